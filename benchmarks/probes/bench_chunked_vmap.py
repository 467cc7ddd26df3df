"""Benchmark `chunked_vmap` against `jax.vmap`, `lax.map(batch_size=)` and numpyro's `soft_vmap`.

The problem is a line-of-sight integral: for each of `n` lines of sight, a weight vector of
`samples` entries, computed from non-linear functions of constants and the line's parameter
`t`, is dotted with the row `field[pixel]` gathered from a large broadcast array. "forward" is
`jit(sum(map(...)))`; "reverse" is `jit(grad(...))` w.r.t. `t` (mapped) and `field` (broadcast),
whose backward pass scatter-adds into a cotangent of the whole field ("reverse t" and
"reverse field" take one of the two, to separate the scatter-add's cost).

Compiled memory is `memory_analysis().temp_size_in_bytes` of the compiled program, read in this
process. Each time is measured in a fresh subprocess (best of `--repeats` calls after one
warm-up call), so that the cases do not share caches or allocator state. The second table
measures the reverse pass against the number of chunks at fixed `n`, the check that the
backward accumulation into loop-invariant inputs is not O(n) per chunk.

Run: `python benchmarks/probes/bench_chunked_vmap.py` (prints markdown tables).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

METHODS = ("jax.vmap", "chunked_vmap", "lax.map(batch_size=)", "numpyro soft_vmap")
DIRECTIONS = ("forward", "reverse")


def line_of_sight(samples):
    s = jnp.linspace(0.0, 1.0, samples)

    def one(t, pixel, field):
        weights = jnp.exp(-t * s) * jnp.sin(3.0 * s + t) / (1.0 + t * s**2)
        return jnp.dot(weights, field[pixel])

    return one


def mapped_fn(method, samples, chunk_size):
    """`(t, pixel, field) -> per-line integrals`, with `t`/`pixel` mapped, `field` broadcast."""
    one = line_of_sight(samples)
    if method == "jax.vmap":
        return jax.vmap(one, (0, 0, None))
    if method == "chunked_vmap":
        from pymc_chunkpost import chunked_vmap

        return chunked_vmap(one, (0, 0, None), chunk_size=chunk_size)
    if method == "lax.map(batch_size=)":
        return lambda t, pixel, field: lax.map(
            lambda tp: one(*tp, field), (t, pixel), batch_size=chunk_size
        )
    if method == "numpyro soft_vmap":
        from numpyro.util import soft_vmap

        return lambda t, pixel, field: soft_vmap(
            lambda tp: one(*tp, field), (t, pixel), chunk_size=chunk_size
        )
    raise ValueError(f"unknown {method=}")


def program(method, direction, n, samples, pixels, chunk_size):
    """The jitted program and its arguments."""
    mapped = mapped_fn(method, samples, chunk_size)

    def loss(t, pixel, field):
        return jnp.sum(mapped(t, pixel, field))

    argnums = {"reverse": (0, 2), "reverse t": 0, "reverse field": 2}.get(direction)
    fn = jax.jit(loss if direction == "forward" else jax.grad(loss, argnums=argnums))
    rng = np.random.default_rng(0)
    args = (
        jnp.asarray(rng.uniform(0.0, 2.0, n), jnp.float32),
        jnp.asarray(rng.integers(0, pixels, n), jnp.int32),
        jnp.asarray(rng.normal(size=(pixels, samples)), jnp.float32),
    )
    return fn, args


def temp_bytes(method, direction, n, samples, pixels, chunk_size):
    fn, args = program(method, direction, n, samples, pixels, chunk_size)
    return fn.lower(*args).compile().memory_analysis().temp_size_in_bytes


def time_case(method, direction, n, samples, pixels, chunk_size, repeats):
    """Best wall time of `repeats` calls, in seconds (run inside a fresh subprocess)."""
    fn, args = program(method, direction, n, samples, pixels, chunk_size)
    compiled = fn.lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def time_in_subprocess(method, direction, n, samples, pixels, chunk_size, repeats):
    case = json.dumps([method, direction, n, samples, pixels, chunk_size, repeats])
    out = subprocess.run(
        [sys.executable, __file__, "--time-case", case],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="lines of sight")
    parser.add_argument("--samples", type=int, default=256, help="samples per line of sight")
    parser.add_argument("--pixels", type=int, default=4096, help="rows of the broadcast field")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--time-case", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.time_case:
        print(time_case(*json.loads(opts.time_case)))
        return

    size = (opts.n, opts.samples, opts.pixels)
    mib = 2**20
    print(
        f"jax {jax.__version__}, {jax.devices()[0].platform}, python "
        f"{platform.python_version()}, {platform.processor() or platform.machine()}; "
        f"n={opts.n} lines of sight x {opts.samples} samples, field {opts.pixels}x"
        f"{opts.samples} f32, chunk_size={opts.chunk_size}\n"
    )
    rows = {}
    for method in METHODS:
        for direction in DIRECTIONS:
            memory = temp_bytes(method, direction, *size, opts.chunk_size)
            seconds = time_in_subprocess(method, direction, *size, opts.chunk_size, opts.repeats)
            rows[method, direction] = (seconds, memory)
    print(
        "| method | forward ms | forward temp MiB | reverse ms | reverse temp MiB "
        "| reverse time / vmap | reverse temp / vmap |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    base_time, base_memory = rows["jax.vmap", "reverse"]
    for method in METHODS:
        (f_s, f_b), (r_s, r_b) = rows[method, "forward"], rows[method, "reverse"]
        print(
            f"| {method} | {f_s * 1e3:.1f} | {f_b / mib:.2f} | {r_s * 1e3:.1f} | "
            f"{r_b / mib:.2f} | {r_s / base_time:.2f} | {r_b / base_memory:.3f} |"
        )

    print("\nThe reverse pass w.r.t. one argument: `t` (mapped) or `field` (broadcast: its")
    print("cotangent is a scatter-add of every line's weights into the whole field).\n")
    print("| method | reverse t ms | temp MiB | reverse field ms | temp MiB |")
    print("|---|---:|---:|---:|---:|")
    for method in ("jax.vmap", "chunked_vmap"):
        cells = []
        for direction in ("reverse t", "reverse field"):
            seconds = time_in_subprocess(method, direction, *size, opts.chunk_size, opts.repeats)
            memory = temp_bytes(method, direction, *size, opts.chunk_size)
            cells.append(f"{seconds * 1e3:.1f} | {memory / mib:.2f}")
        print(f"| {method} | {' | '.join(cells)} |")

    print(f"\nchunked_vmap reverse pass against the number of chunks (n={opts.n}):\n")
    print("| n_chunks | chunk_size | reverse ms | ms per chunk | reverse temp MiB |")
    print("|---:|---:|---:|---:|---:|")
    for n_chunks in (4, 16, 64, 256, 1024):
        chunk_size = -(-opts.n // n_chunks)
        seconds = time_in_subprocess("chunked_vmap", "reverse", *size, chunk_size, opts.repeats)
        memory = temp_bytes("chunked_vmap", "reverse", *size, chunk_size)
        print(
            f"| {n_chunks} | {chunk_size} | {seconds * 1e3:.1f} | "
            f"{seconds * 1e3 / n_chunks:.3f} | {memory / mib:.2f} |"
        )


if __name__ == "__main__":
    main()
