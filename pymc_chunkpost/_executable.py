"""What a post-processing problem is, and its compiled executables (cached).

This is the one place where the computation is traced, jitted, compiled and donated; every
strategy and the planner go through it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._chunked import chunk_start, read_slice, write_slice
from ._progress import on_chunk
from ._strategies import STRATEGY_TABLE

__all__ = ["Problem", "Executable", "executable", "analyse", "is_out_of_memory"]


def is_out_of_memory(error: Exception) -> bool:
    """Whether an XLA error is the device running out of memory.

    At run time XLA raises RESOURCE_EXHAUSTED. On a GPU it can also fail while *compiling*:
    its autotuner runs candidate kernels on buffers of the real sizes, and when none can be
    allocated it raises "NOT_FOUND: All configs failed during profiling", listing the
    RESOURCE_EXHAUSTED failures (seen on an H200 with a 1.1 GiB pool, one 640 MiB chunk).
    """
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


@dataclasses.dataclass(frozen=True)
class Problem:
    """The shapes of one post-processing call: what the planner and the cache key on.

    Attributes:
        jax_fn: the per-draw function.
        in_specs: the raw samples' shapes and dtypes, `(chains, draws, ...)` each.
        device: where the computation runs.
        out_specs: every output's shape and dtype, `(chains, draws, ...)` each.
        forwarded: for each output, the index of the input it merely passes through (an
            untransformed variable), or None. Such outputs are the input arrays themselves:
            no copy, no work.
        intermediate_bytes: per draw, the bytes of intermediates that XLA cannot fuse away
            (results of dots, decompositions, solves, gathers, loops, ...), read from the
            jaxpr. A cheap estimate of temporaries, used before anything is compiled.
        n_equations: per draw, the number of equations in the jaxpr (nested ones included).
        shared_bytes: bytes of the constants that every draw reads (the model's data, such
            as a design matrix), from the jaxpr's constants.
    """

    jax_fn: Callable
    in_specs: tuple[jax.ShapeDtypeStruct, ...]
    device: jax.Device
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    forwarded: tuple[int | None, ...]
    intermediate_bytes: int = 0
    n_equations: int = 0
    shared_bytes: int = 0

    @property
    def chains(self) -> int:
        return self.in_specs[0].shape[0]

    @property
    def draws(self) -> int:
        return self.in_specs[0].shape[1]

    @property
    def n_items(self) -> int:
        return self.chains * self.draws

    @property
    def input_bytes(self) -> int:
        return sum(_nbytes(s) for s in self.in_specs)

    @property
    def output_bytes(self) -> int:
        """Bytes of the outputs that must be newly allocated (not passed-through inputs)."""
        return sum(_nbytes(s) for s, k in zip(self.out_specs, self.forwarded) if k is None)

    @property
    def computed(self) -> tuple[int, ...]:
        """Indices of the outputs that are computed (not passed through)."""
        return tuple(j for j, k in enumerate(self.forwarded) if k is None)

    @property
    def per_item_bytes(self) -> int:
        """Input plus computed-output bytes of one draw."""
        n = max(self.n_items, 1)
        return (self.input_bytes + self.output_bytes) // n


def _nbytes(spec: jax.ShapeDtypeStruct) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


_ANALYSIS_CACHE: OrderedDict = OrderedDict()


def analyse(jax_fn: Callable, in_specs: Sequence[jax.ShapeDtypeStruct], device) -> Problem:
    """Trace `jax_fn` once on one draw's shapes: output shapes and passed-through inputs."""
    in_specs = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in in_specs)
    key = (jax_fn, in_specs, device)
    if key in _ANALYSIS_CACHE:
        _ANALYSIS_CACHE.move_to_end(key)
        return _ANALYSIS_CACHE[key]
    lead = in_specs[0].shape[:2]
    per_draw = [jax.ShapeDtypeStruct(s.shape[2:], s.dtype) for s in in_specs]
    closed = jax.make_jaxpr(lambda *xs: list(jax_fn(*xs)))(*per_draw)
    invars = list(closed.jaxpr.invars)
    forwarded = tuple(
        invars.index(v) if any(v is w for w in invars) else None for v in closed.jaxpr.outvars
    )
    out_specs = tuple(
        jax.ShapeDtypeStruct(lead + tuple(a.shape), a.dtype) for a in closed.out_avals
    )
    intermediate, n_equations = _jaxpr_cost(closed.jaxpr)
    shared = sum(int(getattr(c, "nbytes", 0)) for c in closed.consts)
    problem = Problem(
        jax_fn, in_specs, device, out_specs, forwarded, intermediate, n_equations, shared
    )
    _ANALYSIS_CACHE[key] = problem
    if len(_ANALYSIS_CACHE) > 64:
        _ANALYSIS_CACHE.popitem(last=False)
    return problem


# Primitives whose results XLA's fusion passes generally cannot keep out of memory.
_MATERIALISING = {
    "dot_general",
    "cholesky",
    "triangular_solve",
    "lu",
    "qr",
    "eigh",
    "eig",
    "svd",
    "householder_product",
    "schur",
    "gather",
    "scatter",
    "scatter-add",
    "scatter_add",
    "sort",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "cumlogsumexp",
    "fft",
    "conv_general_dilated",
    "transpose",
    "argsort",
    "top_k",
}


