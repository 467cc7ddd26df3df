"""Where `pymc_chunkpost.loo`'s time goes: each block's engine call and each part's PSIS, as
(start, end) seconds from the call's start, cold then warm in one process (bench_loo's model).

    python benchmarks/probes/loo_timeline.py [--rows 20000]
"""

import argparse
import sys
import threading
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
    from bench_loo import build

    import pymc_chunkpost
    from pymc_chunkpost import _loo

    jax.devices()
    model, idata = build(args.rows)
    warnings.simplefilter("ignore")
    events: list = []
    origin = [0.0]

    def wrap(name):
        inner = getattr(_loo, name)

        def timed(*a, **k):
            tic = time.perf_counter()
            out = inner(*a, **k)
            events.append(
                (
                    name,
                    threading.current_thread().name,
                    tic - origin[0],
                    time.perf_counter() - origin[0],
                )
            )
            return out

        setattr(_loo, name, timed)

    for name in ("_collected", "psis_loo_block", "_LogpBlocks", "evaluate"):
        wrap(name)
    for phase in ("cold", "warm"):
        events.clear()
        origin[0] = time.perf_counter()
        pymc_chunkpost.loo(idata, model, progressbar=False)
        print(f"{phase}: {time.perf_counter() - origin[0]:.3f} s", flush=True)
        for e in sorted(events, key=lambda e: e[2]):
            name, thread, start, end = e
            print(f"  {name:16} {thread:14} {start:.3f} {end:.3f} ({end - start:.3f})", flush=True)


if __name__ == "__main__":
    main()
