"""benchmarks/library_fusions.py: the compiler option it measures removes every library
fusion, and its table reports what each setting compiled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "library_fusions.py"


def test_library_fusions_bench(tmp_path):
    out = tmp_path / "fusions.json"
    command = [sys.executable, str(SCRIPT), "--case", "radon_slopes:5", "--repeats", "1"]
    command += ["--draws", "10", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
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
