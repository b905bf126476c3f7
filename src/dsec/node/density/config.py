"""Node-level density settings (``NodeConfig.density``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DensityConfig", "SwapConfig"]


class SwapConfig(BaseModel):
    """Swap the node uses to take memory back from paused and idle sandboxes."""

    model_config = ConfigDict(extra="forbid")

    zram_mb: int | None = Field(
        None, ge=0, description="size of the compressed in-memory swap device the node adds "
                                "(what it may hold uncompressed; it costs memory only as "
                                "pages land in it). None: half the host's RAM; 0: no zram")
    zram_algorithm: str | None = Field(
        None, description="zram compressor (e.g. lz4, lzo-rle); None: the kernel's default")
    file: Path | None = Field(None, description="also a swap file on disk at this path")
    file_mb: int = Field(0, ge=0, description="size of that swap file")
    sandbox_fraction: float = Field(
        0.25, gt=0, le=1, description="most of the node's swap one sandbox may fill (and "
                                      "never more than its memory_mb)")


class DensityConfig(BaseModel):
    """How a node packs sandboxes: reclaim, swap, CPU classes, KSM."""

    model_config = ConfigDict(extra="forbid")

    swap: SwapConfig = Field(default_factory=SwapConfig)
    reclaim_on_pause: bool = Field(
        True, description="a paused sandbox's memory is pushed out to swap and out of the "
                          "page cache, in the background; resume brings it back")
    reclaim_parallel: int = Field(
        2, ge=1, le=64, description="sandboxes reclaimed at once (each compresses on a core)")
    reclaim_step_mb: int = Field(
        64, ge=1, description="v1: how far each step lowers the limit; v2: bytes asked of "
                              "memory.reclaim per step (a resume waits for at most one step)")
    idle_reclaim_s: float | None = Field(
        300.0, ge=0, description="a running sandbox with no request for this long has its "
                                 "cold pages pushed out, a step at a time, without being "
                                 "frozen (a sandbox's own idle_reclaim_s overrides it); "
                                 "None or 0: never")
    idle_reclaim_interval_s: float = Field(
        2.0, gt=0, description="how often idle sandboxes are looked at (one step each)")
    idle_reclaim_step_mb: int = Field(
        8, ge=1, description="pushed out of one idle sandbox per step (the most its next "
                             "request can wait for the reclaim)")
    ksm: bool = Field(True, description="container sandboxes' memory is merged by KSM "
                                        "(PR_SET_MEMORY_MERGE on their init; kernel >= 6.4)")
    sysctls: dict[str, int] = Field(
        default_factory=lambda: {"kernel.pid_max": 4194304},
        description="host sysctls the node raises to at least these values (never lowers; "
                    "puts back what it changed when it closes with no sandbox left). "
                    "kernel.pid_max: every sandbox is at least one process, and the "
                    "kernel's default 32768 counts the whole host's pids and threads; "
                    "4194304 is the 64-bit maximum (systemd's default too)")
