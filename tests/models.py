"""Real PyMC models for the core tests, and seeded raw draws of any (chains, draws)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
from pymc.sampling.jax import get_jaxified_graph
from pymc.util import get_default_varnames


def transforms(ordered: bool = True) -> pm.Model:
    """log, logodds, simplex and ordered transforms; an integer and a scalar deterministic."""
    rng = np.random.default_rng(1)
    coords = {"group": ["a", "b", "c"], "cat": list("wxyz")}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", dims="group")
        sigma = pm.HalfNormal("sigma")
        p = pm.Beta("p", 2.0, 2.0)
        weights = pm.Dirichlet("weights", np.ones(4), dims="cat")
        if ordered:
            cut = pm.Normal(
                "cut",
                shape=3,
                transform=pm.distributions.transforms.ordered,
                initval=np.array([-1.0, 0.0, 1.0]),
            )
        else:
            cut = pm.Normal("cut", shape=3)
        pm.Deterministic("positive", (mu > 0).sum())  # an integer output
        pm.Deterministic("score", mu.sum() * sigma + p + weights[0] + cut[-1])
        pm.Normal("y", mu.sum(), sigma, observed=rng.normal(size=7))
    return model


def structured() -> pm.Model:
    """LKJ Cholesky, ZeroSumNormal and a Gaussian random walk."""
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        pm.ZeroSumNormal("effects", sigma=1.0, shape=5)
        pm.GaussianRandomWalk("walk", sigma=0.5, init_dist=pm.Normal.dist(0.0, 1.0), steps=6)
        pm.Deterministic("cov", chol @ chol.T)
    return model


def data_regression(n_obs: int = 300) -> pm.Model:
    """`pm.Data`, coords/dims and an observation-level deterministic."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(n_obs, 3))
    with pm.Model(coords={"obs": range(n_obs), "feature": ["f0", "f1", "f2"]}) as model:
        data = pm.Data("x", x, dims=("obs", "feature"))
        beta = pm.Normal("beta", dims="feature")
        sigma = pm.HalfNormal("sigma")
        mu = pm.Deterministic("mu", data @ beta, dims="obs")
        pm.Normal("y", mu, sigma, observed=rng.normal(size=n_obs), dims="obs")
    return model


def no_deterministic() -> pm.Model:
    with pm.Model() as model:
        pm.Normal("a", shape=2)
        pm.Exponential("rate", 1.0)
    return model


def float32_model() -> pm.Model:
    """`transforms` in float32, without the ordered transform (pymc's fails in float32)."""
    with pytensor.config.change_flags(floatX="float32"):
        return transforms(ordered=False)


MODELS = {
    "transforms": transforms,
    "structured": structured,
    "data_regression": data_regression,
    "no_deterministic": no_deterministic,
}


def jax_fn(model: pm.Model):
    """What pymc's `sample_jax_nuts` post-processes: value vars -> posterior variables."""
    outputs = list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))
    with pytensor.config.change_flags(floatX=model.value_vars[0].dtype):
        return get_jaxified_graph(inputs=model.value_vars, outputs=outputs)


def raw_draws(model: pm.Model, chains: int, draws: int, seed: int = 0) -> list[np.ndarray]:
    """Seeded unconstrained draws of shape (chains, draws, ...), one per value variable."""
    rng = np.random.default_rng(seed)
    point = model.initial_point()
    return [
        (point[v.name] + 0.3 * rng.normal(size=(chains, draws) + np.shape(point[v.name]))).astype(
            v.dtype
        )
        for v in model.value_vars
    ]
