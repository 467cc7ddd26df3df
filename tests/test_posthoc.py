"""The post-hoc route: `compute_log_likelihood`, `compute_log_prior`, `compute_deterministics`.

Each result is compared with pymc's own function (its default backend) on real models and
a small seeded posterior (2 chains x 7 draws): values within 1e-12, and the same groups,
names, dims, coords, dtypes and attrs (all but the creation time).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
xr = pytest.importorskip("xarray")

import models  # noqa: E402

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._engine.call import postprocess as _postprocess  # noqa: E402
from pymc_chunkpost._pymc import posthoc as _posthoc  # noqa: E402

PYMC6 = int(pm.__version__.split(".")[0]) >= 6
CHAINS, DRAWS = 2, 7
FUNCTIONS = ("compute_log_likelihood", "compute_log_prior", "compute_deterministics")
PYMC = {name: _posthoc._pymc(name) for name in FUNCTIONS}  # pymc's own, never patched
OURS = {name: getattr(pymc_chunkpost, name) for name in FUNCTIONS}


def counts() -> pm.Model:
    """Integer observations (Poisson, Binomial) indexed by rows, with coords."""
    rng = np.random.default_rng(3)
    group = rng.integers(0, 4, size=40)
    with pm.Model(coords={"group": list("abcd"), "row": range(40)}) as model:
        rate = pm.Gamma("rate", 2.0, 1.0, dims="group")
        p = pm.Beta("p", 2.0, 3.0)
        pm.Poisson("events", rate[group], observed=rng.poisson(2.0, size=40), dims="row")
        pm.Binomial("hits", n=10, p=p, observed=rng.binomial(10, 0.3, size=40), dims="row")
        pm.Deterministic("total_rate", rate.sum())
    return model


def mvnormal() -> pm.Model:
    """A multivariate likelihood (MvNormal with an LKJ Cholesky factor)."""
    rng = np.random.default_rng(4)
    with pm.Model(coords={"obs": range(25), "axis": ["x", "y", "z"]}) as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        mu = pm.Normal("mu", dims="axis")
        pm.MvNormal("y", mu, chol=chol, observed=rng.normal(size=(25, 3)), dims=("obs", "axis"))
    return model


def eight_schools() -> pm.Model:
    """Non-centred eight schools: a deterministic over coords."""
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    with pm.Model(coords={"school": [f"s{i}" for i in range(8)]}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        z = pm.Normal("z", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * z, dims="school")
        pm.Normal("obs", theta, sigma, observed=y, dims="school")
    return model


MODELS = {
    # log, logodds, simplex; an integer det. (pymc cannot remove the transforms of a model
    # with initial values, so the ordered one, which needs them, is left out.)
    "transforms": lambda: models.transforms(ordered=False),
    "data_regression": models.data_regression,  # pm.Data, coords, an observation-level det
    "structured": models.structured,  # LKJ, ZeroSumNormal, random walk; nothing observed
    "counts": counts,
    "mvnormal": mvnormal,
    "eight_schools": eight_schools,
}
OBSERVED = [name for name in MODELS if name != "structured"]
JAX_MODE = {"backend": "jax"} if PYMC6 else {"compile_kwargs": {"mode": "JAX"}}


@pytest.fixture(scope="module")
def model_and_posterior():
    cache = {}

    def get(name):
        if name not in cache:
            model = MODELS[name]()
            cache[name] = (model, posterior(model))
        return cache[name]

    return get


def posterior(model: pm.Model, seed: int = 1) -> xr.Dataset:
    """A seeded (2, 7) posterior of every free variable and deterministic, from the prior."""
    prior = pm.sample_prior_predictive(
        draws=CHAINS * DRAWS, model=model, random_seed=seed, var_names=_posterior_names(model)
    )["prior"]
    prior = prior.to_dataset() if hasattr(prior, "to_dataset") else prior
    variables = {
        name: (("chain", "draw", *da.dims[2:]), da.values.reshape(CHAINS, DRAWS, *da.shape[2:]))
        for name, da in prior.data_vars.items()
    }
    coords = {k: v for k, v in prior.coords.items() if k not in ("chain", "draw")}
    coords |= {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
    return xr.Dataset(variables, coords=coords, attrs=dict(prior.attrs))


def _posterior_names(model):
    return [v.name for v in model.free_RVs] + [v.name for v in model.deterministics]


def idata_of(dataset: xr.Dataset):
    """The inference data type of the installed pymc, with a copy of `dataset` as posterior."""
    if PYMC6:
        return xr.DataTree.from_dict({"posterior": dataset.copy(deep=True)})
    import arviz as az

    return az.InferenceData(posterior=dataset.copy(deep=True))


def as_dataset(x):
    return x.to_dataset() if hasattr(x, "to_dataset") else x


def assert_same_dataset(ours, theirs):
    """Same names (in order), dims, coords, dtypes, attrs (bar creation time); values 1e-12."""
    ours, theirs = as_dataset(ours), as_dataset(theirs)
    assert list(ours.data_vars) == list(theirs.data_vars)
    for name in theirs.data_vars:
        a, b = ours[name], theirs[name]
        assert a.dims == b.dims, name
        assert a.dtype == b.dtype, name
        np.testing.assert_allclose(a.values, b.values, rtol=1e-12, atol=1e-12, err_msg=name)
        assert a.values.flags.writeable, name  # as pymc's
    xr.testing.assert_identical(xr.Dataset(coords=ours.coords), xr.Dataset(coords=theirs.coords))
    drop = {"created_at"}
    assert {k: v for k, v in ours.attrs.items() if k not in drop} == {
        k: v for k, v in theirs.attrs.items() if k not in drop
    }


def assert_same_idata(ours, theirs):
    groups = (lambda x: list(x.children)) if PYMC6 else (lambda x: list(x.groups()))
    assert groups(ours) == groups(theirs)
    for group in groups(theirs):
        assert_same_dataset(ours[group], theirs[group])


@pytest.fixture
def runs(monkeypatch):
    """The calls that reach `_postprocess.run` (which still runs)."""
    calls = []
    run = _postprocess.run

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return run(*args, **kwargs)

    spy.__signature__ = __import__("inspect").signature(run)
    monkeypatch.setattr(_postprocess, "run", spy)
    return calls


# --- equality with pymc --------------------------------------------------------------------


@pytest.mark.parametrize("extend", [True, False])
@pytest.mark.parametrize("name", OBSERVED)
def test_log_likelihood_equals_pymc(model_and_posterior, runs, name, extend):
    model, post = model_and_posterior(name)
    kwargs = dict(model=model, extend_inferencedata=extend, progressbar=False)
    theirs = PYMC["compute_log_likelihood"](idata_of(post), **kwargs)
    ours = OURS["compute_log_likelihood"](idata_of(post), **kwargs)
    assert len(runs) == 1
    if extend:
        assert_same_idata(ours, theirs)
    else:
        assert_same_dataset(ours, theirs)


@pytest.mark.parametrize("extend", [True, False])
@pytest.mark.parametrize("name", list(MODELS))
def test_log_prior_equals_pymc(model_and_posterior, runs, name, extend):
    """Within 1e-12 of pymc's default backend, LKJCholeskyCov priors included: pytensor's own
    JAX conversion computes their `sd_dist` term in float32 (1e-6 relative off); ours keeps
    every node in its declared dtype (`_graph`)."""
    model, post = model_and_posterior(name)
    kwargs = dict(model=model, extend_inferencedata=extend, progressbar=False)
    theirs = PYMC["compute_log_prior"](idata_of(post), **kwargs)
    ours = OURS["compute_log_prior"](idata_of(post), **kwargs)
    assert len(runs) == 1
    if extend:
        assert_same_idata(ours, theirs)
    else:
        assert_same_dataset(ours, theirs)


@pytest.mark.parametrize("name", [n for n in MODELS if n != "mvnormal"])
def test_deterministics_equal_pymc(model_and_posterior, runs, name):
    model, post = model_and_posterior(name)
    dets = [d.name for d in model.deterministics]
    dataset = post.drop_vars(dets)
    theirs = PYMC["compute_deterministics"](dataset, model=model, progressbar=False)
    ours = OURS["compute_deterministics"](dataset, model=model, progressbar=False)
    assert len(runs) == 1
    assert_same_dataset(ours, theirs)
    assert_same_dataset(ours, post[dets])  # and the deterministics the prior drew


def test_deterministics_merge_and_extend(model_and_posterior):
    model, post = model_and_posterior("eight_schools")
    dataset = post.drop_vars("theta")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pymc 6 deprecates merge_dataset
        theirs = PYMC["compute_deterministics"](dataset, model=model, merge_dataset=True)
        ours = OURS["compute_deterministics"](dataset, model=model, merge_dataset=True)
    assert_same_dataset(ours, theirs)
    if PYMC6:
        theirs = idata_of(dataset)
        ours = idata_of(dataset)
        PYMC["compute_deterministics"](theirs, model=model, extend_dataset=True)
        assert OURS["compute_deterministics"](ours, model=model, extend_dataset=True) is ours
        assert_same_idata(ours, theirs)


def test_var_names_order_and_subset(model_and_posterior):
    model, post = model_and_posterior("counts")
    kwargs = dict(model=model, var_names=["hits", "events"], extend_inferencedata=False)
    ours = OURS["compute_log_likelihood"](idata_of(post), **kwargs, progressbar=False)
    theirs = PYMC["compute_log_likelihood"](idata_of(post), **kwargs, progressbar=False)
    assert_same_dataset(ours, theirs)


def test_invalid_parameter_gives_minus_inf_as_pymc(model_and_posterior):
    """pymc's rewrite of parameter checks to -inf is kept (jaxifying alone would drop it)."""
    model, post = model_and_posterior("eight_schools")
    post = post.copy(deep=True)
    post["tau"][0, 0] = -1.0  # HalfCauchy outside its support; z's logp is unaffected
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False)
    theirs = PYMC["compute_log_prior"](idata_of(post), **kwargs)
    ours = OURS["compute_log_prior"](idata_of(post), **kwargs)
    assert np.isneginf(as_dataset(theirs)["tau"].values[0, 0])
    assert_same_dataset(ours, theirs)
    with pm.Model(coords={"i": range(5)}) as bad:
        s = pm.Normal("s")
        pm.Normal("y", 0.0, s, observed=np.zeros(5), dims="i")  # s < 0: an invalid sigma
    post = xr.Dataset({"s": (("chain", "draw"), -np.ones((CHAINS, DRAWS)))})
    theirs = PYMC["compute_log_likelihood"](idata_of(post), model=bad, progressbar=False)
    ours = OURS["compute_log_likelihood"](idata_of(post), model=bad, progressbar=False)
    assert np.isneginf(as_dataset(theirs["log_likelihood"])["y"].values).all()
    assert_same_idata(ours, theirs)


