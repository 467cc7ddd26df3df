"""benchmarks/chunk_sweep.py --cold: every run a fresh process, the table from their medians."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "chunk_sweep.py"


def test_cold_sweep_times_each_size_in_its_own_process(tmp_path):
    out = tmp_path / "sweep.json"
    command = [sys.executable, str(SCRIPT), "--cold", "--repeats", "1"]
    command += ["--case", "eight_schools:{}:1,5", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["model"] == "eight_schools" and row["cold"] is True
    assert sorted(row["relative"]) == ["1", "5"]
    assert min(row["relative"].values()) == 1.0 and row["best_seconds"] > 0
    assert "| eight_schools |" in done.stdout  # the table
