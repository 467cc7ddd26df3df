"""How the chunk size sets the run time, and where `auto`'s time goes (docs/strategies.md).

    python benchmarks/chunk_size.py sweep big_det 2,4,8,10,16,20
    python benchmarks/chunk_size.py breakdown auto,lax_map:8,lax_map:10 --repeat 8

`sweep` compiles `chunked` at each size in one process and times the runs alone (median of
7, alternating up and down the sizes), as a ratio to the fastest. `breakdown` runs each case
in a fresh process per repeat (round-robin) on big_det and splits its time into validation
and analysis, tracing and lowering, compiling and running; medians are printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(fixture: str):
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    from pymc_chunkpost.profiling.fixtures import on_device

    _, fn, raw = on_device(fixture)
    return fn, raw


def sweep(fixture: str, sizes: list[int], repeats: int = 7) -> str:
    import jax

    from pymc_chunkpost import _executable, _planner

    fn, raw = _load(fixture)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in raw]
    problem = _executable.analyse(fn, specs, jax.devices()[0])
    plan, _ = _planner.plan_problem(problem, None)
    compiled = {s: _executable.executable(problem, "chunked", s) for s in sizes}
    times: dict[int, list[float]] = {s: [] for s in sizes}
    for rep in range(repeats):
        for s in sizes if rep % 2 == 0 else sizes[::-1]:
            tic = time.perf_counter()
            jax.block_until_ready(_executable.execute(compiled[s], raw))
            times[s].append(time.perf_counter() - tic)
    medians = {s: statistics.median(v) for s, v in times.items()}
    best = min(medians.values())
    cells = "  ".join(f"{s}: {m:.3f} s ({m / best:.2f})" for s, m in medians.items())
    return f"{fixture} (auto: {plan.strategy} {plan.chunk_size or ''})\n  {cells}"


def breakdown_child(case: str) -> dict:
    import jax

    from pymc_chunkpost import _executable, _postprocess

    fn, raw = _load("big_det")
    chains, draws = raw[0].shape[:2]
    n = chains * draws
    # As in bench_postprocess.py: JAX's first lowering and pending garbage paid untimed.
    jax.block_until_ready(jax.jit(lambda x: x + 1).lower(raw[-1]).compile()(raw[-1]))
    gc.collect()
    t: dict[str, float] = {}
    tic = time.perf_counter()
    if case == "auto":
        problem, samples = _postprocess._validate(fn, raw, None, "auto", None, None, None)
        t["validate"] = time.perf_counter() - tic
        placed, donate = _postprocess._place(samples, problem.device, True, problem)
        plan, exe = _postprocess._choose(problem, "auto", None, None, None, donate, False)
        t["trace"], t["compile"] = exe.trace_seconds, exe.compile_seconds
        toc = time.perf_counter()
        jax.block_until_ready(_executable.execute(exe, placed))
        t["run"] = time.perf_counter() - toc
    else:
        batch = int(case.split(":")[1])

        def whole(*xs):
            flat = [x.reshape((n,) + x.shape[2:]) for x in xs]
            ys = jax.lax.map(lambda a: list(fn(*a)), flat, batch_size=batch)
            return [y.reshape((chains, draws) + y.shape[1:]) for y in ys]

        jitted = jax.jit(whole, donate_argnums=tuple(range(len(raw))))
        toc = time.perf_counter()
        lowered = jitted.lower(*raw)
        t["trace"] = time.perf_counter() - toc
        toc = time.perf_counter()
        compiled = lowered.compile()
        t["compile"] = time.perf_counter() - toc
        toc = time.perf_counter()
        jax.block_until_ready(compiled(*raw))
        t["run"] = time.perf_counter() - toc
    t["total"] = time.perf_counter() - tic
    return t


def breakdown(cases: list[str], repeat: int) -> str:
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(repeat):
        for case in cases:
            done = subprocess.run(
                [sys.executable, __file__, "--child", case],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            runs[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = []
    for case, rows in runs.items():
        keys = [k for k in ("validate", "trace", "compile", "run", "total") if k in rows[0]]
        medians = ", ".join(f"{k} {statistics.median(r[k] for r in rows):.4f}" for k in keys)
        lines.append(f"{case}: {medians}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("sweep")
    p.add_argument("fixture")
    p.add_argument("sizes")
    p = sub.add_parser("breakdown")
    p.add_argument("cases")
    p.add_argument("--repeat", type=int, default=8)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(breakdown_child(args.child)))
    elif args.command == "sweep":
        print(sweep(args.fixture, [int(s) for s in args.sizes.split(",")]))
    elif args.command == "breakdown":
        print(breakdown(args.cases.split(","), args.repeat))
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
