"""What to compile for a plan: one small description per loop kind.

A `Request` is what the planner asks for (strategy, loop, chunk size, donation, progress,
where the outputs go, whether XLA's CPU library fusions stay on). `program_for` turns it into
a `Program`: the function to compile, the specs of its arguments, how its outputs start (the
fill), and how the compiled step is called (`Call`). It traces nothing and compiles nothing:
`_executor.obtain` does that, and caches the result by `Request.key`.

The loop kinds:

- `Call.WHOLE`: every draw in one call, `step(*samples, consts) -> outputs`: the loop-free
  vmap, a fixed strategy's own structure, or one XLA loop over every chunk.
- `Call.CHUNK`: one chunk per call, written into the outputs in place,
  `step(outputs, samples, start, consts) -> outputs` (`Loop.HOST`).
- `Call.SEGMENT`: `count` chunks of an XLA loop per call, written in place,
  `step(outputs, samples, start, count, consts) -> outputs` (progress, or the tuner).
- `Call.TO_HOST`: per device that holds draws, `step(samples, start, consts) -> chunk
  outputs`, each chunk landed in numpy arrays (`_host_output`).

Invariant: every step takes the per-draw function's constants (the model's data,
`Problem.consts`) as its last argument, replicated on every device; no program holds them.
One program thus serves every value of the data of the same shapes (a `pm.set_data` of new
values compiles nothing), and no cached executable holds a model's data.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr
from jax.sharding import PartitionSpec

from ..._support.compat import NO_LIBRARY_FUSIONS, PREFER_VECTOR_WIDTH
from ..._support.config import current
from ..._support.progress import on_chunk
from ..data.problem import Problem
from ..data.types import Loop
from ..kernels.chunked import read_slice, shard_map_unchecked, write_slice
from ..kernels.jaxpr_eval import draw_major_fun, vmap_draws
from ..kernels.strategies import STRATEGY_TABLE, flat_vmap
from .host_output import host_chunk_program

__all__ = [
    "Call",
    "Program",
    "Request",
    "const_sharding",
    "const_specs",
    "flattens_vmap",
    "program_for",
]


class Call(enum.Enum):
    """How a compiled step is called (module docstring); `Executable.run` adapts each to one
    protocol."""

    WHOLE = "whole"
    CHUNK = "chunk"
    SEGMENT = "segment"
    TO_HOST = "to_host"


@dataclasses.dataclass(frozen=True)
class Request:
    """What the planner asks to be compiled.

    Attributes:
        strategy: a `STRATEGY_TABLE` name.
        loop: how its chunks are driven.
        chunk_size: draws per chunk (per shard), or None.
        donate: the input indices handed to XLA.
        progress: whether it reports progress.
        output_memory: "device", "host" (chunks landed in numpy arrays; nothing donated), or
            "disk" (the same chunks, handed on to a Zarr store, `_disk_sink`).
        segmented: an XLA loop in host-dispatched segments even without progress (the
            tuner switches chunk sizes between segments).
        library_fusions: whether XLA's CPU library fusions stay on (the default); False
            compiles with `_compat.NO_LIBRARY_FUSIONS` (an XLA loop on a CPU only).
        lanes: for outputs in host memory, the host threads that stream chunks at once
            (`_host_output.stream_to_host`); the compiled step is the same for any number.
        vector_width: XLA's preferred vector width on a CPU, in bits; 0: XLA's default.
    """

    strategy: str
    loop: Loop
    chunk_size: int | None
    donate: tuple[int, ...] = ()
    progress: bool = False
    output_memory: str = "device"
    segmented: bool = False
    library_fusions: bool = True
    lanes: int = 1
    vector_width: int = 0

    @property
    def segments(self) -> bool:
        """An XLA loop run in host-dispatched segments (progress, or the tuner)."""
        return self.loop is Loop.XLA and (self.progress or self.segmented)

    def key(self, problem: Problem) -> tuple:
        """What names the program for `problem`: the in-memory cache's key, and the text the
        on-disk store names it by (`"|".join(map(str, key[1:]))`)."""
        key: tuple = (problem, self.strategy, self.loop, self.chunk_size, self.donate)
        key += (self.progress, self.output_memory, self.segments)
        if not self.library_fusions:  # a new key only where it differs: the default's stay
            key += ("no library fusions",)
        if self.lanes > 1:
            key += (f"{self.lanes} lanes",)
        if self.vector_width:
            key += (f"vectors of {self.vector_width} bits",)
        exact = exact_product_terms(problem)
        if exact:  # the configuration in force, as `_binder` reads it
            key += (f"exact products of up to {exact} terms",)
        return key

    def compiler_options(self) -> dict[str, Any]:
        """XLA's compile options for the step."""
        options: dict[str, Any] = {} if self.library_fusions else dict(NO_LIBRARY_FUSIONS)
        if self.vector_width:
            options[PREFER_VECTOR_WIDTH] = self.vector_width
        return options


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """What to compile for one request (module docstring).

    Attributes:
        problem: what it computes.
        request: what the planner asked for.
        call: how the compiled step is called.
        step: the jitted step to lower (None for `Call.TO_HOST`).
        args: the specs `step` is lowered with.
        fill: for `CHUNK` and `SEGMENT`, a jitted `() -> zero outputs`, compiled beside the
            step; or None, and then...
        zeros: ...`() -> zero outputs` placed from the host (`_host_zeros`).
        host_steps: for `TO_HOST`, `(device, jitted step, args)` per device that holds draws.
    """

    problem: Problem
    request: Request
    call: Call
    step: Any = None
    args: tuple[Any, ...] = ()
    fill: Any = None
    zeros: Callable[[], list] | None = None
    host_steps: tuple[tuple[Any, Any, tuple[Any, ...]], ...] = ()