def _jaxpr_cost(jaxpr) -> tuple[int, int]:
    """Bytes of materialising intermediates and number of equations, nested jaxprs included."""
    outvars = {id(v) for v in jaxpr.outvars}
    total, count = 0, 0
    for eqn in jaxpr.eqns:
        count += 1
        nested = [v for v in eqn.params.values() if hasattr(v, "jaxpr") or hasattr(v, "eqns")]
        for sub in nested:
            sub_bytes, sub_count = _jaxpr_cost(getattr(sub, "jaxpr", sub))
            total, count = total + sub_bytes, count + sub_count
        if eqn.primitive.name in _MATERIALISING or nested:
            for v in eqn.outvars:
                if id(v) not in outvars and hasattr(v.aval, "shape"):
                    total += int(np.prod(v.aval.shape, dtype=np.int64)) * v.aval.dtype.itemsize
    return total, count


#: Internal strategy: the chunked map driven by a host loop over one compiled chunk step.
HOST_CHUNKED = "chunked_host"
#: Internal strategy: the chunked map's XLA loop run in a few host-dispatched segments, so
#: that a progress bar can follow it (what "chunked" compiles to with `progress=True`).
HOST_SEGMENTS = "chunked_segments"
#: Host-driven loops: the host calls a compiled step that updates donated outputs in place.
HOST_DRIVEN = (HOST_CHUNKED, HOST_SEGMENTS)
#: With progress, the first segment runs this fraction of the chunks, to time them...
FIRST_SEGMENT_FRACTION = 1 / 64
#: ...and every later one runs about this many seconds' worth (tqdm redraws every 0.1 s).
SEGMENT_SECONDS = 0.25


@dataclasses.dataclass(frozen=True)
class Executable:
    """A compiled strategy for one problem, with what it cost and what it will use.

    Attributes:
        strategy: the strategy compiled (`HOST_CHUNKED` or `HOST_SEGMENTS` for host-driven
            loops).
        chunk_size: its chunk size, or None.
        compiled: the `jax.stages.Compiled` to call with the samples; for host-driven loops,
            a step `(outputs, samples, first_chunk, end_chunk) -> outputs` that the host calls
            per chunk (`HOST_CHUNKED`) or per segment of chunks (`HOST_SEGMENTS`).
        donated: the input indices it donates.
        progress: whether it reports progress.
        trace_seconds: time to trace and lower.
        compile_seconds: time for XLA to compile.
        temp_bytes: XLA's temporary buffers (`memory_analysis().temp_size_in_bytes`).
        output_bytes: XLA's output buffers.
        alias_bytes: output bytes written into donated inputs.
        problem: what it was compiled for.
        init: for host-driven loops, a compiled `() -> outputs` that makes the zero-filled
            outputs the step updates; None otherwise.
    """

    strategy: str
    chunk_size: int | None
    compiled: Any
    donated: tuple[int, ...]
    progress: bool
    trace_seconds: float
    compile_seconds: float
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    problem: Problem
    init: Any = None

    @property
    def peak_bytes(self) -> int:
        """New memory at the peak of a run: outputs and temporaries, less aliased inputs."""
        if self.strategy in HOST_DRIVEN:  # the step updates the outputs in place
            return self.problem.output_bytes + self.temp_bytes
        return self.output_bytes + self.temp_bytes - self.alias_bytes


_EXECUTABLES: OrderedDict = OrderedDict()


