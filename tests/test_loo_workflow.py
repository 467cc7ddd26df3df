"""`loo_pit`, `loo_expectations`, `loo_metrics`, `loo_score`, `loo_r2`: in blocks of
observations, against the installed ArviZ's own functions on the full log-likelihood.

The reference is ArviZ's function (1.x: arviz-stats'; 0.x: `arviz.loo_pit`) on a copy of
the inference data with pymc's own `compute_log_likelihood`: PIT values within 1e-9
(absolute), expectations and scores within 1e-9 (relative), Pareto k within 1e-6.
Posteriors are seeded random draws (no sampling), predictive draws pymc's own; blocks of 7
observations overlap (the last one recomputes the one before's), one block holds them all.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
xr = pytest.importorskip("xarray")

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._stats import psis as _psis  # noqa: E402

GENERATION = _psis.arviz_generation()
CHAINS, DRAWS = 4, 100
N = 50
BLOCK_SIZES = [7, N, None]


# --- models and ArviZ's side ----------------------------------------------------------------


def _posterior(draws: dict):
    if GENERATION == 0:
        import arviz as az

        return az.from_dict(posterior=draws)
    from arviz_base import from_dict

    return from_dict({"posterior": draws})


def poisson(n: int = N):
    """Discrete data (ties: arviz-stats breaks them at random; ArviZ 0.x smooths them),
    dims with coords, a parameter vector checked by pymc."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    with pm.Model(coords={"obs": [f"o{i}" for i in range(n)]}) as model:
        b = pm.Normal("b")
        a = pm.Normal("a")
        pm.Poisson("y", pm.math.exp(a + b * x), observed=rng.poisson(np.exp(0.3 * x)), dims="obs")
    draws = {"a": rng.normal(0, 0.1, (CHAINS, DRAWS)), "b": rng.normal(0.3, 0.1, (CHAINS, DRAWS))}
    return model, draws


def normal(n: int = N):
    """Continuous data, pymc's default dims, a heavy-ish tail of weights (a small sigma)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=n)
    with pm.Model() as model:
        b = pm.Normal("b")
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", b * x, sigma, observed=0.5 * x + rng.standard_t(3, size=n))
    draws = {
        "b": rng.normal(0.5, 0.1, (CHAINS, DRAWS)),
        "sigma": rng.gamma(60, 1 / 60, (CHAINS, DRAWS)),
    }
    return model, draws


def cells(n: int = 20):
    """An elementwise likelihood with a matrix value: blocks of rows of 3 observations."""
    rng = np.random.default_rng(2)
    with pm.Model() as model:
        mu = pm.Normal("mu", shape=3)
        pm.Normal("y", mu, 1.0, observed=rng.normal(size=(n, 3)))
    return model, {"mu": rng.normal(0, 0.2, (CHAINS, DRAWS, 3))}


MODELS = {"poisson": poisson, "normal": normal, "cells": cells}
_CACHE: dict = {}


def _case(name: str):
    """The model, its inference data (posterior, posterior predictive, observed data, no
    log-likelihood) and a copy with pymc's log-likelihood, built once a module."""
    if name not in _CACHE:
        model, draws = MODELS[name]()
        idata = _posterior(draws)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm.sample_posterior_predictive(
                idata, model=model, random_seed=5, progressbar=False, extend_inferencedata=True
            )
        full = idata.copy()
        pm.compute_log_likelihood(full, model=model, progressbar=False)
        assert "log_likelihood" not in _groups(idata)
        _CACHE[name] = (model, idata, full)
    return _CACHE[name]


def _groups(idata) -> list[str]:
    return list(idata.children) if hasattr(idata, "children") else list(idata.groups())


def _quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def _assert_same_array(ours, theirs, *, atol=0.0, rtol=0.0) -> None:
    """The same DataArray: name, dims, coords; values within the tolerances."""
    assert ours.name == theirs.name
    assert ours.dims == theirs.dims
    assert set(ours.coords) == set(theirs.coords)
    for dim in theirs.coords:
        np.testing.assert_array_equal(ours.coords[dim].values, theirs.coords[dim].values)
    np.testing.assert_allclose(ours.values, theirs.values, rtol=rtol, atol=atol)


# --- LOO-PIT --------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("name", list(MODELS))
def test_loo_pit_equals_arviz(name, block_size):
    model, idata, full = _case(name)
    ours = _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=block_size)
    if GENERATION == 0:
        import arviz as az

        theirs = _quiet(az.loo_pit, full, y="y", y_hat="y")
        assert isinstance(ours, np.ndarray) and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
        return
    from arviz_stats import loo_pit

    theirs = _quiet(loo_pit, full, var_names="y")
    assert isinstance(ours, xr.Dataset)
    assert list(ours.data_vars) == list(theirs.data_vars) == ["y"]
    assert set(ours.coords) == set(theirs.coords)
    _assert_same_array(ours["y"], theirs["y"], atol=1e-9)


