"""The post-hoc route against pymc's own `compute_log_likelihood`, each case in a fresh process.

    python benchmarks/bench_posthoc.py --repeats 3 --out posthoc.md --json run.json

`--json` keeps every run for benchmarks/results_page.py (kept in benchmarks/results/ under a
name like `bench_posthoc_run7_py312.json`).

Cases: a 4 x 1000-draw posterior of (a) `hier_2k`, a row-indexed hierarchical regression
with 2,000 rows, (b) `eight_schools`, (c) `hier_30k`, the same with 30,000 rows (0.9 GiB of
log-likelihood). Methods: `ours` (`pymc_chunkpost.compute_log_likelihood`, "auto"),
`pymc_jax` (pymc's own with the JAX backend: `backend="jax"` on pymc 6,
`compile_kwargs={"mode": "JAX"}` on pymc 5) and `pymc_default` (pymc's own, its default
backend: numba on pymc 6, C on pymc 5).

Every (case, method) runs in three fresh Python processes: one timing it and one measuring
its memory, each with a new empty cache folder (`PYMC_CHUNKPOST_CACHE_DIR`: tuning entries
and stored executables), and a third ("re-run") timing the first call with the folder the
timing process left, as a notebook run again the next day has. In each, the model
and the posterior are built, JAX's first lowering is paid on a trivial function, the model's
jaxified logp is built and its value-and-gradient compiled and run once (as
`pm.sample(nuts_sampler="numpyro")` does before its draws; `--fresh` skips this), and the
garbage is collected. Then the first call runs (cold: graph building, compiling and running),
its result is dropped, and the second call runs (warm). The timing process times both calls.
The memory process runs each under memray and takes its peak: the most bytes the call had
allocated and not yet freed at one time, JAX's and XLA's native allocations included.
The floor is the bytes of the log-likelihood array. Processes run round-robin (one repeat of
every case, then the next); speed-ups are medians of the run-by-run ratios.

Peak RSS (`VmHWM`) is not used: it counts the first touch of library code pages, and misses
allocations that reuse heap pages another compile left resident, so the same call read 1.13x
the floor after a trivial compile and 0.55x after the logp's (docs/decisions.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one
from _cell import measured_call, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = ("hier_2k", "eight_schools", "hier_30k")
METHODS = ("ours", "pymc_jax", "pymc_default")
CHAINS, DRAWS = 4, 1000


def build(case: str):
    """The model and a (4, 1000) posterior Dataset of its free variables (seeded)."""
    import numpy as np
    import pymc as pm
    import xarray as xr

    rng = np.random.default_rng(0)
    shape = (CHAINS, DRAWS)
    sample = {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
    if case == "eight_schools":
        y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
        sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
        with pm.Model(coords={"school": np.arange(8)}) as model:
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfCauchy("tau", 5.0)
            z = pm.Normal("z", 0.0, 1.0, dims="school")
            theta = pm.Deterministic("theta", mu + tau * z, dims="school")
            pm.Normal("obs", theta, sigma, observed=y, dims="school")
        post = {
            "mu": (("chain", "draw"), rng.normal(4.0, 3.0, shape)),
            "tau": (("chain", "draw"), np.abs(rng.normal(3.0, 2.0, shape))),
            "z": (("chain", "draw", "school"), rng.normal(size=(*shape, 8))),
        }
        return model, xr.Dataset(post, coords=sample | {"school": np.arange(8)})
    n_rows, n_groups = {
        "hier_2k": (2_000, 40),
        "hier_20k": (20_000, 200),
        "hier_30k": (30_000, 200),
    }[case]
    group = rng.integers(0, n_groups, size=n_rows)
    x = rng.normal(size=n_rows)
    coords = {"group": np.arange(n_groups), "row": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        x_data = pm.Data("x", x, dims="row")
        mu = pm.Normal("mu")
        tau = pm.HalfNormal("tau")
        z = pm.Normal("z", dims="group")
        beta = pm.Normal("beta")
        sigma = pm.HalfNormal("sigma")
        intercept = mu + tau * z
        pm.Normal(
            "y",
            intercept[group] + beta * x_data,
            sigma,
            observed=rng.normal(size=n_rows),
            dims="row",
        )
    post = {
        "mu": (("chain", "draw"), rng.normal(0.0, 0.1, shape)),
        "tau": (("chain", "draw"), np.abs(rng.normal(1.0, 0.1, shape))),
        "z": (("chain", "draw", "group"), rng.normal(size=(*shape, n_groups))),
        "beta": (("chain", "draw"), rng.normal(0.0, 0.1, shape)),
        "sigma": (("chain", "draw"), np.abs(rng.normal(1.0, 0.1, shape))),
    }
    return model, xr.Dataset(post, coords=sample | {"group": np.arange(n_groups)})


def child(case: str, method: str, after_sampling: bool, measure: str) -> dict:
    """One case in this (fresh) process: cold and warm seconds (`measure="time"`), the first
    call's seconds in a process after another one's (`"rerun"`), or the peak bytes each call
    allocates, under memray (`measure="memory"`)."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pymc as pm

    import pymc_chunkpost

    pymc6 = int(pm.__version__.split(".")[0]) >= 6
    model, posterior = build(case)
    if pymc6:
        import xarray as xr

        def idata():
            return xr.DataTree.from_dict({"posterior": posterior})
    else:
        import arviz as az

        def idata():
            return az.InferenceData(posterior=posterior)

    jax_mode = {"backend": "jax"} if pymc6 else {"compile_kwargs": {"mode": "JAX"}}
    call = {
        "ours": lambda: pymc_chunkpost.compute_log_likelihood(
            idata(), model=model, extend_inferencedata=False, progressbar=False
        ),
        "pymc_jax": lambda: pm.compute_log_likelihood(
            idata(), model=model, extend_inferencedata=False, progressbar=False, **jax_mode
        ),
        "pymc_default": lambda: pm.compute_log_likelihood(
            idata(), model=model, extend_inferencedata=False, progressbar=False
        ),
    }[method]
    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # JAX's first lowering
    if after_sampling:  # what `pm.sample(nuts_sampler="numpyro")` built and compiled before
        from pymc.sampling.jax import get_jaxified_logp

        logp = get_jaxified_logp(model)
        point = model.initial_point()
        start = [jnp.asarray(point[v.name]) for v in model.value_vars]
        jax.block_until_ready(jax.jit(jax.value_and_grad(logp))(start))
    result = {"case": case, "method": method, "pymc": pm.__version__, "jax": jax.__version__}
    if measure == "rerun":  # the first call only, in a process after an earlier one
        measured_call(call, "time", "rerun", result)
        return result
    for phase in ("cold", "warm"):
        out = measured_call(call, measure, phase, result)
        result["floor"] = int(sum(v.values.nbytes for v in out.data_vars.values()))
        checksum = float(np.sum(out["y" if "y" in out else "obs"].values))
        result["checksum"] = checksum
        del out
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument(
        "--json", default=None, help="write every run here (benchmarks/results_page.py reads it)"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="time the first call in a bare process (default: after building the model's "
        "jaxified logp and compiling its gradient, as a session that has just sampled with "
        "numpyro has)",
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("CASE", "METHOD", "MEASURE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        case, method, measure = args.child
        print(json.dumps(child(case, method, not args.fresh, measure)))
        return
    cases, methods = args.cases.split(","), args.methods.split(",")
    runs: list[dict] = []
    for repeat in range(args.repeats):  # round-robin: one repeat of every case, then the next
        for case in cases:
            for method in methods:
                run = {"repeat": repeat}
                # Each measure in its own fresh process. "time" starts with an empty cache
                # folder and "rerun" reuses what it left; "memory" has an empty one of its own.
                with tempfile.TemporaryDirectory() as timed, tempfile.TemporaryDirectory() as mem:
                    for measure, cache in (("time", timed), ("rerun", timed), ("memory", mem)):
                        argv = ["--child", case, method, measure]
                        argv += ["--fresh"] if args.fresh else []
                        env = {"PYMC_CHUNKPOST_CACHE_DIR": cache}
                        run |= run_child(__file__, argv, env)
                runs.append(run)
                print(
                    f"{case:14s} {method:13s} cold {run['cold_s']:6.2f} s  warm "
                    f"{run['warm_s']:6.2f} s  re-run {run['rerun_s']:6.2f} s  peak "
                    f"{run['cold_peak'] / run['floor']:5.2f}x / "
                    f"{run['warm_peak'] / run['floor']:5.2f}x of {run['floor'] / 2**20:,.1f} MiB",
                    flush=True,
                )
    table = report(runs, cases, methods, args.fresh)
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    if args.json:
        record = {
            "command": " ".join(["python benchmarks/bench_posthoc.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d"),
            "python": sys.version.split()[0],
            "cases": cases,
            "methods": methods,
            "fresh": args.fresh,
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(record, indent=1))


def report(runs: list[dict], cases: list[str], methods: list[str], fresh: bool) -> str:
    def pick(case, method, key):
        return [r[key] for r in runs if r["case"] == case and r["method"] == method]

    first = runs[0]
    lines = [
        f"pymc {first['pymc']}, jax {first['jax']}, {CHAINS} x {DRAWS} draws; medians of "
        f"{max(r['repeat'] for r in runs) + 1} fresh processes per cell; speed-up = median "
        "of run-by-run ratios (pymc's time / ours); cold = first call "
        + ("in a bare process" if fresh else "after the model's logp and gradient were compiled")
        + "; warm = the second call in that process; re-run = the first call in a new process "
        "that reuses the cache folder the cold one left (pymc's own disk caches are there for "
        "every method); peak = memray's high-water mark of the call's allocations.",
        "",
        "| posterior | method | cold s | warm s | re-run s | cold speed-up | warm speed-up "
        "| re-run speed-up | peak / floor (cold, warm) | floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for method in methods:
            cold, warm = pick(case, method, "cold_s"), pick(case, method, "warm_s")
            rerun = pick(case, method, "rerun_s")
            if not cold:
                continue
            speed = ["", "", ""]
            if method != "ours" and "ours" in methods:
                for i, key in enumerate(("cold_s", "warm_s", "rerun_s")):
                    ratios = [
                        a / b for a, b in zip(pick(case, method, key), pick(case, "ours", key))
                    ]
                    speed[i] = f"{statistics.median(ratios):.2f}x"
            floor = pick(case, method, "floor")[0]
            peaks = [
                statistics.median(pick(case, method, k)) / floor for k in ("cold_peak", "warm_peak")
            ]
            lines.append(
                f"| {case} | {method} | {statistics.median(cold):.2f} | "
                f"{statistics.median(warm):.2f} | {statistics.median(rerun):.2f} | "
                f"{speed[0]} | {speed[1]} | {speed[2]} | "
                f"{peaks[0]:.2f}x, {peaks[1]:.2f}x | {floor / 2**20:,.1f} MiB |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
