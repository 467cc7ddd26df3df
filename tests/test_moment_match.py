"""`loo_moment_match` from `loo`'s result equals arviz-stats' own on the full matrices."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

azs = pytest.importorskip("arviz_stats")
pm = pytest.importorskip("pymc")

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._pymc.moment_match import loo_moment_match  # noqa: E402

J = 12


@pytest.fixture(scope="module")
def schools():
    """A hierarchical normal whose two extreme observations, and several others, have Pareto
    k over the threshold; its NUTS draws (seeded), and the same draws with pymc's
    log-likelihood group."""
    rng = np.random.default_rng(0)
    y = rng.normal(0, 1, J)
    y[0], y[1] = 9.0, -7.0
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        theta = pm.Normal("theta", mu, tau, shape=J)
        pm.Normal("y", theta, 1.0, observed=y, dims=None)
        idata = pm.sample(
            500,
            tune=500,
            chains=2,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    full = idata.copy()
    pm.compute_log_likelihood(full, model=model, progressbar=False)
    return model, idata, full


def test_equals_arviz_stats_on_the_full_matrices(schools):
    model, idata, full = schools
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs_loo = azs.loo(full, pointwise=True)
        theirs = azs.loo_moment_match(full, theirs_loo, model=model)
        ours_loo = pymc_chunkpost.loo(idata, model, pointwise=True)
        before = ours_loo.elpd, ours_loo.pareto_k.values.copy()
        ours = loo_moment_match(idata, ours_loo, model=model)
    bad = theirs_loo.pareto_k.values > theirs_loo.good_k
    assert bad.sum() >= 3  # the model gives moment matching work to do
    assert type(ours) is type(theirs) and ours.method == "loo_moment_match"
    np.testing.assert_allclose(ours.elpd, theirs.elpd, rtol=1e-9)
    np.testing.assert_allclose(ours.se, theirs.se, rtol=1e-9)
    np.testing.assert_allclose(ours.p, theirs.p, rtol=1e-9)
    np.testing.assert_allclose(ours.pareto_k.values, theirs.pareto_k.values, atol=1e-9)
    np.testing.assert_allclose(ours.elpd_i.values, theirs.elpd_i.values, rtol=1e-9)
    np.testing.assert_allclose(
        ours.influence_pareto_k.values, theirs.influence_pareto_k.values, atol=1e-9
    )
    np.testing.assert_allclose(ours.n_eff_i.values, theirs.n_eff_i.values, rtol=1e-9)
    np.testing.assert_allclose(ours.p_loo_i.values[bad], theirs.p_loo_i.values[bad], rtol=1e-9)
    assert ours.warning == theirs.warning and ours.good_k == theirs.good_k
    assert ours.elpd != ours_loo.elpd  # matching changed the estimate
    assert ours_loo.elpd == before[0]  # the caller's result is untouched
    np.testing.assert_array_equal(ours_loo.pareto_k.values, before[1])


def test_without_pointwise_values_or_for_another_model_it_refuses(schools):
    model, idata, _ = schools
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = pymc_chunkpost.loo(idata, model, pointwise=False)
        with pytest.raises(ValueError, match="pointwise=True"):
            loo_moment_match(idata, summary, model=model)
        with pm.Model() as other:
            pm.Normal("y", 0, 1, observed=np.zeros(J + 1))
        pointwise = pymc_chunkpost.loo(idata, model, pointwise=True)
        with pytest.raises(ValueError, match="13"):
            loo_moment_match(idata, pointwise, model=other)
        with pytest.raises(TypeError, match="ELPDDataLOO"):
            loo_moment_match(idata, {"elpd": 1.0}, model=model)
        # arviz-stats' own result keeps no p_loo_i, which matching reports for every one.
        full = idata.copy()
        pm.compute_log_likelihood(full, model=model, progressbar=False)
        with pytest.raises(ValueError, match="p_loo_i"):
            loo_moment_match(idata, azs.loo(full, pointwise=True), model=model)


def test_a_multivariate_likelihood_counts_its_rows():
    """An MvNormal's log-likelihood has a value per row, not per element: accepted."""
    rng = np.random.default_rng(1)
    with pm.Model() as model:
        m = pm.Normal("m", 0, 1, shape=2)
        pm.MvNormal("Y", m, np.eye(2), observed=rng.normal(size=(30, 2)))
        idata = pm.sample(200, tune=200, chains=2, random_seed=2, progressbar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pymc_chunkpost.loo(idata, model, pointwise=True)
        matched = loo_moment_match(idata, result, model=model)
    assert matched.pareto_k.shape == (30,)
    np.testing.assert_array_equal(matched.influence_pareto_k.values, result.pareto_k.values)
