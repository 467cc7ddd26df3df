"""The precision of float32 products (`matmul_precision`).

On a TPU, JAX's default float32 product is one bfloat16 pass. The routes whose pymc
counterpart computes on the host (post-hoc, predictive) ask for "highest" by default, so that
their answers are pymc's to float32 accuracy; `postprocess_samples` and the patched
`pm.sample` keep JAX's default, as pymc's own JAX route has it. On a CPU the setting changes
no number, so these tests read what the traced program asks of XLA: every product's
precision in the per-draw jaxpr the engine compiles.
"""

from __future__ import annotations

import warnings

import jax
import models
import numpy as np
import pytest
from helpers import assert_same, reference

import pymc_chunkpost
from pymc_chunkpost import clear_caches
from pymc_chunkpost._engine.call import draws as _draws

pm = pytest.importorskip("pymc")


def _precisions(jaxpr) -> set:
    """The `precision` of every product in `jaxpr` and the jaxprs it holds."""
    found = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.add(eqn.params["precision"])
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found |= _precisions(inner)
    return found


HIGHEST = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)


@pytest.fixture
def traced(monkeypatch):
    """The per-draw jaxprs that the engine analyses (`draws.validate`), in order."""
    jaxprs = []
    analyse = _draws.analyse

    def spy(*args, **kwargs):
        problem = analyse(*args, **kwargs)
        jaxprs.append(problem.jaxpr.jaxpr)
        return problem

    monkeypatch.setattr(_draws, "analyse", spy)
    return jaxprs


@pytest.mark.parametrize("precision", [None, "highest", "high"])
def test_the_engine_traces_products_at_the_precision_asked(traced, precision):
    model = models.data_regression(n_obs=50)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 10)
    clear_caches()
    outputs = pymc_chunkpost.postprocess_samples(jax_fn, raw, matmul_precision=precision)
    expected = None if precision is None else jax.lax.Precision(precision)
    assert _precisions(traced[-1]) == {None if expected is None else (expected, expected)}
    assert_same(outputs, reference(jax_fn, raw))


def test_one_function_at_two_precisions_is_two_programs(traced):
    """The precision is part of what a trace is cached by: the second call does not reuse
    the first one's program."""
    model = models.data_regression(n_obs=50)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 10)
    pymc_chunkpost.postprocess_samples(jax_fn, raw, matmul_precision="highest")
    pymc_chunkpost.postprocess_samples(jax_fn, raw)
    assert [_precisions(j) for j in traced] == [{HIGHEST}, {None}]


def test_the_posthoc_and_predictive_routes_default_to_highest(traced):
    model = models.data_regression(n_obs=50)
    with model:
        idata = pm.sample_prior_predictive(draws=10, random_seed=1)
    idata = _as_posterior(idata)
    quiet = dict(model=model, progressbar=False, extend_inferencedata=False)
    pymc_chunkpost.compute_log_likelihood(idata, **quiet)
    pymc_chunkpost.compute_deterministics(idata.posterior, model=model, progressbar=False)
    with model:
        pymc_chunkpost.sample_posterior_predictive(idata, progressbar=False)
    assert len(traced) == 3
    assert all(_precisions(j) == {HIGHEST} for j in traced)
    pymc_chunkpost.compute_log_likelihood(idata, **quiet, matmul_precision=None)
    assert _precisions(traced[-1]) == {None}


def _as_posterior(idata):
    """`idata` with its prior as a posterior of one chain."""
    prior = idata["prior"]
    prior = prior.to_dataset() if hasattr(prior, "to_dataset") else prior
    if int(pm.__version__.split(".")[0]) >= 6:
        import xarray as xr

        return xr.DataTree.from_dict({"posterior": prior})
    import arviz as az

    return az.InferenceData(posterior=prior)


@pytest.mark.parametrize("bad", ["float64", "HIGHEST", 3, ""])
def test_a_bad_precision_is_refused_before_any_work(bad, monkeypatch):
    monkeypatch.setattr(_draws, "analyse", lambda *a, **k: pytest.fail("traced"))
    raw = [np.zeros((2, 5, 3))]
    with pytest.raises(ValueError, match="`matmul_precision` must be one of"):
        pymc_chunkpost.postprocess_samples(lambda x: [x], raw, matmul_precision=bad)
    assert not raw[0].any()


def test_the_patched_sampler_checks_its_precision_before_sampling():
    model = models.data_regression(n_obs=20)
    with pymc_chunkpost.patched(), model:
        with pytest.raises(ValueError, match="postprocessing_matmul_precision.*Nothing was"):
            pm.sample(
                nuts_sampler="numpyro",
                draws=5,
                tune=5,
                chains=1,
                progressbar=False,
                nuts_sampler_kwargs={"postprocessing_matmul_precision": "fast"},
            )


def test_loo_defaults_to_highest(traced):
    model = models.data_regression(n_obs=50)
    with model:
        idata = pm.sample_prior_predictive(draws=40, random_seed=1)
    with warnings.catch_warnings():  # 40 draws: ArviZ may warn of so few
        warnings.simplefilter("ignore")
        pymc_chunkpost.loo(_as_posterior(idata), model)
    assert traced and all(_precisions(j) == {HIGHEST} for j in traced)


def test_small_products_on_an_exact_product_platform_are_multiplies_and_adds(
    configure, monkeypatch
):
    """Where the platform is one of `exact_product_platforms` (a TPU's; the CPU here, by
    configuration), a float32 model's 3-term product at "highest" runs as multiplies and
    adds, with pymc's numbers to float32's rounding; elsewhere the product stays a product."""
    import pytensor

    from pymc_chunkpost._engine.kernels import jaxpr_eval as _jaxpr_eval

    with pytensor.config.change_flags(floatX="float32"):
        model = models.data_regression(n_obs=50)
        with model:
            idata = _as_posterior(pm.sample_prior_predictive(draws=20, random_seed=1))
        quiet = dict(model=model, progressbar=False, extend_inferencedata=False)
        theirs = pm.compute_log_likelihood(idata, **quiet)["y"].values
        calls = []
        exact = _jaxpr_eval._exact_product
        monkeypatch.setattr(_jaxpr_eval, "_exact_product", lambda *a: calls.append(1) or exact(*a))
        clear_caches()
        products = pymc_chunkpost.compute_log_likelihood(idata, **quiet)["y"].values
        assert not calls  # the CPU is no exact-product platform by default
        configure(exact_product_platforms=("cpu",))
        clear_caches()
        ours = pymc_chunkpost.compute_log_likelihood(idata, **quiet)["y"].values
        assert calls
    assert ours.dtype == theirs.dtype == np.float32
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() / scale < 1e-6
    assert np.abs(products - theirs).max() / scale < 1e-6
