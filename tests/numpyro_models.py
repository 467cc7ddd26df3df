"""Real numpyro models, with data, for the numpyro route's tests and its parity script.

Imports numpy, jax and numpyro only (not pymc, which turns on float64 in jax), so that
`benchmarks/probes/numpyro_parity.py` sees the float32 that numpyro users see.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def hierarchical(X, group, n_groups, y=None):
    """A hierarchical regression with plates: group intercepts, three slopes."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", n_groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("rows", X.shape[0]):
        numpyro.sample("y", dist.Normal(a[group] + X @ beta, sigma), obs=y)


def deterministic_sites(x, y=None):
    """Deterministic sites, one with a data-only term that XLA would fold if it could."""
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    mu = numpyro.deterministic("mu", a + b * x)
    numpyro.deterministic("scaled", jnp.exp(mu / 10.0) + jnp.log1p(x**2))
    with numpyro.plate("rows", x.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def logistic(x, y=None):
    """A discrete likelihood: Bernoulli with logits."""
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=a + b * x), obs=y)


def poisson(x, y=None):
    """A discrete likelihood whose sampler is a rejection loop."""
    a = numpyro.sample("a", dist.Normal(0.0, 0.5))
    b = numpyro.sample("b", dist.Normal(0.0, 0.5))
    with numpyro.plate("rows", x.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(a + b * x)), obs=y)


def multivariate(d, n, y=None):
    """A multivariate normal with an LKJ Cholesky factor."""
    L = numpyro.sample("L", dist.LKJCholesky(d, 2.0))
    scale = numpyro.sample("scale", dist.HalfNormal(jnp.ones(d)).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
    with numpyro.plate("rows", n):
        numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=scale[:, None] * L), obs=y)


def ar1(T, y=None):
    """A time series: an AR(1) process through numpyro's `scan`."""
    phi = numpyro.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(previous, y_t):
        mean = phi * previous
        y_t = numpyro.sample("y", dist.Normal(mean, sigma), obs=y_t)
        return y_t, mean

    _, means = scan(step, jnp.zeros(()), y, length=T)
    numpyro.deterministic("means", means)


def regression(X, y=None):
    """A linear regression whose design matrix times the slopes is a library matrix product."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("rows", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def eight_schools(sigma, y=None):
    """The eight schools: known per-school noise, data that multiplies the draws' noise."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def _data():
    rng = np.random.default_rng(0)
    n = 60
    X = jnp.asarray(rng.normal(size=(n, 3)), jnp.float32)
    x = jnp.asarray(rng.normal(size=n), jnp.float32)
    return {
        "hierarchical": (hierarchical, (X, jnp.asarray(rng.integers(0, 4, size=n)), 4)),
        "deterministic_sites": (deterministic_sites, (x,)),
        "logistic": (logistic, (x,)),
        "poisson": (poisson, (x,)),
        "multivariate": (multivariate, (3, 20)),
        "ar1": (ar1, (15,)),
        "regression": (regression, (jnp.asarray(rng.normal(size=(n, 50)), jnp.float32),)),
        "eight_schools": (eight_schools, (np.array([15.0, 10, 16, 11, 9, 11, 10, 18]),)),
    }


MODELS = _data()
