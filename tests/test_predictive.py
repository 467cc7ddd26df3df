"""The predictive route: `sample_posterior_predictive` against pymc's own.

Structure (groups, names, dims, coords, dtypes, attrs bar the creation time) and the rules of
which variables are drawn anew are compared with pymc's own function on the installed pymc.
Random outputs are tested as distributions: two-sample tests per element against pymc's
draws (KS for continuous, chi-square for discrete, Holm-corrected; `slow`), exact tests of
the conditional law at a single posterior point, exact reproducibility for a seed whatever
the strategy and chunk size, and a test that fails on pytensor's own Categorical sampler.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
xr = pytest.importorskip("xarray")
stats = pytest.importorskip("scipy.stats")

import predictive_models as models  # noqa: E402
from two_sample import holm_rejects, two_sample_p_values  # noqa: E402

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._engine.call import postprocess as _postprocess  # noqa: E402
from pymc_chunkpost._pymc import forward_graph as _forward_graph  # noqa: E402
from pymc_chunkpost._pymc import predictive as _predictive  # noqa: E402
from pymc_chunkpost._pymc import samplers as _samplers  # noqa: E402

PYMC6 = models.PYMC6
PYMC = _predictive._pymc_function()  # pymc's own, never patched
OURS = pymc_chunkpost.sample_posterior_predictive


@pytest.fixture(scope="module")
def hierarchical():
    model = models.hierarchical()
    return model, models.posterior(model, chains=2, draws=12)


@pytest.fixture
def runs(monkeypatch):
    """The engine's runs in this test (the route must use it, and nothing may fall back)."""
    calls = []
    run = _postprocess.run

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return run(*args, **kwargs)

    monkeypatch.setattr(_postprocess, "run", counted)
    return calls


def dataset(group):
    return group.to_dataset() if hasattr(group, "to_dataset") else group


def groups(idata) -> list[str]:
    return list(idata.children) if PYMC6 else list(idata.groups())


