"""`benchmarks/leak_loop.py` runs anyone's small version: both loops, the table, the ratio check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_small_leak_loop_prints_both_columns_and_checks_the_ratio():
    argv = ["--models", "2", "--rows", "500", "--cols", "20", "--draws", "10"]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "leak_loop.py"), *argv, "--max-ratio", "0.5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
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
