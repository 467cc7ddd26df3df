"""Where `pymc_chunkpost.loo`'s time goes: each block's engine call and each part's PSIS, as
(start, end) seconds from the call's start, cold then warm in one process (bench_loo's model);
with `--profile`, the cold call's first block (its graph, compile and run, in the block
thread) by cProfile, the functions of longest cumulative time.

    python benchmarks/probes/loo_timeline.py [--rows 20000] [--model logistic] [--profile 30]
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
    parser.add_argument("--model", default="hierarchical", help="bench_loo.py's --model")
    parser.add_argument("--profile", type=int, default=0, help="functions to print; 0: none")
    args = parser.parse_args()
    import jax
    from bench_loo import build

    import pymc_chunkpost
    from pymc_chunkpost._pymc import loo as _loo
    from pymc_chunkpost._stats import loo as _stats_loo

    jax.devices()
    model, idata = build(args.rows, family=args.model)
    warnings.simplefilter("ignore")
    events: list = []
    origin = [0.0]

    def wrap(module, name):
        inner = getattr(module, name)

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

        setattr(module, name, timed)

    # Each name where the code looks it up: the blocks' driver and PSIS in `_stats.loo`,
    # pymc's graph and the engine's call in `_pymc.loo`.
    for module, name in (
        (_stats_loo, "_collected"),
        (_stats_loo, "psis_loo_block"),
        (_loo, "_LogpBlocks"),
        (_loo, "evaluate"),
    ):
        wrap(module, name)
    profiles: list = []
    if args.profile:
        import cProfile

        timed_block = _stats_loo._collected

        def profiled(*a, **k):
            if profiles:
                return timed_block(*a, **k)
            profiles.append(cProfile.Profile())
            return profiles[0].runcall(timed_block, *a, **k)

        _stats_loo._collected = profiled
    for phase in ("cold", "warm"):
        events.clear()
        origin[0] = time.perf_counter()
        pymc_chunkpost.loo(idata, model, progressbar=False)
        print(f"{phase}: {time.perf_counter() - origin[0]:.3f} s", flush=True)
        for e in sorted(events, key=lambda e: e[2]):
            name, thread, start, end = e
            print(f"  {name:16} {thread:14} {start:.3f} {end:.3f} ({end - start:.3f})", flush=True)
        if profiles and phase == "cold":
            import pstats

            pstats.Stats(profiles[0], stream=sys.stdout).sort_stats("cumulative").print_stats(
                args.profile
            )


if __name__ == "__main__":
    main()
