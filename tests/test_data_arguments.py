"""The model's data are arguments of every compiled program, not constants in it.

One executable per model and shapes, whatever the data's values: `pm.set_data` with new values
of the same shapes compiles nothing (every XLA compile counted, `jax.jit`'s own included), and
the answers read the new values (compared with pymc's own functions). Nothing that a cache
keeps across models holds a model's data.
"""

from __future__ import annotations

import contextlib

import jax
import models
import numpy as np
import pytest
from helpers import assert_same, reference

import pymc_chunkpost
from pymc_chunkpost import _executor, _posthoc, _postprocess, clear_caches

pm = pytest.importorskip("pymc")

PYMC6 = int(pm.__version__.split(".")[0]) >= 6


@contextlib.contextmanager
def counting_compiles():
    """Every XLA compile in the block (`backend_compile_duration`, which jit's first calls
    and ahead-of-time compiles alike record), counted in the yielded list."""
    count = [0]

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _posterior(model, chains=2, draws=15):
    """A seeded `(chains, draws)` posterior from the prior, in the installed pymc's type."""
    import xarray as xr

    names = [v.name for v in model.free_RVs]
    prior = pm.sample_prior_predictive(
        draws=chains * draws, model=model, random_seed=1, var_names=names
    )["prior"]
    variables = {
        n: (
            ("chain", "draw", *prior[n].dims[2:]),
            prior[n].values.reshape(chains, draws, *prior[n].shape[2:]),
        )
        for n in names
    }
    coords = {k: v.values for k, v in prior.coords.items() if k not in ("chain", "draw")}
    dataset = xr.Dataset(variables, coords={**coords, "chain": range(chains), "draw": range(draws)})
    if PYMC6:
        return xr.DataTree.from_dict({"posterior": dataset})
    import arviz as az

    return az.InferenceData(posterior=dataset)


def _new_x(model, seed):
    return np.random.default_rng(seed).normal(size=model["x"].get_value().shape)


@pytest.mark.parametrize("strategy", ["auto", "vmap", "chunked"])
def test_new_data_of_the_same_shapes_compiles_nothing(strategy):
    """The engine: two functions of one model with other data, the same program."""
    model = models.data_regression(n_obs=400)
    raw = models.raw_draws(model, 2, 30)
    clear_caches()
    options = {"chunk_size": 16} if strategy == "chunked" else {}
    _postprocess.run(models.jax_fn(model), raw, None, strategy, **options)
    for seed in (5, 6):
        with model:
            pm.set_data({"x": _new_x(model, seed)})
        jax_fn = models.jax_fn(model)
        with counting_compiles() as compiles:
            outputs, _ = _postprocess.run(jax_fn, raw, None, strategy, **options)
        assert compiles[0] == 0
        assert_same(outputs, reference(jax_fn, raw))


def test_compute_log_likelihood_after_set_data_compiles_nothing():
    model = models.data_regression(n_obs=400)
    idata = _posterior(model)
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False)
    pymc_chunkpost.compute_log_likelihood(idata, **kwargs)
    with model:
        pm.set_data({"x": _new_x(model, 7)})
    with counting_compiles() as compiles:
        ours = pymc_chunkpost.compute_log_likelihood(idata, **kwargs)
    assert compiles[0] == 0
    theirs = _posthoc._pymc("compute_log_likelihood")(idata, **kwargs)
    np.testing.assert_allclose(ours["y"].values, theirs["y"].values, rtol=1e-12, atol=1e-12)


def test_predictions_after_set_data_compile_nothing():
    """The out-of-sample loop: new `x` of the same shape, `predictions=True`, no compile;
    the draws' means follow the new data."""
    model = models.data_regression(n_obs=400)
    idata = _posterior(model, draws=200)
    kwargs = dict(predictions=True, progressbar=False, random_seed=3)
    with model:
        pymc_chunkpost.sample_posterior_predictive(idata, var_names=["y"], **kwargs)
        new_x = _new_x(model, 8)
        pm.set_data({"x": new_x})
        with counting_compiles() as compiles:
            ours = pymc_chunkpost.sample_posterior_predictive(idata, var_names=["y"], **kwargs)
    assert compiles[0] == 0
    posterior = idata["posterior"]
    beta = posterior["beta"].values.reshape(-1, 3)
    expected = (beta @ new_x.T).mean(axis=0)
    got = ours["predictions"]["y"].values.reshape(-1, new_x.shape[0]).mean(axis=0)
    sigma = posterior["sigma"].values.mean()
    assert np.abs(got - expected).max() < 6 * sigma / np.sqrt(beta.shape[0])


def test_nothing_cached_holds_a_model_s_data_once_it_is_gone():
    """After a model and its function are gone, no array of its data's shape is alive: not
    on the device (placed constants), not on the host (a jaxpr's constants), though the
    executables that every model of the same program shares stay cached."""
    import gc

    shape = (1237, 3)  # a shape nothing else in the process has
    model = models.data_regression(n_obs=shape[0])
    raw = models.raw_draws(model, 2, 30)
    clear_caches()
    for strategy in ("auto", "chunked"):
        _postprocess.run(models.jax_fn(model), raw, None, strategy)
    assert len(_executor._BY_PROGRAM) > 0
    del model
    gc.collect()
    assert not [a for a in jax.live_arrays() if a.shape == shape]
    arrays = [o for o in gc.get_objects() if issubclass(type(o), np.ndarray)]
    assert not [a for a in arrays if a.shape == shape]
    assert len(_executor._BY_PROGRAM) > 0
