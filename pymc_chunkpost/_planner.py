"""`auto` and the one retry policy (out of memory; an executable not compiled here that failed to
run): policy only.

The planner decides, from evidence, what to run; `_executor` runs it. Every decision about a
call lives here: the budget, the devices, the loop kind, the chunk size, and what to try
after running out of memory. Numbers behind the constants are in docs/strategies.md.

Evidence, in the order it is used:

1. The tuning cache: the plan that a previous run of the same function and shapes measured
   best (`_tuning`). A hit skips the search; it is still checked against today's budget.
   The executable that ran is stored beside it (`finished`), and a hit on the same program
   and data loads it instead of compiling (`_executable_store`).
2. XLA's compiled analysis. The loop-free `vmap` is compiled first when the jaxpr's bound on
   its temporaries leaves any chance that it fits; its `memory_analysis()` gives the real
   temporaries per draw, after fusion. It runs when those stay under `VMAP_TEMP_BYTES` and
   its peak under `COMFORT_FRACTION` of the budget: then nothing beats it, as it compiles
   fastest and runs one wide computation. Otherwise the chunk is sized from the compiled
   temporaries per draw (a working set near `TARGET_CHUNK_BYTES` on a CPU; half the room
   left on an accelerator), and checked against the budget by its own compiled peak.
3. Measured time on the real draws. A chunked `auto` run is driven from the host, and a run
   that has more than `TUNE_MIN_SECONDS` of work left after its first chunks tries larger
   and smaller chunks on the next ones (each writes its real outputs, nothing is computed
   twice), then goes on with the fastest. Before that, a CPU run with more than
   `LIBRARY_TRY_COMPILES` compiles' worth of work left, whose loop XLA gave a short
   reduction to a kernel library (`LIBRARY_SHORT_REDUCTION`), times the same chunk
   compiled without library fusions and keeps the faster.
   The result goes to the tuning cache.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from . import _tuning
from ._chunked import resolve_chunk_size
from ._executor import (
    Executable,
    Loop,
    Origin,
    compile_executable,
    distrust_foreign,
    library_reductions,
    persist,
    release,
)
from ._host_output import host_memory_kind
from ._memory import free_bytes, host_free_bytes
from ._problem import Placement, Problem, cpu_cores, is_out_of_memory, uses_primitives

__all__ = [
    "Attempt",
    "Plan",
    "first_attempt",
    "next_attempt",
    "retries",
    "resolve_budget",
    "serial_shards",
    "spread",
    "TARGET_CHUNK_BYTES",
]

#: The loop-free `vmap` runs when its compiled temporaries stay under this (on a CPU, those
#: of all its devices together: they share one memory): below it, a loop's extra compiles
#: and per-chunk costs outweigh what the temporaries cost in memory traffic; far above it,
#: they go to DRAM and cost more than any loop (docs/strategies.md).
VMAP_TEMP_BYTES = 256 * 2**20
#: ...and when its compiled peak is at most this fraction of the budget, leaving room for
#: whatever else the process allocates meanwhile.
COMFORT_FRACTION = 0.5
#: The vmap candidate is compiled only when the jaxpr's bound on its temporaries is at most
#: `VMAP_BOUND_SLACK` x `VMAP_TEMP_BYTES` (XLA fuses gathers and transposes the bound counts),
#: and, above `VMAP_TEMP_BYTES`, at most this many times the outputs: temporaries that large
#: beside small outputs are reduced into them, which keeps them in memory (big_data's
#: compiled 1.2 GiB against a bound of 0.6 GiB), while fusion writes temporaries no larger
#: than the outputs straight into them (wide, big_det: none compiled).
VMAP_BOUND_SLACK = 4
VMAP_BOUND_PER_OUTPUT = 4
#: Per-chunk cost of a loop, per buffer it slices or updates, in bytes of work that take as
#: long (docs/strategies.md).
OVERHEAD_BYTES_PER_BUFFER = 64 * 2**10
#: A host-driven loop runs at most this many chunks on a model with many buffers (each call
#: costs a dispatch that grows with the buffers).
HOST_LOOP_MANY_BUFFERS = 48
HOST_LOOP_MAX_CHUNKS = 64
#: A compiled chunk whose temporaries exceed this many times the expected is a "jump" (XLA
#: changed its layout or fusion at that size): the planner tries a smaller chunk.
JUMP_FACTOR = 4
#: The online tuner tries other chunk sizes only when at least this much work is left after
#: the first chunks: below it, the compiles cannot pay for themselves.
TUNE_MIN_SECONDS = 3.0
#: Each candidate size is timed over at least this many chunks and this many seconds (after
#: one untimed warm-up chunk of each): shorter windows are lost in the noise of a busy machine.
TUNE_CHUNKS = 2
TUNE_WINDOW_SECONDS = 0.05
#: A tuned run that took less than this fraction of `TUNE_MIN_SECONDS` in all was projected
#: long from first chunks that ran far slower than the rest (the machine stalled): what it
#: measured is not kept, and the tuning cache gets the rule's size.
TUNE_TRUST_FRACTION = 0.5
#: The online tuner tries the chunk compiled without XLA's library fusions (`_executor.
#: NO_LIBRARY_FUSIONS`) where one of them reduces at most `LIBRARY_SHORT_REDUCTION` elements
#: into each result: a reduction shorter than two AVX-512 vectors of float64 gains nothing
#: from a vectorised kernel, and the library writes out its operand, which XLA's own loop
#: fusion never materialises (9x per draw on a row-indexed model: docs/strategies.md).
LIBRARY_SHORT_REDUCTION = 16
#: ...and where the work left after the first chunks would take at least this many times the
#: first compile: the trial costs a compile on a second thread and two short timed windows.
LIBRARY_TRY_COMPILES = 2
#: The chunk without library fusions replaces the library's when it runs at least this many
#: times faster: the two are timed a few chunks apart, and a stall of the machine while the
#: first was timed would favour the second (the gains measured are 8-14x).
LIBRARY_MIN_GAIN = 1.25
#: Spread single-device draws over local accelerators only when the outputs and temporaries
#: of the whole run come to at least this much work.
SPREAD_MIN_BYTES = 64 * 2**20
#: Platforms whose single-device draws `auto` spreads over the other local devices. Not the
#: CPU: XLA already runs one device's work on every core, and splitting it over host
#: devices measured slower on the zoo (docs/strategies.md).
SPREAD_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")


def cache_bytes() -> int:
    """The CPU's L2 cache size per core, from sysfs (2 MiB where it cannot be read)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        scale = {"K": 2**10, "M": 2**20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return 2 * 2**20


