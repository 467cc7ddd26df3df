"""benchmarks/probes/chunk_sweep.py --cold: every run a fresh process, the table from their
medians."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

pytestmark = pytest.mark.slow  # a benchmark script


def test_cold_sweep_times_each_size_in_its_own_process(tmp_path):
    out = tmp_path / "sweep.json"
    args = ["--cold", "--repeats", "1", "--case", "eight_schools:{}:1,5", "--json", out]
    done = run_script("benchmarks/probes/chunk_sweep.py", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["model"] == "eight_schools" and row["cold"] is True
    assert sorted(row["relative"]) == ["1", "5"]
    assert min(row["relative"].values()) == 1.0 and row["best_seconds"] > 0
    assert "| eight_schools |" in done.stdout  # the table
