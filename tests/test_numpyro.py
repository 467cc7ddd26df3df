"""The numpyro routes: `pymc_chunkpost.numpyro.Predictive` and `log_likelihood`.

Every result is compared with numpyro's own function on real numpyro models, bit for bit:
`numpyro.infer.Predictive(parallel=False)` (numpyro's default) and
`numpyro.infer.util.log_likelihood`. numpyro's `parallel=True` rounds apart from its own
`parallel=False` in the last bit on most of these models (docs/numpyro.md), so it is the
reference only where the two agree. Draws are 2 chains x 12 draws, seeded; chunks of 5 leave
an overlapping last chunk.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")

import numpyro.distributions as dist  # noqa: E402
from helpers import count_compiles  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer import Predictive as NumpyroPredictive  # noqa: E402
from numpyro.infer.autoguide import AutoNormal  # noqa: E402
from numpyro.infer.util import log_likelihood as numpyro_log_likelihood  # noqa: E402

import pymc_chunkpost.numpyro  # noqa: E402
from pymc_chunkpost._engine.plan import resources as _resources  # noqa: E402
from pymc_chunkpost._numpyro import draws as _draws  # noqa: E402
from pymc_chunkpost._numpyro import routes as _numpyro  # noqa: E402
from pymc_chunkpost._support import compat as _compat  # noqa: E402
from pymc_chunkpost.numpyro import Predictive, log_likelihood  # noqa: E402

CHAINS, DRAWS = 2, 12
KEY = jax.random.PRNGKey(7)

from numpyro_models import MODELS  # noqa: E402

FAST = ("hierarchical", "deterministic_sites", "logistic", "multivariate", "ar1")


@pytest.fixture(scope="module")
def posteriors():
    """Per model: its posterior draws (from the prior, seeded) of shape (CHAINS * DRAWS, ...)
    and observations to condition `log_likelihood` on."""
    cache = {}

    def get(name):
        if name not in cache:
            model, args = MODELS[name]
            prior = NumpyroPredictive(model, num_samples=CHAINS * DRAWS)(
                jax.random.PRNGKey(1), *args
            )
            sites = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(*args)
            latent = {k for k, s in sites.items() if s["type"] == "sample" and k != "y"}
            draws = {k: v for k, v in prior.items() if k in latent}
            cache[name] = draws, prior["y"][0]
        return cache[name]

    return get


@pytest.fixture(scope="module")
def svi_fit():
    """An AutoNormal guide fitted by a few SVI steps to `deterministic_sites`' data."""
    model, (x,) = MODELS["deterministic_sites"]
    y = 0.5 + 2.0 * x
    guide = AutoNormal(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(2), 20, x, y, progress_bar=False)
    return model, guide, result.params, x


def _batched(draws, batch_ndims):
    """The draws with `batch_ndims` leading axes: (N, ...) or (CHAINS, DRAWS, ...)."""
    if batch_ndims == 1:
        return draws
    return {k: v.reshape((CHAINS, DRAWS) + v.shape[1:]) for k, v in draws.items()}


def assert_identical(ours, theirs):
    """The same sites in the same order, each of the same shape, dtype and bits."""
    assert list(ours) == list(theirs)
    for name in theirs:
        got, want = np.asarray(ours[name]), np.asarray(theirs[name])
        assert got.shape == want.shape, name
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


# --- Predictive and log_likelihood against numpyro's own ------------------------------------


@pytest.mark.parametrize("batch_ndims", [1, 2])
@pytest.mark.parametrize("name", FAST)
def test_predictive_equals_numpyro(posteriors, name, batch_ndims):
    model, args = MODELS[name]
    draws = _batched(posteriors(name)[0], batch_ndims)
    options = {"postprocessing_vectorize": "chunked", "chunk_size": 5} if batch_ndims == 1 else {}
    ours = Predictive(model, draws, batch_ndims=batch_ndims, **options)(KEY, *args)
    theirs = NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, *args)
    assert_identical(ours, theirs)