#: One chunk's working set that the planner aims for on a CPU: twice the L2 cache of a core,
#: and at least 8 MiB (smaller chunks lose to XLA's per-kernel dispatch on every chunk, larger
#: ones to cache misses: the sweep over 8 models in docs/strategies.md).
TARGET_CHUNK_BYTES = max(2 * cache_bytes(), 8 * 2**20)
#: The rule's size goes down to a divisor of the draws that lies within this fraction below
#: it, rather than up past the target (`_rule_divisor`).
ROUND_DOWN_WITHIN = 0.25


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ran (or would run), and why.

    Attributes:
        strategy: the strategy name ("vmap" or "chunked", or as forced by the caller).
        chunk_size: draws per chunk (per device) of the flattened chain x draw axis; None
            without chunks.
        n_chunks: chunks per device (the last one may overlap the one before); None without.
        output_bytes: bytes of the outputs that must be allocated, on all devices together
            (pass-through outputs such as untransformed variables reuse the inputs).
        peak_bytes: predicted new memory per device at the peak: XLA's compiled outputs plus
            temporaries, less outputs written into donated inputs.
        budget_bytes: the memory budget per device; None when the device cannot say.
        reason: one readable sentence.
        compile_seconds: XLA compile time of the executable that ran.
        planning_seconds: wall time of planning, all compiles of candidates included.
        loop: how chunks are driven (`Loop.NONE`, `Loop.XLA` or `Loop.HOST`).
        source: where the chunk size came from: "rule" (compiled analysis), "measured" (the
            online tuner), "cache" (the tuning cache), "requested" or "retry".
        n_devices: devices the work ran on, one shard each.
        devices_reason: why those devices.
        output_memory: where the outputs live: "device" or "host".
        tuning_seconds: seconds per draw measured for each chunk size tried, if tuned
            (of the chunks compiled as `library_fusions` says).
        library_fusions: whether XLA's CPU library fusions were on (the default); False
            where the tuner measured the chunk faster without them.
    """

    strategy: str
    chunk_size: int | None
    n_chunks: int | None
    output_bytes: int
    peak_bytes: int
    budget_bytes: int | None
    reason: str
    compile_seconds: float = 0.0
    planning_seconds: float = 0.0
    loop: Loop = Loop.NONE
    source: str = "rule"
    n_devices: int = 1
    devices_reason: str = "one device"
    output_memory: str = "device"
    tuning_seconds: dict[int, float] = dataclasses.field(default_factory=dict)
    library_fusions: bool = True


@dataclasses.dataclass
class Attempt:
    """One try at a call: the plan, its executable, and the tuner that may change its size."""

    plan: Plan
    exe: Executable
    tuner: Tuner | None = None


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _budget_text(budget: int | None) -> str:
    return "no known memory limit" if budget is None else f"the budget of {_mib(budget)}"


def check_budget(problem: Problem, budget: int | None) -> None:
    """Raise `MemoryError` if `budget` cannot even hold the outputs (None: no known limit)."""
    per_device = problem.output_bytes // problem.n_shards
    if budget is not None and per_device > budget:
        raise MemoryError(
            f"Post-processing needs at least {_mib(per_device)} per device for its outputs "
            f"({problem.chains} chains x {problem.draws} draws), but the memory budget is "
            f"{_mib(budget)}. Free memory, raise `memory_budget`, post-process fewer variables "
            "(`var_names`), or thin the draws. Nothing was run; the draws are untouched."
        )


def resolve_budget(problem: Problem, memory_budget: float | None) -> int | None:
    """The budget per device in bytes: `memory_budget`, or the free memory if None.

    On a CPU every device shares one RAM, so it is counted once and split over the shards.
    None when the device cannot say what it has free (an accelerator whose allocator keeps
    no statistics, as with `XLA_PYTHON_CLIENT_ALLOCATOR=platform`): the plan then has no
    limit, and the out-of-memory retry is what keeps the draws safe. A warning says so.
    """
    shards = problem.n_local_shards
    if memory_budget is not None:
        return int(memory_budget) // shards
    placement, cpu = problem.placement, problem.device.platform == "cpu"
    devices = [problem.device] if placement.mesh is None or cpu else placement.local_devices
    frees = [free_bytes(d) for d in devices]
    if any(free is None for free in frees):
        warn(
            f"{problem.device} reports no memory statistics (as with "
            "`XLA_PYTHON_CLIENT_ALLOCATOR=platform`), so its free memory is unknown: planning "
            "without a memory limit, with the out-of-memory retry as the safety net. Pass "
            "`memory_budget` (bytes) to plan under a limit."
        )
        return None
    free = min(f for f in frees if f is not None)
    return free // shards if cpu else free


def _user_stacklevel() -> int:
    """The `stacklevel`, for a `warnings.warn` made by the caller of this function, that
    points at the first frame outside this package and pymc (the user's own call)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("pymc_chunkpost", "pymc.", "pytensor", "contextlib")
    ):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str) -> None:
    """A `RuntimeWarning` pointed at the user's own call."""
    warnings.warn(message, RuntimeWarning, stacklevel=_user_stacklevel())


#: jaxlib releases before this one can deadlock when all the CPU devices of a process run
#: LAPACK kernels at once, in a loop or not (docs/strategies.md, "A deadlock of jaxlib 0.10
#: on few CPU devices"). Python 3.11 gets at most jaxlib 0.10.
LAPACK_DEADLOCK_FIXED_IN = (0, 11)
#: Primitives that run as batched LAPACK kernels on a CPU: Cholesky and LU deadlocked; eigh
#: and SVD take the same route and are included untested.
LAPACK_PRIMITIVES = frozenset({"cholesky", "lu", "eigh", "svd"})


def _jaxlib_version() -> tuple[int, ...]:
    import jaxlib

    parts = []
    for part in str(getattr(jaxlib, "__version__", "0")).split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def serial_shards(problem: Problem) -> str | None:
    """Why the shards of `problem` must run one after another, each as a one-device run, or
    None when they run together.

    Only for the jaxlib deadlock of `LAPACK_DEADLOCK_FIXED_IN`, whatever the strategy: draws
    split over CPU devices, a per-draw function that calls a LAPACK kernel, and fewer than
    twice as many CPU devices in the process as shards (4 of 8 ran). The cost: the shards'
    runs add up instead of overlapping (they compile once in all: `_executor._relocated`).
    """
    if problem.n_local_shards < 2 or problem.device.platform != "cpu":
        return None
    if _jaxlib_version() >= LAPACK_DEADLOCK_FIXED_IN or problem.jaxpr is None:
        return None
    cpu_devices = _cpu_device_count()
    if cpu_devices >= 2 * problem.n_local_shards:
        return None
    if not uses_primitives(problem.jaxpr.jaxpr, LAPACK_PRIMITIVES):
        return None
    import jaxlib

    return (
        f"{problem.n_local_shards} devices, one shard after another: jaxlib "
        f"{jaxlib.__version__} can deadlock when {problem.n_local_shards} of {cpu_devices} CPU "
        "devices run LAPACK kernels at once"
    )


