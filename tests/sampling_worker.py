"""pymc's own JAX sampling routes, patched, run in a fresh process (for test_sampling_routes.py).

    python sampling_worker.py OUT CASE [CASE ...]

Each CASE is `route:sampler:chains:chain_method:model`:
- route: `pm.sample` (`pm.sample(nuts_sampler=sampler)`) or `sample_nuts`
  (`pymc.sampling.jax.sample_<sampler>_nuts`);
- sampler: `numpyro` or `blackjax`;
- chain_method: `parallel` (one chain per CPU device, pymc's default) or `vectorized` (all
  chains on one device);
- model: `tiny` (one untransformed Normal and nothing else: the post-processing program is an
  identity) or `ordinary` (a regression with a HalfNormal scale and a Deterministic).

It writes OUT.npz (each case's posterior, one array per variable) and OUT.json (per case: the
warnings raised while sampling, and the source and reason of every plan that ran). The cache
folder is the caller's `PYMC_CHUNKPOST_CACHE_DIR`.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pymc as pm
import pymc.sampling.jax as pmjax

import pymc_chunkpost
from pymc_chunkpost._engine.call import postprocess as _postprocess

PYMC6 = int(pm.__version__.split(".")[0]) >= 6


def build(name: str) -> pm.Model:
    with pm.Model() as model:
        if name == "tiny":
            pm.Normal("x", 0.0, 1.0)
        else:
            rng = np.random.default_rng(0)
            x = rng.normal(size=30)
            beta = pm.Normal("beta", 0.0, 1.0, shape=2)
            sigma = pm.HalfNormal("sigma", 1.0)
            mu = pm.Deterministic("mu", beta[0] + beta[1] * x)
            pm.Normal("y", mu, sigma, observed=1.0 + 2.0 * x + rng.normal(size=30))
    return model


def sample(route: str, sampler: str, chains: int, chain_method: str, model: pm.Model):
    common = {"draws": 5, "tune": 5, "chains": chains, "random_seed": 1, "progressbar": False}
    with model:
        if route == "sample_nuts":
            return getattr(pmjax, f"sample_{sampler}_nuts")(chain_method=chain_method, **common)
        kwargs = {"nuts": {"chain_method": chain_method}} if PYMC6 else {}
        if not PYMC6:
            kwargs["nuts_sampler_kwargs"] = {"chain_method": chain_method}
        return pm.sample(nuts_sampler=sampler, compute_convergence_checks=False, **common, **kwargs)


def main(out: str, cases: list[str]) -> None:
    pymc_chunkpost.patch()
    plans: list[tuple[str, str]] = []
    run = _postprocess.run

    def recorded(*args, **kwargs):
        outputs, plan = run(*args, **kwargs)
        plans.append((plan.source, plan.reason))
        return outputs, plan

    _postprocess.run = recorded
    arrays, report = {}, {}
    for case in cases:
        route, sampler, chains, chain_method, name = case.split(":")
        plans.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = sample(route, sampler, int(chains), chain_method, build(name))
        for var, values in idata.posterior.data_vars.items():
            arrays[f"{case}/{var}"] = np.asarray(values)
        report[case] = {"warnings": [str(w.message) for w in caught], "plans": list(plans)}
    np.savez(f"{out}.npz", **arrays)
    with open(f"{out}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
