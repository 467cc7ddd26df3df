"""Every route once on a small model with data of `ROWS` observations, in a fresh process
whose XLA dumps each program it compiles (for test_program_constants.py).

    XLA_FLAGS=--xla_dump_to=DIR python constants_worker.py ROUTE [ROUTE ...]

ROUTE: `pymc` (compute_log_likelihood / log_prior / deterministics,
sample_posterior_predictive, loo) or `numpyro` (Predictive, log_likelihood, loo). The pymc
model is a Poisson regression with group intercepts (`exp(a[g] + x @ b)`), whose parameter
check `mu >= 0` XLA can prove for every observation; the NumPyro one is its twin. The cache
folder is the caller's `PYMC_CHUNKPOST_CACHE_DIR` (fresh: every program is compiled).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

import pymc_chunkpost

ROWS, GROUPS, CHAINS, DRAWS = 700, 7, 2, 40


def data():
    rng = np.random.default_rng(0)
    x, group = rng.normal(size=(ROWS, 3)), rng.integers(0, GROUPS, ROWS)
    y = rng.poisson(np.exp(0.3 * x[:, 0] + 0.1 * group))
    draws = {
        "a": rng.normal(0, 0.1, (CHAINS, DRAWS, GROUPS)),
        "b": rng.normal(0, 0.1, (CHAINS, DRAWS, 3)),
    }
    return x, group, y, draws


def pymc_routes() -> None:
    import pymc as pm

    x, group, y, draws = data()
    with pm.Model(coords={"obs": range(ROWS)}) as model:
        xs, gs = pm.Data("x", x), pm.Data("group", group)
        a = pm.Normal("a", shape=GROUPS)
        b = pm.Normal("b", shape=3)
        mu = pm.Deterministic("mu", pm.math.exp(a[gs] + xs @ b), dims="obs")
        pm.Poisson("y", mu, observed=y, dims="obs")
    if int(pm.__version__.split(".")[0]) >= 6:
        from arviz_base import from_dict

        idata = from_dict({"posterior": draws})
    else:
        import arviz

        idata = arviz.from_dict(posterior=draws)
    pymc_chunkpost.compute_log_likelihood(idata, model=model, progressbar=False)
    pymc_chunkpost.compute_log_prior(idata, model=model, progressbar=False)
    pymc_chunkpost.compute_deterministics(idata["posterior"], model=model, progressbar=False)
    pymc_chunkpost.sample_posterior_predictive(idata, model=model, random_seed=1, progressbar=False)
    pymc_chunkpost.loo(idata, model)


def numpyro_routes() -> None:
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from pymc_chunkpost import numpyro as chunkpost_numpyro

    def model(x, group, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([GROUPS]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("rows", x.shape[0]):
            numpyro.sample("y", dist.Poisson(jnp.exp(a[group] + x @ b)), obs=y)

    x, group, y, draws = data()
    samples = {k: v.reshape(CHAINS * DRAWS, *v.shape[2:]) for k, v in draws.items()}
    chunkpost_numpyro.Predictive(model, samples)(jax.random.key(0), x, group)
    chunkpost_numpyro.log_likelihood(model, samples, x, group, y)
    chunkpost_numpyro.loo(model, samples, x, group, y)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for route in sys.argv[1:]:
        {"pymc": pymc_routes, "numpyro": numpyro_routes}[route]()
    print("done")
