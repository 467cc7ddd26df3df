"""The mechanism: obtain the executable of what the planner chose, run it, report what it cost.

`obtain` is the one place where a program (`_program`) is lowered, compiled, loaded or moved,
for every strategy and loop kind. `execute` runs an `Executable` through its one protocol,
`run(outputs, samples, start, count) -> outputs`, in one loop that asks the planner's tuner
for each next step where there is one. It decides nothing: the loop, the chunk size and the
donation come from the planner.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import make_single_device_sharding

from ..._support.cache import FunctionCache, LruCache
from ..._support.compat import PREFER_VECTOR_WIDTH, constants_in_program, unserializable_after_run
from ..._support.config import current
from ..._support.memory import release_freed_heap
from ..._support.progress import on_chunk
from ..data.problem import Problem, is_out_of_memory, uses_primitives
from ..data.types import Loop, Origin
from . import executable_store as _executable_store
from .host_output import aligned_empty, stream_to_host
from .program import Call, Program, Request, const_sharding, program_for

__all__ = [
    "CompileOutOfMemory",
    "Executable",
    "distrust_foreign",
    "execute",
    "hlo_text",
    "obtain",
    "persist",
    "release",
]


class CompileOutOfMemory(Exception):
    """XLA ran out of device memory while compiling (on a GPU, its autotuner runs candidate
    kernels on buffers of the real sizes): the planner's out-of-memory policy retries it as
    it does a run that ran out (`_planner.retries`)."""

    def __init__(self, strategy: str):
        super().__init__(f"RESOURCE_EXHAUSTED: compiling {strategy!r} ran out of memory")
        self.strategy = strategy


@dataclasses.dataclass(frozen=True)
class Executable:
    """A compiled program for one problem, with what it cost and what it will use.

    Attributes:
        problem: what it was compiled for.
        request: what the planner asked for (strategy, loop, chunk size, ...).
        call: how `compiled` is called; `run` adapts it to the one protocol.
        compiled: the `jax.stages.Compiled` step (for `Call.TO_HOST`, one per device).
        init: `() -> outputs` that `run` starts from: zeros that a host-driven step updates
            in place (compiled, or placed from the host), numpy arrays for outputs in host
            memory, or nothing.
        origin: where `compiled` came from.
        trace_seconds: time to trace and lower.
        compile_seconds: time for XLA to compile, or to load or move what was compiled before.
        temp_bytes: XLA's temporaries per device (`memory_analysis()`).
        output_bytes: XLA's output buffers per device.
        alias_bytes: output bytes written into donated inputs.
        to_store: what `persist` hands to the on-disk store, (slot, lowered, compiled) each,
            the compiled step as a `_executable_store.Portable` where it was serialized
            before running (`must_serialize_before_run`); emptied once handed over, or by
            `release` for a candidate the planner rejects.
        consts: the problem's constants (the model's data) placed where the step runs, its
            last argument at every call (`_program`); for `Call.TO_HOST`, `(device,
            constants)` for each device's step. An executable is bound to one call's data
            by `_bound`, and `_BY_PROGRAM` keeps it without them.
    """

    problem: Problem
    request: Request
    call: Call
    compiled: Any
    init: Callable[[], list]
    origin: Origin
    trace_seconds: float
    compile_seconds: float
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    to_store: list[tuple[Any, Any, Any]] = dataclasses.field(default_factory=list, compare=False)
    consts: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def strategy(self) -> str:
        return self.request.strategy

    @property
    def loop(self) -> Loop:
        return Loop.HOST if self.call is Call.TO_HOST else self.request.loop

    @property
    def chunk_size(self) -> int | None:
        return self.request.chunk_size

    @property
    def donated(self) -> tuple[int, ...]:
        return self.request.donate

    @property
    def progress(self) -> bool:
        return self.request.progress

    @property
    def segments(self) -> bool:
        return self.call is Call.SEGMENT

    @property
    def output_memory(self) -> str:
        return self.request.output_memory

    @property
    def library_fusions(self) -> bool:
        return self.request.library_fusions

    @property
    def host_driven(self) -> bool:
        """The host calls the step chunk by chunk (or segment by segment)."""
        return self.call in (Call.CHUNK, Call.SEGMENT)

    @property
    def peak_bytes(self) -> int:
        """New memory per device at the peak: outputs and temporaries, less aliased inputs."""
        if self.call is Call.TO_HOST:  # per lane, two chunks' outputs and one's temporaries
            return self.request.lanes * (2 * self.output_bytes + self.temp_bytes)
        if self.host_driven:  # the step updates the outputs in place
            return self.problem.output_bytes // self.problem.n_shards + self.temp_bytes
        return self.output_bytes + self.temp_bytes - self.alias_bytes

    def run(self, outputs: list, samples: list, start: int, count: int) -> list:
        """The one protocol: compute `count` chunks from item `start` on into `outputs` (from
        `init`), and return the outputs. A `WHOLE` step computes every draw, a `CHUNK` step
        one chunk, a `TO_HOST` step streams every chunk."""
        consts = list(self.consts)
        if self.call is Call.WHOLE:
            return list(self.compiled(*samples, consts))
        if self.call is Call.CHUNK:
            return self.compiled(outputs, samples, np.int32(start), consts)
        if self.call is Call.SEGMENT:
            return self.compiled(outputs, samples, np.int32(start), np.int32(count), consts)
        return _stream_to_host(self, outputs, samples)

    def chunks_in_call(self, left: int, per_call: int | None) -> int:
        """Chunks the next call computes of the `left` items: one for a `CHUNK` step, those
        in about `per_call` items for a timed segment, else all."""
        size = int(self.chunk_size or self.problem.n_local)
        if self.call is Call.CHUNK:
            return 1
        if self.call is Call.SEGMENT and per_call is not None:
            return -(-min(per_call, left) // size)
        return -(-left // size)


_EXECUTABLES = FunctionCache(per_function=16)
#: The same executables, keyed by device kind instead of device (`_relocated`).
_BY_DEVICE_KIND = FunctionCache(per_function=16)
#: The same executables keyed by their program (`_program_key`), for every function whose
#: per-draw jaxpr is the same: another model object, or new data of the same shapes. They
#: hold no data (`_program`'s invariant) and no jaxpr (`_unbound`).
_BY_PROGRAM = LruCache(size=32)
#: The functions' constants placed where their steps run, by function and sharding.
_PLACED = FunctionCache(per_function=16)


def obtain(
    jax_fn: Callable, problem: Problem, request: Request, *, stored: bool = False
) -> Executable:
    """The executable of `request` for `problem`; nothing runs.

    In order: this process's cache (keyed weakly on `jax_fn`); a copy compiled for another
    device of its kind, moved here; with `stored`, the on-disk store (where `persist` left
    it); else XLA compiles it. A step that cannot be serialized once it has run is serialized
    right after it is compiled (`must_serialize_before_run`).

    Raises:
        CompileOutOfMemory: XLA ran out of device memory while compiling.
        jax.errors.JaxRuntimeError: any other failure of XLA's, or, with library fusions
            off, an XLA that does not know `NO_LIBRARY_FUSIONS`' option.
        ValueError: library fusions off for anything but an XLA loop on a CPU.
    """
    # The program's text is in the key: one function traced at two precisions (or under
    # another setting that the problem's shapes do not show) is two programs.
    key = (*request.key(problem), problem.program_digest)
    cached = _EXECUTABLES.get(jax_fn, key)
    if cached is not None:
        return cached
    program_key = _program_key(problem, key)
    same_program = None if program_key is None else _BY_PROGRAM.get(program_key)
    if same_program is not None:  # compiled in this process for another function
        same_program = dataclasses.replace(same_program, trace_seconds=0.0, compile_seconds=0.0)
        exe = _bound(same_program, jax_fn, problem)
        _EXECUTABLES.put(jax_fn, key, exe)
        return exe
    program = program_for(jax_fn, problem, request)
    try:
        if program.call is Call.TO_HOST:
            exe = _compile_to_host(program)
        else:
            exe = _obtain_step(jax_fn, program, key, stored)
    except jax.errors.JaxRuntimeError as error:
        if is_out_of_memory(error):
            raise CompileOutOfMemory(request.strategy) from error
        raise
    if program_key is not None:
        _BY_PROGRAM.put(program_key, _unbound(exe))
    exe = _bound(exe, jax_fn, problem)
    _EXECUTABLES.put(jax_fn, key, exe)  # bound to `jax_fn`'s data, which it holds anyway
    return exe


def _program_key(problem: Problem, key: tuple) -> tuple | None:
    """What names a program whatever function it came from: `key` (the problem's shapes and
    placement, the plan, and the per-draw jaxpr's text, its constants by shape and dtype
    only: they are arguments), the problem without its jaxpr. None where the text does not
    say all the program computes (`Problem.shareable`).

    Invariant: two functions whose jaxprs print the same, and are `shareable`, compute the
    same outputs from the same draws and constants."""
    if problem.jaxpr is None or not problem.shareable:
        return None
    return (dataclasses.replace(problem, jaxpr=None), *key[1:])  # no data held


def _unbound(exe: Executable) -> Executable:
    """`exe` as `_BY_PROGRAM` keeps it: no constants, no jaxpr, nothing to store."""
    problem = dataclasses.replace(exe.problem, jaxpr=None)
    return dataclasses.replace(exe, problem=problem, consts=(), to_store=[])


def _bound(exe: Executable, jax_fn: Callable, problem: Problem) -> Executable:
    """`exe` for this call: `problem` (the same shapes and program, this function's jaxpr)
    and its constants placed where the step runs."""
    if exe.call is Call.TO_HOST:  # each device's step reads its own copy
        by_device = tuple(
            (device, placed(jax_fn, problem, make_single_device_sharding(device)))
            for device in exe.compiled
        )
        return dataclasses.replace(exe, problem=problem, consts=by_device)
    consts = placed(jax_fn, problem, const_sharding(problem))
    return dataclasses.replace(exe, problem=problem, consts=consts)


def placed(jax_fn: Callable, problem: Problem, sharding: Any) -> tuple[Any, ...]:
    """`problem.consts` on `sharding` (whole on each of its devices), kept while `jax_fn`
    lives: a call with the same data places nothing again. A CPU may read host arrays in
    place (`may_alias`)."""
    consts = problem.consts
    if not consts:
        return ()
    key = (problem.program_digest, sharding)  # a sharding compares its devices
    found = _PLACED.get(jax_fn, key)
    if found is None:
        found = tuple(_place_whole(c, sharding) for c in consts)
        _PLACED.put(jax_fn, key, found)
    return found


def _place_whole(value: Any, sharding: Any) -> jax.Array:
    """`value` whole on every device of `sharding`: this process's devices only (under
    `jax.distributed`, `device_put` of one host array would first check, by a collective,
    that every process passed the same value)."""
    if len(sharding.device_set) == 1 or jax.process_count() == 1:
        return jax.device_put(value, sharding, may_alias=True)
    host = np.asarray(value)  # (a PRNG key's data would need `jax.random.key_data` here)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _compile_to_host(program: Program) -> Executable:
    """The chunk steps of outputs in host memory, one per device; never stored or moved."""
    problem = program.problem
    tic = time.perf_counter()
    options = program.request.compiler_options()
    with constants_in_program():
        lowered = {device: step.lower(*args) for device, step, args in program.host_steps}
    steps = {device: _compile_step(step, options) for device, step in lowered.items()}
    compile_seconds = time.perf_counter() - tic
    _after_compile(problem, "host")
    out_specs = [problem.out_specs[j] for j in problem.computed]

    # Lanes are a CPU's: its outputs are aligned, to be placed on the device without a copy.
    empty = aligned_empty if program.request.lanes > 1 else np.empty
    # Invariant: `init` holds nothing of the program (whose problem holds the data).
    disk = program.request.output_memory == "disk"

    def init() -> list:
        if disk:  # the run's sink takes the chunks
            return []
        return [empty(s.shape, s.dtype) for s in out_specs]

    memory = next(iter(steps.values())).memory_analysis()
    return Executable(
        problem=problem,
        request=program.request,
        call=program.call,
        compiled=steps,
        init=init,
        origin=Origin.COMPILED,
        trace_seconds=0.0,
        compile_seconds=compile_seconds,
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", 0)),
        alias_bytes=0,
    )


def _obtain_step(jax_fn: Callable, program: Program, key: tuple, stored: bool) -> Executable:
    """A step (and its compiled fill, if any): moved from another device of its kind,
    loaded from the store, or compiled; what it will store is kept on the executable."""
    problem = program.problem
    n_programs = 1 if program.fill is None else 2
    kind_key = _device_kind_key(key)
    tic = time.perf_counter()
    moved = None
    if kind_key is not None:
        moved = _relocated(_BY_DEVICE_KIND.get(jax_fn, kind_key), problem.device, n_programs)
    relocate_seconds = time.perf_counter() - tic
    tic = time.perf_counter()
    lowereds: list[Any] = [None] * n_programs if moved is not None else _lower(program)
    toc = time.perf_counter()
    slots = _slots(program, key, n_programs) if stored and moved is None else [None] * n_programs
    loads = [None if k is None else _executable_store.load(k, x) for k, x in zip(slots, lowereds)]
    found = [None if x is None else x[0] for x in loads]
    compiled, init = _compile(program, lowereds, moved or found, any(k is not None for k in slots))
    # What is stored or moved later: the step as compiled, or, where it could no longer be
    # serialized once it has run, its bytes taken now (`must_serialize_before_run`).
    movable = kind_key is not None and _BY_DEVICE_KIND.get(jax_fn, kind_key) is None
    step_code = compiled
    keep = slots[0] is not None or (movable and not _executable_store.loading_stopped())
    if moved is None and found[0] is None and keep:
        step_code = _serialized_before_run(problem, compiled)
    codes = (step_code, init)
    to_store = [
        (k, x, c)
        for k, x, c, f in zip(slots, lowereds, codes, found)
        if k is not None and f is None
    ]
    compile_seconds = time.perf_counter() - toc + relocate_seconds
    _after_compile(problem, program.request.output_memory)
    memory = compiled.memory_analysis()
    exe = Executable(
        problem=problem,
        request=program.request,
        call=program.call,
        compiled=compiled,
        init=init if init is not None else _no_outputs,
        origin=_origin(moved, found),
        trace_seconds=toc - tic,
        compile_seconds=compile_seconds,
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", problem.output_bytes)),
        alias_bytes=int(getattr(memory, "alias_size_in_bytes", 0)),
        to_store=to_store,
    )
    if movable and moved is None:
        # What XLA compiled (or its bytes, taken before it ran), or the bytes that were
        # loaded: never an executable that was loaded or moved itself
        # (`_executable_store.Portable`).
        programs = [c if x is None else x[1] for c, x in zip(codes, loads)]
        _BY_DEVICE_KIND.put(jax_fn, kind_key, programs[:n_programs])
    return exe


def _no_outputs() -> list:
    return []


def _lower(program: Program) -> list[Any]:
    """The step lowered (and the fill, where it is compiled).

    Invariant: the constants are in the lowered text (`_compat.constants_in_program`), which
    names the program in the on-disk store."""
    with warnings.catch_warnings(), constants_in_program():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = [program.step.lower(*program.args)]
        if program.fill is not None:
            lowered.append(program.fill.lower())
    return lowered


def _slots(program: Program, key: tuple, n_programs: int) -> list[Any]:
    """Where the step (and its compiled fill) are stored: named from the plan (the program is
    digested only on a hit, or after the run), by everything the in-memory key holds, the
    problem by what decides its program."""
    problem = program.problem
    mesh = problem.placement.mesh
    devices = [problem.device] if mesh is None else list(mesh.devices.flat)
    plan_text = [
        problem.fingerprint,
        ";".join(f"{s.shape}{s.dtype}" for s in problem.in_specs),
        str(problem.placement.spec),
        repr(problem.placement.sharding),  # the devices, their mesh and memory kind
        "|".join(map(str, key[1:])),
    ]
    return [
        _executable_store.slot_for([*plan_text, role], devices)
        for role in ("step", "zeros")[:n_programs]
    ]


def _compile(
    program: Program, lowereds: list[Any], ready: list[Any], storing: bool
) -> tuple[Any, Callable[[], list] | None]:
    """The step and its fill: those in `ready` (moved or loaded), the rest compiled. XLA
    compiles without the GIL: a compiled fill compiles on the side, behind the step."""
    compiled = ready[0]
    init = ready[1] if program.fill is not None else program.zeros
    if compiled is None and storing:
        _executable_store.start_worker()  # behind the compile, which releases the GIL
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = None
        if program.fill is not None and init is None:
            pending = pool.submit(lowereds[1].compile)
        if compiled is None:
            compiled = _compile_step(lowereds[0], program.request.compiler_options())
        if pending is not None:
            init = pending.result()
    return compiled, init


def _compile_step(lowered: Any, options: dict[str, Any]) -> Any:
    """`lowered` compiled with `options`; without the preferred vector width where this XLA
    rejects that option (`_compat.PREFER_VECTOR_WIDTH`)."""
    try:
        return lowered.compile(compiler_options=options)
    except Exception as error:
        if PREFER_VECTOR_WIDTH not in options or PREFER_VECTOR_WIDTH not in str(error):
            raise
    options = {k: v for k, v in options.items() if k != PREFER_VECTOR_WIDTH}
    return lowered.compile(compiler_options=options)


def must_serialize_before_run(problem: Problem) -> bool:
    """Whether `problem`'s compiled step must be serialized (for the on-disk store, or to be
    moved to another device) before it first runs: a program that applies any primitive of
    `_compat.unserializable_after_run` on its platform."""
    names = unserializable_after_run(problem.device.platform)
    return bool(names) and problem.jaxpr is not None and uses_primitives(problem.jaxpr.jaxpr, names)


def _serialized_before_run(problem: Problem, compiled: Any) -> Any:
    """`compiled`, or its bytes (a `Portable`) where it could not be serialized once run."""
    if not must_serialize_before_run(problem):
        return compiled
    return _executable_store.portable(compiled) or compiled


def hlo_text(exe: Executable) -> str:
    """The compiled program's HLO text; empty where it cannot be read back."""
    try:
        return exe.compiled.as_text() or ""
    except Exception:  # noqa: BLE001 - loaded or moved programs may not keep their text
        return ""