def flattens_vmap(problem: Problem) -> bool:
    """Whether the "vmap" strategy runs over the flattened chain x draw axis for `problem`
    (`PlannerConfig.flatten_min_gathered_bytes`)."""
    gathered = problem.memory_sharing * problem.n_local * problem.gathered_bytes
    return gathered >= current().flatten_min_gathered_bytes


def program_for(jax_fn: Callable, problem: Problem, request: Request) -> Program:
    """The program that `request` asks for `problem`; nothing is traced or compiled.

    Raises:
        ValueError: library fusions turned off for anything but an XLA loop on a CPU.
    """
    if not request.library_fusions and (
        request.loop is not Loop.XLA or problem.device.platform != "cpu"
    ):
        raise ValueError("Only an XLA loop on a CPU compiles without library fusions.")
    bind = _binder(jax_fn, problem)
    if request.output_memory in ("host", "disk"):  # disk: the host's chunks, then a store
        return _to_host(bind, problem, request)
    if request.loop is Loop.HOST or request.segments or _segmented_off_cpu(problem, request):
        return _stepped(bind, problem, request)
    return _whole(bind, problem, request)


def _segmented_off_cpu(problem: Problem, request: Request) -> bool:
    """Whether "chunked"'s XLA loop runs as one segment of the stepped program: off a CPU,
    where the loop of `_strategies` would carry its outputs flat (`_write_for`)."""
    return (
        request.strategy == "chunked"
        and request.loop is Loop.XLA
        and request.chunk_size is not None
        and problem.device.platform != "cpu"
    )


#: `bind(consts)`: the computed outputs of one draw, reading `consts` as the model's data.
Binder = Callable[[Sequence[Any]], Callable]


