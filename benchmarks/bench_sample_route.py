"""pymc's own parallel-chain route, `pm.sample(nuts_sampler="numpyro", chains=4)`, patched and not.

    python benchmarks/bench_sample_route.py --repeats 3 --json bench_sample_route.json

What a user meets when a notebook runs again: each case samples one model in a fresh Python
process, with one chain per CPU device (pymc's default route on a CPU), and times the
post-processing calls pymc makes in it (`pymc.sampling.jax._postprocess_samples`, for the
posterior and the log-likelihood) and the whole `pm.sample` call.

Cases:
- `pymc`: unpatched pymc.
- `cold`: `pymc_chunkpost.patch()`, with a new empty cache folder.
- `warm`: the same, in a new process that reuses the folder the same repeat's cold run left.

Models: `untransformed` (untransformed free variables and no deterministic: the
post-processing program computes nothing, every output passes a draw through), and
`regression` (a HalfNormal scale and a 2,000-row Deterministic). Cases run round-robin, and
each run reports whether any warning mentioned an executable (the warm route must warn
nothing) and, patched, where each executable came from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("pymc", "cold", "warm")
MODELS = ("untransformed", "regression")
#: Accelerator cases (issues 49 and 50): a 500-row regression with 8 coefficients and one
#: float32 `Deterministic` `Xbig @ beta` of `rows x 8`: 8 GB at 1,000,000 rows over 4 x 500
#: draws (larger than pymc's vmap can hold beside it on a 16 GiB chip at 1,100,000 rows and
#: 4 x 1,000 draws: 17.6 GB).
#: `tiny_det` is the same at 20,000 rows, for a try-out on a CPU.
BIG_ROWS = {"big_det": 1_000_000, "huge_det": 1_100_000, "tiny_det": 20_000}


def build(name: str):
    import numpy as np
    import pymc as pm

    rng = np.random.default_rng(0)
    with pm.Model() as model:
        if name == "untransformed":
            beta = pm.Normal("beta", 0.0, 1.0, shape=3)
            x = rng.normal(size=(200, 3))
            pm.Normal("y", x @ beta, 1.0, observed=x @ [1.0, -1.0, 0.5] + rng.normal(size=200))
        elif name in BIG_ROWS:
            x, y, xbig = _big_data(name)
            beta = pm.Normal("beta", 0.0, 1.0, shape=8)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("y", x @ beta, sigma, observed=y)
            pm.Deterministic("big", pm.math.dot(xbig, beta))
        else:
            x = rng.normal(size=2000)
            beta = pm.Normal("beta", 0.0, 1.0, shape=2)
            sigma = pm.HalfNormal("sigma", 1.0)
            mu = pm.Deterministic("mu", beta[0] + beta[1] * x)
            pm.Normal("y", mu, sigma, observed=1.0 + 2.0 * x + rng.normal(size=2000))
    return model


def _big_data(name: str):
    """The regression's rows, its observations, and the `Deterministic`'s rows (float32)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8)).astype("float32")
    y = x @ np.ones(8) + rng.normal(size=500)
    return x, y, rng.normal(size=(BIG_ROWS[name], 8)).astype("float32")


