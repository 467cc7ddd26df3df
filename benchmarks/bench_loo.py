"""`pymc_chunkpost.loo` against `pm.compute_log_likelihood` + ArviZ's `loo`, each cell in a
fresh process.

    python benchmarks/bench_loo.py --rows 20000 --json benchmarks/results/bench_loo_run1_py312.json

The model (`--model`) is issue 59's: a hierarchical regression (40 groups, 3 features,
`pm.Data`) with `--rows` observations, and a seeded 4 x 1000-draw posterior (no sampling);
or `logistic`, the same design with a Bernoulli likelihood (`logit_p`), whose parameter check
`0 <= p <= 1` reads every observation; or one of issue 69's GLMs with group indices
(`MODEL_NAMES`: Poisson, negative binomial with group slopes, Student-t with a scale per
group, Bernoulli with crossed groups, Gamma with a log link, zero-inflated Poisson), whose
posterior is the true parameters plus noise of the posterior's scale. Methods: `ours`
(`pymc_chunkpost.loo`, defaults: 1 GiB blocks) and `anchor` (`pm.compute_log_likelihood`,
pymc's own with its default backend, then the installed ArviZ's `loo`: `arviz.loo` on 0.x,
`arviz_stats.loo` on 1.x). Each (rows, method) runs in a fresh Python process: the model and
posterior are built, the garbage collected, `VmHWM` reset (`echo 5 > /proc/self/clear_refs`),
and the one call timed cold (graph building, compiling, running); the record keeps its
seconds, its CPU seconds (all threads; less sensitive than wall time to other processes on
a shared machine) and its peak RSS above the RSS before the call. Each cell gets a fresh
cache folder (`PYMC_CHUNKPOST_CACHE_DIR`): no executable an earlier cell stored is loaded.
`--methods ours` runs ours alone (for sizes whose matrix does not fit the machine);
`--check-subset K` then compares ours at K random observations with ArviZ's `loo` on their
log-likelihood alone (the model of those observations, same posterior), recording the
largest differences of elpd_i and k. `--plot-from RECORD... --plot PNG` draws the records'
peak RSS and seconds against the rows, ours beside the anchor, and runs nothing (from
benchmarks/):

    python bench_loo.py --plot ../docs/loo_memory.png --plot-from results/loo_memory_sweep_run1_*

`--workflow` runs the LOO workflow's benchmark instead (`_loo_workflow.py`: `loo_pit`,
`loo_expectations`, ..., `loo_moment_match` beside arviz-stats'; its own options follow).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one
from _cell import run_child  # noqa: E402

CHAINS, DRAWS, GROUPS = 4, 1000, 40


MODEL_NAMES = {
    "hierarchical": "hierarchical regression",
    "logistic": "hierarchical logistic regression",
    "poisson": "Poisson regression with group intercepts (log link)",
    "negbin": "negative binomial regression with group intercepts and slopes",
    "studentt": "Student-t regression with a scale per group",
    "crossed_logit": "Bernoulli logit with two crossed groupings",
    "gamma": "Gamma regression with a log link",
    "zip": "zero-inflated Poisson with group intercepts",
}
MODELS = tuple(MODEL_NAMES)
CROSSED = 25  # the second grouping's levels (`crossed_logit`)


def _design(rows: int):
    """The data every family shares: features, two group indices and the true parameters.
    The hierarchical and logistic models draw what they drew before the other families
    existed (the other families' parameters come from a generator of their own)."""
    import numpy as np

    rng, more = np.random.default_rng(0), np.random.default_rng(1)
    x, group = rng.normal(size=(rows, 3)), rng.integers(0, GROUPS, rows)
    truth = {
        "a": rng.normal(0, 1, GROUPS),
        "b": np.array([0.5, -0.3, 0.2]),
        "c": more.normal(0, 0.5, CROSSED),
        "s": more.normal(0, 0.3, GROUPS),
        "sigma_g": np.exp(more.normal(0, 0.3, GROUPS)),
    }
    return rng, x, group, more.integers(0, CROSSED, rows), truth


def _observed(family: str, rng, x, group, second, truth):
    """Observations drawn from `family` at the true parameters."""
    import numpy as np

    a, b = truth["a"], truth["b"]
    mean = a[group] + x @ b
    n = len(group)
    noise = rng.normal(0, 1, n)  # drawn by every family (the first two models did)
    if family == "hierarchical":
        return mean + noise
    if family == "logistic":
        return (rng.random(n) < 1 / (1 + np.exp(-mean))).astype(np.int64)
    log_mu = 0.3 * mean
    if family == "poisson":
        return rng.poisson(np.exp(log_mu))
    if family == "negbin":
        mu = np.exp(log_mu + truth["s"][group] * x[:, 0])
        return rng.negative_binomial(5.0, 5.0 / (5.0 + mu))
    if family == "studentt":
        return mean + truth["sigma_g"][group] * rng.standard_t(5.0, n)
    if family == "crossed_logit":
        eta = a[group] + truth["c"][second] + x @ b
        return (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(np.int64)
    if family == "gamma":
        return rng.gamma(4.0, np.exp(log_mu) / 4.0)
    if family == "zip":
        return np.where(rng.random(n) < 0.3, 0, rng.poisson(np.exp(log_mu)))
    raise ValueError(f"{family=} is not one of {MODELS}")


def _likelihood(family: str, pm, data, groups, seconds, a, b, extra, y) -> None:
    """`family`'s observed variable `y` (dims `obs`), in the current model."""
    mean = a[groups] + data @ b
    mu = pm.math.exp(0.3 * mean)
    observed = {"observed": y, "dims": "obs"}
    if family == "hierarchical":
        pm.Normal("y", mean, extra["sigma"], **observed)
    elif family == "logistic":
        pm.Bernoulli("y", logit_p=mean, **observed)
    elif family == "poisson":
        pm.Poisson("y", mu, **observed)
    elif family == "negbin":
        mu = pm.math.exp(0.3 * mean + extra["s"][groups] * data[:, 0])
        pm.NegativeBinomial("y", mu=mu, alpha=extra["alpha"], **observed)
    elif family == "studentt":
        pm.StudentT("y", nu=5.0, mu=mean, sigma=extra["sigma_g"][groups], **observed)
    elif family == "crossed_logit":
        pm.Bernoulli("y", logit_p=mean + extra["c"][seconds], **observed)
    elif family == "gamma":
        pm.Gamma("y", alpha=extra["shape"], beta=extra["shape"] / mu, **observed)
    elif family == "zip":
        pm.ZeroInflatedPoisson("y", psi=extra["psi"], mu=mu, **observed)
    else:
        raise ValueError(f"{family=} is not one of {MODELS}")


# Each family's free variables beyond `a` and `b`: (its prior, its true value).
_EXTRA = {
    "hierarchical": {"sigma": ("halfnormal", 1.0)},
    "logistic": {},
    "poisson": {},
    "negbin": {"s": ("groups", "s"), "alpha": ("halfnormal", 5.0)},
    "studentt": {"sigma_g": ("groups_positive", "sigma_g")},
    "crossed_logit": {"c": ("crossed", "c")},
    "gamma": {"shape": ("halfnormal", 4.0)},
    "zip": {"psi": ("beta", 0.7)},
}


def build(rows: int, subset=None, family: str = "hierarchical"):
    """The model and its posterior as inference data (pymc 6: DataTree; 5: InferenceData);
    with `subset` (observation indices), the model of those observations alone, with the
    same posterior: its log-likelihood is the full model's at those columns."""
    import numpy as np
    import pymc as pm

    rng, x, group, second, truth = _design(rows)
    y = _observed(family, rng, x, group, second, truth)
    if subset is not None:
        x, group, second, y = x[subset], group[subset], second[subset], y[subset]
    scale = 1 / np.sqrt(rows / GROUPS)
    posterior = {
        "a": truth["a"] + rng.normal(0, scale, (CHAINS, DRAWS, GROUPS)),
        "b": truth["b"] + rng.normal(0, 1 / np.sqrt(rows), (CHAINS, DRAWS, 3)),
    }
    with pm.Model(coords={"obs": range(len(y))}) as model:
        data, groups = pm.Data("x", x), pm.Data("group", group)
        seconds = pm.Data("second", second) if family == "crossed_logit" else None
        a = pm.Normal("a", shape=GROUPS)
        b = pm.Normal("b", shape=3)
        extra = {}
        for name, (prior, value) in _EXTRA[family].items():
            if prior == "halfnormal":
                extra[name] = pm.HalfNormal(name, 2 * value)
                draws = value * np.abs(1 + rng.normal(0, 1 / np.sqrt(2 * rows), (CHAINS, DRAWS)))
            elif prior == "beta":
                extra[name] = pm.Beta(name, 2.0, 2.0)
                draws = np.clip(
                    value + rng.normal(0, 1 / np.sqrt(rows), (CHAINS, DRAWS)), 0.01, 0.99
                )
            elif prior == "crossed":
                extra[name] = pm.Normal(name, 0, 1, shape=CROSSED)
                spread = 1 / np.sqrt(rows / CROSSED)
                draws = truth[value] + rng.normal(0, spread, (CHAINS, DRAWS, CROSSED))
            else:  # one per group: a slope, or a positive scale
                size = (CHAINS, DRAWS, GROUPS)
                if prior == "groups_positive":
                    extra[name] = pm.HalfNormal(name, 2.0, shape=GROUPS)
                    draws = truth[value] * np.exp(rng.normal(0, scale, size))
                else:
                    extra[name] = pm.Normal(name, 0, 1, shape=GROUPS)
                    draws = truth[value] + rng.normal(0, scale, size)
            posterior[name] = draws
        _likelihood(family, pm, data, groups, seconds, a, b, extra, y)
    import arviz

    if arviz.__version__.startswith("0."):
        idata = arviz.from_dict(posterior=posterior)
    else:
        from arviz_base import from_dict

        idata = from_dict({"posterior": posterior})
    return model, idata


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    if field == "VmHWM":  # a kernel without it (a sandbox): the process's peak, as getrusage
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    raise KeyError(field)


def check_subset(rows: int, result, n_subset: int, family: str) -> dict:
    """ArviZ's `loo` on `n_subset` random observations' log-likelihood (from the model of
    those observations, same posterior) against ours at those observations: the largest
    differences of elpd_i and Pareto k."""
    import warnings

    import arviz
    import numpy as np
    import pymc as pm

    subset = np.sort(np.random.default_rng(1).choice(rows, n_subset, replace=False))
    model, idata = build(rows, subset, family)
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if arviz.__version__.startswith("0."):
            theirs = arviz.loo(idata, pointwise=True)
            ours_i, theirs_i = result.loo_i.values[subset], theirs.loo_i.values
        else:
            from arviz_stats import loo

            theirs = loo(idata, pointwise=True)
            ours_i, theirs_i = result.elpd_i.values[subset], theirs.elpd_i.values
    return {
        "subset": n_subset,
        "elpd_i_max_abs_diff": float(np.max(np.abs(ours_i - theirs_i))),
        "pareto_k_max_abs_diff": float(
            np.max(np.abs(result.pareto_k.values[subset] - theirs.pareto_k.values))
        ),
    }


def child(rows: int, method: str, n_subset: int = 0, family: str = "hierarchical") -> dict:
    import gc
    import warnings

    import arviz

    model, idata = build(rows, family=family)
    generation = 0 if arviz.__version__.startswith("0.") else 1
    # Both libraries imported before the clock: the cold call is graph building,
    # compiling and running, not imports.
    sys.path.insert(0, str(ROOT))
    import pymc_chunkpost

    if generation == 1:
        import arviz_stats  # noqa: F401
    import jax

    # The device opened before the clock too: its first call (about 8 s on a TPU) is paid
    # once per process, whoever makes it.
    platform_name = jax.devices()[0].platform
    gc.collect()
    try:  # the peak from here on (not writable on some machines: then since the start)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    start = _status("VmRSS")
    tic, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "ours":
            result = pymc_chunkpost.loo(idata, model, pointwise=bool(n_subset), progressbar=False)
        else:
            import pymc as pm

            pm.compute_log_likelihood(idata, model=model, progressbar=False)
            if generation == 0:
                result = arviz.loo(idata)
            else:
                from arviz_stats import loo

                result = loo(idata)
    seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    peak = _status("VmHWM") - start
    elpd = float(result.elpd_loo if generation == 0 else result.elpd)
    checked = check_subset(rows, result, n_subset, family) if n_subset and method == "ours" else {}
    return checked | {
        "rows": rows,
        "method": method,
        "platform": platform_name,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_rss_above_start": peak,
        "elpd": elpd,
    }


def main() -> None:
    if "--workflow" in sys.argv[1:]:  # the LOO workflow's benchmark (`_loo_workflow.py`)
        import _loo_workflow

        _loo_workflow.main([a for a in sys.argv[1:] if a != "--workflow"])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[20000])
    parser.add_argument("--methods", nargs="+", default=["ours", "anchor"])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--check-subset",
        type=int,
        default=0,
        help="after ours, compare its elpd_i and k at this many random observations with "
        "ArviZ's loo on their log-likelihood alone",
    )
    parser.add_argument("--model", choices=MODELS, default="hierarchical")
    parser.add_argument("--child", nargs=4, metavar=("ROWS", "METHOD", "SUBSET", "MODEL"))
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of --plot-from's records")
    parser.add_argument("--plot-from", type=Path, nargs="+", default=[])
    args = parser.parse_args()
    if args.plot is not None:
        plot([json.loads(path.read_text()) for path in args.plot_from], args.plot)
        return
    if args.child:
        rows, method, n_subset, family = args.child
        print(json.dumps(child(int(rows), method, int(n_subset), family)))
        return
    import arviz
    import jax
    import pymc
    import pytensor

    cells = []
    for rows in args.rows:
        for method in args.methods:
            # A fresh cache folder per cell: cold is a first process, no executable stored.
            with tempfile.TemporaryDirectory(prefix="bench_loo_cache_") as cache:
                cell = run_child(
                    __file__,
                    ["--child", str(rows), method, str(args.check_subset), args.model],
                    env={"PYMC_CHUNKPOST_CACHE_DIR": cache},
                )
            print(json.dumps(cell), flush=True)
            cells.append(cell)
    record = {
        "script": "benchmarks/bench_loo.py",
        "command": " ".join(sys.argv),
        "python": platform.python_version(),
        "versions": {"pymc": pymc.__version__, "jax": jax.__version__, "arviz": arviz.__version__},
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "chains": CHAINS,
        "draws": DRAWS,
        "model": args.model,
        "cells": cells,
    }
    for rows in args.rows:
        by = {c["method"]: c for c in cells if c["rows"] == rows}
        if {"ours", "anchor"} <= set(by):
            speedup = by["anchor"]["seconds"] / by["ours"]["seconds"]
            cpu_speedup = by["anchor"]["cpu_seconds"] / by["ours"]["cpu_seconds"]
            record.setdefault("speedup_cold", {})[str(rows)] = speedup
            record.setdefault("cpu_speedup_cold", {})[str(rows)] = cpu_speedup
            print(
                f"{rows} rows: {speedup:.2f}x faster cold ({cpu_speedup:.2f}x in CPU time); elpd "
                f"{by['ours']['elpd']:.6f} vs {by['anchor']['elpd']:.6f}"
            )
    record["header"] = (
        f"Python {platform.python_version()}, pymc {pymc.__version__}, jax {jax.__version__}, "
        f"arviz {arviz.__version__}; {os.cpu_count()} CPUs; floatX={pytensor.config.floatX}; "
        f"{MODEL_NAMES[args.model]}, "
        f"{CHAINS} x {DRAWS} draws; each cell cold in a fresh process with a fresh cache "
        "folder. Ours: `pymc_chunkpost.loo`; anchor: `pm.compute_log_likelihood` + ArviZ's `loo`."
    )
    record["table"] = table(cells)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