def _binder(jax_fn: Callable, problem: Problem) -> Binder:
    """`bind(consts)`: the computed outputs of one draw, with `consts` (a step's traced
    arguments) for the per-draw jaxpr's constants. From the jaxpr that `analyse` traced,
    where there is one: evaluating it skips a second trace of `jax_fn`, and computes
    data-times-draw products draw-major (`_jaxpr_eval`). Without one (no constants known),
    `jax_fn` itself, which then holds whatever it closes over."""
    if problem.jaxpr is not None:
        # The jaxpr without its constants: a program's closures must not hold the data.
        jaxpr = problem.jaxpr.jaxpr
        draw_fn = draw_major_fun(
            ClosedJaxpr(jaxpr, [None] * len(jaxpr.constvars)),
            problem.computed,
            exact_product_terms(problem),
        )
        return draw_fn.with_consts
    computed = problem.computed

    def per_draw(*values):
        outs = jax_fn(*values)
        return [outs[j] for j in computed]

    return lambda consts: per_draw


def exact_product_terms(problem: Problem) -> int:
    """The most terms of a float32 product at "highest" precision that the problem's device
    computes as multiplies and adds (`PlannerConfig.exact_product_terms`); 0: none."""
    config = current()
    if problem.device.platform in config.exact_product_platforms:
        return config.exact_product_terms
    return 0


def const_sharding(problem: Problem) -> jax.sharding.Sharding:
    """Where a step reads the problem's constants: whole on each device of the draws."""
    placement = problem.placement
    if placement.mesh is None:
        return placement.sharding
    return jax.sharding.NamedSharding(placement.mesh, P0)


def const_specs(problem: Problem) -> list[jax.ShapeDtypeStruct]:
    """The specs of `problem.consts`, as the steps are lowered with them."""
    sharding = const_sharding(problem)
    return [jax.ShapeDtypeStruct(np.shape(c), c.dtype, sharding=sharding) for c in problem.consts]


def _sample_specs(problem: Problem) -> list[jax.ShapeDtypeStruct]:
    sharding = problem.placement.sharding
    return [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in problem.in_specs]


def _whole(bind: Binder, problem: Problem, request: Request) -> Program:
    """Every draw in one call: a strategy of `STRATEGY_TABLE` over the samples."""
    strategy, sharding = request.strategy, problem.placement.sharding
    flat = strategy == "vmap" and flattens_vmap(problem)
    whole_chains = problem.placement.spec[1] is None
    strategy_fn = flat_vmap if flat else STRATEGY_TABLE[strategy]
    callback = None
    if request.progress:
        callback = on_chunk if problem.n_shards == 1 else _scaled_progress(problem.n_shards)

    def run(*args):
        *samples, consts = args
        return strategy_fn(bind(consts), list(samples), request.chunk_size, callback)

    specs = _sample_specs(problem)
    donate = request.donate
    if strategy == "vmap" and problem.n_shards > 1 and (not flat or whole_chains):
        # No loop and no draw sees another: XLA's partitioner keeps the draws' split on its
        # own (the outputs are pinned to it), and compiles this faster than shard_map does
        # (docs/strategies.md). Flattened chains x draws stay in contiguous blocks only when
        # each device holds whole chains.
        jitted = jax.jit(run, donate_argnums=donate, out_shardings=sharding)
    else:
        jitted = jax.jit(_per_shard(run, problem, n_mapped=len(specs)), donate_argnums=donate)
    return Program(problem, request, Call.WHOLE, jitted, (*specs, const_specs(problem)))