def test_outputs_stay_on_the_draws_device_small_or_not(posteriors, monkeypatch):
    """NumPyro's routes return `jax.Array`s where the draws are: small work is never moved
    to the host CPU (`resources.small_work_on_host` is not asked)."""
    asked = []
    monkeypatch.setattr(
        _resources, "small_work_on_host", lambda *args: asked.append(args) or (True, "a test")
    )
    model, args = MODELS["hierarchical"]
    draws, y = posteriors("hierarchical")
    ours = Predictive(model, draws)(KEY, *args)
    log_likelihood(model, draws, *args, y=y)
    assert asked == []
    assert all(isinstance(v, jax.Array) for v in ours.values())
    # `loo` decides once for all its blocks, on every value of them (`loo_backend`).
    more = {k: jnp.concatenate([v] * 8) for k, v in draws.items()}  # draws enough for PSIS
    pymc_chunkpost.numpyro.loo(model, more, *args, y=y, batch_ndims=1, block_size=3)
    assert [values for _, values in asked] == [len(more["mu"]) * np.size(y)]


@pytest.mark.parametrize("batch_ndims", [1, 2])
def test_predictive_equals_numpyro_under_the_original_threefry_split(posteriors, batch_ndims):
    """Where jax splits keys with its original (non-partitionable) threefry, a draw's key is
    no single hash of its index: the route splits as numpyro does, and still equals it."""
    model, args = MODELS["hierarchical"]
    draws = _batched(posteriors("hierarchical")[0], batch_ndims)
    with jax.threefry_partitionable(False):
        assert not _compat.splits_key_at()
        ours = Predictive(model, draws, batch_ndims=batch_ndims)(KEY, *args)
        theirs = NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, *args)
    assert_identical(ours, theirs)


@pytest.mark.parametrize("batch_ndims", [1, 2])
@pytest.mark.parametrize("name", FAST)
def test_log_likelihood_equals_numpyro(posteriors, name, batch_ndims):
    model, args = MODELS[name]
    draws, y = posteriors(name)
    draws = _batched(draws, batch_ndims)
    options = {"postprocessing_vectorize": "chunked", "chunk_size": 5} if batch_ndims == 2 else {}
    ours = log_likelihood(model, draws, *args, y=y, batch_ndims=batch_ndims, **options)
    theirs = numpyro_log_likelihood(model, draws, *args, y=y, batch_ndims=batch_ndims)
    assert_identical(ours, theirs)


def test_guide_from_svi_equals_numpyro(svi_fit):
    model, guide, params, x = svi_fit
    n = CHAINS * DRAWS
    ours = Predictive(model, guide=guide, params=params, num_samples=n)(KEY, x)
    theirs = NumpyroPredictive(model, guide=guide, params=params, num_samples=n)(KEY, x)
    assert_identical(ours, theirs)
    return_sites = ["y", "a", "b", "mu"]  # the guide's draws and the model's predictions
    ours = Predictive(model, guide=guide, params=params, num_samples=n, return_sites=return_sites)
    theirs = NumpyroPredictive(
        model, guide=guide, params=params, num_samples=n, return_sites=return_sites
    )
    assert_identical(ours(KEY, x), theirs(KEY, x))


@pytest.mark.parametrize("batch_ndims", [1, 2])
def test_posterior_drawn_from_an_svi_guide_equals_numpyro(svi_fit, batch_ndims):
    model, guide, params, x = svi_fit
    draws = NumpyroPredictive(guide, params=params, num_samples=CHAINS * DRAWS)(
        jax.random.PRNGKey(3), x
    )
    draws = _batched(draws, batch_ndims)
    ours = Predictive(model, draws, params=params, batch_ndims=batch_ndims)(KEY, x)
    theirs = NumpyroPredictive(model, draws, params=params, batch_ndims=batch_ndims)(KEY, x)
    assert_identical(ours, theirs)


STRATEGIES = [
    ("vmap", {}),
    ("scan", {}),
    ("scan_vmap", {}),
    ("nested_scan", {}),
    ("chunked", {"chunk_size": 1}),
    ("chunked", {"chunk_size": 7}),
    ("chunked", {"chunk_size": 5, "output_memory": "host"}),
    ("auto", {"memory_budget": 2**30}),
]


