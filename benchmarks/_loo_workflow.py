"""The LOO workflow on one real model, ours beside arviz-stats', each in a fresh process, and
the plots arviz-plots draws from our values (docs/loo_workflow.md): `bench_loo.py --workflow`
runs it (a module beside the scripts, not one of them).

    python benchmarks/bench_loo.py --workflow --plots docs \
        --json benchmarks/results/loo_workflow_run1_py312.json

The model: the eight schools (Rubin 1981; the SAT coaching effects `y` and their standard
errors `sigma`), centred and non-centred, each sampled once in the parent (NUTS, `--chains` x
`--draws`, seeded) with its posterior predictive, and saved for the cells. Each cell runs the
workflow on both fits and times each step cold (compiles included): `loo` of each, `compare`,
`loo_pit`, `loo_expectations` (mean), `loo_metrics` (rmse), `loo_score` (crps) and
`loo_moment_match` of the centred model. `ours`: `pymc_chunkpost`'s functions, given the
draws without a log-likelihood group, and the model; `arviz_stats`: `pm.compute_log_likelihood`
(timed as a step) and arviz-stats' functions on the full matrices. The record keeps each
step's seconds and the largest differences between the two cells' values. With `--plots DIR`,
the parent draws, from ours: `plot_khat` of the centred model's `loo`, `plot_compare`, and
`plot_ecdf_pit` of the LOO-PIT values, as `DIR/loo_workflow_{khat,compare,pit}.png`.

`--case moment_match` times `loo_moment_match` alone, ours against arviz-stats' with
`model=`: a hierarchical normal regression (`--groups` groups, `--rows` observations, a slope)
whose data carry `--outliers` gross outliers, so that several observations have Pareto k
over the threshold; its NUTS posterior is sampled once, in the parent, and saved for the
cells. Each cell computes its own `loo` (not timed: `pymc_chunkpost.loo(pointwise=True)`, or
`pm.compute_log_likelihood` and `arviz_stats.loo`), then times one cold call of its
`loo_moment_match(..., model=model)`. The record keeps the seconds, the elpd, the k over the
threshold before and after, and the largest differences of elpd (relative) and of every k.

    python benchmarks/bench_loo.py --workflow --case moment_match \
        --json benchmarks/results/moment_match_run2_py312.json

`--case scale` runs `loo_pit` and `loo_expectations` at `--rows` of bench_loo.py's
hierarchical regression (4 x 1,000 seeded draws), its posterior predictive written once by
`sample_posterior_predictive(output_memory="disk")` (into `--store-dir`) and opened lazily in
each function's fresh process: seconds and peak RSS above the RSS before the call.

ArviZ 1.x only.
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cell import run_child  # noqa: E402

Y = [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]
SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]
SCHOOLS = ["Choate", "Deerfield", "Phillips Andover", "Phillips Exeter", "Hotchkiss"]
SCHOOLS += ["Lawrenceville", "St. Paul's", "Mt. Hermon"]


def _model(kind: str):
    import numpy as np
    import pymc as pm

    with pm.Model(coords={"school": SCHOOLS}) as model:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfCauchy("tau", 5)
        if kind == "centered":
            theta = pm.Normal("theta", mu, tau, dims="school")
        else:
            eta = pm.Normal("eta", 0, 1, dims="school")
            theta = pm.Deterministic("theta", mu + tau * eta, dims="school")
        pm.Normal("y", theta, np.array(SIGMA), observed=np.array(Y), dims="school")
    return model


def _steps(method: str, fits: dict) -> tuple[dict, dict]:
    """Each step's seconds and values."""
    import time
    import warnings

    import arviz_stats as azs
    import pymc as pm

    import pymc_chunkpost as pc

    warnings.filterwarnings("ignore")
    seconds, values = {}, {}

    def timed(step, call):
        tic = time.perf_counter()
        out = call()
        seconds[step] = time.perf_counter() - tic
        return out

    models = {kind: _model(kind) for kind in fits}
    loos = {}
    for kind, idata in fits.items():
        if method == "ours":

            def ours(idata=idata, kind=kind):
                return pc.loo(idata, models[kind], pointwise=True)

            loos[kind] = timed(f"loo_{kind}", ours)
        else:

            def full(idata=idata, kind=kind):
                pm.compute_log_likelihood(idata, model=models[kind], progressbar=False)
                return azs.loo(idata, pointwise=True)

            loos[kind] = timed(f"loo_{kind}", full)
    compared = timed("compare", lambda: azs.compare(loos))
    data, model = fits["centered"], models["centered"]
    own = method == "ours"
    seed = 7
    pit = timed(
        "loo_pit",
        lambda: (
            pc.loo_pit(data, model, random_state=seed)
            if own
            else azs.loo_pit(data, random_state=seed)
        ),
    )
    expectation, khat = timed(
        "loo_expectations",
        lambda: pc.loo_expectations(data, model) if own else azs.loo_expectations(data),
    )
    rmse = timed(
        "loo_metrics", lambda: pc.loo_metrics(data, model) if own else azs.loo_metrics(data)
    )
    crps = timed("loo_score", lambda: pc.loo_score(data, model) if own else azs.loo_score(data))
    matched = timed(
        "loo_moment_match",
        lambda: (
            pc.loo_moment_match(data, loos["centered"], model=model)
            if own
            else azs.loo_moment_match(data, loos["centered"], model=model)
        ),
    )
    values = {
        "elpd": {kind: float(loo.elpd) for kind, loo in loos.items()},
        "pareto_k": loos["centered"].pareto_k.values.tolist(),
        "compare_weight": compared["weight"].to_dict(),
        "pit": pit["y"].values.tolist(),
        "expectation": expectation.values.tolist(),
        "khat": khat.values.tolist(),
        "rmse": [float(rmse.mean), float(rmse.se)],
        "crps": [float(crps.mean), float(crps.se)],
        "moment_matched_elpd": float(matched.elpd),
        "moment_matched_k": matched.pareto_k.values.tolist(),
    }
    return seconds, values