def assert_same_structure(ours, theirs, random_groups=("posterior_predictive", "predictions")):
    """Same groups, names (in order), dims, shapes, dtypes, coords and attrs (bar the creation
    time); the groups that are not drawn hold the same values."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for name in theirs:
            assert ours[name].shape == theirs[name].shape, name
            assert ours[name].dtype == theirs[name].dtype, name
        return
    assert type(ours) is type(theirs)
    assert groups(ours) == groups(theirs)
    for group in groups(theirs):
        a, b = dataset(ours[group]), dataset(theirs[group])
        assert list(a.data_vars) == list(b.data_vars), group
        for name in b.data_vars:
            assert a[name].dims == b[name].dims, (group, name)
            assert a[name].shape == b[name].shape, (group, name)
            assert a[name].dtype == b[name].dtype, (group, name)
            if group not in random_groups:
                np.testing.assert_array_equal(a[name].values, b[name].values)
        xr.testing.assert_identical(xr.Dataset(coords=a.coords), xr.Dataset(coords=b.coords))
        drop = {"created_at"}
        assert {k: v for k, v in a.attrs.items() if k not in drop} == {
            k: v for k, v in b.attrs.items() if k not in drop
        }, group


def copy_idata(idata):
    return models.with_posterior(idata, dataset(idata["posterior"]).copy(deep=True))


ARGUMENTS = [
    {},
    {"extend_inferencedata": True},
    {"return_inferencedata": False},
    {"var_names": ["mu", "y"]},
    {"var_names": ["a"]},
    {"idata_kwargs": {"coords": {"obs": np.arange(100, 160)}}},
]


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=lambda a: ",".join(a) or "default")
def test_structure_equals_pymc(hierarchical, runs, arguments):
    model, idata = hierarchical
    theirs = PYMC(copy_idata(idata), model=model, progressbar=False, random_seed=1, **arguments)
    ours = OURS(copy_idata(idata), model=model, progressbar=False, random_seed=1, **arguments)
    copied_only = PYMC6 and arguments.get("var_names") == ["a"]  # pymc 6 copies `a`
    assert len(runs) == (0 if copied_only else 1)
    assert_same_structure(ours, theirs)


def test_dataset_trace_and_other_sample_dims(hierarchical, runs):
    """A posterior `Dataset` with one sample dim, as pymc takes it."""
    model, idata = hierarchical
    post = dataset(idata["posterior"])
    stacked = xr.Dataset(
        {
            name: (("sample", *da.dims[2:]), da.values.reshape(-1, *da.shape[2:]))
            for name, da in post.data_vars.items()
        },
        coords={"sample": np.arange(24), "group": post.group, "obs": post.obs},
    )
    kwargs = dict(model=model, sample_dims=["sample"], progressbar=False, random_seed=2)
    assert_same_structure(OURS(stacked, **kwargs), PYMC(stacked, **kwargs))
    assert len(runs) == 1
    # No device named: small work on an accelerator may run on the host CPU.
    assert runs[0]["small_on_host"] is True


def test_list_of_points(hierarchical, runs):
    model, idata = hierarchical
    post = dataset(idata["posterior"])
    points = [
        {name: post[name].values[0, i] for name in post.data_vars}
        for i in range(post.sizes["draw"])
    ]
    kwargs = dict(model=model, progressbar=False, random_seed=3)
    assert_same_structure(OURS(points, **kwargs), PYMC(points, **kwargs))


def test_out_of_sample_predictions_after_set_data(runs):
    """`pm.set_data` with a new length, then `predictions=True`, extending the trace."""
    model = models.hierarchical()
    idata = models.posterior(model, chains=2, draws=12)
    rng = np.random.default_rng(5)
    new_x, new_group = rng.normal(size=9), rng.integers(0, 5, size=9)
    with model:
        pm.set_data({"x": new_x, "group_idx": new_group}, coords={"obs": np.arange(60, 69)})
        kwargs = dict(predictions=True, extend_inferencedata=True, progressbar=False)
        theirs = PYMC(copy_idata(idata), random_seed=4, **kwargs)
        ours = OURS(copy_idata(idata), random_seed=4, **kwargs)
    assert_same_structure(ours, theirs)
    predicted = dataset(ours["predictions"])
    assert predicted["y"].shape == (2, 12, 9)
    # The draws follow the new data: y = a[group] + b x + noise, at each posterior draw.
    post = dataset(idata["posterior"])
    mean = post["a"].values[..., new_group] + post["b"].values[..., None] * new_x
    residual = (predicted["y"].values - mean) / post["sigma"].values[..., None]
    assert stats.kstest(residual.reshape(-1), stats.norm().cdf).pvalue > 1e-3


# --- which variables are drawn anew: pymc's rules ---------------------------------------


def sampled(caplog, function, *args, **kwargs):
    """The result, and the variables the function says it samples ("Sampling: [...]")."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pymc"):
        result = function(*args, **kwargs)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Sampling")]
    assert len(lines) == 1, lines
    return result, lines[0]


RULES_V5 = [{}, {"var_names": ["y"]}, {"var_names": ["a", "y"]}, {"var_names": ["mu"]}]
RULES_V6 = [
    {},
    {"var_names": ["mu", "a"]},
    {"sample_vars": ["a"], "var_names": ["a", "mu", "y"]},
    {"sample_vars": ["mu_a", "a"]},
    {"sample_vars": ["sigma"], "freeze_vars": ["a"], "var_names": ["y", "a"]},
]


@pytest.mark.parametrize("arguments", RULES_V6 if PYMC6 else RULES_V5, ids=str)
def test_resampled_variables_follow_pymc(hierarchical, caplog, arguments):
    """The same variables drawn anew as pymc's own, and the others copied from the trace."""
    model, idata = hierarchical
    kwargs = dict(model=model, progressbar=False, random_seed=6, return_inferencedata=False)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        theirs, theirs_line = sampled(caplog, PYMC, copy_idata(idata), **kwargs, **arguments)
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        ours, ours_line = sampled(caplog, OURS, copy_idata(idata), **kwargs, **arguments)
    assert ours_line == theirs_line
    assert [str(w.message) for w in ours_warned] == [str(w.message) for w in theirs_warned]
    post = dataset(idata["posterior"])
    drawn = theirs_line.removeprefix("Sampling: [").removesuffix("]").split(", ")
    for name in theirs:
        assert ours[name].shape == theirs[name].shape
        if name in post and name not in drawn and post[name].dims[-1] != "obs":
            np.testing.assert_array_equal(ours[name], post[name].values)