# --- sample dims ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reversed"] + (["stacked", "point"] if PYMC6 else []))
def test_sample_dims(model_and_posterior, runs, kind):
    model, post = model_and_posterior("data_regression")
    if kind == "stacked":  # as `arviz.extract` gives it
        dataset, sample_dims = post.stack(sample=("chain", "draw")), ("sample",)
    elif kind == "reversed":
        dataset, sample_dims = post.transpose("draw", "chain", ...), ("draw", "chain")
    else:  # pymc 6: one point, no sample dims
        dataset, sample_dims = post.isel(chain=0, draw=3, drop=True), ()
    kwargs = dict(model=model, sample_dims=sample_dims, progressbar=False)
    for name in ("compute_log_likelihood", "compute_log_prior"):
        theirs = PYMC[name](idata_of(dataset), extend_inferencedata=False, **kwargs)
        ours = OURS[name](idata_of(dataset), extend_inferencedata=False, **kwargs)
        assert_same_dataset(ours, theirs)
    dataset = dataset.drop_vars("mu")
    theirs = PYMC["compute_deterministics"](dataset, **kwargs)
    ours = OURS["compute_deterministics"](dataset, **kwargs)
    assert_same_dataset(ours, theirs)
    assert len(runs) == 3


@pytest.mark.skipif(PYMC6, reason="pymc 6 takes one or no sample dims")
@pytest.mark.parametrize("kind", ["stacked", "point"])
def test_other_sample_dims_fall_back_on_pymc5(model_and_posterior, runs, kind):
    """pymc 5 fails on them; the route hands them to pymc, which fails as it does."""
    model, post = model_and_posterior("data_regression")
    if kind == "stacked":
        dataset, sample_dims = post.stack(sample=("chain", "draw")), ("sample",)
    else:
        dataset, sample_dims = post.isel(chain=0, draw=0, drop=True), ()
    kwargs = dict(model=model, sample_dims=sample_dims, progressbar=False)
    with pytest.raises(Exception) as theirs:
        PYMC["compute_log_likelihood"](idata_of(dataset), **kwargs)
    with pytest.warns(UserWarning, match="pymc's own"), pytest.raises(type(theirs.value)):
        OURS["compute_log_likelihood"](idata_of(dataset), **kwargs)
    assert runs == []