def executable(
    problem: Problem,
    strategy: str,
    chunk_size: int | None,
    donate: Sequence[int] = (),
    progress: bool = False,
) -> Executable:
    """Compile (or fetch from the cache) `strategy` for `problem`; nothing runs.

    "chunked" with `progress` compiles to `HOST_SEGMENTS`: the same loop, run in segments
    that the host dispatches and reports on. A callback inside the loop would cost more
    (measured on big_det: +0.04 s of compiling for a nested loop with `jax.debug.callback`,
    about 70 us per callback), and segments cost only a dispatch each.
    """
    donate = tuple(donate)
    if strategy == "chunked" and progress:
        strategy = HOST_SEGMENTS
    key = (problem, strategy, chunk_size, donate, progress)
    if key in _EXECUTABLES:
        _EXECUTABLES.move_to_end(key)
        return _EXECUTABLES[key]
    fn, computed = problem.jax_fn, problem.computed

    def per_draw(*values):
        outs = fn(*values)
        return [outs[j] for j in computed]

    sharding = jax.sharding.SingleDeviceSharding(problem.device)
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in problem.in_specs]
    if strategy in HOST_DRIVEN:
        out_specs = [
            jax.ShapeDtypeStruct(
                problem.out_specs[j].shape, problem.out_specs[j].dtype, sharding=sharding
            )
            for j in computed
        ]
        index = jax.ShapeDtypeStruct((), np.int32, sharding=sharding)
        args = (out_specs, specs, index, index)
        step = _host_step(per_draw, problem.n_items, chunk_size, strategy == HOST_SEGMENTS)
        jitted = jax.jit(step, donate_argnums=0)
        make_outputs = jax.jit(
            lambda: [jnp.zeros(s.shape, s.dtype) for s in out_specs],
            out_shardings=[sharding] * len(out_specs),
        ).lower()
    else:
        strategy_fn = STRATEGY_TABLE[strategy]

        def run(*samples):
            callback = on_chunk if progress else None
            return strategy_fn(per_draw, list(samples), chunk_size, callback)

        args = specs
        jitted = jax.jit(run, donate_argnums=donate)
        make_outputs = None
    tic = time.perf_counter()
    lowered = jitted.lower(*args)
    toc = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # XLA compiles without the GIL: the host-driven loops' zero outputs compile on the
        # side (measured on big_det: 0.05 s that would otherwise be added).
        init = make_outputs and pool.submit(make_outputs.compile)
        compiled = lowered.compile()
        init = init and init.result()
    compile_seconds = time.perf_counter() - toc
    memory = compiled.memory_analysis()
    result = Executable(
        strategy=strategy,
        chunk_size=chunk_size,
        compiled=compiled,
        donated=donate,
        progress=progress,
        trace_seconds=toc - tic,
        compile_seconds=compile_seconds,
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", problem.output_bytes)),
        alias_bytes=int(getattr(memory, "alias_size_in_bytes", 0)),
        problem=problem,
        init=init,
    )
    _EXECUTABLES[key] = result
    if len(_EXECUTABLES) > 32:
        _EXECUTABLES.popitem(last=False)
    return result


def _host_step(per_draw: Callable, n: int, size: int, looped: bool) -> Callable:
    """Chunks `[lo, hi)`: evaluate them and write them into the donated outputs, in place.

    `looped=False` (`HOST_CHUNKED`) evaluates chunk `lo` only, in straight-line code: XLA's
    CPU compile time of a loop body grows steeply with the number of buffers it slices and
    updates (measured, jax 0.12: 146 s for a model with 200 scalars at 16 draws per chunk),
    while this step compiles like the loop-free vmap (0.7 s). The host calls it per chunk;
    each call costs a dispatch (about 1 ms with 400 buffers).

    `looped=True` (`HOST_SEGMENTS`) runs chunks `lo` to `hi` in an XLA loop: the "chunked"
    loop, cut into segments that the host can report progress on.
    """

    def chunk(flat, outs, i):
        start = chunk_start(i, size, n)
        ys = jax.vmap(per_draw)(*[read_slice(x, start, size, 0) for x in flat])
        return [write_slice(o, y, start, 0) for o, y in zip(outs, ys)]

    def step(outs, samples, lo, hi):
        flat = [x.reshape((n,) + x.shape[2:]) for x in samples]  # free: bitcasts
        flat_outs = [o.reshape((n,) + o.shape[2:]) for o in outs]
        if looped:
            flat_outs = lax.fori_loop(lo, hi, lambda i, o: chunk(flat, o, i), flat_outs)
        else:
            flat_outs = chunk(flat, flat_outs, lo)
        return [o.reshape(old.shape) for o, old in zip(flat_outs, outs)]

    return step


def execute(exe: Executable, samples: Sequence[jax.Array]) -> list[jax.Array]:
    """Run a compiled strategy. Donated buffers that XLA cannot reuse are not worth a warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        if exe.strategy not in HOST_DRIVEN:
            return list(exe.compiled(*samples))
        return _run_host_driven(exe, samples)


def _run_host_driven(exe: Executable, samples: Sequence[jax.Array]) -> list[jax.Array]:
    """Call a host-driven step over every chunk; report progress after each call.

    `HOST_CHUNKED` calls once per chunk. `HOST_SEGMENTS` times a first, small segment and
    then sizes segments to about `SEGMENT_SECONDS` each: a short run takes two or three
    calls, a long one redraws the bar often enough, and neither pays for more dispatches.
    The samples are read by every call, so none of them takes the draws: the caller
    (`_postprocess.run`) deletes donated draws once the whole run has succeeded, and an
    error on the way leaves them intact.
    """
    problem, size = exe.problem, exe.chunk_size
    n = problem.n_items
    n_chunks = -(-n // size)
    outs = list(exe.init())
    looped = exe.strategy == HOST_SEGMENTS
    per_call = max(1, int(n_chunks * FIRST_SEGMENT_FRACTION)) if looped else 1
    samples = list(samples)
    lo, tic = 0, time.perf_counter()
    while lo < n_chunks:
        hi = min(lo + per_call, n_chunks)
        outs = exe.compiled(outs, samples, np.int32(lo), np.int32(hi))
        if exe.progress:  # report work done, not work dispatched
            jax.block_until_ready(outs)
            on_chunk(min(hi * size, n), n)
            if looped:
                rate = hi / max(time.perf_counter() - tic, 1e-9)  # chunks per second
                per_call = max(1, int(rate * SEGMENT_SECONDS))
        lo = hi
    return outs