def _stepped(bind: Binder, problem: Problem, request: Request) -> Program:
    """A step that the host calls, updating donated outputs in place: one chunk per call
    (`Loop.HOST`), or segments of an XLA loop. Its outputs start as zeros: placed from the
    host on a CPU below `host_zeros_max_bytes` (nothing to compile), else filled by a
    compiled program."""
    size, n_local = request.chunk_size, problem.n_local
    assert size is not None, "a loop needs a chunk size"
    out_specs = [
        jax.ShapeDtypeStruct(problem.out_specs[j].shape, problem.out_specs[j].dtype)
        for j in problem.computed
    ]
    index = jax.ShapeDtypeStruct((), np.int32)
    specs = _sample_specs(problem)
    write = _write_for(problem)
    consts = const_specs(problem)
    if request.loop is Loop.XLA:  # segments; one for all chunks without progress or tuner
        step, call = _segment_step(bind, n_local, size, write), Call.SEGMENT
        args: tuple = (out_specs, specs, index, index, consts)
    else:
        step, call = _chunk_step(bind, n_local, size, write), Call.CHUNK
        args = (out_specs, specs, index, consts)
    jitted = jax.jit(_per_shard(step, problem, n_mapped=2), donate_argnums=0)
    sharding = problem.placement.sharding
    on_cpu = problem.device.platform == "cpu"
    if on_cpu and problem.output_bytes < current().host_zeros_max_bytes:
        return Program(problem, request, call, jitted, args, zeros=_host_zeros(out_specs, sharding))
    fill = jax.jit(
        lambda: [jnp.zeros(s.shape, s.dtype) for s in out_specs],
        out_shardings=[sharding] * len(out_specs),
    )
    return Program(problem, request, call, jitted, args, fill=fill)


def _to_host(bind: Binder, problem: Problem, request: Request) -> Program:
    """One chunk step per device that holds draws (one device, or each chain shard), whose
    chunks are landed in host memory."""
    assert request.chunk_size is not None, "host outputs stream chunks"
    chains, draws = problem.local_shape
    local = [
        jax.ShapeDtypeStruct((chains, draws) + tuple(s.shape[2:]), s.dtype)
        for s in problem.in_specs
    ]
    devices = problem.placement.local_devices if problem.n_shards > 1 else [problem.device]
    steps = tuple(
        (device, *host_chunk_program(bind, local, request.chunk_size, device, problem.consts))
        for device in devices
    )
    return Program(problem, request, Call.TO_HOST, host_steps=steps)


def _host_zeros(out_specs: Sequence[jax.ShapeDtypeStruct], sharding) -> Callable[[], list]:
    """Zero outputs for a host-driven run on a CPU, placed from a broadcast numpy zero.

    For outputs under `host_zeros_max_bytes`: nothing compiles (a compiled fill costs XLA's
    fixed 50-75 ms on 2 cores), while the copy costs more per byte than the compiled fill
    (docs/strategies.md). The placed buffers are XLA's own, so the step may take them by
    donation.
    """

    def zeros(spec: jax.ShapeDtypeStruct) -> jax.Array:
        zero = np.zeros((), spec.dtype)

        def shard(index: tuple[slice, ...] | None) -> np.ndarray:
            shape = [len(range(*k.indices(n))) for k, n in zip(index or (), spec.shape)]
            return np.broadcast_to(zero, (*shape, *spec.shape[len(shape) :]))

        # Only this process's shards: under `jax.distributed`, `device_put` of one host array
        # would first check, by a collective, that every process passed the same value.
        return jax.make_array_from_callback(spec.shape, sharding, shard)

    def init() -> list[jax.Array]:
        return [zeros(s) for s in out_specs]

    return init


def _scaled_progress(n_shards: int) -> Callable:
    """Per-shard progress callbacks, counted for all shards (they advance together)."""

    def callback(items_done, n_items):
        on_chunk(np.asarray(items_done) * n_shards, n_items * n_shards)

    return callback


P0 = PartitionSpec()


def _per_shard(fn: Callable, problem: Problem, n_mapped: int) -> Callable:
    """`fn` run on each shard's local arrays with `jax.shard_map`, or `fn` on one device.

    The first `n_mapped` arguments (lists of arrays) are split like the draws; the rest (chunk
    indices) are the same on every shard. Nothing is gathered: outputs keep the draws' split.
    """
    placement = problem.placement
    if placement.mesh is None:
        return fn
    spec = PartitionSpec(*placement.spec)

    def specs_of(args):
        return tuple(
            jax.tree.map(lambda _: spec, a) if i < n_mapped else jax.tree.map(lambda _: P0, a)
            for i, a in enumerate(args)
        )

    def sharded(*args):
        # Every output is split like the draws: `spec` is a prefix of the whole output tree
        # (no second trace of `fn` to learn its structure).
        mapped = shard_map_unchecked(fn, placement.mesh, specs_of(args), spec)
        return mapped(*args)

    return sharded


