"""PSIS's host cost per value, one thread against one part per core, and by the rows of a
pass: a block of a normal model's log-likelihood, `pymc_chunkpost._stats.psis.psis_loo_block` on
(rows, draws) parts, each part in passes of `--rows-per-pass` rows (0: the whole part), and the
whole `loo` of bench_loo's model with the parts capped (`--parts`), warm (one call before).

    python benchmarks/probes/psis_threads.py [--rows 4000] [--draws 4000] [--rows-per-pass 0,128]
"""

import argparse
import itertools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--parts", default="1,2,4,8,13")
    parser.add_argument("--rows-per-pass", default="0,32,64,128,256")
    parser.add_argument("--loo-rows", type=int, default=20000)
    args = parser.parse_args()
    import numpy as np

    import pymc_chunkpost
    from pymc_chunkpost._stats import loo as _stats_loo
    from pymc_chunkpost._stats import psis as _psis

    rng = np.random.default_rng(0)
    mu = rng.normal(size=(args.rows, 1))
    noise = rng.normal(size=(args.rows, args.draws))
    ll = np.ascontiguousarray(-0.5 * (mu + 0.02 * noise) ** 2 - 0.92)
    print("cores", os.cpu_count(), len(os.sched_getaffinity(0)), flush=True)
    for n, per_pass in itertools.product(
        [int(p) for p in args.parts.split(",")], [int(r) for r in args.rows_per_pass.split(",")]
    ):
        bounds = np.linspace(0, args.rows, n + 1).astype(int)
        parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        rows = per_pass or bounds[1] - bounds[0]
        works = [_psis.Workspace(rows, args.draws) for _ in parts]
        with ThreadPoolExecutor(n) as pool:
            for rep in range(3):
                tic = time.perf_counter()
                list(pool.map(lambda s, w: _psis.psis_loo_block(ll[s], 1.0, w), parts, works))
                sec = time.perf_counter() - tic
                print(
                    f"parts={n} rows_per_pass={per_pass} rep={rep}: {sec:.3f} s, "
                    f"{1e9 * sec / ll.size:.1f} ns/value",
                    flush=True,
                )
    import jax
    from bench_loo import build

    jax.devices()
    model, idata = build(args.loo_rows)
    import warnings

    from pymc_chunkpost._support.config import configured

    warnings.simplefilter("ignore")
    pymc_chunkpost.loo(idata, model, progressbar=False)  # compiled once: each call below warm
    for n in [int(p) for p in args.parts.split(",")][::-1]:
        _stats_loo.cpu_cores = lambda n=n: n
        with configured(psis_parts=n):
            tic = time.perf_counter()
            pymc_chunkpost.loo(idata, model, progressbar=False)
        print(f"loo parts={n} (warm): {time.perf_counter() - tic:.3f} s", flush=True)


if __name__ == "__main__":
    main()
