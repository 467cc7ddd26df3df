"""Bambi's models (pymc 6): fits unchanged by the patch, and `loo` with ArviZ's answer on Bambi's
own log-likelihood, or a clear refusal; never a silent number."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

bmb = pytest.importorskip("bambi")
azs = pytest.importorskip("arviz_stats")
pd = pytest.importorskip("pandas")

import pymc_chunkpost  # noqa: E402


def _data(n: int = 300):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=n), "g": rng.integers(0, 10, n).astype(str)})
    frame["y"] = rng.poisson(
        np.exp(0.5 + 0.3 * frame.x + rng.normal(0, 0.3, 10)[frame.g.astype(int)])
    )
    return frame


@pytest.fixture(scope="module")
def poisson_glmm():
    """A Poisson GLMM (a centred predictor, a group intercept), fitted twice, each with
    Bambi's own log-likelihood group: Bambi's default fit (offsets dropped) and one with
    `omit_offsets=False`."""
    model = bmb.Model("y ~ x + (1|g)", _data(), family="poisson")
    kwargs = dict(
        draws=200,
        tune=300,
        chains=2,
        random_seed=1,
        progressbar=False,
        idata_kwargs={"log_likelihood": True},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = model.fit(**kwargs)
        with_offsets = model.fit(omit_offsets=False, **kwargs)
    return model, default, with_offsets


@pytest.mark.parametrize("fit", ["default", "with_offsets"])
def test_loo_of_a_bambi_model_equals_arviz_on_bambis_log_likelihood(poisson_glmm, fit):
    model, default, with_offsets = poisson_glmm
    idata = default if fit == "default" else with_offsets
    before = {name: idata.posterior[name].values.copy() for name in idata.posterior.data_vars}
    ours = pymc_chunkpost.loo(idata, model, pointwise=True)
    theirs = azs.loo(idata, pointwise=True)  # on the fit's own log-likelihood group
    np.testing.assert_allclose(ours.elpd, theirs.elpd, rtol=1e-9)
    np.testing.assert_allclose(ours.elpd_i.values, theirs.elpd_i.values, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.pareto_k.values, theirs.pareto_k.values, atol=1e-9)
    assert list(idata.posterior.data_vars) == list(before)  # the caller's draws untouched
    for name, values in before.items():
        np.testing.assert_array_equal(idata.posterior[name].values, values)


def test_loo_of_bambis_draws_on_its_pymc_model_refuses(poisson_glmm):
    model, _, with_offsets = poisson_glmm
    with pytest.raises(ValueError, match="Pass the Bambi model itself"):
        pymc_chunkpost.loo(with_offsets, model.backend.model)


def test_a_bambi_fit_is_unchanged_by_the_patch(poisson_glmm):
    """Bit for bit, through the route the patch changes: NUTS by numpyro (post-processing)
    and the log-likelihood Bambi asks pymc for."""
    model = bmb.Model("y ~ x + (1|g)", _data(), family="poisson")
    kwargs = dict(
        draws=50,
        tune=50,
        chains=2,
        random_seed=3,
        progressbar=False,
        inference_method="numpyro",
        idata_kwargs={"log_likelihood": True},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = model.fit(**kwargs)
        with pymc_chunkpost.patched():
            patched = model.fit(**kwargs)
    for group in ("posterior", "log_likelihood"):
        ours, theirs = patched[group], plain[group]
        assert list(ours.data_vars) == list(theirs.data_vars), group
        for name in theirs.data_vars:
            np.testing.assert_array_equal(ours[name].values, theirs[name].values, err_msg=name)


def test_expectations_of_a_posterior_variable_read_the_callers_draws(poisson_glmm):
    """`group="posterior"` reads the draws as the caller has them (as ArviZ does), not as
    Bambi's PyMC model reads them (its intercept re-centred)."""
    model, _, with_offsets = poisson_glmm
    kwargs = dict(group="posterior", var_name="Intercept", log_likelihood_var_name="y")
    ours, _ = pymc_chunkpost.loo_expectations(with_offsets, model, **kwargs)
    theirs, _ = azs.loo_expectations(with_offsets, **kwargs)
    np.testing.assert_allclose(ours.values, theirs.values, rtol=1e-9)
