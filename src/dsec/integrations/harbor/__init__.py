"""Harbor on dsec: :class:`DsecEnvironment`, an environment provider (Harbor needs Python
>= 3.12; use ``-e dsec.integrations.harbor:DsecEnvironment``)."""

from dsec.integrations.harbor.environment import DsecEnvironment, DsecOptions

__all__ = ["DsecEnvironment", "DsecOptions"]
