"""pymc's own sampling routes, patched, run twice, each time in a new process, with one cache
folder: the second run loads what the first stored, runs it, warns nothing the first did
not, and gives the first run's numbers.

This is a user rerunning a notebook. An executable is stored for the devices XLA assigned
it (`_executable_store.Portable.devices`): a program with nothing to compute (every
variable untransformed, no deterministic) is compiled for one device, whatever devices the
draws are on, and must be loaded onto that one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("sampling_worker.py")
ROUTES = ("pm.sample", "sample_nuts")
SAMPLERS = ("numpyro", "blackjax")
CHAINS = (1, 2, 4)
METHODS = ("parallel", "vectorized")
MODELS = ("tiny", "ordinary")
#: What the README's fast suite runs; the slow step runs every combination.
FAST = [
    "pm.sample:numpyro:2:parallel:tiny",
    "pm.sample:numpyro:4:parallel:ordinary",
    "sample_nuts:blackjax:2:parallel:tiny",
    "sample_nuts:numpyro:2:vectorized:ordinary",
]
ALL = [
    f"{r}:{s}:{c}:{m}:{name}"
    for r in ROUTES
    for s in SAMPLERS
    for c in CHAINS
    for m in METHODS
    for name in MODELS
    if not (c == 1 and m == "vectorized")  # one chain is on one device either way
]


def _run(cases: list[str], cache: Path, out: Path) -> tuple[dict, dict]:
    env = {**os.environ, "PYMC_CHUNKPOST_CACHE_DIR": str(cache)}
    env.pop("XLA_FLAGS", None)  # pymc gives the CPU 100 devices, as for a user
    subprocess.run(
        [sys.executable, str(WORKER), str(out), *cases],
        env=env,
        check=True,
        capture_output=True,
        timeout=1800,
        cwd=WORKER.parent,
    )
    with np.load(f"{out}.npz") as arrays:
        posterior = {k: arrays[k] for k in arrays.files}
    return posterior, json.loads(Path(f"{out}.json").read_text())


def _check_second_run(cases: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, first_report = _run(cases, cache, tmp_path / "first")
    second, second_report = _run(cases, cache, tmp_path / "second")
    assert first.keys() == second.keys() and first
    for name in first:
        np.testing.assert_array_equal(second[name], first[name], err_msg=name)
    for case in cases:
        before, after = first_report[case], second_report[case]
        new = [w for w in after["warnings"] if w not in before["warnings"]]
        assert not new, (case, new)
        assert not any("executable" in w for w in after["warnings"]), case
        assert after["plans"], case
        for source, reason in after["plans"]:
            assert source == "cache" and "loaded from disk" in reason, (case, reason)


@pytest.mark.parametrize("cases", [FAST], ids=["fast"])
def test_a_second_run_loads_runs_and_warns_nothing(cases, tmp_path):
    _check_second_run(cases, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_route_chain_count_and_placement(sampler, model, tmp_path):
    _check_second_run([c for c in ALL if f":{sampler}:" in c and c.endswith(model)], tmp_path)