def test_loo_pit_of_one_of_several_observed_variables_equals_arviz():
    rng = np.random.default_rng(3)
    with pm.Model(coords={"i": range(30), "j": range(12)}) as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=rng.normal(size=30), dims="i")
        pm.Poisson("z", pm.math.exp(mu), observed=rng.poisson(1.0, 12), dims="j")
    idata = _posterior({"mu": rng.normal(0, 0.1, (CHAINS, DRAWS))})
    _quiet(
        pm.sample_posterior_predictive,
        idata,
        model=model,
        random_seed=4,
        progressbar=False,
        extend_inferencedata=True,
    )
    full = idata.copy()
    pm.compute_log_likelihood(full, model=model, progressbar=False)
    for name in ("y", "z"):
        ours = _quiet(pymc_chunkpost.loo_pit, idata, model, var_name=name, block_size=5)
        if GENERATION == 0:
            import arviz as az

            theirs = _quiet(az.loo_pit, full, y=name, y_hat=name)
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
            continue
        from arviz_stats import loo_pit

        theirs = _quiet(loo_pit, full, var_names=name)
        assert set(ours.coords) == set(theirs.coords)
        _assert_same_array(ours[name], theirs[name], atol=1e-9)
    with pytest.raises(ValueError, match="several observed variables"):
        pymc_chunkpost.loo_pit(idata, model)


@pytest.mark.parametrize("block_size", [7, None])
def test_loo_pit_random_state_and_pareto_pit_equal_arviz_stats(block_size):
    """Ties broken by arviz-stats' random numbers, drawn in its order across blocks: from a
    seed, from a generator (left as arviz-stats leaves it), and Pareto-smoothed."""
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_pit

    model, idata, full = _case("poisson")
    for given in (
        {"random_state": 3},
        {"pareto_pit": True},
        {"pareto_pit": True, "random_state": 9},
    ):
        theirs = _quiet(loo_pit, full, var_names="y", **given)
        ours = _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=block_size, **given)
        _assert_same_array(ours["y"], theirs["y"], atol=1e-9)
    mine, reference = np.random.default_rng(11), np.random.default_rng(11)
    theirs = _quiet(loo_pit, full, var_names="y", random_state=reference)
    ours = _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=block_size, random_state=mine)
    _assert_same_array(ours["y"], theirs["y"], atol=1e-9)
    assert mine.random() == reference.random()  # each drew as many numbers


def test_loo_pit_of_a_well_specified_model_is_uniform():
    """y ~ N(mu, 1) with mu's exact (conjugate) posterior: LOO-PIT values are uniform
    (a Kolmogorov-Smirnov test, seeded)."""
    from scipy import stats

    rng = np.random.default_rng(42)
    n = 300
    y = rng.normal(0.7, 1.0, size=n)
    precision = 1 / 10**2 + n
    mean = y.sum() / precision
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1.0, observed=y)
    idata = _posterior({"mu": rng.normal(mean, precision**-0.5, (CHAINS, 250))})
    _quiet(
        pm.sample_posterior_predictive,
        idata,
        model=model,
        random_seed=3,
        progressbar=False,
        extend_inferencedata=True,
    )
    pit = _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=64)
    values = np.asarray(pit if GENERATION == 0 else pit["y"]).ravel()
    assert values.shape == (n,)
    assert stats.kstest(values, "uniform").pvalue > 0.01


def test_loo_pit_of_a_multivariate_likelihood_gives_each_row_its_weights():
    """An MvNormal: one log-likelihood per row of 3 values. ArviZ's `loo_pit` refuses the
    shapes (both generations); ours gives each row's log-weights to its 3 values: ArviZ's
    own PIT of the full matrix's log-weights, broadcast so."""
    rng = np.random.default_rng(6)
    n = 20
    with pm.Model(coords={"row": range(n), "feature": list("abc")}) as model:
        mu = pm.Normal("mu", shape=3)
        pm.MvNormal(
            "rows", mu, np.eye(3), observed=rng.normal(size=(n, 3)), dims=("row", "feature")
        )
    idata = _posterior({"mu": rng.normal(0, 0.2, (CHAINS, DRAWS, 3))})
    _quiet(
        pm.sample_posterior_predictive,
        idata,
        model=model,
        random_seed=2,
        progressbar=False,
        extend_inferencedata=True,
    )
    full = idata.copy()
    pm.compute_log_likelihood(full, model=model, progressbar=False)
    ours = _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=7)
    log_likelihood = full["log_likelihood"]["rows"]
    reff = _reff(full)
    if GENERATION == 0:
        import arviz as az

        stacked = log_likelihood.stack(__sample__=("chain", "draw"))
        log_weights = az.psislw(-stacked, reff=reff)[0].values[:, None, :]
        y_hat = full.posterior_predictive["rows"].stack(__sample__=("chain", "draw")).values
        y = full.observed_data["rows"].values
        theirs = az.loo_pit(y=y, y_hat=y_hat, log_weights=np.broadcast_to(log_weights, y_hat.shape))
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
        return
    from arviz_stats import loo_pit

    log_weights, pareto_k = log_likelihood.azstats.psislw(r_eff=reff, dim=["chain", "draw"])
    draws = full["posterior_predictive"]["rows"]
    given = {
        "log_weights": xr.Dataset(
            {"rows": log_weights.broadcast_like(draws, exclude=["chain", "draw"])}
        ),
        "pareto_k": xr.Dataset({"rows": pareto_k.broadcast_like(draws, exclude=["chain", "draw"])}),
    }
    theirs = _quiet(loo_pit, full, var_names="rows", **given)
    _assert_same_array(ours["rows"], theirs["rows"], atol=1e-9)


