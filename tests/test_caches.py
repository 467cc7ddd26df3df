"""In-memory caches let go of models nobody references, and `clear_caches` empties them."""

from __future__ import annotations

import gc
import weakref

import models
import pytest

import pymc_chunkpost as pc
from pymc_chunkpost._engine.data import problem as _problem
from pymc_chunkpost._engine.execute import executor as _executor


@pytest.mark.parametrize(
    "strategy, options",
    [("auto", {}), ("chunked", {"chunk_size": 3}), ("vmap", {}), ("scan", {})],
)
def test_a_model_nobody_references_is_freed(strategy, options):
    """The caches key weakly on `jax_fn`, which closes over the model's data: once the caller
    drops it, its analysis and compiled executables go too."""
    model = models.data_regression(n_obs=500)
    jax_fn = models.jax_fn(model)
    pc.postprocess_samples(jax_fn, models.raw_draws(model, 2, 20), None, strategy, **options)
    assert _executor._EXECUTABLES.get(jax_fn, None) is None  # keyed on more than the function
    assert len(_executor._EXECUTABLES) > 0 and len(_problem._ANALYSES) > 0
    ref = weakref.ref(jax_fn)
    del model, jax_fn
    gc.collect()
    assert ref() is None


def test_clear_caches():
    model = models.data_regression(n_obs=500)
    jax_fn = models.jax_fn(model)
    pc.postprocess_samples(jax_fn, models.raw_draws(model, 2, 20), None, "auto")
    assert len(_executor._EXECUTABLES) > 0
    pc.clear_caches()
    assert len(_executor._EXECUTABLES) == 0 and len(_problem._ANALYSES) == 0


def test_a_function_that_cannot_be_weakly_referenced_is_still_cached():
    model = models.data_regression(n_obs=500)
    inner = models.jax_fn(model)

    class Slotted:
        __slots__ = ("fn",)

        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *xs):
            return self.fn(*xs)

        def __hash__(self):
            return id(self)

    jax_fn = Slotted(inner)
    raw = models.raw_draws(model, 2, 20)
    pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=3)
    calls = []
    jax_fn.fn = lambda *xs: calls.append(1) or inner(*xs)
    pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=3)
    assert not calls  # the second call traced nothing: cached strongly, in a small LRU


def test_the_analysis_follows_the_x64_setting():
    """A function's own constants trace to float32 or float64 with the x64 setting: a cached
    analysis made under one is never used under the other."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def jax_fn(x):
        return [x * np.float64(0.5)]  # a float64 constant, float32 without x64

    specs = [jax.ShapeDtypeStruct((2, 3, 4), jnp.int32)]
    device = jax.devices()[0]
    with jax.enable_x64(True):
        wide = _problem.analyse(jax_fn, specs, device)
    with jax.enable_x64(False):
        narrow = _problem.analyse(jax_fn, specs, device)
    assert wide.out_specs[0].dtype == np.float64
    assert narrow.out_specs[0].dtype == np.float32


def test_a_program_follows_the_random_bits_setting():
    """`jax_threefry_partitionable` changes the bits a key gives, not the printed jaxpr: a
    program compiled under one setting is never run under the other."""
    import jax
    import numpy as np

    def draw(key):
        return (jax.random.normal(jax.random.wrap_key_data(key), (3,)),)

    keys = np.stack(
        [np.stack([np.array([0, 7 * i + c], np.uint32) for i in range(5)]) for c in range(2)]
    )
    for setting in (True, False, True):
        with jax.threefry_partitionable(setting):
            ours = pc.postprocess_samples(draw, [keys], None, "chunked", chunk_size=2)[0]
            theirs = jax.vmap(jax.vmap(draw))(keys)[0]
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
