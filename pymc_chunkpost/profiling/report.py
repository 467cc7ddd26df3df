"""Tables, `report.md` and `report.png` from `CaseResult`s."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from .harness import CaseResult

__all__ = ["machine_info", "table", "write_report", "plot"]

_PACKAGES = ("pymc-chunkpost", "pymc", "pytensor", "jax", "jaxlib", "numpy", "numpyro", "memray")

HOW_MEASURED = (
    "Each row ran in a fresh Python process. Peak memory and allocations are memray's "
    "high-water mark and allocation count over the post-processing call alone (the raw draws "
    "were already on the device as jax arrays, and were donated, as pymc does after "
    "sampling). Wall time is that call under memray: tracing, compiling and running. "
    "Compile is XLA's compile step only: `Plan.compile_seconds` for ours; for pymc's, "
    "`jax.jit(...).lower(...).compile()` of the same function, timed after the tracked call. "
    "Plan is planning with every candidate compile (ours only). Equal: every output "
    "`np.allclose(rtol=1e-10, atol=1e-12)` to pymc's `vmap` on the same draws, computed "
    "after the tracked call."
)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}"


def table(results: Sequence[CaseResult]) -> str:
    """A Markdown table, one row per case; peak ratio is against `pymc:vmap` when present."""
    ref = next((r.peak_bytes for r in results if r.case == "pymc:vmap" and r.ok), None)
    rows = [
        "| case | peak MiB | vs pymc vmap | allocations | wall s | compile s | plan s "
        "| ran as | equal |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        if not r.ok:
            rows.append(f"| {r.case} | failed: {r.error[:120]} | | | | | | | |")
            continue
        ratio = "-" if not ref else f"{r.peak_bytes / ref:.2f}x"
        equal = {True: "yes", False: "**NO**", None: "-"}[r.equal]
        rows.append(
            f"| {r.case} | {_mib(r.peak_bytes)} | {ratio} | {r.allocations:,} "
            f"| {_seconds(r.wall_seconds)} | {_seconds(r.compile_seconds)} "
            f"| {_seconds(r.planning_seconds or None)} | {r.plan or '-'} | {equal} |"
        )
    return "\n".join(rows)


def machine_info() -> dict[str, str]:
    """Machine and package versions, for the report."""
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": str(os.cpu_count()),
    }
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        total_kb = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        info["memory"] = f"{total_kb / 2**20:.1f} GiB"
    import jax

    info["jax devices"] = ", ".join(str(d) for d in jax.devices())
    for name in _PACKAGES:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    return info


def plot(results: Sequence[CaseResult], path: str | Path, title: str) -> None:
    """Peak memory against wall time, one labelled point per successful case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ok = [r for r in results if r.ok]
    colors = plt.get_cmap("tab10")
    for i, r in enumerate(ok):  # labelled in a legend: points of similar cases overlap
        ax.scatter(
            r.wall_seconds,
            r.peak_bytes / 2**20,
            marker="s" if r.case.startswith("pymc:") else "o",
            color=colors(i % 10),
            s=60,
            alpha=0.8,
            label=r.case,
            zorder=3,
        )
    ax.set_xlabel("wall time of the call, s (trace + compile + run)")
    ax.set_ylabel("peak memory, MiB (memray)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(
    results: Sequence[CaseResult], out_dir: str | Path, title: str, command: str
) -> Path:
    """Write `report.md` and `report.png` into `out_dir`; returns the path of `report.md`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(results, out_dir / "report.png", title)
    info = machine_info()
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        "Measured with memray. " + HOW_MEASURED,
        "",
        table(results),
        "",
        "![peak memory against wall time](report.png)",
        "",
        "## Machine",
        "",
        *[f"- {key}: {value}" for key, value in info.items()],
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