@pytest.mark.skipif(not PYMC6, reason="ImplicitFreezeWarning is pymc 6's")
def test_implicit_freeze_warning_as_pymc():
    """pymc 6 keeps trace variables downstream of changed data, and warns that it does."""
    model = models.hierarchical()
    idata = models.posterior(model, chains=2, draws=12)
    with model:
        pm.set_data({"x": np.zeros(60)})
        caught = {}
        for name, function in (("theirs", PYMC), ("ours", OURS)):
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                function(copy_idata(idata), var_names=["mu", "y"], progressbar=False)
            caught[name] = [(w.category, str(w.message)) for w in record]
    assert caught["ours"] == caught["theirs"]


# --- numbers: seeds, chunks, strategies --------------------------------------------------


STRATEGY_OPTIONS = [
    {"postprocessing_vectorize": "vmap"},
    {"postprocessing_vectorize": "scan"},
    {"postprocessing_vectorize": "chunked", "chunk_size": 1},
    {"postprocessing_vectorize": "chunked", "chunk_size": 7},
    {"postprocessing_vectorize": "chunked", "n_chunks": 2, "output_memory": "host"},
]


def test_same_seed_same_numbers_whatever_the_plan(hierarchical, runs):
    model, idata = hierarchical
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False)
    reference = OURS(idata, random_seed=11, **kwargs)["y"]
    for options in STRATEGY_OPTIONS:
        np.testing.assert_array_equal(
            OURS(idata, random_seed=11, **kwargs, **options)["y"], reference
        )
    again = OURS(idata, random_seed=np.random.default_rng(11), **kwargs)["y"]
    other = OURS(idata, random_seed=12, **kwargs)["y"]
    assert not np.array_equal(other, reference)
    assert not np.array_equal(again, other)
    # No two draws share a stream: every value is distinct.
    assert len(np.unique(reference)) == reference.size


def test_draws_are_exact_and_their_functions_equal_up_to_the_order_of_sums():
    """The draws depend on the seed and the draw's index alone, bit for bit; a function of
    several draws (`m`, a mean over 200 rows) is computed by XLA in a program whose shape
    follows the plan, and may sum in another order: equal to the rounding of that sum
    (README, docs/predictive.md)."""
    rows = 200
    with pm.Model() as model:
        y = pm.Normal("y", pm.Normal("mu"), 1.0, shape=rows)
        pm.Deterministic("m", y.mean())
    idata = models.posterior(model, chains=4, draws=50)

    def predict(**options):
        out = OURS(
            idata,
            model=model,
            var_names=["y", "m"],
            random_seed=3,
            progressbar=False,
            return_inferencedata=False,
            **options,
        )
        return np.asarray(out["y"]), np.asarray(out["m"])

    y, m = predict()
    assert y.dtype == m.dtype == np.float64
    bound = rows * np.finfo(np.float64).eps * np.abs(y).max()
    np.testing.assert_allclose(m, y.mean(-1), rtol=0, atol=bound)
    for options in STRATEGY_OPTIONS:
        y_plan, m_plan = predict(**options)
        np.testing.assert_array_equal(y_plan, y, err_msg=str(options))
        np.testing.assert_allclose(m_plan, m, rtol=0, atol=bound, err_msg=str(options))


def test_keys_are_jax_seeds_of_the_seed_and_the_draw():
    """With threefry, generator `j` of draw `i` uses `jax.random.key(seed * 2**32 + i * n +
    j)`: JAX's own seeding, one distinct seed per (draw, generator)."""
    import jax

    from pymc_chunkpost._pymc.graph import RandomFunction

    seen = []
    graph = RandomFunction(lambda keys: [jax.random.key_data(keys)], 3)
    fn = _forward_graph._per_draw(graph, "threefry2x32")
    for i in (0, 1, 7):
        (got,) = fn(np.array([12345, i], np.uint32))
        for j in range(3):
            want = jax.random.key_data(jax.random.key(12345 * 2**32 + i * 3 + j))
            np.testing.assert_array_equal(got[j], want)
            seen.append(tuple(np.asarray(got[j])))
    assert len(set(seen)) == len(seen)