@pytest.mark.parametrize(("strategy", "options"), STRATEGIES)
def test_every_strategy_and_chunk_size_gives_numpyros_numbers(posteriors, strategy, options):
    model, args = MODELS["deterministic_sites"]
    draws = _batched(posteriors("deterministic_sites")[0], 2)
    predictive = Predictive(
        model, draws, batch_ndims=2, postprocessing_vectorize=strategy, **options
    )
    ours = predictive(KEY, *args)
    assert predictive.plan.strategy == strategy or strategy == "auto"
    if options.get("output_memory") == "host":
        assert all(isinstance(v, np.ndarray) for v in ours.values())
    assert_identical(ours, NumpyroPredictive(model, draws, batch_ndims=2)(KEY, *args))


def test_data_only_terms_are_not_folded_at_compile_time(posteriors):
    """`log1p(x ** 2)` of the data alone: computed at run time as in numpyro's loop. Folded
    into a constant by XLA, it would differ in the last bit (the module docstring)."""
    model, args = MODELS["deterministic_sites"]
    draws = posteriors("deterministic_sites")[0]
    ours = Predictive(model, draws, return_sites=["scaled"])(KEY, *args)
    theirs = NumpyroPredictive(model, draws, return_sites=["scaled"])(KEY, *args)
    assert_identical(ours, theirs)


def test_typed_keys_and_single_draws_as_numpyro(posteriors, caplog):
    model, args = MODELS["hierarchical"]
    draws = posteriors("hierarchical")[0]
    key = jax.random.key(11)
    assert_identical(
        Predictive(model, draws)(key, *args), NumpyroPredictive(model, draws)(key, *args)
    )
    # One draw: numpyro calls the model op by op (nothing to map), so numpyro's own runs.
    one = {k: v[0] for k, v in draws.items()}
    first = {k: v[:1] for k, v in draws.items()}
    with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
        for single, batch_ndims in ((one, 0), (first, 1)):
            predictive = Predictive(model, single, batch_ndims=batch_ndims)
            theirs = NumpyroPredictive(model, single, batch_ndims=batch_ndims)
            assert_identical(predictive(key, *args), theirs(key, *args))
            assert predictive.plan is None
        y = posteriors("hierarchical")[1]
        assert_identical(
            log_likelihood(model, first, *args, y=y),
            numpyro_log_likelihood(model, first, *args, y=y),
        )
    assert caplog.text.count("one draw, which numpyro computes op by op") == 3


def test_prior_predictive_return_sites_and_conditioned_deterministics(posteriors):
    model, args = MODELS["deterministic_sites"]
    assert_identical(
        Predictive(model, num_samples=9)(KEY, *args),
        NumpyroPredictive(model, num_samples=9)(KEY, *args),
    )
    draws = dict(posteriors("deterministic_sites")[0])
    draws["mu"] = jnp.ones((CHAINS * DRAWS, 60))  # a stored deterministic, to condition on
    for options in (
        {"return_sites": ["a", "y", "mu"]},  # `a` is a posterior draw passed through
        {"condition_deterministic": True},
        {"return_sites": []},
    ):
        ours = Predictive(model, draws, **options)(KEY, *args)
        assert_identical(ours, NumpyroPredictive(model, draws, **options)(KEY, *args))


def test_deprecated_exclude_deterministic_as_numpyro(posteriors):
    model, args = MODELS["deterministic_sites"]
    draws = posteriors("deterministic_sites")[0]
    with pytest.warns(FutureWarning, match="condition_deterministic"):
        ours = Predictive(model, draws, exclude_deterministic=False)
    assert ours.condition_deterministic
    with pytest.raises(ValueError, match="Only one of"):
        Predictive(model, draws, exclude_deterministic=False, condition_deterministic=True)


# --- what the engine cannot honour runs numpyro's own ---------------------------------------


