"""The predictive route's time against its chunk size, beside `vmap` and `auto`.

    python benchmarks/predictive_sweep.py [--cases hier_2k,hier_20k,ar_500]
        [--cases logistic_5k,poisson_groups_10k,studentt_8k]
        [--sizes 40,100,250,500,1000,2000] [--repeats 2] [--json FILE]

Each (case, plan) runs in a fresh process with an empty cache folder: the model and its
4 x 1000-draw posterior are built (`bench_predictive.build`, or `build_unseen` for the
models the route was never tuned on, `UNSEEN`), JAX's first lowering is paid on
a trivial function, then `pymc_chunkpost.sample_posterior_predictive` is called three times:
the first call's time is `cold`, the best of the other two `warm`. Plans: `auto`, `vmap`,
and `chunked` at each size. The table gives each plan's times over the best fixed plan's
(issue 51: `auto` within 1.05x of the best fixed strategy, cold and warm). The last line
printed is the JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cell import run_child  # noqa: E402

#: Models the route was never tuned on (issue 51's acceptance): a Bernoulli logistic
#: regression (5,000 rows, 10 coefficients), a Poisson regression with 50 group effects
#: (10,000 rows), and StudentT observations with a per-row scale (8,000 rows: gamma draws).
UNSEEN = ("logistic_5k", "poisson_groups_10k", "studentt_8k")


def build_unseen(case: str):
    """The model and a seeded (4, 1000) posterior Dataset of its free variables."""
    import numpy as np
    import pymc as pm
    import xarray as xr

    rng = np.random.default_rng(1)
    chains, draws = 4, 1000
    dims = ("chain", "draw")
    with pm.Model() as model:
        if case == "logistic_5k":
            x = rng.normal(size=(5000, 10))
            beta = pm.Normal("beta", 0.0, 1.0, shape=10)
            pm.Bernoulli("y", logit_p=x @ beta, observed=rng.integers(0, 2, 5000))
            post = {"beta": ((*dims, "beta_dim_0"), rng.normal(0, 0.3, (chains, draws, 10)))}
        elif case == "poisson_groups_10k":
            group = rng.integers(0, 50, 10000)
            x = rng.normal(size=10000)
            a = pm.Normal("a", 0.0, 1.0, shape=50)
            b = pm.Normal("b", 0.0, 1.0)
            pm.Poisson("y", pm.math.exp(a[group] + b * x), observed=rng.poisson(2.0, 10000))
            post = {
                "a": ((*dims, "a_dim_0"), rng.normal(0.7, 0.1, (chains, draws, 50))),
                "b": (dims, rng.normal(0.2, 0.05, (chains, draws))),
            }
        else:
            x = rng.normal(size=8000)
            w = rng.uniform(0.5, 2.0, 8000)
            mu = pm.Normal("mu", 0.0, 1.0)
            nu = pm.Gamma("nu", 2.0, 0.1)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.StudentT("y", nu=nu, mu=mu + x, sigma=sigma * w, observed=rng.normal(size=8000))
            post = {
                "mu": (dims, rng.normal(0, 0.1, (chains, draws))),
                "nu": (dims, rng.uniform(3, 10, (chains, draws))),
                "sigma": (dims, np.abs(rng.normal(1, 0.1, (chains, draws)))),
            }
    coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
    return model, xr.Dataset(post, coords=coords)


def _cell(case: str, plan: str) -> dict:
    import jax
    from bench_predictive import build as build_seen

    def build(case):
        return build_unseen(case) if case in UNSEEN else build_seen(case)

    from _internals import on_plan

    import pymc_chunkpost as pc

    model, posterior = build(case)
    jax.jit(lambda x: x + 1)(1.0).block_until_ready()
    options: dict = {}
    if plan == "vmap":
        options = {"postprocessing_vectorize": "vmap"}
    elif plan != "auto":
        options = {"postprocessing_vectorize": "chunked", "chunk_size": int(plan)}
    plans = []
    on_plan(
        lambda made: plans.append(f"{made.strategy} {made.loop} {made.chunk_size} ({made.source})")
    )
    times = []
    for _ in range(3):
        tic = time.perf_counter()
        out = pc.sample_posterior_predictive(
            posterior,
            model=model,
            progressbar=False,
            random_seed=1,
            return_inferencedata=False,
            **options,
        )
        times.append(time.perf_counter() - tic)
        del out
    return {"case": case, "plan": plan, "cold": times[0], "warm": min(times[1:]), "made": plans}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="hier_2k,hier_20k,ar_500")
    parser.add_argument("--sizes", default="40,100,250,500,1000,2000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, plan = args.child.split(":")
        print(json.dumps(_cell(case, plan)))
        return
    plans = ["auto", "vmap", *args.sizes.split(",")]
    cells: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):  # round-robin: one repeat of every cell, then the next
        for case in args.cases.split(","):
            for plan in plans:
                env = {
                    "PYMC_CHUNKPOST_CACHE_DIR": tempfile.mkdtemp(),
                    "PYTHONPATH": os.pathsep.join(
                        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
                    ),
                }
                r = run_child(__file__, ["--child", f"{case}:{plan}"], env)
                cells.setdefault((case, plan), []).append(r)
                print(
                    f"{case:>9} {plan:>5}: cold {r['cold']:.2f} s, warm {r['warm']:.3f} s "
                    f"{r['made'][-1]}",
                    file=sys.stderr,
                    flush=True,
                )
    rows = [
        "| case | plan | cold | warm | cold / best fixed | warm / best fixed | made |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = []
    for case in args.cases.split(","):
        med = {
            p: {k: statistics.median(r[k] for r in cells[(case, p)]) for k in ("cold", "warm")}
            for p in plans
        }
        best = {k: min(med[p][k] for p in plans if p != "auto") for k in ("cold", "warm")}
        for p in plans:
            made = cells[(case, p)][-1]["made"][-1]
            ratio = {k: med[p][k] / best[k] for k in ("cold", "warm")}
            summary.append(
                {
                    "case": case,
                    "plan": p,
                    **med[p],
                    **{f"{k}_ratio": v for k, v in ratio.items()},
                    "made": made,
                }
            )
            rows.append(
                f"| {case} | {p} | {med[p]['cold']:.2f} s | {med[p]['warm']:.3f} s | "
                f"{ratio['cold']:.2f} | {ratio['warm']:.2f} | {made} |"
            )
    table = "\n".join(rows)
    print(table, file=sys.stderr)
    record = {
        "summary": summary,
        "table": table,
        "cells": {f"{c}:{p}": v for (c, p), v in cells.items()},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
