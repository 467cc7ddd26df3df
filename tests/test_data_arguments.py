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
from pymc_chunkpost import clear_caches
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.execute import executor as _executor
from pymc_chunkpost._pymc import posthoc as _posthoc

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
    for strategy, where in (("auto", "device"), ("chunked", "device"), ("chunked", "host")):
        _postprocess.run(models.jax_fn(model), raw, None, strategy, output_memory=where)
    assert len(_executor._BY_PROGRAM) > 0
    del model
    gc.collect()
    assert not [a for a in jax.live_arrays() if a.shape == shape]
    arrays = [o for o in gc.get_objects() if issubclass(type(o), np.ndarray)]
    assert not [a for a in arrays if a.shape == shape]
    assert len(_executor._BY_PROGRAM) > 0


def _inner_jit(value):
    """A function whose nested `jax.jit` holds a constant of its own: printed by type only."""
    w = jax.numpy.full((4,), value)
    inner = jax.jit(lambda x: x * w)
    return lambda x: [inner(x)]


def _callback(value):
    """A function whose callback (printed with its address masked) closes over a value."""

    def host(x):
        return np.asarray(x) * value

    spec = jax.ShapeDtypeStruct((4,), np.float64)
    return lambda x: [jax.pure_callback(host, spec, x, vmap_method="sequential")]


@pytest.mark.parametrize("make", [_inner_jit, _callback])
def test_what_the_printed_program_hides_is_never_shared(make):
    """Two functions that print the same jaxpr but compute other numbers (a nested jit's own
    constants, a callback's closure) each run their own executable."""
    samples = [np.ones((2, 3, 4))]
    clear_caches()
    first = pymc_chunkpost.postprocess_samples(make(1.0), samples)
    second = pymc_chunkpost.postprocess_samples(make(2.0), samples)
    np.testing.assert_array_equal(np.asarray(first[0]), 1.0)
    np.testing.assert_array_equal(np.asarray(second[0]), 2.0)


def test_one_function_at_two_precisions_runs_two_programs():
    model = models.data_regression(n_obs=50)
    jax_fn, raw = models.jax_fn(model), models.raw_draws(model, 2, 10)
    clear_caches()
    _postprocess.run(jax_fn, raw, None, "vmap", matmul_precision="highest")
    with counting_compiles() as compiles:
        _, plan = _postprocess.run(jax_fn, raw, None, "vmap")
    assert compiles[0] == 1


def test_data_placed_on_one_mesh_are_not_read_on_another():
    """The placed data are kept by sharding, devices included: the same function on draws
    split over other devices places them again."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    model = models.data_regression(n_obs=50)
    jax_fn, raw = models.jax_fn(model), models.raw_draws(model, 2, 10)
    for devices in ([0, 1], [2, 3], [1, 0]):
        mesh = Mesh(np.array([jax.devices()[i] for i in devices]), ("chain",))
        sharding = NamedSharding(mesh, PartitionSpec("chain"))
        split = [jax.device_put(jax.numpy.asarray(x), sharding) for x in raw]
        outputs, _ = _postprocess.run(jax_fn, split, None, "auto")
        assert_same(outputs, reference(jax_fn, raw))
