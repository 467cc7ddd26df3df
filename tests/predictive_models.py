"""Models for the predictive route's tests, and posteriors to condition them on.

Each builder returns a model with observed data; `posterior(model, chains, draws)` gives an
inference data of the installed pymc's type (pymc 6: `DataTree`; pymc 5: `InferenceData`)
whose posterior holds seeded prior draws of every free variable and deterministic, with
pymc's `observed_data` and `constant_data` groups.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import xarray as xr

PYMC6 = int(pm.__version__.split(".")[0]) >= 6


def hierarchical(n_rows: int = 60, n_groups: int = 5) -> pm.Model:
    """A hierarchical regression with `pm.Data`, coords and an observation-level deterministic."""
    rng = np.random.default_rng(10)
    group = rng.integers(0, n_groups, size=n_rows)
    x = rng.normal(size=n_rows)
    coords = {"group": [f"g{i}" for i in range(n_groups)], "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        x_data = pm.Data("x", x, dims="obs")
        group_data = pm.Data("group_idx", group, dims="obs")
        mu_a = pm.Normal("mu_a", 0.0, 1.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")
        b = pm.Normal("b", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.Deterministic("mu", a[group_data] + b * x_data, dims="obs")
        pm.Normal("y", mu, sigma, observed=rng.normal(size=n_rows), shape=x_data.shape, dims="obs")
    return model


def categorical() -> pm.Model:
    """A Categorical with strongly non-uniform probabilities (P(2) = 0.85)."""
    rng = np.random.default_rng(11)
    with pm.Model() as model:
        w = pm.Dirichlet("w", a=np.array([1.0, 2.0, 30.0]))
        pm.Categorical("y", p=w, observed=rng.integers(0, 3, size=8))
    return model


def zero_inflated() -> pm.Model:
    rng = np.random.default_rng(12)
    with pm.Model() as model:
        psi = pm.Beta("psi", 2.0, 2.0)
        rate = pm.Gamma("rate", 4.0, 1.0)
        pm.ZeroInflatedPoisson("y", psi=psi, mu=rate, observed=rng.poisson(2.0, size=10))
    return model


def negative_binomial() -> pm.Model:
    """A NegativeBinomial GLM (log link)."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=12)
    with pm.Model() as model:
        intercept = pm.Normal("intercept", 1.0, 0.5)
        slope = pm.Normal("slope", 0.0, 0.5)
        alpha = pm.Gamma("alpha", 2.0, 1.0)
        pm.NegativeBinomial(
            "y",
            mu=pm.math.exp(intercept + slope * x),
            alpha=alpha,
            observed=rng.poisson(3.0, size=12),
        )
    return model


def mvnormal() -> pm.Model:
    """An MvNormal likelihood with an LKJCholeskyCov prior."""
    rng = np.random.default_rng(14)
    with pm.Model(coords={"obs": range(6), "axis": ["x", "y", "z"]}) as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        mu = pm.Normal("mu", dims="axis")
        pm.MvNormal("y", mu, chol=chol, observed=rng.normal(size=(6, 3)), dims=("obs", "axis"))
    return model


def student_t() -> pm.Model:
    rng = np.random.default_rng(15)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        sigma = pm.HalfNormal("sigma")
        nu = pm.Gamma("nu", 3.0, 0.5)
        pm.StudentT("y", nu=nu, mu=mu, sigma=sigma, observed=rng.standard_t(4, size=7))
    return model


def censored() -> pm.Model:
    """A Censored normal likelihood (upper censoring at 1, lower at -1)."""
    rng = np.random.default_rng(16)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 0.5)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Censored(
            "y",
            pm.Normal.dist(mu, sigma),
            lower=-1.0,
            upper=1.0,
            observed=np.clip(rng.normal(size=9), -1, 1),
        )
    return model


def random_walk() -> pm.Model:
    rng = np.random.default_rng(17)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 0.5)
        pm.GaussianRandomWalk(
            "y",
            sigma=sigma,
            init_dist=pm.Normal.dist(0.0, 1.0),
            steps=9,
            observed=np.cumsum(rng.normal(size=10)),
        )
    return model


def weibull() -> pm.Model:
    """A Weibull likelihood (no JAX sampler in pytensor)."""
    rng = np.random.default_rng(18)
    with pm.Model() as model:
        alpha = pm.Gamma("alpha", 4.0, 2.0)
        beta = pm.HalfNormal("beta", 2.0)
        pm.Weibull("y", alpha=alpha, beta=beta, observed=rng.weibull(2.0, size=8))
    return model


def observed_deterministic() -> pm.Model:
    """A deterministic of an observed variable (returned by default, recomputed per draw)."""
    rng = np.random.default_rng(19)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        sigma = pm.HalfNormal("sigma")
        y = pm.Normal("y", mu, sigma, observed=rng.normal(size=5))
        pm.Deterministic("y_squared", y**2)
    return model