def _cell(method: str, fits_path: str) -> dict:
    with open(fits_path, "rb") as f:
        fits = pickle.load(f)
    seconds, values = _steps(method, fits)
    return {"method": method, "seconds": seconds, "values": values}


def _largest_differences(ours: dict, theirs: dict) -> dict:
    import numpy as np

    out = {}
    for key, value in theirs.items():
        a, b = ours[key], value
        if isinstance(b, dict):
            a, b = [a[k] for k in b], list(b.values())
        out[key] = float(np.max(np.abs(np.asarray(a, float) - np.asarray(b, float))))
    return out


def _plots(folder: Path, fits: dict) -> None:
    import warnings

    import arviz_plots as azp
    import arviz_stats as azs
    import matplotlib
    import xarray as xr

    import pymc_chunkpost as pc

    matplotlib.use("Agg")
    warnings.filterwarnings("ignore")
    models = {kind: _model(kind) for kind in fits}
    loos = {kind: pc.loo(fits[kind], models[kind], pointwise=True) for kind in fits}
    pit = pc.loo_pit(fits["centered"], models["centered"], random_state=7)
    figures = {
        "khat": azp.plot_khat(loos["centered"], backend="matplotlib"),
        "compare": azp.plot_compare(azs.compare(loos), backend="matplotlib"),
        "pit": azp.plot_ecdf_pit(
            xr.DataTree.from_dict({"loo_pit": pit}),
            group="loo_pit",
            sample_dims=list(pit.dims),
            backend="matplotlib",
        ),
    }
    for name, plot in figures.items():
        plot.savefig(folder / f"loo_workflow_{name}.png", dpi=80)