def child(case: str, name: str, draws: int, tune: int) -> dict:
    """One case, in this process: the seconds spent post-processing and in `pm.sample`."""
    import pymc as pm
    import pymc.sampling.jax as pmjax
    from _internals import on_plan

    import pymc_chunkpost
    from pymc_chunkpost.profiling.proc import PeakRss, status_bytes

    if case != "pymc":
        pymc_chunkpost.patch()
    post_seconds, reasons = [], []
    original = pmjax._postprocess_samples

    def timed(*args, **kwargs):
        tic = time.perf_counter()
        out = original(*args, **kwargs)
        post_seconds.append(time.perf_counter() - tic)
        return out

    pmjax._postprocess_samples = timed
    on_plan(lambda plan: reasons.append(plan.reason))
    import jax

    model = build(name)
    options: dict = {"idata_kwargs": {"log_likelihood": name not in BIG_ROWS}}
    if jax.device_count() < 4:  # one accelerator: its chains vectorized, as users run them
        options["nuts_sampler_kwargs"] = {"chain_method": "vectorized"}
    rss_start, peak = status_bytes("VmRSS"), PeakRss()
    with warnings.catch_warnings(record=True) as caught, model:
        warnings.simplefilter("always")
        tic = time.perf_counter()
        idata = pm.sample(
            nuts_sampler="numpyro",
            chains=4,
            draws=draws,
            tune=tune,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
            **options,
        )
        total = time.perf_counter() - tic
    record = {
        "platform": jax.default_backend(),
        "rss_start_bytes": rss_start,
        "peak_rss_bytes": peak.bytes(),
        "peak_method": peak.method,
        "postprocess_seconds": sum(post_seconds),
        "sample_seconds": total,
        "loaded": sum("loaded from disk" in r for r in reasons),
        "plans": len(reasons),
        "executable_warnings": [str(w.message) for w in caught if "executable" in str(w.message)],
    }
    if name in BIG_ROWS:  # the Deterministic against NumPy on three draws
        import numpy as np

        xbig = _big_data(name)[2]
        big, beta = idata.posterior["big"].values, idata.posterior["beta"].values
        record["big_bytes"] = int(big.nbytes)
        record["largest_relative_difference"] = max(
            float(np.max(np.abs(big[c, d] - want)) / np.max(np.abs(want)))
            for c, d in ((0, 0), (3, draws - 1), (2, draws // 3))
            for want in [xbig @ beta[c, d]]
        )
    return record


def run_case(case: str, name: str, draws: int, tune: int, cache: Path) -> dict:
    env = {**os.environ, "PYMC_CHUNKPOST_CACHE_DIR": str(cache)}
    # The package of this checkout, as the other benchmarks' cells run it.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("XLA_FLAGS", None)  # pymc's own: 100 CPU devices
    command = [sys.executable, __file__, "--child", case, name, str(draws), str(tune)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # e.g. pymc's vmap out of an accelerator's memory: said, not fatal
        return {"error": "\n".join(done.stderr.strip().splitlines()[-6:])}
    return json.loads(done.stdout.strip().splitlines()[-1])


def header(repeats: int, draws: int) -> str:
    """What the table is, for the results page."""
    from importlib.metadata import version

    return (
        f'pymc {version("pymc")}, jax {version("jax")}: `pm.sample(nuts_sampler="numpyro", '
        f"chains=4)`, {draws} draws, one chain per CPU device (on one accelerator the chains "
        f"vectorized); medians of {repeats} fresh "
        "processes per case (post-processing also min-max). Post-processing s: pymc's "
        "`_postprocess_samples` calls (posterior and log-likelihood); loaded: plans whose "
        "executable came from the cache folder, of all plans; executable warnings: warnings "
        "that mention an executable."
    )


def table(results: dict) -> str:
    """Medians (min-max) of the post-processing time per case and model."""
    lines = [
        "| model | case | post-processing s | pm.sample s | loaded | executable warnings |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, by_case in results.items():
        for case, all_runs in by_case.items():
            runs = [r for r in all_runs if "error" not in r]
            if not runs:
                error = all_runs[0]["error"].splitlines()[-1][:120]
                lines.append(f"| {name} | {case} | failed: {error} | | | |")
                continue
            post = [r["postprocess_seconds"] for r in runs]
            total = [r["sample_seconds"] for r in runs]
            loaded = f"{sum(r['loaded'] for r in runs)}/{sum(r['plans'] for r in runs)}"
            warned = sum(len(r["executable_warnings"]) for r in runs)
            lines.append(
                f"| {name} | {case} | {statistics.median(post):.3f} ({min(post):.3f}-"
                f"{max(post):.3f}) | {statistics.median(total):.2f} | {loaded} | {warned} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=200)
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {MODELS + tuple(BIG_ROWS)}")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=4, metavar=("CASE", "MODEL", "DRAWS", "TUNE"))
    args = parser.parse_args(argv)
    if args.child:
        case, name, draws, tune = args.child
        print(json.dumps(child(case, name, int(draws), int(tune))))
        return
    models, cases = args.models.split(","), args.cases.split(",")
    unknown = sorted(set(models) - set(MODELS) - set(BIG_ROWS)) + sorted(set(cases) - set(CASES))
    if unknown or args.repeats < 1:
        parser.error(
            f"--models takes {MODELS + tuple(BIG_ROWS)}, --cases {CASES}; "
            f"--repeats >= 1 (got {unknown})"
        )
    results: dict = {name: {case: [] for case in cases} for name in models}
    for _ in range(args.repeats):
        for name in models:
            with tempfile.TemporaryDirectory() as cache:
                for case in cases:  # warm reuses the folder its cold run left
                    run = run_case(case, name, args.draws, args.tune, Path(cache))
                    results[name][case].append(run)
                    print(
                        json.dumps({"model": name, "case": case} | run), file=sys.stderr, flush=True
                    )
    text = table(results)
    print(text)
    if args.json:
        record = {
            "benchmark": "bench_sample_route",
            "draws": args.draws,
            "header": header(args.repeats, args.draws),
            "table": text,
            "results": results,
        }
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