# --- patch ---------------------------------------------------------------------------------


def test_patch_routes_and_unpatch_restores(model_and_posterior, runs):
    import pymc.sampling.deterministic
    import pymc.stats.log_density

    places = [
        (pm, "compute_log_likelihood"),
        (pm, "compute_deterministics"),
        (pm.stats, "compute_log_likelihood"),
        (pm.stats, "compute_log_prior"),
        (pymc.stats.log_density, "compute_log_likelihood"),
        (pymc.stats.log_density, "compute_log_prior"),
        (pm.sampling, "compute_deterministics"),
        (pymc.sampling.deterministic, "compute_deterministics"),
    ] + ([] if PYMC6 else [(pm, "compute_log_prior")])  # pymc 6 resolves it from pm.stats
    before = [getattr(module, name) for module, name in places]
    model, post = model_and_posterior("eight_schools")
    with pymc_chunkpost.patched():
        assert all(getattr(m, n) is not b for (m, n), b in zip(places, before))
        assert pm.compute_log_likelihood is pm.stats.compute_log_likelihood
        ours = pm.compute_log_likelihood(idata_of(post), model=model, progressbar=False)
        # pymc's own callers import it at call time, as `to_inference_data` does.
        from pymc.stats.log_density import compute_log_prior

        prior = compute_log_prior(idata_of(post), model=model, progressbar=False)
        dets = pm.compute_deterministics(
            post.drop_vars("theta"), model=model, chunk_size=3, progressbar=False
        )
        assert runs[-1][1]["chunk_size"] == 3  # our options pass through the patched name
    assert [getattr(module, name) for module, name in places] == before
    assert all(getattr(m, n) is b for (m, n), b in zip(places, before))
    assert len(runs) == 3
    assert_same_idata(ours, PYMC["compute_log_likelihood"](idata_of(post), model=model))
    assert_same_idata(prior, PYMC["compute_log_prior"](idata_of(post), model=model))
    assert_same_dataset(dets, post[["theta"]])


