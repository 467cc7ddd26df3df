"""Tables, `report.md` and `report.png` from `CaseResult`s."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from .._support.extras import require
from .harness import CaseResult

__all__ = ["failures", "machine_info", "table", "write_report", "plot"]

_PACKAGES = ("pymc-chunkpost", "pymc", "pytensor", "jax", "jaxlib", "numpy", "numpyro", "memray")

HOW_MEASURED = (
    "Each row ran in a fresh Python process. Peak memory and allocations are memray's "
    "high-water mark and allocation count over the post-processing call alone (the raw draws "
    "were already on the device as jax arrays, and were donated, as pymc does after "
    "sampling). The floor is the outputs' bytes: no strategy can use less, and x floor is "
    "the peak over it. Wall time is that call under memray: tracing, compiling and running. "
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


def _ratio(n: int | None, ref: int | None) -> str:
    return "-" if n is None or not ref else f"{n / ref:.2f}x"


def table(results: Sequence[CaseResult]) -> str:
    """A Markdown table, one row per case.

    "x floor" is the peak over the outputs' bytes (what no strategy can go below); "vs pymc
    vmap" is the peak over pymc's default's, when that case ran. A failed case's row says so;
    `failures` gives its output.
    """
    ref = next((r.peak_bytes for r in results if r.case == "pymc:vmap" and r.ok), None)
    rows = [
        "| case | peak MiB | x floor | vs pymc vmap | allocations | wall s | compile s | plan s "
        "| ran as | equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        if not r.ok:
            rows.append(f"| {r.case} | **failed** (see below) | | | | | | | | |")
            continue
        equal = {True: "yes", False: "**NO**", None: "-"}[r.equal]
        allocations = "-" if r.allocations is None else f"{r.allocations:,}"
        rows.append(
            f"| {r.case} | {_mib(r.peak_bytes)} | {_ratio(r.peak_bytes, r.output_bytes)} "
            f"| {_ratio(r.peak_bytes, ref)} | {allocations} "
            f"| {_seconds(r.wall_seconds)} | {_seconds(r.compile_seconds)} "
            f"| {_seconds(r.planning_seconds or None)} | {r.plan or '-'} | {equal} |"
        )
    return "\n".join(rows)


def failures(results: Sequence[CaseResult]) -> str:
    """The last lines of output of every failed case, each under its name ("" if none)."""
    blocks = []
    for r in results:
        if not r.ok:
            lines = r.error.splitlines() or ["(no output)"]
            blocks.append("\n".join([f"{r.case} failed:", *(f"    {line}" for line in lines)]))
    return "\n\n".join(blocks)


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
    """Peak memory against wall time, one labelled point per successful case.

    A dashed line marks the floor, the outputs' bytes, where the cases report it.
    """
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    points = [  # (case, seconds, MiB, floor MiB) of each case that ran
        (r.case, r.wall_seconds, r.peak_bytes / 2**20, (r.output_bytes or 0) / 2**20)
        for r in results
        if r.ok and r.peak_bytes is not None and r.wall_seconds is not None
    ]
    colors = plt.get_cmap("tab10")
    for i, (case, seconds, mib, _) in enumerate(points):  # in a legend: points may overlap
        ax.scatter(
            seconds,
            mib,
            marker="s" if case.startswith("pymc:") else "o",
            color=colors(i % 10),
            s=60,
            alpha=0.8,
            label=case,
            zorder=3,
        )
    floor = max((p[3] for p in points), default=0.0)
    if floor:
        ax.axhline(floor, color="0.4", linestyle="--", linewidth=1, zorder=2)
        ax.annotate(
            "floor: the outputs' bytes",
            (0, floor),
            xycoords=("axes fraction", "data"),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )
    if not points:
        ax.text(0.5, 0.5, "every case failed", transform=ax.transAxes, ha="center")
    ax.set_xlabel("wall time of the call, s (trace + compile + run)")
    ax.set_ylabel("peak memory, MiB (memray)")
    top = max([p[2] for p in points] + [floor, 1.0])
    right = max([p[1] for p in points] + [1.0])
    ax.set_ylim(0, 1.1 * top)  # room around the points at the edges
    ax.set_xlim(0, 1.1 * right)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    if points:
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
    failed = failures(results)
    failures_section = ["## Failures", "", "```", failed, "```", ""] if failed else []
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        "Measured with memray. " + HOW_MEASURED,
        "",
        table(results),
        "",
        *failures_section,
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
