"""The evidence behind `auto`'s chunk-size rule: run time against chunk size, per model.

For each model (a zoo fixture, or a fixture's builder with other sizes), 4 x 1000 seeded
draws are post-processed with `"chunked"` at each chunk size, in one process: every size is
compiled and run once first, then timed round-robin over `--repeats` rounds (the best run per
size). The table gives each size's time over the best size's, XLA's compiled temporaries per
draw (`memory_analysis()` of the first size) beside the jaxpr's bound, and the size the rule
(`_sizing.rule_chunk`) picks at several working-set targets, from the jaxpr's bound and
from the compiled temporaries. Warm runs: compile time is not in the times (docs/zoo.md
measures `auto` cold, compiles included).

With `--cold`, every run is one call in a fresh Python process, timed as `bench_zoo.py`
times its child's (JAX's first lowering paid before, then the call from just before it to
`block_until_ready`: tracing, compiling and running), the sizes round-robin in each of
`--repeats` rounds; the table gives each size's median over the best median.

    python benchmarks/probes/chunk_sweep.py                   # the models of docs/strategies.md
    python benchmarks/probes/chunk_sweep.py --case 'gp:{"n_points": 250}:1,2,4,8,16,32'
    python benchmarks/probes/chunk_sweep.py --cold --repeats 5 --case 'gp:{}:1,2,8,25'
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import jax

from pymc_chunkpost._engine.call import draws as _draws
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.data.types import Loop
from pymc_chunkpost._engine.execute.executor import obtain
from pymc_chunkpost._engine.execute.program import Request
from pymc_chunkpost._engine.plan import sizing as _sizing
from pymc_chunkpost._support.config import configured
from pymc_chunkpost.profiling import fixtures

#: model builder, its keyword arguments, chunk sizes (docs/strategies.md, the rule's sweep).
CASES = [
    ("radon_slopes", {}, [2, 4, 5, 8, 10, 16, 20, 32]),
    ("hierarchical", {}, [4, 8, 10, 16, 20, 25, 40]),
    ("gp", {}, [1, 2, 5, 10, 20, 25, 40, 50]),
    ("big_data", {}, [4, 8, 10, 16, 20, 25, 40]),
    ("radon_slopes", {"n_obs": 5000, "n_groups": 100}, [2, 4, 8, 16, 32, 64]),
    ("gp", {"n_points": 250}, [1, 2, 4, 8, 16, 32]),
    ("hierarchical", {"n_obs": 200_000, "n_groups": 200}, [1, 2, 4, 8, 16, 32]),
    ("big_data", {"n_obs": 5000, "n_features": 40}, [4, 8, 16, 32, 64, 128]),
]
TARGETS_MIB = (4, 8, 16)


def _model(name: str, kwargs: dict):
    model = getattr(fixtures, name)(**kwargs)
    fn = fixtures.jax_fn(model)
    draws = [jax.numpy.asarray(x) for x in fixtures.raw_draws(model, 4, 1000, 0)]
    jax.block_until_ready(draws)
    return fn, draws


def child(name: str, kwargs: dict, size: int) -> float:
    """One cold call in this fresh process: its seconds, compile included."""
    fn, draws = _model(name, kwargs)
    jax.block_until_ready(jax.jit(lambda x: x + 1).lower(draws[-1]).compile()(draws[-1]))
    tic = time.perf_counter()
    outputs, _ = _postprocess.run(fn, draws, None, "chunked", True, chunk_size=size)
    jax.block_until_ready(outputs)
    return time.perf_counter() - tic


def _cold_run(name: str, kwargs: dict, size: int) -> float:
    command = [sys.executable, __file__, "--child", json.dumps([name, kwargs, size])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def sweep(name: str, kwargs: dict, sizes: list[int], repeats: int, cold: bool = False) -> dict:
    fn, draws = _model(name, kwargs)
    problem, _ = _draws.validate(fn, draws, None)

    def run(size: int) -> float:
        tic = time.perf_counter()
        outputs, _ = _postprocess.run(fn, draws, None, "chunked", chunk_size=size)
        jax.block_until_ready(outputs)
        return time.perf_counter() - tic

    first = obtain(fn, problem, Request("chunked", Loop.XLA, sizes[0]))
    compiled = first.temp_bytes / sizes[0]
    times: dict[int, float] = {size: float("inf") for size in sizes}
    if cold:
        runs: dict[int, list[float]] = {size: [] for size in sizes}
        for _ in range(repeats):
            for size in sizes:
                runs[size].append(_cold_run(name, kwargs, size))
        times = {size: statistics.median(ts) for size, ts in runs.items()}
    else:
        for size in sizes:
            run(size)  # compile and warm up
        for _ in range(repeats):
            for size in sizes:
                times[size] = min(times[size], run(size))
    best = min(times.values())
    rules = {}
    for target in TARGETS_MIB:
        with configured(target_chunk_bytes=target * 2**20):
            rules[target] = [
                _sizing.rule_chunk(problem, Loop.XLA, float(bound), None)[0]
                for bound in (problem.intermediate_bytes, compiled)
            ]
    return {
        "model": name,
        "kwargs": kwargs,
        "jaxpr_kib": problem.intermediate_bytes / 2**10,
        "compiled_kib": compiled / 2**10,
        "shared_mib": problem.shared_bytes / 2**20,
        "best_seconds": best,
        "relative": {size: t / best for size, t in times.items()},
        "cold": cold,
        "rule_sizes": rules,
    }


def table(rows: list[dict]) -> str:
    head = "| model | temps per draw KiB: jaxpr / compiled | time / best, by chunk size |"
    head += "".join(f" rule at {t} MiB |" for t in TARGETS_MIB)
    lines = [head, "|---|---:|---|" + "---:|" * len(TARGETS_MIB)]
    for r in rows:
        label = r["model"] + (
            " (" + ", ".join(f"{k}={v}" for k, v in r["kwargs"].items()) + ")"
            if r["kwargs"]
            else ""
        )
        curve = ", ".join(f"{s}: {v:.2f}" for s, v in r["relative"].items())
        rules = "".join(" {} / {} |".format(*r["rule_sizes"][t]) for t in TARGETS_MIB)
        lines.append(
            f"| {label} | {r['jaxpr_kib']:.0f} / {r['compiled_kib']:.0f} | {curve} |{rules}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--case",
        action="append",
        default=None,
        help="builder:json-kwargs:sizes, e.g. 'gp:{}:1,2,4' (repeatable; default: CASES)",
    )
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--cold", action="store_true", help="each run in a fresh process")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, kwargs, size = json.loads(args.child)
        print(child(name, kwargs, size))
        return
    cases = CASES
    if args.case:
        cases = []
        for text in args.case:
            name, rest = text.split(":", 1)
            kwargs, sizes = rest.rsplit(":", 1)
            cases.append((name, json.loads(kwargs), [int(s) for s in sizes.split(",")]))
    rows = []
    for name, kwargs, sizes in cases:
        rows.append(sweep(name, kwargs, sizes, args.repeats, args.cold))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
