"""pytest fixtures for memory tests: a real model, its `jax_fn`, and raw draws on the device.

The model is chosen per module with `MEMORY_FIXTURE = (name, chains, draws)` (default: the
latent GP at 4 x 1000, whose pymc "vmap" holds a 100 x 100 Cholesky for every draw at once).
Everything here is built during setup, outside the test call that pytest-memray measures.
"""

from __future__ import annotations

import jax
import pytest

from pymc_chunkpost.profiling.fixtures import FIXTURES
from pymc_chunkpost.profiling.fixtures import jax_fn as make_jax_fn

DEFAULT_MEMORY_FIXTURE = ("gp", 4, 1000)


def _choice(request) -> tuple[str, int, int]:
    return getattr(request.module, "MEMORY_FIXTURE", DEFAULT_MEMORY_FIXTURE)


@pytest.fixture
def memray_active(request) -> None:
    """Skip unless pytest runs with `--memray` (pytest-memray), which measures the test."""
    if not request.config.getoption("memray", default=False):
        pytest.skip("memory bounds are measured only under `pytest --memray`")


@pytest.fixture(scope="module")
def model(request):
    """The `pm.Model` of the module's `MEMORY_FIXTURE`."""
    name, _, _ = _choice(request)
    return FIXTURES[name].build()


@pytest.fixture(scope="module")
def jax_fn(model):
    """The per-draw function pymc post-processes for `model`."""
    return make_jax_fn(model)


@pytest.fixture
def raw_mcmc_samples(request, model) -> list[jax.Array]:
    """Seeded raw draws as fresh jax arrays (donation consumes them, so one set per test)."""
    name, chains, draws = _choice(request)
    samples = [jax.numpy.array(x) for x in FIXTURES[name].raw_draws(model, chains, draws, 0)]
    jax.block_until_ready(samples)
    return samples
