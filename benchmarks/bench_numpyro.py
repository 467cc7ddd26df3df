"""`pymc_chunkpost.numpyro.Predictive` against numpyro's own, each case in a fresh process.

    python benchmarks/bench_numpyro.py --repeats 3

Cases, 4 x 1000 draws each (`mcmc.get_samples()`'s layout, `(4000, ...)`): (a) `hier_2k`, a
hierarchical regression (20 group intercepts, 3 slopes) with 2,000 rows; (b) `eight_schools`;
(c) `hier_30k`, the same regression with 30,000 rows: 458 MiB of predictions, under a memory
budget of 1 GiB (`memory_budget=2**30` for ours; numpyro has no budget to give). Methods:
`ours` (the defaults: each draw computed by a program of one draw, numpyro's numbers),
`ours_vectorised` (`exact=False`), `numpyro_vmap` (`Predictive(parallel=True)`) and
`numpyro_map` (`parallel=False`, numpyro's default).

Every (case, method) runs in two fresh Python processes, one timing it and one measuring its
memory, each with a new empty cache folder (`PYMC_CHUNKPOST_CACHE_DIR`). In each, the model's
data and the posterior are built, JAX's first lowering is paid on a trivial function and the
garbage is collected. Then the first call runs (cold: tracing, compiling and running), its
result is dropped, and the second call runs (warm). The memory process runs each call under
memray and takes its peak: the most bytes the call had allocated and not yet freed at one
time, JAX's and XLA's native allocations included (as `bench_posthoc.py` measures). The
floor is the bytes of the predictions. Processes run round-robin (one repeat of every case and
method, then the next); ratios are medians of the run-by-run ratios. Each run's predictions
are checked against `numpyro_map`'s (bit for bit for `ours`: `equal_to_numpyro_map`).

Writes `benchmarks/results/bench_numpyro_py3<minor>.json` (every run, and the table) and prints the
table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one
from _cell import measured_call, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = ("hier_2k", "eight_schools", "hier_30k")
METHODS = ("ours", "ours_vectorised", "numpyro_vmap", "numpyro_map")
CHAINS, DRAWS = 4, 1000
BUDGET = 2**30  # the memory case's budget, bytes
ROWS = {"hier_2k": 2_000, "hier_30k": 30_000}


def build(case: str):
    """The model, its arguments, and a (4000, ...) posterior of its latent sites (seeded)."""
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist

    rng = np.random.default_rng(0)
    n = CHAINS * DRAWS
    if case == "eight_schools":

        def eight_schools(sigma, y=None):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
            with numpyro.plate("schools", sigma.shape[0]):
                theta = numpyro.sample("theta", dist.Normal(mu, tau))
                numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

        sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)
        draws = {
            "mu": rng.normal(4.0, 3.0, n),
            "tau": np.abs(rng.normal(3.0, 2.0, n)),
            "theta": rng.normal(size=(n, 8)),
        }
        return eight_schools, (sigma,), {k: jnp.asarray(v, jnp.float32) for k, v in draws.items()}
    rows, groups = ROWS[case], 20
    X = rng.normal(size=(rows, 3)).astype(np.float32)
    group = rng.integers(0, groups, size=rows)

    def hierarchical(X, group, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.HalfNormal(1.0))
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("groups", groups):
            a = numpyro.sample("a", dist.Normal(mu, tau))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("rows", X.shape[0]):
            numpyro.sample("y", dist.Normal(a[group] + X @ beta, sigma), obs=y)

    draws = {
        "mu": rng.normal(0.0, 0.1, n),
        "tau": np.abs(rng.normal(1.0, 0.1, n)),
        "beta": rng.normal(size=(n, 3)),
        "a": rng.normal(size=(n, groups)),
        "sigma": np.abs(rng.normal(1.0, 0.1, n)),
    }
    posterior = {k: jnp.asarray(v, jnp.float32) for k, v in draws.items()}
    return hierarchical, (jnp.asarray(X), jnp.asarray(group)), posterior


def child(case: str, method: str, measure: str) -> dict:
    """One case in this (fresh) process: cold and warm seconds (`measure="time"`), or the
    peak bytes each call allocates, under memray (`measure="memory"`)."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import Predictive as NumpyroPredictive

    from pymc_chunkpost.numpyro import Predictive

    model, args, posterior = build(case)
    key = jax.random.PRNGKey(0)
    budget = {"memory_budget": BUDGET} if case == "hier_30k" else {}
    make = {
        "ours": lambda: Predictive(model, posterior, **budget),
        "ours_vectorised": lambda: Predictive(model, posterior, exact=False, **budget),
        "numpyro_vmap": lambda: NumpyroPredictive(model, posterior, parallel=True),
        "numpyro_map": lambda: NumpyroPredictive(model, posterior, parallel=False),
    }[method]

    def call():
        return jax.block_until_ready(make()(key, *args))

    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # JAX's first lowering
    result = {
        "case": case,
        "method": method,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "python": platform.python_version(),
    }
    for phase in ("cold", "warm"):
        out = measured_call(call, measure, phase, result)
        result["floor"] = int(sum(np.asarray(v).nbytes for v in out.values()))
        result["checksum"] = float(np.sum(np.asarray(out["y"], np.float64)))
        if phase == "cold":
            del out
    if measure == "time" and method != "numpyro_map":  # after the timings
        reference = NumpyroPredictive(model, posterior)(key, *args)
        result["equal_to_numpyro_map"] = bool(np.array_equal(out["y"], reference["y"]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="the JSON file (default: benchmarks/results)")
    parser.add_argument("--note", default="", help="a note on the machine, kept in the JSON")
    parser.add_argument("--measures", default="time,memory", help="'time' where memray is absent")
    parser.add_argument(
        "--child", nargs=3, metavar=("CASE", "METHOD", "MEASURE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    cases, methods = args.cases.split(","), args.methods.split(",")
    runs: list[dict] = []
    for repeat in range(args.repeats):  # round-robin: one repeat of every case, then the next
        for case in cases:
            for method in methods:
                run = {"repeat": repeat}
                for measure in args.measures.split(","):  # each fresh, with an empty cache
                    with tempfile.TemporaryDirectory() as cache:
                        env = {"PYMC_CHUNKPOST_CACHE_DIR": cache}
                        run |= run_child(__file__, ["--child", case, method, measure], env)
                runs.append(run)
                print(json.dumps(run), flush=True)
                if "memory" not in args.measures:
                    Path(args.out or "bench_numpyro_time.json").write_text(json.dumps(runs))
    if "memory" not in args.measures:
        return  # the table reads both measures
    table = report(runs, cases, methods)
    print(table)
    first = runs[0]
    out = (
        Path(args.out)
        if args.out
        else (
            ROOT
            / "benchmarks"
            / "results"
            / f"bench_numpyro_py{first['python'].replace('.', '')[:3]}.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_numpyro.py " + " ".join(sys.argv[1:])
    record = {"command": command.strip(), "note": args.note, "runs": runs, "table": table}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


def _median_ratio(runs: list[dict], case: str, method: str, anchor: str, key: str) -> str:
    """The median of the run-by-run ratios of `method`'s `key` over `anchor`'s."""
    mine = [r[key] for r in runs if r["case"] == case and r["method"] == method]
    theirs = [r[key] for r in runs if r["case"] == case and r["method"] == anchor]
    if not mine or not theirs:
        return ""
    return f"{statistics.median(a / b for a, b in zip(mine, theirs)):.2f}x"


def report(runs: list[dict], cases: list[str], methods: list[str]) -> str:
    first = runs[0]
    lines = [
        f"Python {first['python']}, jax {first['jax']}, numpyro {first['numpyro']}, "
        f"{CHAINS} x {DRAWS} draws; medians of {max(r['repeat'] for r in runs) + 1} fresh "
        "processes per cell; cold = the first call in the process, warm = the second; ratios "
        "= medians of run-by-run ratios of our time over numpyro's (below 1: we are faster); "
        "peak = memray's high-water mark of the call's allocations, over the floor (the "
        "predictions' bytes). hier_30k: ours under a 1 GiB budget.",
        "",
        "| case | method | cold s | warm s | cold / vmap | warm / vmap | cold / map "
        "| warm / map | peak / floor (cold, warm) | peak MiB (cold) | floor | equal to map |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for method in methods:
            cell = [r for r in runs if r["case"] == case and r["method"] == method]
            if not cell:
                continue
            cold = statistics.median(r["cold_s"] for r in cell)
            warm = statistics.median(r["warm_s"] for r in cell)
            floor = cell[0]["floor"]
            peaks = [statistics.median(r[k] for r in cell) for k in ("cold_peak", "warm_peak")]
            ratios = [
                _median_ratio(runs, case, method, anchor, key) if method.startswith("ours") else ""
                for anchor in ("numpyro_vmap", "numpyro_map")
                for key in ("cold_s", "warm_s")
            ]
            equal = {True: "yes", False: "no", None: ""}[
                None
                if "equal_to_numpyro_map" not in cell[0]
                else all(r["equal_to_numpyro_map"] for r in cell)
            ]
            lines.append(
                f"| {case} | {method} | {cold:.2f} | {warm:.3f} | {' | '.join(ratios)} | "
                f"{peaks[0] / floor:.2f}x, {peaks[1] / floor:.2f}x | {peaks[0] / 2**20:,.0f} | "
                f"{floor / 2**20:,.1f} MiB | {equal} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
