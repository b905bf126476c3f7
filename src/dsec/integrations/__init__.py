"""Protocols other sandbox platforms speak, served by dsec so their own clients work by URL.

Each sits on the SDK or the gateway's public interfaces: ``sandboxfusion`` (SandboxFusion's
``run_code``), ``swerex`` (a SWE-ReX deployment and runtime), ``harbor`` (a Harbor
environment).
"""
