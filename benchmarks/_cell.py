"""A benchmark cell in a fresh process, and its one call timed or traced: shared by the
scripts that run each cell so (bench_posthoc, bench_predictive, bench_numpyro)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
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


def run_child(script: str, args: list[str], env: dict | None = None) -> dict:
    """`python script *args` in a fresh process (with `env` added to this one's), and the
    JSON object its last line of output prints."""
    proc = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        env=os.environ | (env or {}),
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{script} {' '.join(args)} exited {proc.returncode}:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
