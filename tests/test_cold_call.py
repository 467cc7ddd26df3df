"""benchmarks/cold_call.py: each case in its own process, every step of `auto` timed."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

pytestmark = pytest.mark.slow  # a benchmark script

SCRIPT = "benchmarks/cold_call.py"


def test_one_round_times_the_steps_of_both_cases(tmp_path):
    out = tmp_path / "cold.json"
    done = run_script(SCRIPT, "--rounds", "1", "--draws", "20", "--json", out)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    (auto,), (pymc,) = result["runs"]["auto"], result["runs"]["pymc_vmap"]
    for run in (auto, pymc):
        assert run["xla_compile"] > 0 and run["mlir_lower"] > 0
        assert run["nonxla"] == pytest.approx(run["total"] - run["xla_compile"])
    # Planning is timed in `auto` alone: pymc's vmap neither analyses nor caches.
    assert auto["analysis_trace"] > 0 and auto["store.slot_for"] > 0
    assert auto["tuning.store"] > 0 and auto["tuning.tuning_key"] > 0
    assert not any(k.startswith(("store.", "tuning.", "analysis")) for k in pymc)
    assert "paired by round" in done.stdout


def test_bad_arguments_are_refused_before_any_run():
    done = run_script(SCRIPT, "--rounds", "0", timeout=120)
    assert done.returncode == 2 and "must be positive" in done.stderr