def test_guide_with_batched_params_runs_numpyros_own_with_a_note(svi_fit, caplog):
    model, guide, params, x = svi_fit
    batched = {k: jnp.stack([v, v * 0.5]) for k, v in params.items()}
    options = {"guide": guide, "params": batched, "num_samples": 4, "batch_ndims": 1}
    predictive = Predictive(model, **options)
    with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
        ours = predictive(KEY, x)
    assert [r.getMessage() for r in caplog.records] == [
        "`Predictive` runs numpyro's own function (a guide with params batched over batch_ndims=1)."
    ]
    assert predictive.plan is None
    assert_identical(ours, NumpyroPredictive(model, **options)(KEY, x))


def test_infer_discrete_runs_numpyros_own(posteriors, monkeypatch, caplog):
    model, args = MODELS["logistic"]
    draws = posteriors("logistic")[0]
    seen = []

    class Recording(NumpyroPredictive):
        def __call__(self, rng_key, *args, **kwargs):
            seen.append(self.infer_discrete)
            return {}

    monkeypatch.setattr(_numpyro, "_NumpyroPredictive", Recording)
    with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
        assert Predictive(model, draws, infer_discrete=True)(KEY, *args) == {}
    assert seen == [True]
    assert "infer_discrete=True" in caplog.text


def test_log_likelihood_without_draws_runs_numpyros_own(caplog):
    def fixed(y=None):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    y = jnp.arange(3.0)
    with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
        ours = log_likelihood(fixed, {}, y=y)
    assert "no posterior draws" in caplog.text
    assert_identical(ours, numpyro_log_likelihood(fixed, {}, y=y))


# --- memory, devices, caches -------------------------------------------------------------


