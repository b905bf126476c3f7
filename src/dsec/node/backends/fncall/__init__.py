"""The fncall backend: pooled, pre-warmed, isolated, stateless calls (see ``backend.py``)."""

from dsec.node.backends.fncall.backend import FncallBackend

__all__ = ["FncallBackend"]