def _non_jax():
    """A compile request the JAX route cannot honour, for the installed pymc."""
    return {"backend": "c"} if PYMC6 else {"compile_kwargs": {"mode": "FAST_COMPILE"}}


def test_fallback_to_pymc_as_asked_is_logged_not_warned(model_and_posterior, runs, caplog):
    """A non-JAX compile that the user asked for runs pymc's own function, says so at INFO
    on the package's logger, and warns nothing (pymc's own tests turn warnings into errors)."""
    model, post = model_and_posterior("counts")
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False, **_non_jax())
    theirs = PYMC["compute_log_likelihood"](idata_of(post), **kwargs)
    caplog.set_level(logging.INFO, logger="pymc_chunkpost")
    with pymc_chunkpost.patched(), warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = pm.compute_log_likelihood(idata_of(post), **kwargs)
    (record,) = [r for r in caplog.records if r.name == "pymc_chunkpost"]
    assert record.levelno == logging.INFO
    assert "`compute_log_likelihood` runs pymc's own function" in record.getMessage()
    assert "not JAX" in record.getMessage() and "\n" not in record.getMessage()
    assert runs == []
    assert_same_dataset(ours, theirs)
    # Extra compile arguments pymc alone understands fall back too.
    caplog.clear()
    extra = {"compile_kwargs": {"profile": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OURS["compute_log_prior"](idata_of(post), model=model, progressbar=False, **extra)
    (record,) = [r for r in caplog.records if r.name == "pymc_chunkpost"]
    assert "compile_kwargs" in record.getMessage()
    assert runs == []


@pytest.mark.parametrize("via", ["backend", "compile_kwargs"])
def test_deterministics_fallback_as_asked_warns_nothing(model_and_posterior, runs, via):
    """pymc's own `test_compute_deterministics[backend|compile_kwargs]` shape: a non-JAX mode
    under `filterwarnings("error")`; only pymc's own deprecation of `merge_dataset` is raised."""
    if via == "backend" and not PYMC6:
        pytest.skip("pymc 5 has no `backend`")
    model, post = model_and_posterior("eight_schools")
    dataset = post.drop_vars("theta")
    mode = (
        {"backend": "FAST_COMPILE"}
        if via == "backend"
        else {"compile_kwargs": {"mode": "FAST_COMPILE"}}
    )
    kwargs = dict(model=model, var_names=["theta"], progressbar=False, **mode)
    theirs = PYMC["compute_deterministics"](dataset, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = OURS["compute_deterministics"](dataset, **kwargs)
        if PYMC6:
            with pytest.warns(FutureWarning, match="`merge_dataset` is deprecated"):
                merged = OURS["compute_deterministics"](dataset, merge_dataset=True, **kwargs)
            assert set(merged.data_vars) == set(dataset.data_vars) | {"theta"}
    assert runs == []
    assert_same_dataset(ours, theirs)


def test_jax_backend_takes_the_route(model_and_posterior, runs):
    model, post = model_and_posterior("counts")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ours = OURS["compute_log_likelihood"](idata_of(post), model=model, **JAX_MODE)
    theirs = PYMC["compute_log_likelihood"](idata_of(post), model=model, **JAX_MODE)
    assert len(runs) == 1
    assert_same_idata(ours, theirs)


@pytest.mark.skipif(PYMC6, reason="pymc 6 has `backend`")
def test_pymc5_has_no_backend_argument(model_and_posterior):
    model, post = model_and_posterior("counts")
    with pytest.raises(TypeError, match="backend"):
        PYMC["compute_log_likelihood"](idata_of(post), model=model, backend="jax")
    with pytest.raises(TypeError, match="backend"):
        OURS["compute_log_likelihood"](idata_of(post), model=model, backend="jax")


# --- bad input, before any work ------------------------------------------------------------


@pytest.mark.parametrize(
    "case, match",
    [
        ({"var_names": ["nope"]}, "`var_names` has \\['nope'\\]"),
        ({"var_names": "events"}, "must be a list of names"),
        ({"var_names": ["rate"]}, "must refer to observed_RVs"),
        ({"postprocessing_vectorize": "fastest"}, "Unknown `postprocessing_vectorize"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"sample_dims": "sample"}, "`sample_dims` must be a sequence"),
        ({"sample_dims": ("chain", "sample")}, "names \\['sample'\\]"),
    ],
)
def test_bad_arguments(model_and_posterior, runs, case, match):
    model, post = model_and_posterior("counts")
    with pytest.raises(ValueError, match=match):
        OURS["compute_log_likelihood"](idata_of(post), model=model, **case)
    assert runs == []


def test_bad_posterior(model_and_posterior, runs):
    model, post = model_and_posterior("counts")
    with pytest.raises(ValueError, match="has no \\['p'\\]"):
        OURS["compute_log_likelihood"](idata_of(post.drop_vars("p")), model=model)
    with pytest.raises(ValueError, match="has no \\['rate'\\]"):
        OURS["compute_deterministics"](post.drop_vars("rate"), model=model)
    other, other_post = model_and_posterior("eight_schools")
    with pytest.raises(ValueError, match="has no"):  # another model's posterior
        OURS["compute_log_likelihood"](idata_of(other_post), model=model)
    wrong = post.isel(group=slice(0, 3))  # 3 groups, not 4
    with pytest.raises(ValueError, match="shape \\(3,\\) per draw.*\\(4,\\)"):
        OURS["compute_log_likelihood"](idata_of(wrong), model=model)
    with pytest.raises(ValueError, match="no `posterior` group"):
        OURS["compute_log_likelihood"](post, model=model)
    with pytest.raises(ValueError, match="deterministics"):
        OURS["compute_deterministics"](post, model=model, var_names=["rate"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'turbo'"):
        OURS["compute_log_prior"](idata_of(post), model=model, turbo=True)
    assert runs == []


@pytest.mark.parametrize("route", ["compute_log_likelihood", "compute_log_prior"])
def test_a_missing_free_variable_is_both_errors_pymc_users_catch(model_and_posterior, runs, route):
    """pymc raises `KeyError` for a posterior without a free variable; ours says more, as a
    `ValueError`, and is still caught by `except KeyError`."""
    model, post = model_and_posterior("counts")
    idata = idata_of(post.drop_vars("p"))
    with pytest.raises(KeyError):
        PYMC[route](idata, model=model, **JAX_MODE)
    with pytest.raises(KeyError) as caught:
        OURS[route](idata, model=model)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith("`idata.posterior` has no ['p']")  # not quoted
    assert runs == []


def test_new_run_options_pass_through(model_and_posterior, monkeypatch):
    """An option `run` gains later (such as `output_memory`) reaches it unchanged."""
    model, post = model_and_posterior("eight_schools")
    seen = {}
    run = _postprocess.run

    def run_with_option(*args, output_memory="device", **kwargs):
        seen["output_memory"] = output_memory
        return run(*args, **kwargs)

    monkeypatch.setattr(_postprocess, "run", run_with_option)
    OURS["compute_log_prior"](idata_of(post), model=model, output_memory="host")
    assert seen == {"output_memory": "host"}


# --- outputs, cache ------------------------------------------------------------------------


def test_passed_through_output_is_a_copy():
    """A deterministic that is a free variable does not alias the caller's draws."""
    with pm.Model() as model:
        a = pm.Normal("a", shape=3)
        pm.Deterministic("same", a)
    post = xr.Dataset({"a": (("chain", "draw", "k"), np.ones((CHAINS, DRAWS, 3)))})
    ours = OURS["compute_deterministics"](post, model=model, progressbar=False)
    assert not np.shares_memory(ours["same"].values, post["a"].values)
    ours["same"].values[0, 0, 0] = 5.0
    assert post["a"].values[0, 0, 0] == 1.0


def test_graph_cached_per_model_and_data(monkeypatch):
    built = []
    jaxify = _posthoc._jaxify
    monkeypatch.setattr(_posthoc, "_jaxify", lambda *a: built.append(1) or jaxify(*a))
    model = models.data_regression(n_obs=20)
    post = posterior(model)
    first = OURS["compute_log_likelihood"](idata_of(post), model=model, progressbar=False)
    OURS["compute_log_likelihood"](idata_of(post), model=model, progressbar=False)
    assert len(built) == 1
    with model:
        pm.set_data({"x": np.ones((20, 3))})
    ours = OURS["compute_log_likelihood"](idata_of(post), model=model, progressbar=False)
    theirs = PYMC["compute_log_likelihood"](idata_of(post), model=model, progressbar=False)
    assert len(built) == 2
    assert_same_idata(ours, theirs)
    assert not np.allclose(
        as_dataset(first["log_likelihood"])["y"].values,
        as_dataset(ours["log_likelihood"])["y"].values,
    )


def test_cache_lets_the_model_go():
    import gc
    import weakref

    model = eight_schools()
    OURS["compute_log_prior"](idata_of(posterior(model)), model=model, progressbar=False)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_a_fallback_warns_a_direct_call_and_logs_a_routed_one(
    model_and_posterior, monkeypatch, caplog
):
    """The seam's fallback (`_route.fall_back`) says the same on every route: a one-line
    `UserWarning` at a direct call, a log warning where `patch` routed pymc's own call (pymc's
    own tests turn warnings into errors); the answer is pymc's either way."""
    model, post = model_and_posterior("eight_schools")

    def no_jax(*args):
        raise NotImplementedError("no JAX dispatch for this Op")

    monkeypatch.setattr(_posthoc, "_jaxify", no_jax)
    pymc_chunkpost.clear_caches()
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False)
    theirs = PYMC["compute_log_likelihood"](idata_of(post), **kwargs)
    with pytest.warns(UserWarning, match="runs pymc's own function .no JAX implementation"):
        ours = OURS["compute_log_likelihood"](idata_of(post), **kwargs)
    assert_same_dataset(ours, theirs)
    caplog.set_level(logging.WARNING, logger="pymc_chunkpost")
    with pymc_chunkpost.patched(), warnings.catch_warnings():
        warnings.simplefilter("error")
        routed = pm.compute_log_likelihood(idata_of(post), **kwargs)
    assert_same_dataset(routed, theirs)
    (record,) = [r for r in caplog.records if r.name == "pymc_chunkpost"]
    assert record.levelno == logging.WARNING and "no JAX implementation" in record.getMessage()


# --- small work on an accelerator --------------------------------------------------------


def test_small_work_goes_to_the_host_only_where_the_caller_named_no_device(
    model_and_posterior, runs, monkeypatch
):
    """The routes ask the engine for the host CPU's small-work rule only where the caller
    named no device (`small_on_host`), and the engine moves such a call's draws to the host
    CPU where `resources.small_work_on_host` says so, with its reason in the plan; the values
    are pymc's either way."""
    from pymc_chunkpost._engine.plan import resources as _resources

    model, post = model_and_posterior("data_regression")
    asked, plans = [], []
    monkeypatch.setattr(
        _resources,
        "small_work_on_host",
        lambda platform, values: asked.append(values) or (True, "small work (a test)"),
    )
    run = _postprocess.run

    def planned(*args, **kwargs):
        outputs, plan = run(*args, **kwargs)
        plans.append(plan)
        return outputs, plan

    monkeypatch.setattr(_postprocess, "run", planned)
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False)
    ours = pymc_chunkpost.compute_log_likelihood(idata_of(post), **kwargs)
    assert runs[-1][1]["small_on_host"] is True
    (matrix,) = as_dataset(ours).data_vars.values()
    assert asked == [matrix.size]  # draws x observations: every output value
    assert plans[-1].devices_reason == "the host CPU: small work (a test)"
    named = pymc_chunkpost.compute_log_likelihood(
        idata_of(post), postprocessing_backend="cpu", **kwargs
    )
    assert runs[-1][1]["small_on_host"] is False and asked == [matrix.size]
    assert_same_dataset(ours, named)