def test_peak_memory_stays_near_the_outputs():
    """30,000 rows x 200 draws: 23 MiB of predictions (46 MiB with x64), the floor. XLA's
    compiled analysis of what ran: one draw at a time (the default), any plan stays within
    1.1x the floor; vectorised, "vmap" needs more than 1.5x, and a budget of 1.5x makes the
    planner chunk within it."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=30_000), jnp.float32)
    draws = {"a": jnp.asarray(rng.normal(size=200)), "b": jnp.asarray(rng.normal(size=200))}
    model = MODELS["logistic"][0]
    floor = 200 * 30_000 * jnp.asarray(0).dtype.itemsize  # Bernoulli draws: default ints
    options = {"return_sites": ["y"]}
    exact = Predictive(model, draws, memory_budget=int(1.1 * floor), **options)
    ours = exact(KEY, x)
    assert exact.plan.output_bytes == floor
    assert exact.plan.peak_bytes <= 1.1 * floor
    vmapped = Predictive(model, draws, exact=False, postprocessing_vectorize="vmap", **options)
    assert_identical(vmapped(KEY, x), ours)  # Bernoulli draws: no rounding to differ in
    assert vmapped.plan.peak_bytes > 1.5 * floor
    budget = Predictive(model, draws, exact=False, memory_budget=int(1.5 * floor), **options)
    budget(KEY, x)
    assert budget.plan.strategy == "chunked" and budget.plan.peak_bytes <= 1.5 * floor


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices")
def test_draws_split_over_devices_stay_split(posteriors):
    model, args = MODELS["hierarchical"]
    mesh = Mesh(np.array(jax.devices()[:2]), ("chain",))
    sharding = NamedSharding(mesh, PartitionSpec("chain"))
    draws = {
        k: jax.device_put(v, sharding)
        for k, v in _batched(posteriors("hierarchical")[0], 2).items()
    }
    predictive = Predictive(model, draws, batch_ndims=2)
    ours = predictive(KEY, *args)
    assert predictive.plan.n_devices == 2
    assert ours["y"].sharding.is_equivalent_to(sharding, ours["y"].ndim)
    assert_identical(ours, NumpyroPredictive(model, draws, batch_ndims=2)(KEY, *args))


def test_a_second_call_compiles_nothing_and_new_data_are_seen(posteriors, monkeypatch):
    model, (x,) = MODELS["deterministic_sites"]
    draws = posteriors("deterministic_sites")[0]
    data = np.asarray(x).copy()
    predictive = Predictive(model, draws, postprocessing_vectorize="vmap")
    first = predictive(KEY, data)
    compiles = count_compiles(monkeypatch)
    assert_identical(predictive(KEY, data), first)
    assert compiles[0] == 0
    data[:5] += 1.0  # the same numpy array, changed in place: new numbers
    changed = predictive(KEY, data)
    assert not np.array_equal(changed["mu"], first["mu"])
    assert_identical(changed, NumpyroPredictive(model, draws)(KEY, data))


@pytest.mark.parametrize("cores", [1, 3])
def test_lanes_on_every_core_give_numpyros_numbers(posteriors, monkeypatch, cores):
    """The one-draw loop on a CPU streams its chunks from a thread per core (`lanes`): each
    draw computed by the same program, so the numbers do not change; the predictions are
    jax arrays on the draws' device, as numpyro's."""
    monkeypatch.setattr(_resources, "cpu_cores", lambda: cores)
    model, args = MODELS["hierarchical"]
    draws = posteriors("hierarchical")[0]
    predictive = Predictive(model, draws)
    ours = predictive(KEY, *args)
    assert predictive.plan.lanes == cores
    assert predictive.plan.output_memory == ("host" if cores > 1 else "device")
    assert all(isinstance(v, jax.Array) for v in ours.values())
    assert_identical(ours, NumpyroPredictive(model, draws)(KEY, *args))
    vectorised = Predictive(model, draws, exact=False)
    vectorised(KEY, *args)
    assert vectorised.plan.lanes == 1  # XLA runs a vectorised chunk on every core itself


def test_outputs_are_reshaped_without_a_copy(posteriors):
    """A batch_ndims=1 output comes out of the engine as (1, N, ...) and is reshaped into its
    own buffer (donated); the caller's draws are untouched."""
    y = jnp.ones((1, 24, 60))
    where = y.unsafe_buffer_pointer()
    out = _draws.unbatch(y, (24,), forwarded=False)
    assert out.shape == (24, 60) and out.unsafe_buffer_pointer() == where
    passed = jnp.ones((1, 24, 3))
    assert _draws.unbatch(passed, (24,), forwarded=True).shape == (24, 3)
    assert not passed.is_deleted()


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_size": 0}, "`chunk_size` must be a positive int"),
        ({"postprocessing_vectorize": "fast"}, "Unknown `postprocessing_vectorize='fast'`"),
        ({"memory_budget": -1}, "`memory_budget` must be a positive number"),
        ({"output_memory": "disk"}, "needs `output_path`"),
        ({"output_memory": "tape"}, "`output_memory` must be one of"),
        ({"progressbar": "yes"}, "`progressbar` must be True or False"),
        ({"batch_ndims": -1}, "`batch_ndims` must be a non-negative int"),
        ({"batch_ndims": 3}, r"`posterior_samples\['a'\]` has shape \(24,\): fewer axes"),
        ({"return_sites": "y"}, "`return_sites` must be a list"),
        ({"num_samples": 0}, "`num_samples` must be a positive int"),
        ({"params": [1]}, "`params` must be a dict"),
    ],
)
def test_bad_options_raise_before_any_work(posteriors, kwargs, match):
    model = MODELS["deterministic_sites"][0]
    draws = posteriors("deterministic_sites")[0]
    with pytest.raises(ValueError, match=match):
        Predictive(model, draws, **kwargs)


def test_bad_draws_and_keys_raise_naming_the_argument(posteriors):
    model, args = MODELS["deterministic_sites"]
    draws = posteriors("deterministic_sites")[0]
    before = {k: np.asarray(v).copy() for k, v in draws.items()}
    uneven = dict(draws, b=draws["b"][:5])
    with pytest.raises(
        ValueError,
        match=r"Batch shapes at `posterior_samples\['b'\]` and `posterior_samples\['a'\]`",
    ):
        Predictive(model, uneven)
    with pytest.raises(ValueError, match=r"`posterior_samples\['a'\]\[0\]` must be an array"):
        Predictive(model, {"a": [1.0, 2.0]})
    with pytest.raises(ValueError, match="`exact` must be True or False"):
        log_likelihood(model, draws, *args, exact=None)
    with pytest.raises(ValueError, match="`posterior_samples` must be a dict"):
        log_likelihood(model, [draws["a"]], *args)
    with pytest.raises(ValueError, match="`model` must be a callable"):
        Predictive("model", draws)
    with pytest.raises(ValueError, match="Only one of guide or posterior_samples"):
        Predictive(model, draws, guide=model)
    with pytest.raises(ValueError, match="Either posterior_samples or num_samples"):
        Predictive(model)
    for key in (0, jnp.zeros(3, jnp.uint32), jax.random.split(KEY, 2)):
        with pytest.raises(ValueError, match="`rng_key` must be one PRNG key"):
            Predictive(model, draws)(key, *args)
    for name, value in draws.items():
        assert not value.is_deleted()
        np.testing.assert_array_equal(np.asarray(value), before[name])