def ar(steps: int = 30) -> pm.Model:
    """An order-2 autoregression: its random variable is a Scan."""
    rng = np.random.default_rng(20)
    with pm.Model() as model:
        rho = pm.Normal("rho", 0.0, 0.3, shape=2)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.AR(
            "y",
            rho=rho,
            sigma=sigma,
            init_dist=pm.Normal.dist(0.0, 1.0, shape=2),
            steps=steps,
            observed=rng.normal(size=steps + 2),
        )
    return model


def various() -> pm.Model:
    """Likelihoods with samplers of ours that pytensor lacks in JAX, all in one model."""
    rng = np.random.default_rng(21)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 0.3)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.TruncatedNormal(
            "truncated", mu, sigma, lower=-0.5, upper=2.0, observed=rng.uniform(-0.5, 2.0, 4)
        )
        pm.Wald("wald", mu=pm.math.exp(mu), lam=2.0 * sigma, observed=rng.uniform(1, 2, 4))
        pm.SkewNormal("skew", mu=mu, sigma=sigma, alpha=3.0, observed=rng.normal(size=4))
        pm.Triangular(
            "triangular", lower=-1.0, c=0.8 * pm.math.tanh(mu), upper=1.0, observed=np.zeros(4)
        )
        pm.Moyal("moyal", mu, sigma, observed=rng.normal(size=4))
        pm.Rice("rice", nu=pm.math.abs(mu) + 0.5, sigma=sigma, observed=rng.uniform(1, 2, 4))
        pm.DiscreteUniform("discrete_uniform", lower=-2, upper=3, observed=np.zeros(4, int))
        pm.HalfStudentT("half_t", nu=3.0, sigma=sigma, observed=rng.uniform(0, 1, 4))
        pm.HyperGeometric("hypergeometric", N=20, k=7, n=9, observed=np.ones(4, int))
        pm.BetaBinomial("beta_binomial", alpha=2.0, beta=sigma + 1, n=10, observed=np.ones(4, int))
        pm.Geometric("geometric", p=0.3, observed=np.ones(4, int))
        pm.InverseGamma("inverse_gamma", alpha=3.0, beta=sigma, observed=np.ones(4))
        pm.LogNormal("lognormal", mu, sigma, observed=np.ones(4))
        pm.HalfCauchy("half_cauchy", beta=sigma, observed=np.ones(4))
        pm.Binomial("binomial", n=12, p=0.3, observed=np.ones(4, int))
        pm.Poisson("poisson", mu=pm.math.exp(mu) * 3, observed=np.ones(4, int))
        pm.Bernoulli("bernoulli", p=0.8, observed=np.ones(4, int))
    return model


MODELS = {
    "hierarchical": hierarchical,
    "categorical": categorical,
    "zero_inflated": zero_inflated,
    "negative_binomial": negative_binomial,
    "mvnormal": mvnormal,
    "student_t": student_t,
    "censored": censored,
    "random_walk": random_walk,
    "weibull": weibull,
    "observed_deterministic": observed_deterministic,
    "ar": ar,
    "various": various,
}


def posterior(model: pm.Model, chains: int = 2, draws: int = 10, seed: int = 1):
    """Seeded prior draws of every free variable and deterministic, as a posterior, with
    pymc's `observed_data` and `constant_data` groups, in the installed pymc's type."""
    names = [v.name for v in model.free_RVs] + [v.name for v in model.deterministics]
    idata = pm.sample_prior_predictive(
        draws=chains * draws, model=model, random_seed=seed, var_names=names
    )
    prior = _dataset(idata["prior"])
    variables = {
        name: (("chain", "draw", *da.dims[2:]), da.values.reshape(chains, draws, *da.shape[2:]))
        for name, da in prior.data_vars.items()
    }
    coords = {k: v for k, v in prior.coords.items() if k not in ("chain", "draw")}
    coords |= {"chain": np.arange(chains), "draw": np.arange(draws)}
    post = xr.Dataset(variables, coords=coords, attrs=dict(prior.attrs))
    groups = {"posterior": post}
    for group in ("observed_data", "constant_data"):
        if group in _groups(idata):
            groups[group] = _dataset(idata[group]).copy(deep=True)
    if PYMC6:
        return xr.DataTree.from_dict(groups)
    import arviz as az

    return az.InferenceData(**groups)


def with_posterior(idata, dataset: xr.Dataset):
    """A copy of `idata` whose posterior is `dataset`."""
    groups = {g: _dataset(idata[g]).copy(deep=True) for g in _groups(idata)}
    groups["posterior"] = dataset
    if PYMC6:
        return xr.DataTree.from_dict(groups)
    import arviz as az

    return az.InferenceData(**groups)


def _groups(idata) -> list[str]:
    return list(idata.children) if PYMC6 else list(idata.groups())


def _dataset(group):
    return group.to_dataset() if hasattr(group, "to_dataset") else group