def test_another_prng_implementation(hierarchical, runs):
    """Under JAX's `rbg` implementation the route draws as well, reproducibly, other numbers."""
    import jax

    model, idata = hierarchical
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False, random_seed=4)
    threefry = OURS(idata, **kwargs)["y"]
    previous = jax.config.values["jax_default_prng_impl"]
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        first, second = OURS(idata, **kwargs)["y"], OURS(idata, **kwargs)["y"]
    finally:
        jax.config.update("jax_default_prng_impl", previous)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, threefry)
    residual = (first - dataset(idata["posterior"])["mu"].values) / dataset(idata["posterior"])[
        "sigma"
    ].values[..., None]
    assert stats.kstest(residual.reshape(-1), stats.norm().cdf).pvalue > 1e-3


def test_draws_are_iid_from_the_conditional_law_at_one_point(runs):
    """Every posterior draw set to one point: the draws of each element are iid N(mu_i,
    sigma), tested exactly (KS against the law, Holm-corrected) and for independence."""
    model = models.hierarchical()
    idata = models.posterior(model, chains=4, draws=250)
    post = dataset(idata["posterior"])
    point = post.isel(chain=[0], draw=[0])
    constant = xr.concat([point] * 1000, dim="draw").assign_coords(draw=np.arange(1000))
    constant = xr.concat([constant.isel(chain=0)] * 4, dim="chain").assign_coords(chain=range(4))
    constant = constant.transpose("chain", "draw", ...)
    draws = OURS(
        constant, model=model, progressbar=False, random_seed=8, return_inferencedata=False
    )
    y = draws["y"].reshape(4000, -1)
    mean = point["mu"].values.reshape(-1)
    sigma = float(point["sigma"].values.reshape(()))
    p_values = [stats.kstest(y[:, i], stats.norm(mean[i], sigma).cdf).pvalue for i in range(60)]
    assert holm_rejects(p_values, alpha=1e-3) == []
    z = (y - mean) / sigma
    lag_one = np.corrcoef(z[:-1].reshape(-1), z[1:].reshape(-1))[0, 1]
    across = np.corrcoef(z[:, :-1].reshape(-1), z[:, 1:].reshape(-1))[0, 1]
    assert abs(lag_one) < 0.01 and abs(across) < 0.01  # 240,000 pairs: sd 0.002
    assert len(np.unique(y)) == y.size


# --- never a wrong distribution ------------------------------------------------------------


CATEGORY_P = np.array([0.05, 0.1, 0.85])


def categorical_p_value(n_draws=4000) -> float:
    """Chi-square of the route's Categorical draws at p = CATEGORY_P against p itself."""
    model = models.categorical()
    point = xr.Dataset(
        {"w": (("chain", "draw", "w_dim_0"), np.broadcast_to(CATEGORY_P, (1, n_draws, 3)))},
        coords={"chain": [0], "draw": np.arange(n_draws)},
    )
    draws = OURS(point, model=model, progressbar=False, random_seed=9, return_inferencedata=False)
    counts = np.bincount(draws["y"].reshape(-1), minlength=3)
    return stats.chisquare(counts, CATEGORY_P * counts.sum()).pvalue


def test_categorical_draws_from_p(runs):
    assert categorical_p_value() > 1e-3


def test_the_categorical_test_fails_on_pytensors_sampler(monkeypatch, runs):
    """pytensor's JAX Categorical (up to 3.3.8) draws from softmax(logit(p)); the same test
    must reject it. (Our dispatch is swapped for pytensor's own, for this test only.)"""
    import pytensor.tensor.random.basic as ptr
    from pytensor.link.jax.dispatch.random import jax_sample_fn

    def upstream(op):
        sample = jax_sample_fn(op, node=None)
        return lambda key, shape, dtype, p: sample(key, shape, dtype, p).astype(dtype)

    _samplers.sampler_for(ptr.categorical)  # fill the table
    monkeypatch.setitem(_samplers.SAMPLERS, ptr.CategoricalRV, upstream)
    pymc_chunkpost.clear_caches()
    try:
        assert categorical_p_value() < 1e-6
    finally:
        pymc_chunkpost.clear_caches()


