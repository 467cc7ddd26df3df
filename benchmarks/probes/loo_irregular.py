"""How many observations of each `loo` block PSIS smooths per row in ArviZ's own function
(ties at its cutoff, infinities) and what that costs, and how many regular rows have ties
inside the tail (smoothed with the block), on the device's own float32 log-likelihood; and
the host cores before and after JAX opens the device. On a CPU, float32 as a TPU runs it:

    PYTENSOR_FLAGS=floatX=float32 python benchmarks/probes/loo_irregular.py [--rows 20000]
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
    args = parser.parse_args()
    import jax
    import numpy as np

    print("cores before the device:", len(os.sched_getaffinity(0)), flush=True)
    jax.devices()
    print("cores after the device:", len(os.sched_getaffinity(0)), flush=True)
    from bench_loo import build

    import pymc_chunkpost
    from pymc_chunkpost import _loo, _psis

    model, idata = build(args.rows)
    warnings.simplefilter("ignore")
    blocks, tails = [], []
    smoothed, tail = _loo._smoothed, _psis._tail

    def keep(values, workspace, reff):
        blocks.append(values)
        return smoothed(values, workspace, reff)

    def counted(x, tail_len, floor, work):
        out = tail(x, tail_len, floor, work)
        above = np.count_nonzero(x > out[0][:, None], axis=1)
        tied = (np.diff(out[1], axis=1) <= 0).any(axis=1) & out[3]
        tails.append((len(x), int(out[3].sum()), int((above != tail_len).sum()), int(tied.sum())))
        return out

    _loo._smoothed, _psis._tail = keep, counted
    pymc_chunkpost.loo(idata, model, progressbar=False)
    n, regular, at_cutoff, tied = (sum(t[i] for t in tails) for i in range(4))
    print(
        f"{len(blocks)} blocks of {blocks[0].shape} {blocks[0].dtype}: {n} rows, "
        f"{n - regular} irregular ({at_cutoff} with ties at the cutoff), {tied} regular "
        "rows with ties inside the tail",
        flush=True,
    )
    block = np.ascontiguousarray(blocks[0].T)
    work = _psis.Workspace(*block.shape)
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
