"""Does post-processing keep old models alive? Process RSS over a loop of fresh models.

    python benchmarks/probes/leak_loop.py                         # 12 models, 20000 x 200 data each
    python benchmarks/probes/leak_loop.py --models 3 --rows 2000  # a quick look
    python benchmarks/probes/leak_loop.py --max-ratio 1.2         # exit 1 above 1.2x pymc's RSS

Each model is a regression over its own `rows` x `cols` data matrix `X`: `y ~ Normal(X @ beta,
sigma)`, with the fit's R^2 as a deterministic, so that `X` enters the post-processing function
as a constant (as large `pm.Data` do). Every model is built, its seeded raw draws (`chains` x
`draws`) are post-processed once, and everything the loop holds is deleted and collected;
then the process's RSS (VmRSS of /proc/self/status) is recorded. A library that lets go of
old models plateaus; one that caches them grows by about one model's data and executables
per model.

The loop runs twice, each in a fresh process: with `pymc_chunkpost.postprocess_samples(...,
"auto")` ("ours") and with pymc's own `pymc.sampling.jax._postprocess_samples(..., "vmap")`
("pymc"). The table gives both columns; the last line gives the final RSS of ours over
pymc's. RSS also holds what jax, pymc and pytensor cache for their own (pytensor's graph
caches, jax's compilation caches), which pymc's column shows.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHICH = ("ours", "pymc")


def build(seed: int, rows: int, cols: int):
    """A regression over a fresh `rows` x `cols` matrix, with R^2 as a deterministic."""
    import numpy as np
    import pymc as pm

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, cols))
    y = X @ rng.standard_normal(cols) + rng.standard_normal(rows)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=cols)
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.math.dot(X, beta)
        pm.Normal("y", mu, sigma, observed=y)
        pm.Deterministic("r2", 1.0 - (y - mu).var() / y.var())
    return model


def loop(which: str, models: int, rows: int, cols: int, chains: int, draws: int) -> None:
    """Run the loop in this process; print one JSON line per point: {"model": i, "rss": b}."""
    import jax
    from pymc.sampling.jax import _postprocess_samples

    from pymc_chunkpost import postprocess_samples
    from pymc_chunkpost.profiling.fixtures import jax_fn, raw_draws
    from pymc_chunkpost.profiling.proc import status_bytes

    def report(i: int) -> None:
        gc.collect()
        print(json.dumps({"model": i, "rss": status_bytes("VmRSS")}), flush=True)

    report(0)
    for i in range(1, models + 1):
        model = build(i, rows, cols)
        fn = jax_fn(model)
        raw = [jax.numpy.asarray(x) for x in raw_draws(model, chains, draws, seed=i)]
        if which == "ours":
            outputs = postprocess_samples(fn, raw, None, "auto")
        else:
            outputs = _postprocess_samples(fn, raw, None, "vmap")
        jax.block_until_ready(outputs)
        del model, fn, raw, outputs
        report(i)


def run(which: str, args: argparse.Namespace) -> list[int]:
    """The loop in a fresh process; its RSS after each model (index 0: before the first)."""
    cmd = [sys.executable, __file__, "--child", which]
    for name in ("models", "rows", "cols", "chains", "draws"):
        cmd += [f"--{name}", str(getattr(args, name))]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"the {which} loop failed:\n{proc.stderr[-3000:]}")
    points = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [p["rss"] for p in points]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12, help="models in the loop (12)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows of each X (20000)")
    parser.add_argument("--cols", type=int, default=200, help="columns of each X (200)")
    parser.add_argument("--chains", type=int, default=4, help="chains of raw draws (4)")
    parser.add_argument("--draws", type=int, default=100, help="draws per chain (100)")
    parser.add_argument("--max-ratio", type=float, help="exit 1 if ours/pymc's final RSS is above")
    parser.add_argument("--child", choices=WHICH, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        loop(args.child, args.models, args.rows, args.cols, args.chains, args.draws)
        return 0

    mib = 2**20
    data_mib = args.rows * args.cols * 8 / mib
    print(
        f"{args.models} models, each a {args.rows} x {args.cols} float64 matrix "
        f"({data_mib:,.1f} MiB), {args.chains} x {args.draws} draws; RSS in MiB"
    )
    rss = {which: run(which, args) for which in WHICH}
    print(f"{'model':>5} {'ours':>10} {'pymc':>10}")
    for i, (ours, pymc) in enumerate(zip(rss["ours"], rss["pymc"])):
        label = "start" if i == 0 else str(i)
        print(f"{label:>5} {ours / mib:10,.1f} {pymc / mib:10,.1f}")
    n = args.models
    for which in WHICH:
        growth = (rss[which][-1] - rss[which][1]) / mib / max(n - 1, 1)
        print(f"{which}: {growth:,.1f} MiB per model after the first")
    ratio = rss["ours"][-1] / rss["pymc"][-1]
    print(f"final RSS, ours / pymc: {ratio:.2f}x")
    if args.max_ratio is not None and ratio > args.max_ratio:
        print(f"above --max-ratio {args.max_ratio}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
