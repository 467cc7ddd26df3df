"""Every strategy against pymc's own `_postprocess_samples`, on every model of the zoo.

The zoo (`pymc_chunkpost.profiling.fixtures.ZOO`) holds the kinds of model that users
post-process: row-indexed hierarchical, basis expansions, random walks, softmax, mixtures,
ZeroSum and simplex transforms, LKJ, a GP, many scalars, large `pm.Data`, integer
deterministics. Each is built once per module and run at 2 chains x 7 draws.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytensor
import pytest
from pymc.sampling.jax import _postprocess_samples as pymc_postprocess

import pymc_chunkpost as pc
from pymc_chunkpost.profiling.fixtures import FIXTURES, ZOO, jax_fn, many_scalars, raw_draws

CHAINS, DRAWS = 2, 7
CHUNK_SIZE = 3  # odd, and does not divide chains x draws: the last chunk overlaps
FLOAT32_MODEL = "softmax"
# XLA's compile time of a loop grows fast with its number of buffers: 200 scalars take
# minutes to compile in the explicit loop strategies (the trap that `auto` avoids with a
# host-driven loop). Those strategies get the same model with 20 scalars; `auto` and `vmap`
# get the zoo's.
SMALL = {"many_scalars": lambda: many_scalars(n=20)}
FULL_SIZE_ONLY_FOR = ("auto", "vmap")
# On the zoo, the default run checks `auto`, pymc's `vmap` and `chunked`; the other explicit
# loops (checked on the test models in test_postprocess.py) run with the slow tests.
ZOO_STRATEGIES = [
    s if s in ("auto", "vmap", "chunked") else pytest.param(s, marks=pytest.mark.slow)
    for s in pc.STRATEGIES
]


# The GP's jittered 100 x 100 ExpQuad covariance is ill-conditioned: batched and per-draw
# Cholesky calls (LAPACK) differ by up to ~3e-8 on jax 0.10 (rounding, amplified).
ILL_CONDITIONED = {"gp": (1e-6, 1e-7)}


def tolerance(name, dtype) -> tuple[float, float]:
    """(rtol, atol relative to the output's largest magnitude): summation orders differ
    between strategies, so values near zero are compared on the output's scale."""
    if dtype == np.float32:
        return 1e-5, 1e-6
    return ILL_CONDITIONED.get(name, (1e-10, 1e-12))


@pytest.fixture(scope="module")
def zoo():
    """name -> (jax_fn, raw draws, pymc's "vmap" outputs); each model built once."""
    cache = {}

    def get(name):
        if name not in cache:
            floatx = "float32" if name == "float32" else "float64"
            if name == "float32":
                build = FIXTURES[FLOAT32_MODEL].build
            elif name.endswith("-small"):
                build = SMALL[name.removesuffix("-small")]
            else:
                build = FIXTURES[name].build
            with pytensor.config.change_flags(floatX=floatx):
                model = build()
                fn = jax_fn(model)
            raw = raw_draws(model, CHAINS, DRAWS, seed=12)
            expected = pymc_postprocess(fn, [jnp.asarray(x) for x in raw], None, "vmap")
            cache[name] = fn, raw, [np.asarray(y) for y in expected]
        return cache[name]

    return get


def assert_equal_to_pymc(outputs, expected, name=""):
    assert len(outputs) == len(expected)
    for i, (got, want) in enumerate(zip(outputs, expected)):
        got = np.asarray(got)
        assert got.shape == want.shape, i
        assert got.dtype == want.dtype, i
        if not np.issubdtype(want.dtype, np.inexact):
            np.testing.assert_array_equal(got, want, err_msg=f"output {i}")
            continue
        rtol, scaled_atol = tolerance(name, want.dtype)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(
            got, want, rtol=rtol, atol=scaled_atol * scale, err_msg=f"output {i}"
        )


def test_zoo_has_one_model_of_each_kind():
    assert len(ZOO) >= 12
    assert len(set(ZOO)) == len(ZOO)
    assert set(ZOO) <= set(FIXTURES)


@pytest.mark.parametrize("strategy", ZOO_STRATEGIES)
@pytest.mark.parametrize("name", ZOO)
def test_matches_pymc(zoo, name, strategy):
    if name in SMALL and strategy not in FULL_SIZE_ONLY_FOR:
        name += "-small"
    fn, raw, expected = zoo(name)
    options = {"chunk_size": CHUNK_SIZE} if strategy == "chunked" else {}
    outputs = pc.postprocess_samples(fn, raw, None, strategy, **options)
    assert_equal_to_pymc(outputs, expected, name)


@pytest.mark.parametrize("strategy", ["auto", "chunked", "vmap"])
def test_float32_model(zoo, strategy):
    fn, raw, expected = zoo("float32")
    assert {x.dtype for x in raw} == {np.dtype(np.float32)}
    options = {"chunk_size": CHUNK_SIZE} if strategy == "chunked" else {}
    outputs = pc.postprocess_samples(fn, raw, None, strategy, **options)
    assert np.dtype(np.float32) in {o.dtype for o in outputs}
    assert_equal_to_pymc(outputs, expected)


def test_integer_outputs_are_integers(zoo):
    # The zoo's integer deterministics stay integers (and are compared exactly above).
    _, _, expected = zoo("integer_dets")
    assert sum(np.issubdtype(y.dtype, np.integer) for y in expected) == 3


@pytest.mark.slow  # the zoo again, with a schedule forced that the planner takes where it pays
@pytest.mark.parametrize("strategy", ["vmap", "scan_vmap", "auto"])
@pytest.mark.parametrize("name", ZOO)
def test_matches_pymc_with_every_jaxpr_scheduled(zoo, name, strategy, monkeypatch, configure):
    """`DrawFunction.over_draws` takes its schedule (elementwise equations bound on the
    draws' arrays) only where it pays; forced on every model and in each strategy that maps
    draws with it, the outputs are still pymc's."""
    from pymc_chunkpost._engine.kernels import jaxpr_eval as _jaxpr_eval

    configure(eqns_per_run=0)
    calls = []
    real = _jaxpr_eval._run_schedule
    monkeypatch.setattr(_jaxpr_eval, "_run_schedule", lambda *a: calls.append(1) or real(*a))
    if name in SMALL and strategy not in FULL_SIZE_ONLY_FOR:
        name += "-small"
    fn, raw, expected = zoo(name)
    pc.clear_caches()  # traced again, not taken from an earlier test's executables
    try:
        outputs = pc.postprocess_samples(fn, raw, None, strategy)
    finally:
        pc.clear_caches()
    assert calls, "the schedule was not taken"
    assert_equal_to_pymc(outputs, expected, name)