def _origin(moved: Any, found: Sequence[Any]) -> Origin:
    """Not `COMPILED` if any of the programs (a step, a compiled fill) was moved or loaded."""
    if moved is not None:
        return Origin.MOVED
    return Origin.COMPILED if all(f is None for f in found) else Origin.LOADED


def _device_kind_key(key: tuple) -> tuple | None:
    """`obtain`'s cache key with a one-device problem's device replaced by its platform and
    kind; None where nothing is kept to move: draws over several devices, or no other local
    device of this kind."""
    problem = key[0]
    placement = problem.placement
    device = placement.device
    if placement.mesh is not None:
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
    shard-by-shard run (`_resources.shard_by_shard`) thus compile once in all.
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
    _BY_PROGRAM.discard(lambda exe: exe.origin is not Origin.COMPILED)
    _BY_DEVICE_KIND.clear()  # nothing is moved any more


def _after_compile(problem: Problem, output_memory: str) -> None:
    """Invariant: outputs of `trim_min_bytes` or more that land in host memory are written
    after the compiler's freed heap has gone back to the OS (`release_freed_heap`)."""
    host = output_memory in ("host", "disk") or problem.device.platform == "cpu"
    if host and problem.output_bytes >= current().trim_min_bytes:
        release_freed_heap()


