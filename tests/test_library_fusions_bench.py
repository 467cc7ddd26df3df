"""benchmarks/probes/library_fusions.py: the compiler option it measures removes every library
fusion, and its table reports what each setting compiled."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

pytestmark = pytest.mark.slow  # a benchmark script


def test_library_fusions_bench(tmp_path):
    out = tmp_path / "fusions.json"
    args = ["--case", "radon_slopes:5", "--repeats", "1", "--draws", "10", "--json", out]
    done = run_script("benchmarks/probes/library_fusions.py", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    settings = row["settings"]
    assert list(settings) == ["default", "none", "reductions only"]
    assert settings["none"]["library_fusions"] == 0
    # radon_slopes' short reduction is the library's unless turned off (both stacks' XLA).
    assert settings["default"]["library_fusions"] > 0
    assert settings["reductions only"]["library_fusions"] > 0
    assert settings["none"]["temp_mib"] < settings["default"]["temp_mib"]
    assert all(len(s["run_seconds"]) == 1 for s in settings.values())
    assert done.stdout.count("| radon_slopes, 5 |") == 3  # the table