def _outliers_model(rows: int, groups: int, outliers: int):
    import numpy as np
    import pymc as pm

    rng = np.random.default_rng(0)
    group = rng.integers(0, groups, rows)
    x = rng.normal(size=rows)
    a = rng.normal(0, 1, groups)
    y = a[group] + 0.5 * x + rng.normal(0, 0.5, rows)
    y[:outliers] += rng.choice([-1, 1], outliers) * rng.uniform(4, 8, outliers)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 2)
        tau = pm.HalfNormal("tau", 1)
        intercept = pm.Normal("a", mu, tau, shape=groups)
        slope = pm.Normal("b", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", intercept[group] + slope * x, sigma, observed=y)
    return model


def _matching_cell(method: str, args: argparse.Namespace) -> dict:
    import time
    import warnings

    import arviz_stats as azs
    import numpy as np
    import pymc as pm
    import xarray as xr

    warnings.filterwarnings("ignore")
    model = _outliers_model(args.rows, args.groups, args.outliers)
    idata = xr.open_datatree(args.posterior, engine="zarr").load()
    if method == "ours":
        import pymc_chunkpost as pc

        loo = pc.loo(idata, model, pointwise=True)
        tic = time.perf_counter()
        matched = pc.loo_moment_match(idata, loo, model=model)
    else:
        pm.compute_log_likelihood(idata, model=model, progressbar=False)
        loo = azs.loo(idata, pointwise=True)
        tic = time.perf_counter()
        matched = azs.loo_moment_match(idata, loo, model=model)
    seconds = time.perf_counter() - tic
    good_k = loo.good_k
    return {
        "method": method,
        "seconds": seconds,
        "elpd_before": float(loo.elpd),
        "elpd": float(matched.elpd),
        "k_over_before": int(np.sum(loo.pareto_k.values > good_k)),
        "k_over_after": int(np.sum(matched.pareto_k.values > good_k)),
        "pareto_k": np.asarray(matched.pareto_k.values).tolist(),
    }


def _matching_main(args: argparse.Namespace) -> None:
    """The moment-matching case: the outlier regression, ours beside arviz-stats'."""
    import pymc as pm

    folder = tempfile.TemporaryDirectory()
    posterior = Path(folder.name) / "posterior.zarr"
    with _outliers_model(args.rows, args.groups, args.outliers):
        idata = pm.sample(
            args.draws,
            tune=1000,
            chains=args.chains,
            cores=1,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    idata.to_zarr(posterior)
    shared = [f"--{k}={getattr(args, k)}" for k in ("rows", "groups", "outliers")]
    cells = [
        run_child(
            __file__, ["--case=moment_match", "--child", m, f"--posterior={posterior}", *shared]
        )
        for m in args.methods.split(",")
    ]
    by = {c["method"]: c for c in cells}
    record: dict = {
        "script": "benchmarks/bench_loo.py --workflow --case moment_match",
        "python": platform.python_version(),
        "versions": {m: __import__(m).__version__ for m in ("pymc", "jax", "arviz_stats")},
        "rows": args.rows,
        "groups": args.groups,
        "outliers": args.outliers,
        "chains": args.chains,
        "draws": args.draws,
        "cells": [{k: v for k, v in c.items() if k != "pareto_k"} for c in cells],
    }
    if {"ours", "arviz_stats"} <= set(by):
        ours, theirs = by["ours"], by["arviz_stats"]
        record["speedup"] = theirs["seconds"] / ours["seconds"]
        record["elpd_rel_diff"] = abs(ours["elpd"] - theirs["elpd"]) / abs(theirs["elpd"])
        record["k_max_abs_diff"] = max(
            abs(a - b) for a, b in zip(ours["pareto_k"], theirs["pareto_k"])
        )
    print(json.dumps(record, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


def _scale_cell(function: str, args: argparse.Namespace) -> dict:
    """One workflow function at `--rows`, its posterior predictive opened lazily from the
    disk tier's store: seconds and peak RSS above the RSS before the call."""
    import gc
    import time
    import warnings

    import bench_loo
    import numpy as np
    import xarray as xr

    import pymc_chunkpost as pc

    warnings.filterwarnings("ignore")
    model, idata = bench_loo.build(args.rows)
    posterior = idata["posterior"]
    posterior = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    stored = xr.open_datatree(args.store, engine="zarr")["posterior_predictive"].to_dataset()
    observed = model.rvs_to_values[model["y"]]
    y = np.asarray(observed.get_value() if hasattr(observed, "get_value") else observed.data)
    data = xr.DataTree.from_dict(
        {
            "posterior": posterior,
            "posterior_predictive": stored,
            "observed_data": xr.Dataset({"y": (("obs",), y)}, coords={"obs": np.arange(y.size)}),
        }
    )
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    start = bench_loo._status("VmRSS")
    tic = time.perf_counter()
    if function == "loo_pit":
        out = pc.loo_pit(data, model)
        summary = float(out["y"].mean())
    else:
        out, khat = pc.loo_expectations(data, model)
        summary = float(out.mean())
    seconds = time.perf_counter() - tic
    return {
        "function": function,
        "rows": args.rows,
        "seconds": seconds,
        "peak_rss_above_start": bench_loo._status("VmHWM") - start,
        "mean_value": summary,
    }


def _scale_main(args: argparse.Namespace) -> None:
    """The scale case: bench_loo's hierarchical regression at `--rows`, its posterior
    predictive written by `sample_posterior_predictive(output_memory="disk")` once, then
    each function in a fresh process."""
    import time
    import warnings

    import bench_loo

    import pymc_chunkpost as pc

    warnings.filterwarnings("ignore")
    folder = tempfile.TemporaryDirectory(dir=args.store_dir)
    store = str(Path(folder.name) / "predictive")
    model, idata = bench_loo.build(args.rows)
    tic = time.perf_counter()
    pc.sample_posterior_predictive(
        idata,
        model=model,
        random_seed=1,
        progressbar=False,
        output_memory="disk",
        output_path=store,
    )
    drawn = time.perf_counter() - tic
    shared = [f"--rows={args.rows}", f"--store={store}", "--case=scale"]
    cells = [run_child(__file__, ["--child", f, *shared]) for f in args.functions.split(",")]
    record = {
        "script": "benchmarks/bench_loo.py --workflow --case scale",
        "python": platform.python_version(),
        "versions": {m: __import__(m).__version__ for m in ("pymc", "jax", "arviz_stats")},
        "rows": args.rows,
        "draws": bench_loo.CHAINS * bench_loo.DRAWS,
        "predictive_to_disk_seconds": drawn,
        "cells": cells,
    }
    print(json.dumps(record, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case", default="eight_schools", choices=["eight_schools", "moment_match", "scale"]
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--outliers", type=int, default=8)
    parser.add_argument("--posterior", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store-dir", default=None, help="scale: the store's parent folder")
    parser.add_argument("--functions", default="loo_pit,loo_expectations", help="scale's")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--methods", default="ours,arviz_stats")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plots", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fits", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case == "scale":
        if args.child is not None:
            print(json.dumps(_scale_cell(args.child, args)))
        else:
            _scale_main(args)
        return
    if args.case == "moment_match":
        if args.child is not None:
            print(json.dumps(_matching_cell(args.child, args)))
        else:
            _matching_main(args)
        return
    if args.child is not None:
        print(json.dumps(_cell(args.child, args.fits)))
        return
    import pymc as pm

    fits = {}
    for kind in ("centered", "non_centered"):
        with _model(kind):
            idata = pm.sample(
                args.draws,
                chains=args.chains,
                cores=1,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
            )
            pm.sample_posterior_predictive(
                idata, extend_inferencedata=True, random_seed=2, progressbar=False
            )
        fits[kind] = idata
    folder = tempfile.TemporaryDirectory()
    fits_path = str(Path(folder.name) / "fits.pkl")
    with open(fits_path, "wb") as f:
        pickle.dump(fits, f)
    cells = [
        run_child(__file__, ["--child", m, f"--fits={fits_path}"]) for m in args.methods.split(",")
    ]
    by = {c["method"]: c for c in cells}
    record: dict = {
        "script": "benchmarks/bench_loo.py --workflow",
        "python": platform.python_version(),
        "versions": {m: __import__(m).__version__ for m in ("pymc", "jax", "arviz_stats")},
        "chains": args.chains,
        "draws": args.draws,
        "seconds": {c["method"]: c["seconds"] for c in cells},
    }
    if {"ours", "arviz_stats"} <= set(by):
        record["largest_differences"] = _largest_differences(
            by["ours"]["values"], by["arviz_stats"]["values"]
        )
    print(json.dumps(record, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.plots:
        _plots(Path(args.plots), fits)


if __name__ == "__main__":
    main()
