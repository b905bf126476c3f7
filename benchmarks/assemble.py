"""Assemble benchmarks/RESULTS.md from the per-script tables in benchmarks/results/.

Each table was written by its script, with the machine and load it ran on and its own
baseline measured in the same run. Quick (--quick) runs are left out, and so are partial
runs of a script whose full run has a section (``cluster-overhead-singles``: ``--only``).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["exec", "hardening", "protected", "protected_grading", "exec_load", "exec_memory", "create", "cluster",
         "ray", "density", "density-10000", "density_kernel", "density_mounts", "density_count",
         "density_pause", "density_pause_microvm", "density_latency", "density_latency_microvm",
         "density_ksm", "density_pmem", "images_lazy",
         "images_memory", "images_cache", "images_build", "fncall", "trajectory", "jobs",
         "microvm", "guest_network", "registry", "registry_build"]


def _partial(stem: str) -> bool:
    """A variant of a listed script's run (its name plus ``-parts``), not a section of its own."""
    return stem not in ORDER and stem.split("-")[0] in ORDER


def main() -> None:
    files = {p.stem: p for p in (HERE / "results").glob("*.md")
             if not p.stem.endswith("-quick") and not _partial(p.stem)}
    names = [n for n in ORDER if n in files] + sorted(set(files) - set(ORDER))
    parts = [
        "# Benchmark results\n",
        "Every figure comes from a script in this folder, run beside a baseline in the same",
        "run. Each section names the machine and the load average when it ran: the machine",
        "(2 cores) was shared with other work, so compare figures within a section.",
        "Regenerate a section with `.venv/bin/python benchmarks/bench_<name>.py`, then",
        "`.venv/bin/python benchmarks/assemble.py`.\n",
    ]
    for n in names:
        parts.append(files[n].read_text().strip() + "\n")
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote RESULTS.md from {len(names)} result files: {', '.join(names)}")


if __name__ == "__main__":
    main()