def _flat(xs, n: int):
    return [x.reshape((n,) + x.shape[2:]) for x in xs]  # free: a bitcast


class _Write(NamedTuple):
    """How a step holds the donated `(chains, draws, ...)` outputs while it writes chunks
    into them: `enter` gives the form it carries, `write(carried, ys, start)` writes one
    chunk's outputs (`(size, ...)` each) at flat item `start` in place, `leave(carried,
    outs)` gives back the outputs' own shapes."""

    enter: Callable[[list], list]
    write: Callable[[list, list, Any], list]
    leave: Callable[[list, list], list]


def _write_for(problem: Problem) -> _Write:
    """How a step writes its chunk into the outputs: through their flat `(chains * draws,
    ...)` view on a CPU, where that view is free (a bitcast); elsewhere row by row at each
    item's `(chain, draw)`, never viewing the whole buffer flat.

    Invariant: off a CPU no step views the whole outputs flat. On a TPU that view is a
    relayout of all of them (the tiles of their last two axes change), and XLA's compile
    of a step that takes it grows with the buffer (docs/decisions.md, "A chunked step that
    carries the whole output buffer").
    """
    if problem.device.platform == "cpu":
        n = problem.n_local
        return _Write(lambda outs: _flat(outs, n), _write_flat, _unflat)
    return _Write(list, _write_rows, lambda carried, outs: carried)


def _unflat(carried: list, outs: list) -> list:
    return [c.reshape(o.shape) for c, o in zip(carried, outs)]


def _write_flat(flat_outs: list, ys: list, start: Any) -> list:
    return [write_slice(o, y, start, 0) for o, y in zip(flat_outs, ys)]


def _write_rows(outs: list, ys: list, start: Any) -> list:
    written = []
    for o, y in zip(outs, ys):
        items = start + jnp.arange(y.shape[0])
        at = o.at[items // o.shape[1], items % o.shape[1]]
        written.append(at.set(y, indices_are_sorted=True, unique_indices=True))
    return written


def _chunk_step(bind: Binder, n: int, size: int, write: _Write) -> Callable:
    """One chunk of `size` draws at item `start` (clamped so it fits): evaluate it and write it
    into the donated outputs, in place (`write`). Straight-line code: it compiles like the
    loop-free vmap, where XLA's loops over many buffers compile for minutes
    (docs/strategies.md)."""

    def step(outs, samples, start, consts):
        flat = _flat(samples, n)
        start = jnp.minimum(start, n - size)
        ys = vmap_draws(bind(consts), 1)(*[read_slice(x, start, size, 0) for x in flat])
        return write.leave(write.write(write.enter(outs), ys, start), outs)

    return step


def _segment_step(bind: Binder, n: int, size: int, write: _Write) -> Callable:
    """`count` chunks of the "chunked" XLA loop from item `start` on (each start clamped so
    the chunk fits: the last overlaps the one before), written into the donated outputs
    (`write`). Segments of different chunk sizes tile the draws one after the other."""

    def step(outs, samples, start, count, consts):
        flat = _flat(samples, n)
        per_draw = bind(consts)

        def body(i, carried):
            at = jnp.minimum(start + i * size, n - size)
            ys = vmap_draws(per_draw, 1)(*[read_slice(x, at, size, 0) for x in flat])
            return write.write(carried, ys, at)

        return write.leave(lax.fori_loop(0, count, body, write.enter(outs)), outs)

    return step