def plot(records: list[dict], path: Path, machine_gib: float = 24.0) -> None:
    """Peak RSS above the start and seconds against the rows, ours and the anchor, from
    `records` (one stack's), with the log-likelihood matrix's size and the machine's RAM."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [cell for record in records for cell in record["cells"]]
    samples = records[0]["chains"] * records[0]["draws"]
    versions = records[0]["versions"]
    fig, (memory, seconds) = plt.subplots(1, 2, figsize=(10, 4))
    styles = {"ours": ("pymc_chunkpost.loo", "C0", "o"), "anchor": ("anchor", "C3", "s")}
    for method, (label, color, marker) in styles.items():
        mine = sorted((c for c in cells if c["method"] == method), key=lambda c: c["rows"])
        if method == "anchor":
            label = "pm.compute_log_likelihood + ArviZ loo"
        rows = [c["rows"] for c in mine]
        memory.plot(
            rows,
            [c["peak_rss_above_start"] / 2**30 for c in mine],
            marker=marker,
            color=color,
            label=label,
        )
        seconds.plot(rows, [c["seconds"] for c in mine], marker=marker, color=color, label=label)
    every = sorted({c["rows"] for c in cells})
    memory.plot(
        every,
        [8 * samples * n / 2**30 for n in every],
        color="grey",
        linestyle=":",
        label=f"the matrix ({samples:,} draws, float64)",
    )
    memory.axhline(
        machine_gib,
        color="black",
        linewidth=0.8,
        linestyle="--",
        label=f"the machine's RAM ({machine_gib:g} GiB)",
    )
    memory.set(
        xscale="log", yscale="log", xlabel="observations", ylabel="peak RSS above start (GiB)"
    )
    seconds.set(xscale="log", yscale="log", xlabel="observations", ylabel="seconds, cold")
    memory.set_ylim(0.3, 300)  # room above the lines for the legend
    memory.legend(fontsize=8, loc="upper left")
    seconds.legend(fontsize=8)
    fig.suptitle(
        f"PSIS-LOO, hierarchical regression: pymc {versions['pymc']}, arviz {versions['arviz']}, "
        f"{records[0]['cpus']} CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(cells: list[dict]) -> str:
    """The record's cells as the results page's markdown table."""
    lines = [
        "| rows | method | seconds | CPU seconds | peak RSS above start (GiB) | elpd_loo |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell['rows']:,} | {cell['method']} | {cell['seconds']:.2f} | "
            f"{cell['cpu_seconds']:.2f} | {cell['peak_rss_above_start'] / 2**30:.2f} | "
            f"{cell['elpd']:.6f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
