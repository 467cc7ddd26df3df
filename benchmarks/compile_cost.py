"""What a chunked program costs to compile, by loop kind and output size, beside plain JAX.

    python benchmarks/compile_cost.py [--rows 100000,1000000] [--draws 4x500]
        [--plans vmap,chunked,chunked_host_loop,jit_vmap] [--out FILE]

Issue 50 saw XLA compile one chunk step for 212 s on a TPU v5e (an 8 GB `X @ beta`
deterministic, chunks of 500 draws, the step carrying the whole output buffer). Each cell
here runs in a fresh process: the per-draw function `X @ beta` (`X` of `rows x 8`, float32)
over `chains x draws`, post-processed by one plan, timed cold (compile and run) and warm
(run), so that the compile's share is `cold - warm`:
- `jit_vmap`: the anchor, `jax.jit(jax.vmap(jax.vmap(fn)))`, compiled ahead of time;
- `vmap`, `chunked` (chunks of `--chunk` draws in one XLA loop whose step updates the whole
  output buffer), `chunked_host_loop` (the same chunks driven from the host, one
  straight-line step per chunk: `progressbar=True`).
The last line printed is the JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cell import run_child  # noqa: E402

PLANS = ("jit_vmap", "vmap", "chunked", "chunked_host_loop")


def _cell(plan: str, rows: int, chains: int, draws: int, chunk: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pymc_chunkpost as pc

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, 8)).astype(np.float32))
    beta = jax.device_put(rng.normal(size=(chains, draws, 8)).astype(np.float32))

    def fn(b):
        return [x @ b]

    record = {"plan": plan, "rows": rows, "output_bytes": 4 * rows * chains * draws}
    if plan == "jit_vmap":
        tic = time.perf_counter()
        compiled = jax.jit(jax.vmap(jax.vmap(fn))).lower(beta).compile()
        record["compile_s"] = time.perf_counter() - tic
        tic = time.perf_counter()
        jax.block_until_ready(compiled(beta))
        record["run_s"] = time.perf_counter() - tic
        return record
    options: dict = {"memory_budget": None}
    strategy = plan
    if plan.startswith("chunked"):
        strategy, options = "chunked", {"chunk_size": chunk}
        options["progressbar"] = plan == "chunked_host_loop"
    for phase in ("cold", "warm"):
        tic = time.perf_counter()
        out = pc.postprocess_samples(fn, [beta], None, strategy, output_memory="device", **options)
        jax.block_until_ready(out)
        record[f"{phase}_s"] = time.perf_counter() - tic
        del out
    record["compile_s"] = record["cold_s"] - record["warm_s"]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--draws", default="4x500")
    parser.add_argument("--chunk", type=int, default=500)
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    chains, draws = map(int, args.draws.split("x"))
    if args.child is not None:
        plan, rows = args.child.split(":")
        print(json.dumps(_cell(plan, int(rows), chains, draws, args.chunk)))
        return
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    records = []
    for rows in map(int, args.rows.split(",")):
        for plan in args.plans.split(","):
            common = ["--draws", args.draws, "--chunk", str(args.chunk)]
            r = run_child(__file__, [*common, "--child", f"{plan}:{rows}"], env)
            records.append(r)
            print(
                f"{rows:>9} rows, {plan:>18}: compile {r['compile_s']:7.2f} s "
                f"({r['output_bytes'] / 2**30:.2f} GiB of outputs)",
                file=sys.stderr,
                flush=True,
            )
            if args.out:
                Path(args.out).write_text(json.dumps(records) + "\n")
    print(json.dumps(records))


if __name__ == "__main__":
    main()
