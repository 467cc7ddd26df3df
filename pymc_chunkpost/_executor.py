"""The mechanism: compile what the planner chose, run it, and report what it cost.

This is the one place where the computation is traced, jitted, compiled and donated, for
every strategy and loop kind, on one device or per shard with `jax.shard_map`. It decides
nothing: the `Loop`, chunk size and donation come from the planner.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from . import _executable_store
from ._cache import FunctionCache
from ._chunked import read_slice, shard_map_unchecked, write_slice
from ._host_output import compile_host_chunks, stream_to_host
from ._jaxpr_eval import draw_major_fun, vmap_draws
from ._memory import TRIM_MIN_BYTES, release_freed_heap
from ._problem import Problem, uses_primitives
from ._progress import on_chunk
from ._strategies import STRATEGY_TABLE, flat_vmap

__all__ = [
    "Loop",
    "Origin",
    "Executable",
    "compile_executable",
    "execute",
    "has_library_fusions",
    "library_reductions",
    "persist",
    "release",
    "distrust_foreign",
]


class Loop(enum.StrEnum):
    """How chunks are driven. The one list of loop kinds."""

    #: No loop of ours: every draw at once (`vmap`), or a fixed strategy's own structure.
    NONE = "none"
    #: One compiled XLA loop over the chunks.
    XLA = "xla"
    #: The host calls one compiled chunk step per chunk (straight-line code: it compiles like
    #: the loop-free vmap, where XLA's loops over many buffers compile for minutes).
    HOST = "host"


class Origin(enum.StrEnum):
    """Where an executable came from. The one list of origins."""

    #: XLA compiled it in this call.
    COMPILED = "compiled"
    #: Loaded from the on-disk store (`_executable_store.load`).
    LOADED = "loaded"
    #: Compiled for another device of its kind, and moved here (`_relocated`).
    MOVED = "moved"


#: With progress, an XLA loop runs in host-dispatched segments: the first runs this fraction
#: of the chunks, to time them...
FIRST_SEGMENT_FRACTION = 1 / 64
#: ...and every later one about this many seconds' worth (tqdm redraws every 0.1 s).
SEGMENT_SECONDS = 0.25
#: A host-driven run on a CPU starts from zero outputs placed from the host when they come to
#: less than this: no fill program to compile. Larger ones are filled by a compiled program
#: (compiled beside the step), which writes them faster than the host's copy does: the
#: host's copy costs more per byte, the program a fixed compile (docs/strategies.md).
HOST_ZEROS_MAX_BYTES = 48 * 2**20
#: The "vmap" strategy runs as one vmap over the flattened chain x draw axis when the results
#: of gathers and scatters of the draws' values come to at least this much (on a CPU, over all
#: its devices): under two batch dimensions XLA lays them out transposed and copies them into
#: the outputs. Below it the copy costs less than flattening does, in compile time and, on
#: jaxlib 0.10, in memory that XLA's analysis does not count (docs/strategies.md).
FLATTEN_MIN_GATHERED_BYTES = 8 * 2**20
#: XLA's CPU compiler hands some fusions to a kernel library (YNNPACK: `__ynn_fusion` in the
#: compiled HLO). Its reductions materialise their operands, which is far faster on a long
#: reduction and far slower on a short one inside a chunk loop (a row-indexed model's sum over
#: 3 slopes per row ran 2.5x slower with them: docs/strategies.md). These compiler options
#: turn them all off for one executable; nothing else in the process changes.
NO_LIBRARY_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
#: What marks a library fusion in the compiled HLO's text.
LIBRARY_FUSION_MARK = "__ynn_fusion"


def flattens_vmap(problem: Problem) -> bool:
    """Whether the "vmap" strategy runs over the flattened chain x draw axis for `problem`
    (`FLATTEN_MIN_GATHERED_BYTES`)."""
    gathered = problem.memory_sharing * problem.n_local * problem.gathered_bytes
    return gathered >= FLATTEN_MIN_GATHERED_BYTES


@dataclasses.dataclass(frozen=True)
class Executable:
    """A compiled plan for one problem, with what it cost and what it will use.

    Attributes:
        strategy: the strategy compiled (a `STRATEGY_TABLE` name).
        loop: how its chunks are driven.
        chunk_size: draws per chunk (per shard), or None.
        compiled: for `Loop.NONE` and an XLA loop without progress, the `jax.stages.Compiled`
            to call with the samples; for host outputs, a chunk step per device. For
            host-driven runs, a step the host calls:
            `(outputs, samples, start) -> outputs` (`Loop.HOST`: one chunk at item `start`)
            or `(outputs, samples, first_chunk, end_chunk) -> outputs` (segments of an XLA
            loop, for progress).
        donated: the input indices handed to XLA.
        progress: whether it reports progress.
        segments: an XLA loop run in host-dispatched segments (progress).
        trace_seconds: time to trace and lower.
        compile_seconds: time for XLA to compile, or to load or move what was compiled before.
        temp_bytes: XLA's temporaries per device (`memory_analysis()`).
        output_bytes: XLA's output buffers per device.
        alias_bytes: output bytes written into donated inputs.
        problem: what it was compiled for.
        init: for host-driven runs, a `() -> outputs` of zero-filled outputs: compiled, or,
            on a CPU for outputs under `HOST_ZEROS_MAX_BYTES`, placed from the host
            (`_host_zeros`).
        output_memory: "device", or "host": `compiled` is then a chunk step
            `(samples, start) -> chunk outputs` whose results are streamed into numpy
            arrays (`_host_output.stream_to_host`); nothing is donated to it.
        origin: where `compiled` came from.
        library_fusions: whether XLA's CPU library fusions were left on (the default);
            False: compiled with `NO_LIBRARY_FUSIONS`.
        to_store: what `persist` hands to the on-disk store, (slot, lowered, compiled)
            each, the compiled step as a `_executable_store.Portable` where it was
            serialized before running (`must_serialize_before_run`); emptied once handed
            over, or by `release` for a candidate the planner rejects, so that no lowered
            module (a copy of the program's constants) stays in the cache.
    """

    strategy: str
    loop: Loop
    chunk_size: int | None
    compiled: Any
    donated: tuple[int, ...]
    progress: bool
    segments: bool
    trace_seconds: float
    compile_seconds: float
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    problem: Problem
    init: Any = None
    output_memory: str = "device"
    origin: Origin = Origin.COMPILED
    library_fusions: bool = True
    to_store: list[tuple[Any, Any, Any]] = dataclasses.field(default_factory=list, compare=False)

    @property
    def host_driven(self) -> bool:
        return self.loop is Loop.HOST or self.segments

    @property
    def peak_bytes(self) -> int:
        """New memory per device at the peak: outputs and temporaries, less aliased inputs."""
        if self.output_memory == "host":  # two chunks' outputs in flight, one's temporaries
            return 2 * self.output_bytes + self.temp_bytes
        if self.host_driven:  # the step updates the outputs in place
            return self.problem.output_bytes // self.problem.n_shards + self.temp_bytes
        return self.output_bytes + self.temp_bytes - self.alias_bytes


_EXECUTABLES = FunctionCache(per_function=16)
#: The same executables, keyed by device kind instead of device (`_relocated`).
_BY_DEVICE_KIND = FunctionCache(per_function=16)


def compile_executable(
    jax_fn: Callable,
    problem: Problem,
    strategy: str,
    loop: Loop,
    chunk_size: int | None,
    donate: Sequence[int] = (),
    progress: bool = False,
    output_memory: str = "device",
    segmented: bool = False,
    stored: bool = False,
    library_fusions: bool = True,
) -> Executable:
    """Compile (or fetch from the cache) `strategy` for `problem`; nothing runs.

    An XLA loop with `progress` or `segmented` compiles to segments that the host dispatches:
    between two segments it reports progress, and the planner's tuner may switch chunk sizes
    (a callback inside the loop would cost more: docs/strategies.md). `output_memory="host"`
    compiles the chunk step whose outputs are streamed to host memory (`Loop.HOST`, one
    device, nothing donated). With `stored`, an executable that `persist` stored on disk
    before is loaded instead of compiled. `library_fusions=False` compiles the step with
    `NO_LIBRARY_FUSIONS` (an XLA loop on a CPU only).

    Raises:
        jax.errors.JaxRuntimeError: where XLA fails, or, with `library_fusions=False`, does
            not know `NO_LIBRARY_FUSIONS`' option.
    """
    donate = tuple(donate)
    loop = Loop(loop)
    segments = loop is Loop.XLA and (progress or segmented)
    if not library_fusions and (loop is not Loop.XLA or problem.device.platform != "cpu"):
        raise ValueError("Only an XLA loop on a CPU compiles without library fusions.")
    key: tuple = (problem, strategy, loop, chunk_size, donate, progress, output_memory, segments)
    if not library_fusions:  # a new key only where it differs: the default's keys stay
        key += ("no library fusions",)
    cached = _EXECUTABLES.get(jax_fn, key)
    if cached is not None:
        return cached
    computed = problem.computed
    # The jaxpr that `analyse` traced: evaluating it skips a second trace of `jax_fn`, and
    # computes data-times-draw products draw-major (`_jaxpr_eval`).
    per_draw: Callable
    if problem.jaxpr is None:

        def per_draw(*values):
            outs = jax_fn(*values)
            return [outs[j] for j in computed]

    else:
        per_draw = draw_major_fun(problem.jaxpr, computed)

    sharding = problem.placement.sharding
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in problem.in_specs]
    n_local = problem.n_local
    if output_memory == "host":
        assert chunk_size is not None, "host outputs stream chunks"
        tic = time.perf_counter()
        # One chunk step per device that holds draws (one device, or each chain shard).
        chains, draws = problem.local_shape
        local = [
            jax.ShapeDtypeStruct((chains, draws) + tuple(s.shape[2:]), s.dtype)
            for s in problem.in_specs
        ]
        devices = problem.placement.local_devices if problem.n_shards > 1 else [problem.device]
        steps = {
            device: compile_host_chunks(per_draw, local, chunk_size, device=device)
            for device in devices
        }
        _after_compile(problem, output_memory)
        memory = steps[devices[0]].memory_analysis()
        result = Executable(
            strategy=strategy,
            loop=Loop.HOST,
            chunk_size=chunk_size,
            compiled=steps,
            donated=(),
            progress=progress,
            segments=False,
            trace_seconds=0.0,
            compile_seconds=time.perf_counter() - tic,
            temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
            output_bytes=int(getattr(memory, "output_size_in_bytes", 0)),
            alias_bytes=0,
            problem=problem,
            output_memory="host",
        )
        _EXECUTABLES.put(jax_fn, key, result)
        return result
    if loop is Loop.HOST or segments:
        assert chunk_size is not None, "a loop needs a chunk size"
        out_specs = [
            jax.ShapeDtypeStruct(problem.out_specs[j].shape, problem.out_specs[j].dtype)
            for j in computed
        ]
        index = jax.ShapeDtypeStruct((), np.int32)
        if segments:
            local_step = _segment_step(per_draw, n_local, chunk_size)
            args: tuple = (out_specs, specs, index, index)
        else:
            local_step = _chunk_step(per_draw, n_local, chunk_size)
            args = (out_specs, specs, index)
        step = _per_shard(local_step, problem, n_mapped=2)
        jitted = jax.jit(step, donate_argnums=0)
        if problem.device.platform == "cpu" and problem.output_bytes < HOST_ZEROS_MAX_BYTES:
            make_outputs, host_init = None, _host_zeros(out_specs, sharding)
        else:
            host_init = None
            make_outputs = jax.jit(
                lambda: [jnp.zeros(s.shape, s.dtype) for s in out_specs],
                out_shardings=[sharding] * len(out_specs),
            ).lower()
    else:
        host_init = None
        flat = strategy == "vmap" and flattens_vmap(problem)
        whole_chains = problem.placement.spec[1] is None
        strategy_fn = flat_vmap if flat else STRATEGY_TABLE[strategy]
        n_shards = problem.n_shards
        callback = None
        if progress:
            callback = on_chunk if n_shards == 1 else _scaled_progress(n_shards)

        def run(*samples):
            return strategy_fn(per_draw, list(samples), chunk_size, callback)

        args = tuple(specs)
        if strategy == "vmap" and problem.n_shards > 1 and (not flat or whole_chains):
            # No loop and no draw sees another: XLA's partitioner keeps the draws' split on
            # its own (the outputs are pinned to it), and compiles this faster than shard_map
            # does (docs/strategies.md). Flattened chains x draws stay in contiguous blocks
            # only when each device holds whole chains.
            jitted = jax.jit(run, donate_argnums=donate, out_shardings=sharding)
        else:
            jitted = jax.jit(_per_shard(run, problem, n_mapped=len(specs)), donate_argnums=donate)
        make_outputs = None
    # Compiled for another device of this kind: moved here, neither lowered nor compiled
    # again, and not stored.
    kind_key = _device_kind_key(key)
    n_programs = 1 if make_outputs is None else 2
    moved = None
    tic = time.perf_counter()
    if kind_key is not None:
        moved = _relocated(_BY_DEVICE_KIND.get(jax_fn, kind_key), problem.device, n_programs)
    relocate_seconds = time.perf_counter() - tic
    tic = time.perf_counter()
    lowered: Any = None
    if moved is None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            lowered = jitted.lower(*args)
    toc = time.perf_counter()
    mesh = problem.placement.mesh
    devices = [problem.device] if mesh is None else list(mesh.devices.flat)
    lowereds = [lowered, make_outputs][:n_programs]
    slots: list[Any] = [None] * n_programs
    if stored and moved is None:
        # Named from the plan (the program is digested only on a hit, or after the run):
        # everything the in-memory key holds, the problem by what decides its program.
        plan_text = [
            problem.fingerprint,
            ";".join(f"{s.shape}{s.dtype}" for s in problem.in_specs),
            str(problem.placement.spec),
            repr(problem.placement.sharding),  # the devices, their mesh and memory kind
            "|".join(map(str, key[1:])),
        ]
        slots = [
            _executable_store.slot_for([*plan_text, role], devices, problem.shared_bytes)
            for role in ("step", "zeros")[: len(lowereds)]
        ]
    loads = [None if k is None else _executable_store.load(k, x) for k, x in zip(slots, lowereds)]
    found = [None if x is None else x[0] for x in loads]
    ready = moved or found
    compiled, init = ready[0], (ready[1] if make_outputs is not None else host_init)
    if compiled is None and any(k is not None for k in slots):
        _executable_store.start_worker()  # behind the compile, which releases the GIL
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # XLA compiles without the GIL: a compiled fill compiles on the side, hidden behind
        # the main compile.
        pending = (
            None if make_outputs is None or init is not None else pool.submit(make_outputs.compile)
        )
        if compiled is None:
            options = {} if library_fusions else NO_LIBRARY_FUSIONS
            compiled = lowered.compile(compiler_options=options)
        if pending is not None:
            init = pending.result()
    # What is stored or moved later: the step as compiled, or, where it could no longer be
    # serialized once it has run, its bytes taken now (`must_serialize_before_run`).
    step_code = compiled
    movable = kind_key is not None and _BY_DEVICE_KIND.get(jax_fn, kind_key) is None
    if (
        moved is None
        and found[0] is None
        and (slots[0] is not None or (movable and not _executable_store.loading_stopped()))
        and must_serialize_before_run(problem)
    ):
        step_code = _executable_store.portable(compiled) or compiled
    codes = (step_code, init)
    to_store = [
        (k, x, c)
        for k, x, c, f in zip(slots, lowereds, codes, found)
        if k is not None and f is None
    ]
    compile_seconds = time.perf_counter() - toc + relocate_seconds
    _after_compile(problem, output_memory)
    memory = compiled.memory_analysis()
    result = Executable(
        strategy=strategy,
        loop=loop,
        chunk_size=chunk_size,
        compiled=compiled,
        donated=donate,
        progress=progress,
        segments=segments,
        trace_seconds=toc - tic,
        compile_seconds=compile_seconds,
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", problem.output_bytes)),
        alias_bytes=int(getattr(memory, "alias_size_in_bytes", 0)),
        problem=problem,
        init=init,
        origin=_origin(moved, found),
        library_fusions=library_fusions,
        to_store=to_store,
    )
    _EXECUTABLES.put(jax_fn, key, result)
    if movable and moved is None:
        # What XLA compiled (or its bytes, taken before it ran), or the bytes that were
        # loaded: never an executable that was loaded or moved itself
        # (`_executable_store.Portable`).
        programs = [c if x is None else x[1] for c, x in zip(codes, loads)]
        _BY_DEVICE_KIND.put(jax_fn, kind_key, programs[:n_programs])
    return result


def must_serialize_before_run(problem: Problem) -> bool:
    """Whether `problem`'s compiled step must be serialized (for the on-disk store, or to be
    moved to another device) before it first runs: on a CPU, a program that applies any of
    `_executable_store.UNSERIALIZABLE_AFTER_RUN`."""
    return (
        problem.device.platform == "cpu"
        and problem.jaxpr is not None
        and uses_primitives(problem.jaxpr.jaxpr, _executable_store.UNSERIALIZABLE_AFTER_RUN)
    )


def _hlo_text(exe: Executable) -> str:
    """The compiled program's HLO text; empty where it cannot be read back."""
    try:
        return exe.compiled.as_text() or ""
    except Exception:  # loaded or moved programs may not keep their text
        return ""


