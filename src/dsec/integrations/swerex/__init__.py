"""SWE-ReX on dsec: :class:`DsecDeployment` (an ``AbstractDeployment``) whose ``runtime`` is a
:class:`DsecRuntime` (an ``AbstractRuntime``) over a dsec sandbox's shells and files.
Needs the ``swe-rex`` package on the client side only."""

from dsec.integrations.swerex.deployment import DsecDeployment
from dsec.integrations.swerex.runtime import DsecRuntime

__all__ = ["DsecDeployment", "DsecRuntime"]
