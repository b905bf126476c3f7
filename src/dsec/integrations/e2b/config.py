"""What the E2B-compatible API can be tuned with."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dsec.api.limits import MAX_LIFE_S

__all__ = ["E2BConfig", "ENVD_VERSION"]

# The envd version the API reports. The SDK gates features on it: 0.4.0 stops it from
# forcing the user "user", 0.5.7 turns on raw (octet-stream) uploads; 0.6.2 would turn on
# file metadata (xattrs), which dsec does not keep, so the SDK refuses that itself.
ENVD_VERSION = "0.5.7"


class E2BConfig(BaseModel):
    """Limits and defaults of the E2B API mounted at ``/e2b``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_output_bytes: int = Field(
        16 << 20, ge=1, le=1 << 30,
        description="bytes of stdout (and, apart, of stderr) one command may stream; past "
                    "it the command ends with an error naming this limit, never cut short "
                    "silently")
    default_timeout_s: int = Field(300, ge=1, le=MAX_LIFE_S,
                                   description="sandbox life when create has none (E2B's "
                                               "default)")
    watch_interval_s: float = Field(0.2, gt=0, le=60,
                                    description="how often a WatchDir stream (the async "
                                                "SDK's watch_dir) looks at the directory")
    max_list_depth: int = Field(16, ge=1, description="deepest files.list(depth=) served")