def has_library_fusions(exe: Executable) -> bool:
    """Whether XLA handed any of `exe`'s fusions to a kernel library (`LIBRARY_FUSION_MARK`)."""
    return LIBRARY_FUSION_MARK in _hlo_text(exe)


_SHAPE = re.compile(r"%([\w.-]+) = \w+\[([\d,]*)\]")
_PARAM = re.compile(r"([\w.-]+): \w+\[([\d,]*)\]")
_REDUCE = re.compile(r"reduce\(%([\w.-]+),.*?dimensions=\{([\d,]*)\}")


def library_reductions(exe: Executable) -> list[int]:
    """The elements summed into each result of every reduction that XLA handed to a kernel
    library in `exe` (read from the compiled HLO: the reduced dimensions of the reduction's
    operand, inside each computation a `LIBRARY_FUSION_MARK` fusion calls)."""
    text = _hlo_text(exe)
    called = set(re.findall(r"calls=%([\w.-]+)[^\n]*" + LIBRARY_FUSION_MARK, text))
    extents = []
    for block in text.split("\n\n"):
        head = block.lstrip().split(" ", 1)[0]
        if not head.startswith("%") or head[1:] not in called:
            continue
        dims = {name: shape for name, shape in _PARAM.findall(block.split("\n", 1)[0])}
        dims.update(_SHAPE.findall(block))
        for operand, reduced in _REDUCE.findall(block):
            shape = [int(d) for d in dims.get(operand, "").split(",") if d]
            axes = [int(a) for a in reduced.split(",") if a]
            if shape and all(a < len(shape) for a in axes):
                extents.append(math.prod(shape[a] for a in axes))
    return extents