def custom_dist_model():
    def random(mu, rng=None, size=None):
        return rng.normal(mu, 1.0, size=size)

    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.CustomDist(
            "custom", mu, random=random, logp=lambda v, mu: -((v - mu) ** 2), observed=np.zeros(3)
        )
    return model


def test_unsupported_variable_runs_pymcs_own_with_a_warning(runs):
    model = custom_dist_model()
    idata = models.posterior(model, chains=2, draws=5)
    kwargs = dict(model=model, progressbar=False, random_seed=10, return_inferencedata=False)
    with pytest.warns(UserWarning, match=r"runs pymc's own function \(no JAX sampler for `custom`"):
        ours = OURS(copy_idata(idata), **kwargs)
    np.testing.assert_array_equal(ours["custom"], PYMC(copy_idata(idata), **kwargs)["custom"])
    assert runs == []


def test_non_jax_compile_mode_runs_pymcs_own(hierarchical, runs, caplog):
    """pymc's compile, when asked for, runs pymc's own function: logged at INFO, not warned."""
    model, idata = hierarchical
    arguments = {"backend": "c"} if PYMC6 else {"compile_kwargs": {"mode": "FAST_RUN"}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as pymc's own tests run
        with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
            OURS(copy_idata(idata), model=model, progressbar=False, **arguments)
    assert runs == []
    assert any("is not JAX" in r.message and r.levelno == logging.INFO for r in caplog.records)


# --- bad input -----------------------------------------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Fail if the engine is reached: a bad input must be refused before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the engine ran")

    monkeypatch.setattr(_postprocess, "run", refuse)


BAD = [
    ({"var_names": ["nope"]}, ValueError, r"`var_names` has \['nope'\]"),
    ({"chunk_size": 0, "postprocessing_vectorize": "chunked"}, ValueError, "chunk_size"),
    ({"postprocessing_vectorize": "nope"}, ValueError, "Unknown `postprocessing_vectorize"),
    ({"output_memory": "disk"}, ValueError, "output_memory"),
    ({"sample_dims": ["chain", "sample"]}, ValueError, r"names \['sample'\]"),
    ({"sample_dims": "chain"}, ValueError, "sequence of dimension names"),
]
if not PYMC6:
    BAD.append(({"sample_vars": ["a"]}, TypeError, "has no `sample_vars`"))


@pytest.mark.parametrize(("arguments", "error", "match"), BAD, ids=str)
def test_bad_input_raises_before_any_work(hierarchical, no_work, arguments, error, match):
    model, idata = hierarchical
    with pytest.raises(error, match=match):
        OURS(copy_idata(idata), model=model, progressbar=False, **arguments)


def test_trace_with_other_shapes(hierarchical, no_work):
    """A trace's `a` shorter than the groups that index it: pymc raises IndexError, and so
    does the route, before any work (JAX would clamp the index). A variable's rank, and a
    length fixed in its type, are checked as pymc's compiled function checks them."""
    model, idata = hierarchical
    post = dataset(idata["posterior"]).drop_vars(["mu"])  # so that `a` is needed
    short = post.assign(a=(("chain", "draw", "three"), post["a"].values[..., :3]))
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 3"):
        OURS(models.with_posterior(idata, short), model=model, progressbar=False)
    matrix = post.assign(a=(("chain", "draw", "g", "h"), post["a"].values[..., None]))
    with pytest.raises(ValueError, match=r"The trace's 'a' has shape \(5, 1\)"):
        OURS(models.with_posterior(idata, matrix), model=model, progressbar=False)


def test_variables_missing_from_the_trace_are_drawn_as_pymc_draws_them(hierarchical, caplog):
    model, idata = hierarchical
    trimmed = models.with_posterior(idata, dataset(idata["posterior"]).drop_vars(["sigma"]))
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False)
    _, theirs = sampled(caplog, PYMC, trimmed, **kwargs)
    _, ours = sampled(caplog, OURS, trimmed, **kwargs)
    assert ours == theirs and "sigma" in ours


# --- patch ---------------------------------------------------------------------------------


