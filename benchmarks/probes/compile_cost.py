"""What a chunked program costs to compile, by loop kind and output size, beside plain JAX.

    python benchmarks/probes/compile_cost.py [--rows 100000,1000000] [--draws 4x500]
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cell import run_child  # noqa: E402

PLANS = ("jit_vmap", "vmap", "chunked", "chunked_host_loop", "auto")
#: One chunk step written directly, donated outputs updated in place, to find what costs:
#: `step_reshape` flattens `(chains, draws, rows)` to `(chains * draws, rows)` around the
#: update (as the engine's steps do), `step_flat` updates a flat buffer, `step_block` a
#: `(1, chunk, rows)` block of the three-axis buffer at `[chain, draw, 0]`.
STEPS = ("step_reshape", "step_flat", "step_block")


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
    if plan in STEPS:
        return record | _step(plan, x, beta, chunk)
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


def _step(plan: str, x, beta, chunk: int) -> dict:
    """Compile and run one chunk step of `plan` (`STEPS`), the outputs donated."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    chains, draws = beta.shape[:2]
    rows = x.shape[0]
    chunk = min(chunk, draws)

    def chunk_of(b):  # (chunk, 8) -> (chunk, rows)
        return b @ x.T

    if plan == "step_flat":
        shape = (chains * draws, rows)

        def step(out, b, start):
            flat = b.reshape(chains * draws, 8)
            y = chunk_of(lax.dynamic_slice_in_dim(flat, start, chunk))
            return lax.dynamic_update_slice_in_dim(out, y, start, 0)

    elif plan == "step_reshape":
        shape = (chains, draws, rows)

        def step(out, b, start):
            flat = b.reshape(chains * draws, 8)
            y = chunk_of(lax.dynamic_slice_in_dim(flat, start, chunk))
            out = out.reshape(chains * draws, rows)
            return lax.dynamic_update_slice_in_dim(out, y, start, 0).reshape(shape)

    else:
        shape = (chains, draws, rows)

        def step(out, b, start):
            c, d = start // draws, start % draws
            y = chunk_of(lax.dynamic_slice(b, (c, d, 0), (1, chunk, 8))[0])
            return lax.dynamic_update_slice(out, y[None], (c, d, 0))

    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    start = jnp.int32(0)
    tic = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=0).lower(spec, beta, start).compile()
    record = {"compile_s": time.perf_counter() - tic}
    out = jnp.zeros(shape, jnp.float32)
    out = compiled(out, beta, start)
    out.block_until_ready()
    tic = time.perf_counter()
    out = compiled(out, beta, jnp.int32(chunk))
    out.block_until_ready()
    record["run_s"] = time.perf_counter() - tic
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--draws", default="4x500")
    parser.add_argument("--chunk", type=int, default=500)
    parser.add_argument("--plans", default=",".join(PLANS), help=f"of {PLANS + STEPS}")
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