def _origin(moved: Any, found: Sequence[Any]) -> Origin:
    """Not `COMPILED` if any of the programs (a step, a compiled fill) was moved or loaded."""
    if moved is not None:
        return Origin.MOVED
    return Origin.COMPILED if all(f is None for f in found) else Origin.LOADED


def _device_kind_key(key: tuple) -> tuple | None:
    """`compile_executable`'s cache key with a one-device problem's device replaced by its
    platform and kind; None where nothing is kept to move: draws over several devices, no
    other local device of this kind, or constants over `MAX_CONSTANT_BYTES` (what the
    on-disk store refuses to keep a copy of, the same holds here)."""
    problem = key[0]
    placement = problem.placement
    device = placement.device
    if placement.mesh is not None or problem.shared_bytes > _executable_store.MAX_CONSTANT_BYTES:
        return None
    if not any(
        d != device and d.device_kind == device.device_kind
        for d in jax.local_devices(backend=device.platform)
    ):
        return None
    neutral = dataclasses.replace(problem, placement=dataclasses.replace(placement, device=None))
    return (neutral, device.platform, device.device_kind, *key[1:])


def _relocated(programs: list | None, device: jax.Device, n_programs: int) -> list | None:
    """`programs` (a step, and its compiled fill if any: each compiled by XLA, or a
    `Portable`), compiled for another device of `device`'s kind, moved onto it
    (`_executable_store.relocate`); None if there are none or one cannot be moved. A
    failure empties `programs`, so that nothing is tried again.

    Invariant: the program depends on the device only through its assignment. The key of
    `_BY_DEVICE_KIND` holds what `_EXECUTABLES`'s does (the function, the problem, the
    plan) less the device, so it names one program as that key does. The shards of a
    shard-by-shard run (`_planner.serial_shards`) thus compile once in all.
    """
    if programs is None or len(programs) != n_programs:
        return None
    moved = []
    for i, program in enumerate(programs):
        if not isinstance(program, _executable_store.Portable):
            program = programs[i] = _executable_store.portable(program)  # serialized once
        copy = None if program is None else _executable_store.relocate(program, device)
        if copy is None:
            programs.clear()
            return None
        moved.append(copy)
    return moved