def _cpu_device_count() -> int:
    return len(jax.local_devices(backend="cpu"))


def spread(problem: Problem) -> Problem:
    """The problem on the devices it should run on.

    Draws already split over several devices stay there. Draws on one device of a platform
    in `SPREAD_PLATFORMS` are spread over the local devices of that platform when the run is
    large enough to repay it, along the chain axis (or else the draw axis) when the device
    count divides it: no padded copy. On a CPU (when enabled) it would be one device per core
    at most: pymc forces 100 host devices, which must not become 100 shards on 2 cores.
    """
    placement = problem.placement
    device = placement.device
    if placement.mesh is not None or device.platform not in SPREAD_PLATFORMS:
        return problem
    local = [d for d in jax.local_devices() if d.platform == device.platform]
    count = len(local) if device.platform != "cpu" else min(cpu_cores(), len(local))
    work = problem.output_bytes + problem.n_items * problem.intermediate_bytes
    if count < 2 or work < SPREAD_MIN_BYTES:
        return problem
    for axis, length in ((0, problem.chains), (1, problem.draws)):
        for d in range(count, 1, -1):
            if length % d == 0:
                devices = [device] + [x for x in local if x != device][: d - 1]
                mesh = Mesh(np.array(devices), ("spread",))
                spec = ("spread", None) if axis == 0 else (None, "spread")
                reason = (
                    f"spread over {d} {device.platform} devices on the "
                    f"{'chain' if axis == 0 else 'draw'} axis: {_mib(work)} of work"
                )
                return problem.with_placement(Placement(device, mesh, spec, reason))
    return problem


def output_memory_for(problem: Problem, request: str, budget: int | None) -> tuple[str, str]:
    """Where the outputs go, "device" or "host", and why: the one place this is decided.

    "auto" keeps them on the device when they fit its budget with room for one draw's work;
    otherwise, on an accelerator with a host memory kind, they land in host memory chunk by
    chunk. It never chooses "host" on a CPU, where both are the same RAM.

    Raises:
        ValueError: "host" asked of draws split over several devices, or of an accelerator
            without host memory; nothing has run.
        MemoryError: the outputs fit neither the device budget nor host memory; the message
            says what is needed on each side. Nothing has run.
    """
    per_device = problem.output_bytes // problem.n_shards
    if request == "device":
        return "device", "as requested"
    device = problem.device
    placement = problem.placement
    # Split draws stream shard by shard, each into a block of whole chains of the outputs.
    chain_split = placement.spec[1] is None and problem.n_local_shards == problem.n_shards
    can_stream = (problem.n_shards == 1 or chain_split) and (
        device.platform == "cpu" or host_memory_kind(device) is not None
    )
    if request == "host":
        if not can_stream:
            raise ValueError(
                "`output_memory='host'` streams chunks into host arrays, but "
                + (
                    f"device {device} has no host memory kind"
                    if problem.n_shards == 1 or chain_split
                    else "the draws are split on their draw axis or over several processes"
                )
                + ". Pass `output_memory='device'` (or 'auto'). Nothing was run."
            )
        return "host", "as requested"
    room = per_device + problem.per_item_bytes + problem.intermediate_bytes
    if budget is None or room <= budget:
        return "device", "they fit the device's budget"
    if device.platform == "cpu" or not can_stream:
        return "device", "no host memory to stream to"  # check_budget raises what is short
    host = host_free_bytes()
    if problem.output_bytes > host:
        raise MemoryError(
            f"The outputs need {_mib(problem.output_bytes)}: more than {device} can give "
            f"({_budget_text(budget)}) and more than host memory has free ({_mib(host)}). "
            "Post-process fewer variables (`var_names`), or thin the draws. Nothing was run; "
            "the draws are untouched."
        )
    return "host", (
        f"the outputs ({_mib(problem.output_bytes)}) exceed {_budget_text(budget)} on the "
        f"device; host memory has {_mib(host)} free"
    )


