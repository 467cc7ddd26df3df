"""One call of a benchmark cell, timed or traced: shared by the scripts that run each cell in a
fresh process (bench_posthoc, bench_predictive, bench_numpyro)."""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def measured_call(call: Callable[[], Any], measure: str, phase: str, result: dict) -> Any:
    """`call()` after a garbage collection, recording in `result` its seconds (`<phase>_s`)
    or, with `measure="memory"`, memray's peak bytes of its allocations (`<phase>_peak`).
    Returns what the call returned."""
    gc.collect()
    if measure == "memory":
        import memray

        with tempfile.TemporaryDirectory() as folder:
            capture = Path(folder) / "capture.bin"
            with memray.Tracker(capture):
                out = call()
            result[f"{phase}_peak"] = memray.FileReader(capture).metadata.peak_memory
        return out
    tic = time.perf_counter()
    out = call()
    result[f"{phase}_s"] = time.perf_counter() - tic
    return out