def test_importing_the_package_does_not_import_numpyro():
    code = "import sys, pymc_chunkpost; assert 'numpyro' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_numpyro_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpyro", None)  # `import numpyro` fails, as if absent
    monkeypatch.delitem(sys.modules, "pymc_chunkpost.numpyro")
    with pytest.raises(ImportError, match=r'pip install "pymc-chunkpost\[numpyro\]"'):
        importlib.import_module("pymc_chunkpost.numpyro")


# --- slow: every model, strategy and batch shape --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "options"), STRATEGIES)
@pytest.mark.parametrize("batch_ndims", [1, 2])
@pytest.mark.parametrize("name", [*FAST, "poisson"])
def test_every_model_strategy_and_batch_shape(posteriors, name, batch_ndims, strategy, options):
    model, args = MODELS[name]
    draws, y = posteriors(name)
    draws = _batched(draws, batch_ndims)
    options = {"postprocessing_vectorize": strategy, **options}
    ours = Predictive(model, draws, batch_ndims=batch_ndims, **options)(KEY, *args)
    assert_identical(ours, NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, *args))
    ours = log_likelihood(model, draws, *args, y=y, batch_ndims=batch_ndims, **options)
    theirs = numpyro_log_likelihood(model, draws, *args, y=y, batch_ndims=batch_ndims)
    assert_identical(ours, theirs)


@pytest.mark.parametrize("name", ["eight_schools", "regression"])
def test_exact_false_vectorises_and_may_round_apart(posteriors, name):
    """Where a chunk of draws computed together rounds apart from numpyro's loop: data that
    multiply the draws' noise (eight schools: XLA reassociates `(z * sqrt2) * sigma` when
    `sigma` is broadcast over draws) and a design matrix of 50 columns (a matrix-matrix
    kernel sums in another order than the matrix-vector one). `exact=True` (the default)
    gives numpyro's bits at any chunk size; `exact=False` agrees within float rounding."""
    model, args = MODELS[name]
    draws = posteriors(name)[0]
    theirs = NumpyroPredictive(model, draws)(KEY, *args)
    options = {"postprocessing_vectorize": "chunked", "chunk_size": 5}
    assert_identical(Predictive(model, draws, **options)(KEY, *args), theirs)
    vectorised = Predictive(model, draws, exact=False, **options)(KEY, *args)
    np.testing.assert_allclose(vectorised["y"], theirs["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices")
def test_parallel_chains_from_mcmc_stay_on_their_devices():
    """`chain_method="parallel"` leaves each chain on its own device: the predictions are
    computed there, stay split as the draws are, and equal numpyro's."""
    from numpyro.infer import MCMC, NUTS

    model, (x,) = MODELS["deterministic_sites"]
    mcmc = MCMC(
        NUTS(model),
        num_warmup=20,
        num_samples=DRAWS,
        num_chains=2,
        chain_method="parallel",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), x, 0.5 + 2.0 * x)
    for batch_ndims, draws in ((2, mcmc.get_samples(group_by_chain=True)), (1, mcmc.get_samples())):
        assert len(draws["a"].sharding.device_set) == 2
        predictive = Predictive(model, draws, batch_ndims=batch_ndims)
        ours = predictive(KEY, x)
        assert predictive.plan.n_devices == 2
        assert len(ours["y"].sharding.device_set) == 2
        assert_identical(ours, NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, x))
