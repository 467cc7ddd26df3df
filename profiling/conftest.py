"""pytest fixtures for memory tests: a real model, its `jax_fn`, and raw draws on the device.

The model is chosen per module with `MEMORY_FIXTURE = (name, chains, draws)` (default: the
latent GP at 4 x 1000, whose pymc "vmap" holds a 100 x 100 Cholesky for every draw at once).
Everything here is built during setup, outside the test call that pytest-memray measures.
"""

from __future__ import annotations

import os

# No on-disk cache (tuning entries, stored executables): a bound must not depend on what an
# earlier run left.
os.environ["PYMC_CHUNKPOST_CACHE_DIR"] = ""

import jax  # noqa: E402
import pytest  # noqa: E402

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


@pytest.fixture(scope="session", autouse=True)
def lapack_thread_workspaces() -> None:
    """Let every XLA worker thread make its one-time LAPACK workspace before any test is measured.

    jax's CPU Cholesky spreads a batch over XLA's thread pool, and the BLAS behind it maps a
    workspace (32 MiB with scipy's OpenBLAS) the first time each thread calls it, kept until the
    process ends. How many threads a test's call reaches first varies run to run, so counting
    those workspaces made a bound flaky (110 MiB to 1.5 GiB for the same call); they belong
    to the process, not to the call under test.
    """
    eye = jax.numpy.eye(64)
    for batch in (64, 1024, 4096):
        jax.block_until_ready(
            jax.numpy.linalg.cholesky(jax.numpy.broadcast_to(eye, (batch, 64, 64)))
        )


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
