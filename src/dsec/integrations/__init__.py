"""Protocols other sandbox platforms speak, served by dsec so their own clients work by URL.

Each sits on the SDK or the gateway's public interfaces: ``e2b`` (E2B's control plane and
envd, for the unmodified e2b SDK), ``sandboxfusion`` (SandboxFusion's ``run_code``),
``swerex`` (a SWE-ReX deployment and runtime), ``harbor`` (a Harbor environment).
"""