def _host_zeros(out_specs: Sequence[jax.ShapeDtypeStruct], sharding) -> Callable[[], list]:
    """Zero outputs for a host-driven run on a CPU, placed from a broadcast numpy zero.

    For outputs under `HOST_ZEROS_MAX_BYTES`: nothing compiles (a compiled fill costs XLA's
    fixed 50-75 ms on 2 cores), while the copy costs more per byte than the compiled fill
    (docs/strategies.md). The placed buffers are XLA's own, so the chunk step may take them
    by donation.
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


def persist(exe: Executable) -> None:
    """Hand what `exe` compiled (and was asked to store) to the on-disk store, in the
    background; a no-op for an executable loaded from it or compiled without `stored`."""
    while exe.to_store:
        _executable_store.save_later(*exe.to_store.pop())


def release(exe: Executable | None) -> None:
    """Forget what `exe` would store (a candidate that will not run): its lowered module goes."""
    if exe is not None:
        exe.to_store.clear()


def distrust_foreign() -> None:
    """An executable that this process did not compile (loaded or moved) failed to run: the
    others held in memory go, and from now on every executable is compiled here."""
    _executable_store.stop_loading()
    _EXECUTABLES.discard(lambda exe: exe.origin is not Origin.COMPILED)
    _BY_DEVICE_KIND.clear()  # nothing is moved any more


def _after_compile(problem: Problem, output_memory: str) -> None:
    """Invariant: outputs of `TRIM_MIN_BYTES` or more that land in host memory are written
    after the compiler's freed heap has gone back to the OS (`release_freed_heap`)."""
    host = output_memory == "host" or problem.device.platform == "cpu"
    if host and problem.output_bytes >= TRIM_MIN_BYTES:
        release_freed_heap()


