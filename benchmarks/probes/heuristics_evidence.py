"""Evidence for three of `PlannerConfig`'s heuristics that had none written down (issue 42).

    python benchmarks/probes/heuristics_evidence.py jump       # jump_factor, jump_slack_bytes
    python benchmarks/probes/heuristics_evidence.py store      # store_max_bytes
    python benchmarks/probes/heuristics_evidence.py overhead   # overhead_bytes_per_buffer

- `jump`: for each zoo model, the chunk loop is compiled at the sizes the planner may halve
  through (the rule's, then halved to 1), and XLA's compiled temporaries are set against
  what the planner expects from the jaxpr's bound (`size * (bound + inputs and outputs per
  draw)`). A chunk is a "jump" when its temporaries exceed `jump_factor` times that plus
  `jump_slack_bytes`; the table shows where the slack decides. Compiles only: no timing.
- `store`: the executables that one cold `auto` run of each zoo model stores on disk, and
  how many models' worth `store_max_bytes` holds.
- `overhead`: the loop's cost per chunk and per buffer it slices or updates, as bytes of
  work that take as long: each model is run in chunks of `n` and of `n / 8` (warm, best of
  `--repeats`), in an XLA loop and in the host loop; the difference per extra chunk, over the
  buffers, times the model's bytes of work (inputs and outputs) per second.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

from pymc_chunkpost import clear_caches  # noqa: E402
from pymc_chunkpost._engine.call import draws as _draws  # noqa: E402
from pymc_chunkpost._engine.call import postprocess as _postprocess  # noqa: E402
from pymc_chunkpost._engine.data.types import Loop  # noqa: E402
from pymc_chunkpost._engine.execute.executor import obtain  # noqa: E402
from pymc_chunkpost._engine.execute.program import Request  # noqa: E402
from pymc_chunkpost._support import disk as _disk  # noqa: E402
from pymc_chunkpost._support.config import configured, current  # noqa: E402
from pymc_chunkpost.profiling.fixtures import FIXTURES, ZOO, jax_fn  # noqa: E402

MiB = 2**20


def _model(name: str, draws: int):
    spec = FIXTURES[name]
    model = spec.build()
    return jax_fn(model), spec.raw_draws(model, 4, draws)


def jump(names: list[str]) -> None:
    config = current()
    print("| model | size | compiled temps MiB | expected MiB | ratio | over 4x, MiB | jump? |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in names:
        fn, raw = _model(name, 1000)
        problem, _ = _draws.validate(fn, raw, "cpu")
        plan = _postprocess.plan(fn, raw, "cpu", memory_budget=2**34)
        size = plan.chunk_size or 64
        while size >= 1:
            exe = obtain(fn, problem, Request("chunked", Loop.XLA, size))
            expected = size * (problem.intermediate_bytes + problem.per_item_bytes)
            over = exe.temp_bytes - config.jump_factor * expected
            jumped = over > config.jump_slack_bytes and size > 1
            print(
                f"| {name} | {size} | {exe.temp_bytes / MiB:.2f} | {expected / MiB:.2f} | "
                f"{exe.temp_bytes / max(expected, 1):.1f} | {over / MiB:.2f} | "
                f"{'yes' if jumped else 'no'} |"
            )
            size //= 2
        clear_caches()


def store(names: list[str]) -> None:
    sizes = {}
    for name in names:
        folder = tempfile.mkdtemp()
        os.environ["PYMC_CHUNKPOST_CACHE_DIR"] = folder
        fn, raw = _model(name, 1000)
        clear_caches()
        _postprocess.run(fn, raw, "cpu", "auto")
        _disk.wait()
        sizes[name] = sum(p.stat().st_size for p in Path(folder).rglob("*.bin"))
    print("| model | stored MiB |")
    print("|---|---:|")
    for name, size in sizes.items():
        print(f"| {name} | {size / MiB:.2f} |")
    total = sum(sizes.values())
    bound = current().store_max_bytes
    print(f"\nAll {len(sizes)}: {total / MiB:.1f} MiB; `store_max_bytes` ({bound / MiB:.0f} MiB)")
    print(f"holds {bound / max(total, 1):.1f} times the zoo's executables.")


def _best(fn, raw, size: int, loop: Loop, repeats: int) -> float:
    times = []
    with_loop = {"host_loop_many_buffers": 0} if loop is Loop.HOST else {}
    with configured(**with_loop):
        for _ in range(repeats + 1):  # the first compiles
            tic = time.perf_counter()
            outputs, _ = _postprocess.run(fn, raw, "cpu", "chunked", chunk_size=size)
            jax.block_until_ready(outputs)
            times.append(time.perf_counter() - tic)
    return min(times[1:])


def overhead(names: list[str], repeats: int) -> None:
    print("| model | loop | buffers | s, 1 chunk | s, 8 chunks | us per chunk per buffer |", end="")
    print(" work MB/s | bytes of work per buffer-chunk |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        fn, raw = _model(name, 500)
        problem, _ = _draws.validate(fn, raw, "cpu")
        n = problem.n_local
        # XLA's loops over many buffers compile for minutes: those run the host loop only.
        many = problem.n_buffers > current().host_loop_many_buffers
        for loop in (Loop.HOST,) if many else (Loop.XLA, Loop.HOST):
            whole = _best(fn, raw, n, loop, repeats)
            eighths = _best(fn, raw, n // 8, loop, repeats)
            per_chunk = max(eighths - whole, 0.0) / 7
            per_buffer = per_chunk / problem.n_buffers
            rate = n * problem.per_item_bytes / whole
            print(
                f"| {name} | {loop.value} | {problem.n_buffers} | {whole:.4f} | {eighths:.4f} | "
                f"{per_buffer * 1e6:.2f} | {rate / 1e6:.0f} | {per_buffer * rate / 2**10:.0f} KiB |"
            )
            clear_caches()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["jump", "store", "overhead"])
    parser.add_argument("--models", default=None, help="comma-separated zoo models")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    defaults = {
        "jump": ["big_data", "gp", "hierarchical", "radon_slopes", "demo_basis_grid"],
        "store": list(ZOO),
        "overhead": ["many_scalars", "eight_schools", "lkj"],
    }
    names = args.models.split(",") if args.models else defaults[args.what]
    if args.what == "jump":
        jump(names)
    elif args.what == "store":
        store(names)
    else:
        overhead(names, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