def _host_output_attempt(jax_fn, problem, budget, chunk_size, progress, why_host, tic):
    """Chunks computed on the device and landed in host memory: the device holds the draws,
    two chunks' outputs and one chunk's temporaries (`_host_output`)."""
    limit = math.inf if budget is None else budget
    n = problem.n_local
    per_item = problem.per_item_bytes + problem.intermediate_bytes
    if chunk_size is not None:
        size, why, source = min(chunk_size, n), "as requested", "requested"
    elif problem.device.platform == "cpu":
        size, why = _fast_chunk_size(problem, float(problem.intermediate_bytes), None)
        source = "rule"
    else:  # a quarter of the budget per chunk: two in flight, temporaries, the autotuner
        size = n if budget is None else max(1, min(n, int(budget // 4 // max(per_item, 1))))
        why, source = "a quarter of the device budget per chunk", "rule"
    while True:
        exe = _compile(jax_fn, problem, "chunked", Loop.HOST, size, (), progress, "host")
        if exe is not None and exe.peak_bytes <= limit:
            reason = (
                f"Chunks of {size} draws ({why}), each landed in host memory ({why_host}): "
                f"{_mib(exe.peak_bytes)} on the device, within {_budget_text(budget)}."
            )
            plan = _make_plan(
                problem, budget, exe, "chunked", reason, source, time.perf_counter() - tic
            )
            return Attempt(plan, exe)
        if size == 1:
            raise MemoryError(
                "Even one draw at a time does not fit the device's memory with the outputs "
                "in host memory. Nothing was run; the draws are untouched. Post-process on "
                "the CPU (`postprocessing_backend='cpu'`)."
            )
        why = "halved until the device's compiled peak fits the budget"
        size = smaller(n, size)


def loop_for(problem: Problem, strategy: str) -> Loop:
    """The loop that chunks of `problem` run in: the one place this is decided.

    An XLA loop, as `jax.lax.map` runs it (for `auto`, dispatched in segments, so that the
    tuner can change the chunk size between them), except on a model with many buffers,
    whose XLA loops take minutes to compile: there the host calls one straight-line chunk
    step per chunk.
    """
    del strategy  # every request takes the same loop
    if problem.n_buffers > HOST_LOOP_MANY_BUFFERS:
        return Loop.HOST
    return Loop.XLA


def _divisor_near(n: int, target: int) -> int:
    """The divisor of `n` nearest to `target` within [target/2, target]; else `target`."""
    target = max(1, min(target, n))
    for size in range(target, max(target // 2, 1) - 1, -1):
        if n % size == 0:
            return size
    return target


def _rule_divisor(n: int, target: int) -> int:
    """The rule's size `target` rounded to a divisor of `n` (no overlapping last chunk): the
    largest divisor at most `target` and within `ROUND_DOWN_WITHIN` below it, else the
    divisor nearest by ratio within a factor of 2, else `target` itself (a prime count).

    Past the target a chunk's working set leaves the cache and the time per draw climbs
    (docs/strategies.md, "Rounding to a divisor"); below it only the loop's cost per chunk
    grows, which matters where the next divisor down is far: 3 goes to 4, not 2, which
    would cost a third of the work per chunk.
    """
    target = max(1, min(target, n))
    divisors = [d for d in range(max(target // 2, 1), min(2 * target, n) + 1) if n % d == 0]
    if not divisors:
        return target
    below = [d for d in divisors if (1 - ROUND_DOWN_WITHIN) * target <= d <= target]
    if below:
        return max(below)
    return min(divisors, key=lambda d: abs(math.log(d / target)))


def smaller(n: int, size: int) -> int:
    """The next chunk size to try below `size`: about half, a divisor of `n` where one is
    near (it then needs no overlapping last chunk). The one rule for halving, used by the
    planner and by the out-of-memory retry alike."""
    return _divisor_near(n, max(1, size // 2))


def _make_plan(
    problem: Problem,
    budget: int | None,
    exe: Executable,
    strategy: str,
    reason: str,
    source: str,
    planning_seconds: float = 0.0,
) -> Plan:
    size = exe.chunk_size
    return Plan(
        strategy=strategy,
        chunk_size=size,
        n_chunks=None if size is None else -(-problem.n_local // size),
        output_bytes=problem.output_bytes,
        peak_bytes=exe.peak_bytes,
        budget_bytes=budget,
        reason=reason,
        compile_seconds=exe.compile_seconds,
        planning_seconds=planning_seconds,
        loop=exe.loop,
        source=source,
        n_devices=problem.n_shards,
        devices_reason=problem.placement.reason,
        output_memory=exe.output_memory,
        library_fusions=exe.library_fusions,
    )


def _fast_chunk_size(problem: Problem, per_item_temp: float, budget: int | None) -> tuple[int, str]:
    """The chunk size that should run fastest, and why (before any measurement)."""
    n = problem.n_local
    per_item = problem.per_item_bytes + per_item_temp
    if budget is None:
        fits = n
    else:
        room = max(budget - problem.output_bytes // problem.n_shards, 0)
        fits = max(1, int(room // max(per_item, 1)))
    if problem.device.platform != "cpu":
        # Accelerators want wide chunks: take half the room left after the outputs (the
        # other half leaves room for XLA's GPU autotuner, which allocates while compiling).
        if budget is None:
            return max(1, n // 2), "half the draws, as the free memory is unknown"
        return max(1, min(n, fits // 2)), "half the memory left after the outputs"
    # Shards on one CPU run at once, up to one per core, and split its cores and caches: the
    # target is for one device running on all of them.
    together = min(problem.n_local_shards, cpu_cores())
    target = TARGET_CHUNK_BYTES // together
    # The data every draw reads (a design matrix) shares the cache with the chunk's own
    # buffers; the chunk keeps at least half of the target.
    room = max(target - problem.shared_bytes, target // 2)
    cache_size = int(room // max(per_item, 1))
    overhead_size = -(-problem.n_buffers * OVERHEAD_BYTES_PER_BUFFER // max(int(per_item), 1))
    size = min(max(cache_size, overhead_size, 1), fits, n)
    of = f"the target of {_mib(target)}" + (
        f" ({_mib(TARGET_CHUNK_BYTES)} split over {together} devices running at once)"
        if together > 1
        else ""
    )
    if overhead_size > cache_size:
        why = f"enough work per chunk to amortise the loop's cost over {problem.n_buffers} buffers"
    elif problem.shared_bytes:
        why = (
            f"a working set near {_mib(room)} per chunk: {of}, less the "
            f"{_mib(problem.shared_bytes)} of data that every draw reads"
        )
    else:
        why = f"a working set near {of} per chunk"
    return size, why


def _rule_chunk(
    problem: Problem, loop: Loop, per_item_temp: float, budget: int | None
) -> tuple[int, str]:
    """The rule's chunk size for `loop`, and why: `_fast_chunk_size`, at most
    `HOST_LOOP_MAX_CHUNKS` chunks in a host loop, rounded to a divisor of the draws."""
    n = problem.n_local
    size, why = _fast_chunk_size(problem, per_item_temp, budget)
    if loop is Loop.HOST:
        size = max(size, -(-n // HOST_LOOP_MAX_CHUNKS))
        why += (
            f"; a host loop of at most {HOST_LOOP_MAX_CHUNKS} chunks over "
            f"{problem.n_buffers} buffers"
        )
    return _rule_divisor(n, size), why


def _compile(
    jax_fn,
    problem,
    strategy,
    loop,
    size,
    donate,
    progress,
    output_memory="device",
    tuned=False,
    **options,
) -> Executable | None:
    """`compile_executable(...)`, or None if compiling ran out of device memory.

    On a GPU, XLA's autotuner runs candidate kernels on buffers of the chunk's real size while
    compiling, so a large chunk can fail to compile where a smaller one fits. `tuned`: in
    host-dispatched segments, for the tuner. `options` go to `compile_executable`: `stored`,
    the executable may come from, and go to, the on-disk store (with the tuning cache);
    `library_fusions`.
    """
    try:
        return compile_executable(
            jax_fn, problem, strategy, loop, size, donate, progress, output_memory, tuned, **options
        )
    except jax.errors.JaxRuntimeError as error:
        if is_out_of_memory(error):
            return None
        raise


def _vmap_may_fit(problem: Problem, sharing: int) -> bool:
    """Whether the loop-free vmap's compiled temporaries may come under `VMAP_TEMP_BYTES`,
    judged from the jaxpr's bound before compiling it (`VMAP_BOUND_SLACK`,
    `VMAP_BOUND_PER_OUTPUT`)."""
    bound = sharing * problem.n_local * problem.intermediate_bytes
    if bound <= VMAP_TEMP_BYTES:
        return True
    outputs = sharing * problem.output_bytes // problem.n_shards
    return bound <= VMAP_BOUND_SLACK * VMAP_TEMP_BYTES and bound <= VMAP_BOUND_PER_OUTPUT * outputs


def _request(strategy: str, output_memory: str) -> str:
    return f"{strategy}|{output_memory}"


def first_attempt(
    jax_fn: Callable,
    problem: Problem,
    strategy: str,
    budget: int | None,
    *,
    chunk_size: int | None = None,
    donate: Sequence[int] = (),
    progress: bool = False,
    output_memory: str = "auto",
    use_cache: bool = True,
) -> Attempt:
    """The first thing to try for a call.

    Args:
        jax_fn: the per-draw function.
        problem: the call, on the devices it runs on.
        strategy: the requested strategy; "auto" and "chunked" are planned.
        budget: bytes per device for outputs and temporaries; None: no known limit.
        chunk_size: a requested chunk size (for "auto"/"chunked"), already resolved.
        donate: input indices handed to XLA.
        progress: compile with progress reporting.
        output_memory: "auto", "device" or "host" (see `output_memory_for`).
        use_cache: read and write the tuning cache ("auto" only).

    Raises:
        MemoryError: the budget cannot hold the outputs, or a fixed strategy's compiled peak
            exceeds an explicit budget; nothing has run.
    """
    tic = time.perf_counter()
    if strategy in ("auto", "chunked"):
        where, why_host = output_memory_for(problem, output_memory, budget)
        if where == "host":
            return _host_output_attempt(
                jax_fn, problem, budget, chunk_size, progress, why_host, tic
            )
    check_budget(problem, budget)
    if strategy not in ("auto", "chunked"):
        exe = _compile(jax_fn, problem, strategy, Loop.NONE, None, donate, progress)
        if exe is None:  # ran out of memory while compiling: the retry takes it from here
            raise _CompileOutOfMemory(strategy)
        if budget is not None and exe.peak_bytes > budget:
            raise MemoryError(
                f"Strategy {strategy!r} needs {_mib(exe.peak_bytes)} per device at its peak "
                f"(outputs plus XLA's temporaries), over the memory budget of {_mib(budget)}. "
                "Nothing was run; the draws are untouched. Pass "
                "`postprocessing_vectorize='auto'` to plan within the budget."
            )
        reason = f"Strategy {strategy!r} was requested."
        plan = _make_plan(problem, budget, exe, strategy, reason, "requested")
        return Attempt(plan, exe)
    limit = math.inf if budget is None else budget
    loop = loop_for(problem, strategy)
    key = _tuning.tuning_key(problem, _request(strategy, "device"))
    planned = strategy == "auto" and chunk_size is None  # the planner chooses the size
    # The tuning cache and the executables stored beside it serve `auto` alone: a fixed
    # request compiles what it names.
    stored = planned and use_cache
    if stored:
        cached = _from_cache(jax_fn, problem, key, budget, limit, donate, progress, tic)
        if cached is not None:
            return cached
    n = problem.n_local
    per_item_temp = float(problem.intermediate_bytes)
    comfortable = COMFORT_FRACTION * limit
    sharing = problem.memory_sharing
    if planned and _vmap_may_fit(problem, sharing):
        whole = _compile(jax_fn, problem, "vmap", Loop.NONE, None, donate, progress, stored=stored)
        if whole is not None:
            temps = sharing * whole.temp_bytes
            if temps <= VMAP_TEMP_BYTES and whole.peak_bytes <= comfortable:
                reason = (
                    f"No loop: the loop-free vmap needs {_mib(temps)} of temporaries"
                    + (f" ({sharing} devices sharing one memory)" if sharing > 1 else "")
                    + f" and {_mib(whole.peak_bytes)} per device in all, within "
                    f"{COMFORT_FRACTION:.0%} of {_budget_text(budget)}."
                )
                plan = _make_plan(
                    problem, budget, whole, "vmap", reason, "rule", time.perf_counter() - tic
                )
                entry = {"loop": Loop.NONE.value, "chunk_size": None, "why": "compiled analysis"}
                _tuning.store(key, entry)
                return Attempt(plan, whole)
            per_item_temp = whole.temp_bytes / max(n, 1)  # the compiled evidence overrules
            release(whole)
    if chunk_size is None:
        size, why = _rule_chunk(problem, loop, per_item_temp, budget)
        source = "rule"
    else:
        size, why, source = resolve_chunk_size(n, chunk_size, None), "as requested", "requested"
    refined = False
    tuned = planned  # the tuner may change the size
    while True:
        exe = _compile(
            jax_fn, problem, "chunked", loop, size, donate, progress, tuned=tuned, stored=stored
        )
        expected = size * (per_item_temp + problem.per_item_bytes)
        jumped = (  # a smaller chunk may avoid the jump; at one draw there is none
            exe is not None
            and chunk_size is None
            and size > 1
            and exe.temp_bytes > JUMP_FACTOR * expected + 2**24
        )
        if exe is not None and exe.peak_bytes <= limit and not jumped:
            if chunk_size is None and not refined and problem.device.platform == "cpu":
                # The jaxpr's bound may be far off (XLA fuses gathers): size again from
                # this chunk's compiled temporaries, once, if that moves the size 4x or more
                # (a second compile costs more than a chunk size within 4x of the best).
                refined = True
                measured = exe.temp_bytes / size
                better, better_why = _rule_chunk(problem, loop, measured, budget)
                if not size / 4 < better < size * 4:
                    size, why, per_item_temp = better, better_why, measured
                    why += " (from the compiled temporaries per draw)"
                    release(exe)
                    continue
            reason = (
                f"Chunks of {size} draws ({why}): {_mib(exe.temp_bytes)} of temporaries, "
                f"{_mib(exe.peak_bytes)} in all, within {_budget_text(budget)}."
            )
            plan = _make_plan(
                problem, budget, exe, "chunked", reason, source, time.perf_counter() - tic
            )
            tuner = None
            if tuned:
                tuner = Tuner(jax_fn, exe, limit, donate, key)
            return Attempt(plan, exe, tuner)
        if size == 1:
            if exe is None:
                raise MemoryError(
                    "Compiling even one draw at a time ran out of device memory (XLA's GPU "
                    "autotuner allocates buffers of the chunk's size). Nothing was run; the "
                    "draws are untouched. Free device memory, or post-process on the CPU "
                    "(`postprocessing_backend='cpu'`)."
                )
            raise MemoryError(
                f"Even one draw at a time needs {_mib(exe.peak_bytes)} (outputs "
                f"{_mib(problem.output_bytes // problem.n_shards)} plus XLA temporaries), over "
                f"the memory budget of {_mib(limit)}. Nothing was run; the draws are untouched."
            )
        if exe is None:
            why = f"compiling at {size} ran out of device memory; halved"
        elif jumped:
            why = f"XLA's temporaries jumped to {_mib(exe.temp_bytes)} at {size}; halved"
        else:
            why = "halved until the compiled peak fits the budget"
        release(exe)
        size = smaller(n, size)


class _CompileOutOfMemory(Exception):
    """A fixed strategy ran out of device memory while compiling (handled as a failure)."""

    def __init__(self, strategy: str):
        super().__init__(f"RESOURCE_EXHAUSTED: compiling {strategy!r} ran out of memory")
        self.strategy = strategy


#: What a plan says of an executable that this process did not compile.
_ORIGIN_TEXT = {
    Origin.LOADED: "loaded from disk",
    Origin.MOVED: "moved from another device",
}


def _from_cache(jax_fn, problem, key, budget, limit, donate, progress, tic) -> Attempt | None:
    """The tuning cache's plan for `problem`, if it has one that fits today's budget."""
    entry = _tuning.load(key)
    if entry is None:
        return None
    try:
        loop = Loop(entry["loop"])
        size = entry["chunk_size"]
        if size is not None:
            size = int(size)
            if not 1 <= size <= problem.n_local:
                return None
        library = entry.get("library_fusions", True)
        if not isinstance(library, bool):
            return None
        if not library and (loop is not Loop.XLA or problem.device.platform != "cpu"):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    strategy = "vmap" if loop is Loop.NONE else "chunked"
    # The same executable the tuned run had (its segments cost one dispatch more).
    try:
        exe = _compile(
            jax_fn,
            problem,
            strategy,
            loop,
            size,
            donate,
            progress,
            tuned=True,
            stored=True,
            library_fusions=library,
        )
    except jax.errors.JaxRuntimeError:
        if library:
            raise
        return None  # this XLA no longer knows the option: plan afresh
    if exe is None or exe.peak_bytes > limit:
        release(exe)
        return None
    what = "No loop" if size is None else f"Chunks of {size} draws"
    reason = (
        f"{what}, from the tuning cache ({entry.get('why', 'measured before')}"
        + (f"; its executable {_ORIGIN_TEXT[exe.origin]}" if exe.origin in _ORIGIN_TEXT else "")
        + f"): {_mib(exe.peak_bytes)} in all, within {_budget_text(budget)}."
    )
    plan = _make_plan(problem, budget, exe, strategy, reason, "cache", time.perf_counter() - tic)
    return Attempt(plan, exe)


class Tuner:
    """The online tuner of a host-driven `auto` run: policy for the executor's chunk loop.

    The run starts at the rule's chunk size. After one warm-up and `TUNE_CHUNKS` timed
    chunks it projects the work left.

    - On a CPU, where that is at least `LIBRARY_TRY_COMPILES` times the first compile and
      XLA gave a short reduction of the loop to a kernel library (`LIBRARY_SHORT_REDUCTION`),
      it times the same chunk compiled without library fusions and keeps the faster of the
      two. The sizes it tries next are compiled the same way.
    - Only if the work left exceeds `TUNE_MIN_SECONDS` does it try other sizes: double the
      size while that is faster, else halve it while that is faster.

    Each candidate compiles on a second thread (XLA compiles without the GIL) while the best
    so far goes on running, and its compiled peak is checked against the budget before it
    runs. Every chunk writes its real outputs, so tuning computes nothing twice.
    """

    #: Compile candidates on the calling thread (tests: the next chunk then always has it).
    synchronous = False

    def __init__(self, jax_fn, exe: Executable, limit: float, donate, key: str):
        self._jax_fn, self._limit, self._donate, self._key = jax_fn, limit, tuple(donate), key
        self._problem = exe.problem
        size = int(exe.chunk_size or 1)
        self.steps: dict[int, Executable] = {size: exe}
        self._times: dict[int, list[tuple[float, int]]] = {}  # (seconds, draws) per size
        self._warm: set[int] = set()
        self._current = exe
        self.best = size
        self._tried = [size]
        self._up = True
        self._start = 0
        self._began: float | None = None  # when the run asked for its first chunk
        self._trusted = True
        self._pending: concurrent.futures.Future | None = None
        self._pending_library = False  # the compile in flight is the library trial's
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.timing = True  # the executor times chunks while this is set
        #: Whether the steps are compiled with XLA's library fusions (see the class).
        self.library_fusions = exe.library_fusions
        self._library_decided = not (
            exe.library_fusions and exe.loop is Loop.XLA and exe.problem.device.platform == "cpu"
        )
        self._variant: Executable | None = None  # the chunk without library fusions, on trial
        self._variant_times: list[tuple[float, int]] = []
        self._variant_warm = False
        #: Seconds per draw of the library trial's chunk, with library fusions (True) and
        #: without (False), once both were timed.
        self.library_seconds: dict[bool, float] = {}
        #: The largest compiled peak of any step that ran.
        self.peak_bytes = exe.peak_bytes

    #: Seconds a timed segment should take while tuning.
    segment_seconds = TUNE_WINDOW_SECONDS / TUNE_CHUNKS

    @staticmethod
    def _rate(ts: list[tuple[float, int]]) -> float | None:
        """The median call's seconds per draw, once timed over a full window (`TUNE_CHUNKS`
        calls and `TUNE_WINDOW_SECONDS`); else None."""
        if len(ts) < TUNE_CHUNKS or sum(t for t, _ in ts) < TUNE_WINDOW_SECONDS:
            return None
        return float(np.median([t / k for t, k in ts]))

    @property
    def seconds_per_draw(self) -> dict[int, float]:
        """Seconds per draw, for each size timed over a full window (`_rate`)."""
        rates = {size: self._rate(ts) for size, ts in self._times.items()}
        return {size: rate for size, rate in rates.items() if rate is not None}

    @property
    def measured(self) -> bool:
        """More than one size was timed, over a run that bears the measurement out."""
        return len(self.seconds_per_draw) > 1 and self._trusted

    def next_step(self, start: int) -> Executable:
        """The compiled step for the chunk at item `start`."""
        if self._began is None:
            self._began = time.perf_counter()
        self._start = start
        if self._pending is not None and self._pending.done():
            candidate = self._pending.result()
            self._pending = None
            if self._pending_library:
                if candidate is None:  # no library fusion to remove, or no such option
                    self._library_decided = True
                    self._decide()
                else:
                    self._variant = self._current = candidate
                    self.peak_bytes = max(self.peak_bytes, candidate.peak_bytes)
            elif candidate is None:  # over the budget, or out of memory while compiling
                self._finish()
            else:
                self.steps[int(candidate.chunk_size)] = candidate
                self._current = candidate
                self.peak_bytes = max(self.peak_bytes, candidate.peak_bytes)
        return self._current

    def record(self, step: Executable, seconds: float, draws: int) -> None:
        """A call of `step` took `seconds` for `draws` draws (each step's first warms up)."""
        if step is self._variant:
            if not self._variant_warm:
                self._variant_warm = True
                return
            self._variant_times.append((seconds, draws))
            if self._rate(self._variant_times) is not None and self.timing:
                self._judge_library()
            return
        size = int(step.chunk_size or 1)
        if size not in self._warm:
            self._warm.add(size)
            return
        times = self._times.setdefault(size, [])
        complete = size in self.seconds_per_draw
        times.append((seconds, draws))
        if not complete and size in self.seconds_per_draw and self.timing:
            self._decide()

    def _decide(self) -> None:
        if self._pending is not None or self._variant is not None:
            return
        rates = self.seconds_per_draw
        best = min(rates, key=rates.__getitem__)
        self.best = best
        n = self._problem.n_local
        left = (n - self._start) * rates[best]
        if not self._library_decided:
            self._library_decided = True
            first = self.steps[self._tried[0]]
            # A step loaded from disk did not pay the compile that the trial would.
            compiled = first.origin is Origin.COMPILED
            if compiled and left >= LIBRARY_TRY_COMPILES * first.compile_seconds:
                self._current = self.steps[best]
                self._submit(self._compile_without_library, best, library=True)
                return
        if left < TUNE_MIN_SECONDS:
            return self._finish()
        newest = self._tried[-1]
        if newest == best:  # the newest size is the fastest so far: go on that way
            target = newest * 2 if self._up else newest // 2
        elif self._up and best == self._tried[0]:  # a larger chunk was slower: try smaller
            self._up = False
            target = best // 2
        else:
            return self._finish()
        if not 1 <= target <= n or target in self.steps:
            return self._finish()
        self._current = self.steps[best]  # the fastest so far runs while the next compiles
        self._tried.append(target)
        self._submit(self._compile, target, library=False)

    def _submit(self, compile_: Callable[[int], Executable | None], size: int, library: bool):
        self._pending_library = library
        if self.synchronous:
            self._pending = concurrent.futures.Future()
            self._pending.set_result(compile_(size))
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._pending = self._pool.submit(compile_, size)

    def _judge_library(self) -> None:
        """Keep the faster of the trial's two compiles of one chunk size, then go on."""
        variant, self._variant = self._variant, None
        assert variant is not None
        size = int(variant.chunk_size or 1)
        with_library = self.seconds_per_draw[size]
        without = self._rate(self._variant_times)
        assert without is not None
        self.library_seconds = {True: with_library, False: without}
        if LIBRARY_MIN_GAIN * without < with_library:
            release(self.steps[size])
            self.steps[size] = variant
            self._times[size] = self._variant_times
            self.library_fusions = False
        else:
            release(variant)
        self._current = self.steps[self.best]
        self._decide()

    def _candidate(self, size: int, library_fusions: bool) -> Executable | None:
        """The tuner's step of `size`, or None where it does not fit the budget."""
        first = self.steps[self._tried[0]]
        exe = _compile(
            self._jax_fn,
            self._problem,
            "chunked",
            first.loop,
            size,
            self._donate,
            first.progress,
            tuned=True,
            stored=True,
            library_fusions=library_fusions,
        )
        if exe is None or exe.peak_bytes > self._limit:
            release(exe)
            return None
        return exe

    def _compile(self, size: int) -> Executable | None:
        return self._candidate(size, self.library_fusions)

    def _compile_without_library(self, size: int) -> Executable | None:
        """The chunk of `size` without library fusions; None where the library has no short
        reduction in it (nothing is compiled), this XLA does not know the option, it does
        not fit the budget, or XLA's own fusions need as many temporaries: what the library
        costs where it is the wrong choice is the operand it writes out, which its absence
        then does not save."""
        step = self.steps[size]
        if not any(k <= LIBRARY_SHORT_REDUCTION for k in library_reductions(step)):
            return None
        try:
            exe = self._candidate(size, library_fusions=False)
        except jax.errors.JaxRuntimeError:
            return None
        if exe is not None and exe.temp_bytes >= step.temp_bytes:
            release(exe)
            return None
        return exe

    def _finish(self) -> None:
        self.timing = False
        self._current = self.steps[self.best]

    def _wait(self) -> None:
        """Wait for a compile in flight; a candidate that never ran stores nothing."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._pending is not None and self._pending.done():
            release(self._pending.result())
        self._pending = None

    @property
    def ran(self) -> list[Executable]:
        """Every step that ran (a library trial's candidate included)."""
        return [*self.steps.values(), *([self._variant] if self._variant else [])]

    def abandon(self) -> None:
        """End tuning after a failed run: wait for a compile in flight; nothing is stored."""
        self._wait()
        for step in self.ran:
            release(step)

    def close(self) -> None:
        """End tuning (waiting for a compile in flight) and store what was measured, unless
        sizes were tried and the whole run took under `TUNE_TRUST_FRACTION` of
        `TUNE_MIN_SECONDS`: then its first chunks, which started the tuning, were not the
        run's speed, and the rule's size is stored instead. The library trial's choice is
        kept either way (`LIBRARY_MIN_GAIN` guards it; a run it sped up 9x ends far sooner
        than its first chunks projected)."""
        self._wait()
        release(self._variant)  # a trial that the run ended before it was judged
        self._variant = None
        rates = self.seconds_per_draw
        elapsed = 0.0 if self._began is None else time.perf_counter() - self._began
        # Only a run that tried other sizes was projected long by its first chunks.
        self._trusted = len(self._tried) == 1 or elapsed >= TUNE_TRUST_FRACTION * TUNE_MIN_SECONDS
        if rates and self._trusted:
            self.best = min(rates, key=rates.__getitem__)
        else:
            self.best = self._tried[0]
        library = self.library_fusions  # every step since the trial is compiled this way
        why = (
            f"measured fastest of {sorted(rates)} draws per chunk"
            if self.measured
            else "the compiled-analysis rule; the run was too short to tune"
            if self._trusted
            else "the compiled-analysis rule; the run was far shorter than its first chunks "
            "projected, so what they measured is not kept"
        )
        if self.library_seconds:
            why += (
                "; measured faster without XLA's library fusions"
                if not library
                else f"; measured not {LIBRARY_MIN_GAIN}x faster without XLA's library fusions"
            )
        entry = {
            "loop": self.steps[self.best].loop.value,
            "chunk_size": self.best,
            "library_fusions": library,
            "why": why,
        }
        _tuning.store(
            self._key, entry | {"seconds_per_draw": {str(k): v for k, v in rates.items()}}
        )
        self.stored_library_fusions = library


def finished(attempt: Attempt) -> Plan:
    """The plan that ran, with what the tuner measured.

    The executable that the tuning cache now names goes to the on-disk store (`persist`), so
    that the next run of the same problem loads it instead of compiling it.
    """
    tuner, plan = attempt.tuner, attempt.plan
    if tuner is None:
        persist(attempt.exe)
        return plan
    tuner.close()
    for size, step in tuner.steps.items():
        if size == tuner.best and step.library_fusions == tuner.stored_library_fusions:
            persist(step)
        else:
            release(step)
    rates = tuner.seconds_per_draw
    library = ""
    if tuner.library_seconds:
        on, off = tuner.library_seconds[True], tuner.library_seconds[False]
        library = (
            f"{'without' if not tuner.library_fusions else 'with'} XLA's library fusions "
            f"(measured {on * 1e6:.1f} us per draw with them, {off * 1e6:.1f} us without)"
        )
    if not tuner.measured and tuner.library_fusions:
        if library:
            plan = dataclasses.replace(plan, reason=f"{plan.reason[:-1]}; {library}.")
        return dataclasses.replace(plan, tuning_seconds=rates, peak_bytes=tuner.peak_bytes)
    best = tuner.best
    exe = tuner.steps[best]
    if tuner.measured:
        reason = (
            f"Chunks of {best} draws, measured fastest on the first chunks of this run "
            f"(seconds per draw: "
            + ", ".join(f"{k}: {v * 1e6:.1f} us" for k, v in sorted(rates.items()))
            + ")"
        )
    else:
        reason = f"Chunks of {best} draws, as the rule gave"
    reason += (
        f", {library}" if library else ""
    ) + f"; {_mib(tuner.peak_bytes)} in all, within {_budget_text(plan.budget_bytes)}."
    return dataclasses.replace(
        plan,
        chunk_size=best,
        n_chunks=-(-exe.problem.n_local // best),
        peak_bytes=tuner.peak_bytes,
        reason=reason,
        source="measured",
        tuning_seconds=rates,
        library_fusions=exe.library_fusions,
    )


def next_attempt(
    jax_fn: Callable,
    problem: Problem,
    failed: Attempt | None,
    failed_strategy: str,
    error: Exception,
    *,
    lost: Sequence[int],
    budget: int | None,
    donate: Sequence[int],
    progress: bool,
) -> Attempt:
    """What to try after a failure that `retries` accepts: the one retry policy.

    An executable that this process did not compile (loaded from the store, or moved from
    another device) that failed to run is compiled here, with the same plan and no online
    tuning; one loaded from the store is replaced there by what is compiled here. Nothing
    more is loaded or moved in this process.

    After running out of memory, halve the chunk that failed (`smaller`), in the loop it
    had, or in the planner's loop for a plan that had none. Stop, with the draws intact,
    when the device has less free than the outputs alone need (smaller chunks cannot help),
    at one draw per chunk, or when donated draws were lost.

    Raises:
        MemoryError: nothing more to try after running out of memory.
        RuntimeError: the executable that failed had taken donated draws.
    """
    n = problem.n_local
    if failed is not None and failed.tuner is not None:
        failed.tuner.abandon()
    foreign = _foreign_failure(failed, error)
    if failed is not None and foreign is not None:
        origin = _ORIGIN_TEXT[foreign]
        distrust_foreign()
        if lost:
            raise RuntimeError(
                f"Post-processing failed in an executable {origin} ({error}), and inputs "
                f"{list(lost)} had been donated to it and are lost."
            ) from error
        size = failed.exe.chunk_size
        replace = foreign is Origin.LOADED
        exe = _compile(
            jax_fn,
            problem,
            failed.exe.strategy,
            failed.exe.loop,
            size,
            donate,
            progress,
            failed.exe.output_memory,
            tuned=failed.exe.segments,
            stored=replace,
        )
        done = "compiling it here ran out of memory" if exe is None else "compiled it here"
        if exe is not None and replace:
            done += " and stored it in place of the one that failed"
        warn(f"An executable {origin} failed to run ({error}); {done}. The draws are intact.")
        if exe is not None:
            what = "No loop" if size is None else f"Chunks of {size} draws"
            reason = f"{what}, as planned, compiled here: the executable {origin} failed to run."
            plan = _make_plan(problem, budget, exe, failed.plan.strategy, reason, "retry")
            return Attempt(plan, exe)
        # Compiling here ran out of memory: the memory policy below goes on from its plan.
    if failed is not None:
        current = failed.exe.chunk_size or _effective_chunk(problem, failed.exe.strategy)
        loop = failed.exe.loop
    else:  # a fixed strategy that ran out while compiling
        current = _effective_chunk(problem, failed_strategy)
        loop = Loop.NONE
    if loop is Loop.NONE:  # a plan without a loop of ours: the planner's loop for chunks
        loop = loop_for(problem, "chunked")
    host = failed is not None and failed.exe.output_memory == "host"
    free = free_bytes(problem.device)
    needed = 0 if host else problem.output_bytes // problem.n_shards
    if not lost and free is not None and free < needed:
        raise MemoryError(
            f"Post-processing ran out of memory with {failed_strategy!r} at {current} draw(s) "
            f"per chunk, and smaller chunks cannot help: the outputs alone need "
            f"{_mib(needed)} and {problem.device} has {_mib(free)} free. The raw draws are "
            "intact: free device memory (delete arrays you no longer need), or post-process "
            "on the CPU (`postprocessing_backend='cpu'`)."
        ) from error
    if lost or current <= 1:
        raise MemoryError(
            f"Post-processing ran out of memory with {failed_strategy!r} at "
            f"{current} draw(s) per chunk ({error}). "
            + (
                f"Inputs {list(lost)} were donated and are lost."
                if lost
                else "The raw draws are intact: pass a larger `memory_budget` after "
                "freeing memory, or post-process on the CPU "
                "(`postprocessing_backend='cpu'`)."
            )
        ) from error
    size = smaller(n, current)
    warn(
        f"Post-processing ran out of memory with {failed_strategy!r} at {current} "
        f"draw(s) per chunk; retrying with chunks of {size}. The draws are intact."
    )
    while True:
        if host:
            exe = _compile(jax_fn, problem, "chunked", Loop.HOST, size, (), progress, "host")
        else:
            exe = _compile(jax_fn, problem, "chunked", loop, size, donate, progress)
        if exe is not None:
            break
        if size <= 1:
            raise MemoryError(
                "Compiling even one draw at a time ran out of device memory. Nothing was "
                "run; the draws are untouched. Free device memory, or post-process on the "
                "CPU (`postprocessing_backend='cpu'`)."
            ) from error
        size = smaller(n, size)
    reason = f"Retried at {size} draws per chunk after running out of memory."
    return Attempt(_make_plan(problem, budget, exe, "chunked", reason, "retry"), exe)


def retries(failed: Attempt | None, error: Exception) -> bool:
    """Whether `next_attempt` has something to try after `error` (raised while compiling or
    running `failed`): out of memory, or an executable that this process did not compile
    failed to run."""
    return is_out_of_memory(error) or _foreign_failure(failed, error) is not None


def _foreign_failure(failed: Attempt | None, error: Exception) -> Origin | None:
    """Where the executable came from, if `error` is a failure to run (not out of memory) of
    an attempt with an executable that this process did not compile (its own, or a tuner's
    step); else None."""
    if (
        failed is None
        or not isinstance(error, jax.errors.JaxRuntimeError)
        or is_out_of_memory(error)
    ):
        return None
    steps = [failed.exe, *(() if failed.tuner is None else failed.tuner.ran)]
    return next((s.origin for s in steps if s.origin is not Origin.COMPILED), None)


def _effective_chunk(problem: Problem, strategy: str) -> int:
    """Draws evaluated together by a strategy without an explicit chunk size."""
    chains, draws = problem.local_shape
    return {
        "scan": chains,
        "vmap_scan": chains,
        "scan_vmap": draws,
        "nested_scan": 1,
    }.get(strategy, problem.n_local)