def execute(
    exe: Executable, samples: Sequence[jax.Array], tuner: Any = None, sink: Any = None
) -> list[Any]:
    """Run an executable over every draw. Donated buffers that XLA cannot reuse are not worth
    a warning.

    `tuner`, for a host-driven run only, is the planner's online tuner (`_tuner.Tuner`): the
    run asks it which executable to call next (and so which chunk size) and tells it how long
    each call took, so that the first chunks of the real work measure the candidate sizes.

    One loop serves every kind: while anything is timed (a progress bar, or a tuner still
    measuring), a segment runs a first `first_segment_fraction` of the draws and later ones
    about `segment_seconds` each (the tuner's window while tuning); once nothing is timed, the
    rest goes in one call. The samples are read by every call, so no host-driven step takes
    them: the caller deletes donated draws once the whole run has succeeded.

    `sink`, for a `TO_HOST` step only, is where the chunks go instead of host arrays
    (outputs on disk, `_disk_sink.DiskSink`); the run then returns no outputs.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return _drive(exe, list(samples), tuner, sink)


def _drive(exe: Executable, samples: list, tuner: Any, sink: Any = None) -> list[Any]:
    config, problem = current(), exe.problem
    n, n_shards = problem.n_local, problem.n_shards
    outs = exe.init() if sink is None else sink
    start = 0
    per_call = max(1, int(n * config.first_segment_fraction))  # draws per timed call
    while start < n:
        step = exe if tuner is None else tuner.next_step(start)
        size = int(step.chunk_size or n)
        tuning = tuner is not None and tuner.timing
        timed = exe.host_driven and (exe.progress or tuning)
        count = step.chunks_in_call(n - start, per_call if timed else None)
        tic = time.perf_counter()
        outs = step.run(outs, samples, start, count)
        start += count * size
        if not timed:
            continue
        jax.block_until_ready(outs if sink is None else [])  # work done, not dispatched
        elapsed = max(time.perf_counter() - tic, 1e-9)
        if tuning:
            tuner.record(step, elapsed, count * size)
        if exe.progress:
            on_chunk(min(start, n) * n_shards, n * n_shards)
        seconds = tuner.segment_seconds if tuning else config.segment_seconds
        per_call = max(1, int(count * size / elapsed * seconds))
    return [] if sink is not None else list(outs)


def _stream_to_host(exe: Executable, outputs: Any, samples: list) -> Any:
    """Stream every device's chunks into the host arrays `outputs`, or into a sink
    (`_host_output.ChunkSink`) that `execute` was given in their place.

    Draws split on the chain axis stream shard by shard, each into its own chains of the
    outputs (a contiguous block: no copy); one device streams everything.
    """
    sink = None if isinstance(outputs, list) else outputs
    problem = exe.problem
    out_specs = [problem.out_specs[j] for j in problem.computed]
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
        views = [] if sink is not None else [o[where] for o in outputs]  # whole chains
        on_progress = progress if exe.progress else None
        consts = list(dict(exe.consts).get(device, ()))
        stream_to_host(
            functools.partial(_with_consts, compiled, consts),
            local,
            n_local,
            size,
            local_specs,
            on_progress,
            out=None if sink is not None else views,
            lanes=exe.request.lanes,
            sink=None if sink is None else sink.for_chains(where[0]),
        )
        done += n_local
    return outputs


def _with_consts(compiled: Any, consts: list, samples: list, start: Any) -> list:
    return compiled(samples, start, consts)