def multitrace(model, idata):
    """The posterior of `idata` as pymc's `MultiTrace` (one `NDArray` per chain)."""
    from pymc.backends.base import MultiTrace

    post = dataset(idata["posterior"])
    straces = []
    for chain in range(post.sizes["chain"]):
        strace = pm.backends.NDArray(model=model, vars=model.free_RVs)
        strace.setup(post.sizes["draw"], chain)
        values = {name: post[name].values[chain] for name in strace.varnames}
        if PYMC6:
            strace.values = values
        else:
            strace.samples = values
        strace.draw_idx = post.sizes["draw"]
        straces.append(strace)
    return MultiTrace(straces)


def records(caplog, function, *args, **kwargs):
    """(logger, level, message) of every record at INFO and above while `function` runs, as
    pymc's tests read them; the messages of `pymc_chunkpost`'s records at any level; the
    warnings, as (category, message)."""
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG):
        warnings.simplefilter("always")
        function(*args, **kwargs)
    loud = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= 20]
    said = [r.getMessage() for r in caplog.records if r.name == "pymc_chunkpost"]
    return loud, said, [(w.category, str(w.message)) for w in caught]


def test_multitrace_hand_over_logs_as_pymc(hierarchical, runs, caplog):
    """pymc's own function is the route for a `MultiTrace`: patched, the records at INFO and
    above are pymc's own (pymc's `test_logging_sampled_basic_rvs_posterior_mutable`), the
    hand-over is said at DEBUG, and nothing is warned."""
    model, idata = hierarchical
    trace = multitrace(model, idata)
    kwargs = dict(model=model, progressbar=False, random_seed=3, return_inferencedata=False)
    theirs, _, their_warnings = records(caplog, pm.sample_posterior_predictive, trace, **kwargs)
    sampled_by_pymc = "Sampling: [y]" if PYMC6 else "Sampling: [a, y]"  # pymc 5: `a`'s dim
    assert theirs == [("pymc.sampling.forward", logging.INFO, sampled_by_pymc)]
    with pymc_chunkpost.patched(posterior_predictive=True):
        ours, said, our_warnings = records(caplog, pm.sample_posterior_predictive, trace, **kwargs)
    direct, said_direct, direct_warnings = records(caplog, OURS, trace, **kwargs)
    assert ours == theirs and direct == theirs
    assert our_warnings == their_warnings and direct_warnings == their_warnings
    assert (
        said
        == said_direct
        == ["`sample_posterior_predictive` runs pymc's own function (the trace is a MultiTrace)."]
    )
    assert runs == []


def test_patched_fallback_that_costs_speed_warns(runs, caplog):
    """A random variable with no JAX sampler: patched, one WARNING record on the
    `pymc_chunkpost` logger before pymc's own "Sampling" line (not a `UserWarning`)."""
    model = custom_dist_model()
    idata = models.posterior(model, chains=2, draws=5)
    kwargs = dict(model=model, progressbar=False, random_seed=10, return_inferencedata=False)
    with pymc_chunkpost.patched(posterior_predictive=True):
        loud, _, caught = records(
            caplog, pm.sample_posterior_predictive, copy_idata(idata), **kwargs
        )
    assert not [message for _, message in caught if "pymc_chunkpost" in message]
    assert loud == [
        (
            "pymc_chunkpost",
            logging.WARNING,
            "pymc_chunkpost: `sample_posterior_predictive` runs pymc's own function (no JAX "
            "sampler for `custom` (CustomDist_custom)).",
        ),
        ("pymc.sampling.forward", logging.INFO, "Sampling: [custom]"),
    ]
    assert runs == []


def test_patch_routes_only_when_asked(hierarchical, runs, caplog):
    import pymc.sampling.forward as forward

    model, idata = hierarchical
    kwargs = dict(model=model, progressbar=False, random_seed=12, return_inferencedata=False)
    with pymc_chunkpost.patched():
        assert pm.sample_posterior_predictive is PYMC
    with pymc_chunkpost.patched(posterior_predictive=True):
        assert forward.sample_posterior_predictive is not PYMC
        ours = pm.sample_posterior_predictive(copy_idata(idata), **kwargs, chunk_size=5)
        assert runs and runs[-1]["chunk_size"] == 5
        np.testing.assert_array_equal(ours["y"], OURS(copy_idata(idata), **kwargs)["y"])
        mode = {"backend": "c"} if PYMC6 else {"compile_kwargs": {"mode": "FAST_RUN"}}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback the user asked for logs, not warns
            with caplog.at_level(logging.INFO, logger="pymc_chunkpost"):
                pm.sample_posterior_predictive(copy_idata(idata), **kwargs, **mode)
        (record,) = [r for r in caplog.records if "runs pymc's own function" in r.message]
        assert record.levelno == logging.INFO
    assert pm.sample_posterior_predictive is PYMC and forward.sample_posterior_predictive is PYMC


