from __future__ import annotations

import os
import sys
from pathlib import Path

# The on-disk tuning cache is off in tests (its own tests turn it on in a temporary folder), so
# that no run depends on what an earlier run left.
os.environ["PYMC_CHUNKPOST_CACHE_DIR"] = ""

import contextlib

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import models  # noqa: E402

from pymc_chunkpost._support.config import configured  # noqa: E402


@pytest.fixture
def configure():
    """`configure(field=value, ...)`: the planner's heuristics (`PlannerConfig`) changed for
    the rest of the test; calls add up."""
    with contextlib.ExitStack() as stack:

        def apply(**changes):
            return stack.enter_context(configured(**changes))

        yield apply


@pytest.fixture(scope="session")
def built():
    """Each test model and its jax_fn, built once per session (pytensor rewrites are slow)."""
    cache = {}

    def get(name):
        if name not in cache:
            builder = models.float32_model if name == "float32" else models.MODELS[name]
            model = builder()
            cache[name] = (model, models.jax_fn(model))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def wide():
    """An observation-level deterministic of 2,000 points: 16 KiB per draw. Built once per
    module (not per session), so that no module finds another's compiled executables."""
    model = models.data_regression(n_obs=2000)
    return model, models.jax_fn(model)
