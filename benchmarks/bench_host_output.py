"""Outputs in device memory then numpy, against `stream_to_host`, on a model with ~1 GiB of outputs.

The model is big_det with a 30,000-point deterministic `mu = X @ beta` at 4 x 1000 draws (float64:
0.9 GiB of outputs). Each case runs in a fresh process: build the model and the draws, compile,
reset the peak RSS (`echo 5 > /proc/self/clear_refs`), then time a first run (it pays
first-touch page faults and one-off set-up costs) and a second run, each ending with every
output as a numpy array. Peak extra memory is `VmHWM` minus `VmRSS` before the first run.

Cases (same chunk size for all):
- `device`: `jax.jit(chunked_vmap(jax_fn, chunk_size))` then `np.asarray` of each output (on a
  CPU a zero-copy, read-only view): the "device" output memory of the package today.
- `host_view`, `host_pinned_copy`: `stream_to_host` with each `Transfer`; `host_pinned_output`:
  a step compiled with its outputs in `pinned_host` memory (`compile_pinned_output`).

Run: `python benchmarks/bench_host_output.py [--repeat 3] [--n-obs 30000] [--chunk-size 128]
[--json FILE]` (prints a markdown table; cases alternate round-robin so that a shared machine's
noise spreads; `--json` keeps every run for `benchmarks/results_page.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("device", "host_view", "host_pinned_copy", "host_pinned_output")
MiB = 2**20


def child(case: str, n_obs: int, chains: int, draws: int, chunk_size: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import warnings

    warnings.filterwarnings("ignore")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _internals import Transfer, compile_host_chunks, stream_to_host

    from pymc_chunkpost import chunked_vmap
    from pymc_chunkpost.profiling.fixtures import big_det, jax_fn, raw_draws
    from pymc_chunkpost.profiling.proc import reset_peak, status_bytes

    model = big_det(n_obs=n_obs)
    fn = jax_fn(model)
    raw = [jnp.asarray(x) for x in raw_draws(model, chains, draws, 0)]
    jax.block_until_ready(raw)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in raw]
    n = chains * draws
    tic = time.perf_counter()
    if case == "device":
        # Chunked over the flattened (chains * draws) axis, as the package's loops are.
        flat = [jax.ShapeDtypeStruct((n,) + s.shape[2:], s.dtype) for s in specs]
        compiled = jax.jit(chunked_vmap(lambda *v: fn(*v), chunk_size=chunk_size))
        compiled = compiled.lower(*flat).compile()

        def go():
            outs = compiled(*[x.reshape((n,) + x.shape[2:]) for x in raw])
            return [np.asarray(o).reshape((chains, draws) + o.shape[1:]) for o in outs]
    else:
        if case == "host_pinned_output":
            transfer = Transfer.VIEW
            compiled = compile_pinned_output(fn, specs, chunk_size)
        else:
            transfer = Transfer(case.removeprefix("host_"))
            compiled = compile_host_chunks(fn, specs, chunk_size)
        out_specs = jax.eval_shape(jax.vmap(jax.vmap(fn)), *specs)

        def go():
            return stream_to_host(compiled, raw, n, chunk_size, out_specs, transfer=transfer)

    compile_seconds = time.perf_counter() - tic
    base = status_bytes("VmRSS")
    reset_peak()
    tic = time.perf_counter()
    outs = go()  # the first run: it pays first-touch page faults and one-off set-up costs
    first_seconds = time.perf_counter() - tic
    peak = status_bytes("VmHWM") - base
    del outs
    tic = time.perf_counter()
    outs = go()  # the second run: memory the allocators kept from the first is reused
    seconds = time.perf_counter() - tic
    out_bytes = sum(o.nbytes for o in outs)
    checksum = float(sum(np.float64(o.sum(dtype=np.float64)) for o in outs))
    return {
        "case": case,
        "jax": jax.__version__,
        "seconds": seconds,
        "first_seconds": first_seconds,
        "compile_seconds": compile_seconds,
        "peak_extra_MiB": peak / MiB,
        "output_MiB": out_bytes / MiB,
        "checksum": checksum,
        "writeable": all(o.flags.writeable for o in outs),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n-obs", type=int, default=30_000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--json", default=None, help="write every run here (benchmarks/results_page.py reads it)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = (args.n_obs, args.chains, args.draws, args.chunk_size)
    if args.child:
        print(json.dumps(child(args.child, *sizes)))
        return 0
    rows: dict[str, list[dict]] = {c: [] for c in args.cases.split(",")}
    for _ in range(args.repeat):
        for case in rows:  # round robin: the cases share the machine's noise
            done = subprocess.run(
                [sys.executable, __file__, "--child", case]
                + ["--n-obs", str(args.n_obs), "--chains", str(args.chains)]
                + ["--draws", str(args.draws), "--chunk-size", str(args.chunk_size)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                print(f"{case} failed: {done.stderr[-2000:]}", file=sys.stderr)
                continue
            rows[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(report(rows, args.chunk_size, args.repeat))
    if args.json:
        record = {
            "command": " ".join(["python benchmarks/bench_host_output.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d"),
            "python": sys.version.split()[0],
            "chunk_size": args.chunk_size,
            "repeat": args.repeat,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


def report(rows: dict[str, list[dict]], chunk_size: int, repeat: int) -> str:
    """The markdown table of `rows` (case -> its runs): medians, and time over "device"'s."""
    first = next(r for r in rows.values() if r)[0]
    lines = [
        f"jax {first['jax']}, {first['output_MiB']:.0f} MiB of outputs, chunk_size "
        f"{chunk_size}, median of {repeat} fresh processes",
        "",
        "| case | run s | vs device | first run s | peak extra MiB | compile s | same values |",
        "|---|---|---|---|---|---|---|",
    ]
    base = statistics.median(r["seconds"] for r in rows["device"]) if rows.get("device") else None
    for case, runs in rows.items():
        if not runs:
            continue
        seconds = statistics.median(r["seconds"] for r in runs)
        ratio = f"{seconds / base:.2f}" if base else "-"
        same = all(r["checksum"] == first["checksum"] for r in runs)
        lines.append(
            f"| {case} | {seconds:.3f} | {ratio} | "
            f"{statistics.median(r['first_seconds'] for r in runs):.3f} | "
            f"{statistics.median(r['peak_extra_MiB'] for r in runs):.0f} | "
            f"{statistics.median(r['compile_seconds'] for r in runs):.2f} | {same} |"
        )
    return "\n".join(lines)


def compile_pinned_output(fn, specs, chunk_size):
    """The chunk step with its outputs compiled into `pinned_host` memory: the alternative to
    `Transfer.PINNED_COPY` that docs/host_output.md measured (and the library does not use).
    Its chunks are read as views (`Transfer.VIEW`): the copy is part of each chunk's program."""
    import jax
    import numpy as np
    from _internals import host_chunk_function
    from jax.sharding import make_single_device_sharding

    sharding = make_single_device_sharding(jax.devices()[0])
    chains, draws = specs[0].shape[:2]
    chunk = host_chunk_function(fn, chains * draws, chunk_size)
    args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs]
    start = jax.ShapeDtypeStruct((), np.int32, sharding=sharding)
    pinned = sharding.with_memory_kind("pinned_host")
    return jax.jit(chunk, out_shardings=pinned).lower(args, start).compile()


if __name__ == "__main__":
    raise SystemExit(main())
