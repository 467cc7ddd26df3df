"""What a post-processing problem is, and its compiled executables (cached).

This is the one place where the computation is traced, jitted, compiled and donated; every
strategy and the planner go through it.
"""

from __future__ import annotations

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

from ._progress import on_chunk
from ._strategies import STRATEGY_TABLE

__all__ = ["Problem", "Executable", "executable", "analyse"]


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
    """

    jax_fn: Callable
    in_specs: tuple[jax.ShapeDtypeStruct, ...]
    device: jax.Device
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    forwarded: tuple[int | None, ...]
    intermediate_bytes: int = 0
    n_equations: int = 0

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
    problem = Problem(jax_fn, in_specs, device, out_specs, forwarded, intermediate, n_equations)
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


@dataclasses.dataclass(frozen=True)
class Executable:
    """A compiled strategy for one problem, with what it cost and what it will use.

    Attributes:
        strategy: the strategy compiled (`HOST_CHUNKED` for the host-driven loop).
        chunk_size: its chunk size, or None.
        compiled: the `jax.stages.Compiled` to call with the samples; for `HOST_CHUNKED`, a
            step `(outputs, samples, chunk_index) -> outputs` that the host calls per chunk.
        donated: the input indices it donates.
        progress: whether it reports progress.
        trace_seconds: time to trace and lower.
        compile_seconds: time for XLA to compile.
        temp_bytes: XLA's temporary buffers (`memory_analysis().temp_size_in_bytes`).
        output_bytes: XLA's output buffers.
        alias_bytes: output bytes written into donated inputs.
        problem: what it was compiled for.
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

    @property
    def peak_bytes(self) -> int:
        """New memory at the peak of a run: outputs and temporaries, less aliased inputs."""
        if self.strategy == HOST_CHUNKED:  # the step updates the outputs in place
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
    """Compile (or fetch from the cache) `strategy` for `problem`; nothing runs."""
    donate = tuple(donate)
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
    if strategy == HOST_CHUNKED:
        out_specs = [
            jax.ShapeDtypeStruct(
                problem.out_specs[j].shape, problem.out_specs[j].dtype, sharding=sharding
            )
            for j in computed
        ]
        args = (out_specs, specs, jax.ShapeDtypeStruct((), np.int32, sharding=sharding))
        jitted = jax.jit(_host_step(per_draw, problem.n_items, chunk_size), donate_argnums=0)
    else:
        strategy_fn = STRATEGY_TABLE[strategy]

        def run(*samples):
            callback = on_chunk if progress else None
            return strategy_fn(per_draw, list(samples), chunk_size, callback)

        args = specs
        jitted = jax.jit(run, donate_argnums=donate)
    tic = time.perf_counter()
    lowered = jitted.lower(*args)
    toc = time.perf_counter()
    compiled = lowered.compile()
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
    )
    _EXECUTABLES[key] = result
    if len(_EXECUTABLES) > 32:
        _EXECUTABLES.popitem(last=False)
    return result


def _host_step(per_draw: Callable, n: int, size: int) -> Callable:
    """Chunk `i`: evaluate `size` draws and write them into the donated outputs, in place.

    Straight-line code, no XLA loop: XLA's CPU compile time of a loop body grows steeply with
    the number of buffers it slices and updates (measured, jax 0.12: 146 s for a model with 200
    scalars at 16 draws per chunk), while this step compiles like the loop-free vmap (0.7 s).
    The host calls it once per chunk; each call costs a dispatch (about 1 ms with 400 buffers).
    """

    def step(outs, samples, i):
        start = jnp.minimum(i * size, n - size)  # the last chunk overlaps the one before
        flat = [x.reshape((n,) + x.shape[2:]) for x in samples]  # free: bitcasts
        ys = jax.vmap(per_draw)(*[lax.dynamic_slice_in_dim(x, start, size, 0) for x in flat])
        return [
            lax.dynamic_update_slice_in_dim(o.reshape((n,) + o.shape[2:]), y, start, 0).reshape(
                o.shape
            )
            for o, y in zip(outs, ys)
        ]

    return step


def execute(exe: Executable, samples: Sequence[jax.Array]) -> list[jax.Array]:
    """Run a compiled strategy. Donated buffers that XLA cannot reuse are not worth a warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        if exe.strategy != HOST_CHUNKED:
            return list(exe.compiled(*samples))
        problem, size = exe.problem, exe.chunk_size
        n = problem.n_items
        outs = [
            jnp.zeros(problem.out_specs[j].shape, problem.out_specs[j].dtype, device=problem.device)
            for j in problem.computed
        ]
        n_chunks = -(-n // size)
        for i in range(n_chunks):
            outs = exe.compiled(outs, list(samples), np.int32(i))
            if exe.progress:  # report work done, not work dispatched
                jax.block_until_ready(outs)
                on_chunk(min((i + 1) * size, n), n)
        for i in exe.donated:  # what donation would have freed
            samples[i].delete()
        return outs