# --- slow: the same distribution as pymc's, on real models ----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(models.MODELS))
def test_same_distribution_as_pymc(name):
    model = models.MODELS[name]()
    # pymc's seed is not the posterior's: pymc's streams for one seed would repeat the very
    # numbers that drew the posterior, and its draws would not be independent of it.
    idata = models.posterior(model, chains=4, draws=500, seed=2)
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False)
    ours = OURS(copy_idata(idata), random_seed=101, **kwargs)
    theirs = PYMC(copy_idata(idata), random_seed=102, **kwargs)
    assert list(ours) == list(theirs)
    p_values = []
    for variable in theirs:
        assert ours[variable].shape == theirs[variable].shape
        assert ours[variable].dtype == theirs[variable].dtype
        n = ours[variable].shape[0] * ours[variable].shape[1]
        p_values += two_sample_p_values(
            ours[variable].reshape(n, -1), theirs[variable].reshape(n, -1)
        )
    assert holm_rejects(p_values, alpha=1e-3) == []


@pytest.mark.slow
def test_same_seed_same_numbers_through_a_scan():
    """The AR's random variable is a Scan: its keys too depend on the draw alone."""
    model = models.ar()
    idata = models.posterior(model, chains=2, draws=20)
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False, random_seed=3)
    reference = OURS(idata, **kwargs)["y"]
    for options in STRATEGY_OPTIONS[1:4]:
        np.testing.assert_array_equal(OURS(idata, **kwargs, **options)["y"], reference)


def test_the_progress_bar_says_what_is_drawn(hierarchical, capsys):
    """The bar names the variables drawn, not the posterior transform's label."""
    model, idata = hierarchical
    OURS(
        copy_idata(idata),
        model=model,
        var_names=["y"],
        progressbar=True,
        random_seed=1,
        return_inferencedata=False,
        postprocessing_vectorize="chunked",
        chunk_size=100,
    )
    err = capsys.readouterr().err
    assert "Sampling y" in err and "Transforming variables" not in err


def test_the_route_says_its_draws_are_random(hierarchical, runs):
    """The engine is told the program draws random numbers (`Problem.random`: a host loop
    of chunks on a CPU, `_sizing.loop_for`)."""
    model, idata = hierarchical
    OURS(idata, model=model, progressbar=False, random_seed=1, postprocessing_vectorize="auto")
    assert runs and all(call["random"] is True for call in runs)


def test_wider_vectors_change_no_number(hierarchical, runs, monkeypatch):
    """Random draws on a CPU compile with `random_vector_width` (XLA's preferred vector
    width): it changes how the draws are computed, never the numbers; 0 compiles with XLA's
    default."""
    from pymc_chunkpost._engine.execute import executor as _executor
    from pymc_chunkpost._support.compat import PREFER_VECTOR_WIDTH
    from pymc_chunkpost._support.config import configured

    options = []
    real = _executor._compile_step

    def recorded(lowered, compiler_options):
        options.append(dict(compiler_options))
        return real(lowered, compiler_options)

    monkeypatch.setattr(_executor, "_compile_step", recorded)
    model, idata = hierarchical
    kwargs = dict(model=model, progressbar=False, return_inferencedata=False, random_seed=5)
    pymc_chunkpost.clear_caches()
    wide = OURS(idata, **kwargs)["y"]
    assert options and all(o.get(PREFER_VECTOR_WIDTH) == 512 for o in options)
    options.clear()
    pymc_chunkpost.clear_caches()
    with configured(random_vector_width=0):
        default = OURS(idata, **kwargs)["y"]
    assert options and all(PREFER_VECTOR_WIDTH not in o for o in options)
    np.testing.assert_array_equal(wide, default)
