"""How many observations of each `loo` block PSIS smooths per row in ArviZ's own function
(ties at its cutoff, infinities) and what that costs, and how many regular rows have ties
inside the tail (smoothed with the block), on the device's own float32 log-likelihood; and
the host cores before and after JAX opens the device. On a CPU, float32 as a TPU runs it:

    PYTENSOR_FLAGS=floatX=float32 python benchmarks/probes/loo_irregular.py [--model logistic]
"""

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--model", default="hierarchical", help="bench_loo.py's --model")
    args = parser.parse_args()
    import jax
    import numpy as np

    print("cores before the device:", len(os.sched_getaffinity(0)), flush=True)
    jax.devices()
    print("cores after the device:", len(os.sched_getaffinity(0)), flush=True)
    from bench_loo import build

    import pymc_chunkpost
    from pymc_chunkpost._stats import loo as _stats_loo
    from pymc_chunkpost._stats import psis as _psis
    from pymc_chunkpost._support.config import current

    model, idata = build(args.rows, family=args.model)
    warnings.simplefilter("ignore")
    blocks, tails = [], []
    smoothed, passes = _stats_loo._smoothed, _psis._passes

    def keep(values, reff):
        blocks.append(values)
        return smoothed(values, reff)

    def counted(log_likelihood, tail_len, work):
        rows = passes(log_likelihood, tail_len, work)
        regular = rows.finite & (rows.tail[:, 0] > rows.cutoff)  # ArviZ 0.x's floor aside
        tied = (np.diff(rows.tail, axis=1) <= 0).any(axis=1) & regular
        at_cutoff = rows.finite & ~regular
        tails.append((len(regular), int(regular.sum()), int(at_cutoff.sum()), int(tied.sum())))
        return rows

    _stats_loo._smoothed, _psis._passes = keep, counted
    pymc_chunkpost.loo(idata, model, progressbar=False)
    n, regular, at_cutoff, tied = (sum(t[i] for t in tails) for i in range(4))
    print(
        f"{len(blocks)} blocks of {blocks[0].shape} {blocks[0].dtype}: {n} rows, "
        f"{n - regular} irregular ({at_cutoff} with ties at the cutoff), {tied} regular "
        "rows with ties inside the tail",
        flush=True,
    )
    block = np.ascontiguousarray(blocks[0].T)
    work = _psis.Workspace(current().psis_rows_per_pass, block.shape[1])
    for label, values in ((f"{block.dtype} block", block), ("float64 copy", block.astype(float))):
        tails.clear()
        _psis.psis_loo_block(values, 1.0, work)
        tic = time.perf_counter()
        _psis.psis_loo_block(values, 1.0, work)
        sec = time.perf_counter() - tic
        irregular = tails[-1][0] - tails[-1][1]
        print(
            f"{label}: one thread {sec:.3f} s, {1e9 * sec / values.size:.1f} ns/value, "
            f"{irregular} irregular rows",
            flush=True,
        )


if __name__ == "__main__":
    main()
