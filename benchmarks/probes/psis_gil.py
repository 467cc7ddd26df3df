"""What a thread running Python costs PSIS: one part of a block (a normal model's
log-likelihood), `pymc_chunkpost._stats.psis.psis_loo_block` in passes of `--rows-per-pass` rows,
alone and beside a thread that runs Python without pause (the worst case of `loo`'s block
thread, which builds the next block's graph while this block is smoothed). Each numpy call
lets the GIL go; taking it back from a thread running Python waits up to the switch
interval (5 ms), so the time beside it over the switch interval counts those waits.

    python benchmarks/probes/psis_gil.py [--rows 700] [--draws 4000] [--rows-per-pass 128,256,0]
"""

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=700)  # a part of a TPU block (5584 / 8)
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--rows-per-pass", default="128,256,0")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import numpy as np

    from pymc_chunkpost._stats import psis as _psis

    rng = np.random.default_rng(0)
    mu = rng.normal(size=(args.rows, 1))
    noise = rng.normal(size=(args.rows, args.draws))
    ll = np.ascontiguousarray(-0.5 * (mu + 0.02 * noise) ** 2 - 0.92)

    def python(stop: threading.Event) -> None:
        while not stop.is_set():
            {i: (i, str(i)) for i in range(1000)}

    interval = sys.getswitchinterval()
    print(f"ArviZ {_psis.arviz_generation()}.x, switch interval {1e3 * interval:.1f} ms")
    for per_pass in (int(r) for r in args.rows_per_pass.split(",")):
        work = _psis.Workspace(per_pass or args.rows, args.draws)
        _psis.psis_loo_block(ll, 1.0, work)
        alone, beside = [], []
        for _ in range(args.repeats):
            tic = time.perf_counter()
            _psis.psis_loo_block(ll, 1.0, work)
            alone.append(time.perf_counter() - tic)
            stop = threading.Event()
            thread = threading.Thread(target=python, args=(stop,))
            thread.start()
            time.sleep(0.01)
            tic = time.perf_counter()
            _psis.psis_loo_block(ll, 1.0, work)
            beside.append(time.perf_counter() - tic)
            stop.set()
            thread.join()
        print(
            f"rows_per_pass={per_pass}: alone {min(alone):.4f}-{max(alone):.4f} s; beside "
            f"Python {min(beside):.3f}-{max(beside):.3f} s, about {min(beside) / interval:.0f} "
            "waits for the GIL",
            flush=True,
        )


if __name__ == "__main__":
    main()