def _reff(idata) -> float:
    from pymc_chunkpost._stats.loo import default_reff

    posterior = idata["posterior"]
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    return default_reff(dataset, CHAINS * DRAWS, GENERATION)


# --- expectations, metrics, scores (arviz-stats) -----------------------------------------------


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(
    "kind, probs",
    [("mean", None), ("median", None), ("var", None), ("sd", None), ("quantile", [0.1, 0.75])]
    + [("quantile", 0.5), ("circular_mean", None)],
)
def test_loo_expectations_equal_arviz_stats(kind, probs, block_size):
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_expectations

    model, idata, full = _case("normal")
    theirs, their_k = _quiet(loo_expectations, full, var_name="y", kind=kind, probs=probs)
    ours, our_k = _quiet(
        pymc_chunkpost.loo_expectations, idata, model, kind=kind, probs=probs, block_size=block_size
    )
    _assert_same_array(ours, theirs, rtol=1e-9, atol=1e-12)
    _assert_same_array(our_k, their_k, atol=1e-6)


@pytest.mark.parametrize("name", ["poisson", "cells"])
def test_loo_expectations_of_other_models_and_the_posterior_equal_arviz_stats(name):
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_expectations

    model, idata, full = _case(name)
    theirs = _quiet(loo_expectations, full, var_name="y", kind="mean")
    ours = _quiet(pymc_chunkpost.loo_expectations, idata, model, block_size=7)
    for mine, reference in zip(ours, theirs):
        _assert_same_array(mine, reference, rtol=1e-9, atol=1e-6)
    drawn = "b" if name == "poisson" else "mu"
    theirs = _quiet(loo_expectations, full, var_name=drawn, group="posterior", kind="sd")
    ours = _quiet(
        pymc_chunkpost.loo_expectations,
        idata,
        model,
        var_name=drawn,
        group="posterior",
        kind="sd",
        block_size=7,
    )
    _assert_same_array(ours[0], theirs[0], rtol=1e-9)
    _assert_same_array(ours[1], theirs[1], atol=1e-6)


def test_high_khat_warns_once_as_arviz_stats():
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_expectations

    model, idata, full = _case("normal")
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        _, k = loo_expectations(full, var_name="y")
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        pymc_chunkpost.loo_expectations(idata, model, block_size=7)
    pareto = [str(w.message) for w in theirs if "Pareto" in str(w.message)]
    assert pareto == [str(w.message) for w in ours if "Pareto" in str(w.message)]
    assert len(pareto) == int(bool((k > 0.7).any()))


@pytest.mark.parametrize("kind", ["mae", "rmse", "acc"])
def test_loo_metrics_equal_arviz_stats(kind):
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_metrics

    model, idata, full = _case("poisson")
    theirs = _quiet(loo_metrics, full, kind=kind, var_name="y", round_to="none")
    ours = _quiet(
        pymc_chunkpost.loo_metrics, idata, model, kind=kind, round_to="none", block_size=7
    )
    assert type(ours).__name__ == type(theirs).__name__ and ours._fields == theirs._fields
    np.testing.assert_allclose(list(ours), list(theirs), rtol=1e-9)


@pytest.mark.parametrize("kind", ["crps", "scrps"])
def test_loo_score_equals_arviz_stats(kind):
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_score

    model, idata, full = _case("normal")
    theirs = _quiet(loo_score, full, var_name="y", kind=kind, pointwise=True, round_to="none")
    ours = _quiet(
        pymc_chunkpost.loo_score,
        idata,
        model,
        kind=kind,
        pointwise=True,
        round_to="none",
        block_size=7,
    )
    assert type(ours).__name__ == type(theirs).__name__ and ours._fields == theirs._fields
    np.testing.assert_allclose([ours.mean, ours.se], [theirs.mean, theirs.se], rtol=1e-9)
    _assert_same_array(ours.pointwise, theirs.pointwise, rtol=1e-9)
    _assert_same_array(ours.pareto_k, theirs.pareto_k, atol=1e-6)