def _scaled_progress(n_shards: int) -> Callable:
    """Per-shard progress callbacks, counted for all shards (they advance together)."""

    def callback(items_done, n_items):
        on_chunk(np.asarray(items_done) * n_shards, n_items * n_shards)

    return callback


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


P0 = PartitionSpec()


def _flat(xs, n: int):
    return [x.reshape((n,) + x.shape[2:]) for x in xs]  # free: a bitcast


def _chunk_step(per_draw: Callable, n: int, size: int) -> Callable:
    """One chunk of `size` draws at item `start` (clamped so it fits): evaluate it and write it
    into the donated outputs, in place. Straight-line code: it compiles like the loop-free
    vmap, where XLA's loops over many buffers compile for minutes (docs/strategies.md)."""

    def step(outs, samples, start):
        flat, flat_outs = _flat(samples, n), _flat(outs, n)
        start = jnp.minimum(start, n - size)
        ys = vmap_draws(per_draw, 1)(*[read_slice(x, start, size, 0) for x in flat])
        flat_outs = [write_slice(o, y, start, 0) for o, y in zip(flat_outs, ys)]
        return [o.reshape(old.shape) for o, old in zip(flat_outs, outs)]

    return step


def _segment_step(per_draw: Callable, n: int, size: int) -> Callable:
    """`count` chunks of the "chunked" XLA loop from item `start` on (each start clamped so
    the chunk fits: the last overlaps the one before), written into the donated outputs.
    Segments of different chunk sizes tile the draws one after the other."""

    def chunk(flat, outs, start):
        ys = vmap_draws(per_draw, 1)(*[read_slice(x, start, size, 0) for x in flat])
        return [write_slice(o, y, start, 0) for o, y in zip(outs, ys)]

    def step(outs, samples, start, count):
        flat = _flat(samples, n)

        def body(i, outs):
            return chunk(flat, outs, jnp.minimum(start + i * size, n - size))

        flat_outs = lax.fori_loop(0, count, body, _flat(outs, n))
        return [o.reshape(old.shape) for o, old in zip(flat_outs, outs)]

    return step


