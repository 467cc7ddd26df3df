"""`benchmarks/probes/leak_loop.py` runs anyone's small version: both loops, the table, the
ratio check."""

from __future__ import annotations

import re

import pytest
from helpers import run_script

pytestmark = pytest.mark.slow  # a benchmark script


def test_small_leak_loop_prints_both_columns_and_checks_the_ratio():
    argv = ["--models", "2", "--rows", "500", "--cols", "20", "--draws", "10"]
    proc = run_script("benchmarks/probes/leak_loop.py", *argv, "--max-ratio", "0.5", timeout=300)
    # No library runs in half of pymc's RSS (both load jax and pymc): the check must fire.
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "above --max-ratio 0.5" in proc.stderr
    rows = re.findall(r"^\s*(start|\d+)\s+([\d,.]+)\s+([\d,.]+)$", proc.stdout, re.MULTILINE)
    assert [label for label, _, _ in rows] == ["start", "1", "2"]
    for _, ours, pymc in rows:
        assert 50 < float(ours.replace(",", "")) < 100_000
        assert 50 < float(pymc.replace(",", "")) < 100_000
    ratio = float(re.search(r"ours / pymc: ([\d.]+)x", proc.stdout).group(1))
    final_ours, final_pymc = (float(x.replace(",", "")) for x in rows[-1][1:])
    assert abs(ratio - final_ours / final_pymc) < 0.01