def test_loo_r2_equals_arviz_stats():
    pytest.importorskip("arviz_stats")
    from arviz_stats import loo_r2

    model, idata, full = _case("normal")
    theirs = _quiet(loo_r2, full, var_name="y", round_to="none")
    ours = _quiet(pymc_chunkpost.loo_r2, idata, model, round_to="none", block_size=7)
    assert type(ours).__name__ == type(theirs).__name__ and ours._fields == theirs._fields
    np.testing.assert_allclose(list(ours), list(theirs), rtol=1e-9)
    samples = _quiet(loo_r2, full, var_name="y", summary=False, n_simulations=50)
    mine = _quiet(pymc_chunkpost.loo_r2, idata, model, summary=False, n_simulations=50)
    np.testing.assert_allclose(mine, samples, rtol=1e-9)


def test_arviz_0x_has_no_loo_expectations():
    if GENERATION != 0:
        pytest.skip("ArviZ 1.x has them")
    model, idata, _ = _case("normal")
    for function in (pymc_chunkpost.loo_expectations, pymc_chunkpost.loo_score):
        with pytest.raises(ImportError, match="arviz-stats"):
            function(idata, model)
    with pytest.raises(ValueError, match="random_state"):
        pymc_chunkpost.loo_pit(idata, model, random_state=1)


# --- inputs ---------------------------------------------------------------------------------


def test_no_posterior_predictive_raises_before_work(monkeypatch):
    from pymc_chunkpost._pymc import loo as _loo

    def no_work(*args, **kwargs):
        raise AssertionError("the log-likelihood was built")

    monkeypatch.setattr(_loo, "_LogpBlocks", no_work)
    model, draws = normal()
    idata = _posterior(draws)
    functions = [pymc_chunkpost.loo_pit]
    if GENERATION == 1:
        functions += [pymc_chunkpost.loo_expectations, pymc_chunkpost.loo_score]
    for function in functions:
        with pytest.raises(ValueError, match="sample_posterior_predictive"):
            function(idata, model)
    _, with_predictive, _ = _case("poisson")  # a posterior predictive of another variable
    with pytest.raises(ValueError, match="posterior predictive draws of 'y'"):
        pymc_chunkpost.loo_pit(idata, model, var_name="y")
    assert "posterior_predictive" in _groups(with_predictive)


def _data_model(n: int = 30):
    rng = np.random.default_rng(4)
    with pm.Model() as model:
        observed = pm.Data("observed", rng.normal(size=n))
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=observed, shape=observed.shape)
    idata = _posterior({"mu": rng.normal(0, 0.1, (CHAINS, DRAWS))})
    _quiet(
        pm.sample_posterior_predictive,
        idata,
        model=model,
        random_seed=1,
        progressbar=False,
        extend_inferencedata=True,
    )
    return model, idata


def test_observed_data_that_differs_from_the_model_raises_before_work():
    model, idata = _data_model()
    original = model["observed"].get_value().copy()
    functions = [pymc_chunkpost.loo, pymc_chunkpost.loo_pit]
    if GENERATION == 1:
        functions.append(pymc_chunkpost.loo_expectations)
    changed = original.copy()
    changed[3] += 1.0
    with model:
        pm.set_data({"observed": changed})
    for function in functions:
        with pytest.raises(ValueError, match=r"differs from the model's observations of 'y' at 1 "):
            function(idata, model)
    with model:
        pm.set_data({"observed": original[:20]})
    for function in functions:
        with pytest.raises(ValueError, match=r"has shape \(30,\), the model's .* \(20,\)"):
            function(idata, model)
    with model:
        pm.set_data({"observed": original})
    assert _quiet(pymc_chunkpost.loo, idata, model) is not None  # the same data: no error


def test_callers_inference_data_is_unchanged():
    model, idata, _ = _case("poisson")
    groups = _groups(idata)
    before = {
        g: idata[g].to_dataset() if hasattr(idata[g], "to_dataset") else idata[g].copy()
        for g in groups
    }
    _quiet(pymc_chunkpost.loo_pit, idata, model, block_size=7)
    if GENERATION == 1:
        _quiet(pymc_chunkpost.loo_expectations, idata, model, block_size=7)
    assert _groups(idata) == groups
    for group in groups:
        now = idata[group].to_dataset() if hasattr(idata[group], "to_dataset") else idata[group]
        xr.testing.assert_identical(now, before[group])