def execute(
    exe: Executable,
    samples: Sequence[jax.Array],
    tuner: Any = None,
) -> list[Any]:
    """Run a compiled plan. Donated buffers that XLA cannot reuse are not worth a warning.

    `tuner`, for `Loop.HOST` only, is the planner's online tuner (see `_planner.Tuner`): the
    run asks it which compiled step to use for each next chunk and tells it how long each
    took, so that the first chunks of the real work measure the candidate sizes.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        if exe.output_memory == "host":
            return _run_to_host(exe, samples)
        if exe.segments:
            return _run_segments(exe, samples, tuner)
        if exe.loop is Loop.HOST:
            return _run_chunks(exe, samples, tuner)
        return list(exe.compiled(*samples))


def _run_to_host(exe: Executable, samples: Sequence[jax.Array]) -> list[np.ndarray]:
    """Stream every device's chunks into one set of host arrays.

    Draws split on the chain axis stream shard by shard, each into its own chains of the
    outputs (a contiguous block: no copy); one device streams everything.
    """
    problem = exe.problem
    out_specs = [problem.out_specs[j] for j in problem.computed]
    outputs = [np.empty(s.shape, s.dtype) for s in out_specs]
    size, n_local = int(exe.chunk_size or problem.n_local), problem.n_local
    chains, draws = problem.local_shape
    local_specs = [
        jax.ShapeDtypeStruct((chains, draws) + tuple(s.shape[2:]), s.dtype) for s in out_specs
    ]
    done = 0

    def progress(items, n):
        on_chunk(done + items, problem.n_items)

    for device, compiled in exe.compiled.items():
        if problem.n_shards == 1:
            local, where = list(samples), (slice(None),)
        else:
            shards = [next(s for s in x.addressable_shards if s.device == device) for x in samples]
            local, where = [s.data for s in shards], shards[0].index[:1]
        views = [o[where] for o in outputs]  # a block of whole chains: C-contiguous
        stream_to_host(
            compiled,
            local,
            n_local,
            size,
            local_specs,
            progress if exe.progress else None,
            out=views,
        )
        done += n_local
    return outputs


def _run_chunks(exe: Executable, samples: Sequence[jax.Array], tuner: Any) -> list[jax.Array]:
    """Call a chunk step over every draw, from the host; progress after each chunk.

    The samples are read by every call, so no step takes them: the caller deletes donated
    draws once the whole run has succeeded, and an error on the way leaves them intact.
    With a tuner, each chunk's step (and so its size) is the tuner's choice, and the chunk
    is timed; chunks of any sizes tile the draws, the last one overlapping the one before.
    """
    problem = exe.problem
    n, n_shards = problem.n_local, problem.n_shards
    outs = list(exe.init())
    samples = list(samples)
    start = 0
    while start < n:
        step = exe if tuner is None else tuner.next_step(start)
        size = int(step.chunk_size or n)
        tic = time.perf_counter()
        outs = step.compiled(outs, samples, np.int32(start))
        if tuner is not None and tuner.timing:
            jax.block_until_ready(outs)
            tuner.record(step, time.perf_counter() - tic, size)
        start += size
        if exe.progress:  # report work done, not work dispatched
            jax.block_until_ready(outs)
            on_chunk(min(start, n) * n_shards, n * n_shards)
    return outs


def _run_segments(exe: Executable, samples: Sequence[jax.Array], tuner: Any) -> list[Any]:
    """Run an XLA loop in host-dispatched segments.

    While anything is timed (a progress bar, or a tuner still measuring), the first segment
    is small and later ones run about `SEGMENT_SECONDS` each (`tuner.segment_seconds` while
    tuning), so a short run takes a few calls and a long one redraws the bar often enough;
    once nothing is timed, the rest goes in one call. With a tuner, each segment's step (and
    so its chunk size) is the tuner's choice.
    """
    problem = exe.problem
    n, n_shards = problem.n_local, problem.n_shards
    outs = list(exe.init())
    samples = list(samples)
    start = 0
    per_call = max(1, int(n * FIRST_SEGMENT_FRACTION))  # draws per segment
    while start < n:
        step = exe if tuner is None else tuner.next_step(start)
        size = int(step.chunk_size or n)
        tuning = tuner is not None and tuner.timing
        timed = exe.progress or tuning
        count = -(-(n - start) // size) if not timed else -(-min(per_call, n - start) // size)
        tic = time.perf_counter()
        outs = step.compiled(outs, samples, np.int32(start), np.int32(count))
        start += count * size
        if not timed:
            continue
        jax.block_until_ready(outs)  # report work done, not work dispatched
        elapsed = max(time.perf_counter() - tic, 1e-9)
        if tuning:
            tuner.record(step, elapsed, count * size)
        if exe.progress:
            on_chunk(min(start, n) * n_shards, n * n_shards)
        seconds = tuner.segment_seconds if tuning else SEGMENT_SECONDS
        per_call = max(1, int(count * size / elapsed * seconds))
    return outs
