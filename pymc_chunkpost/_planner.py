"""`auto` and the one retry policy (out of memory; an executable not compiled here that failed to
run): policy only.

The planner decides, from evidence, what to run; `_executor` runs it. Every decision about a
call lives here (the loop kind, the chunk size, what to try after running out of memory) or,
for the devices, the budget and where the outputs go, in `_resources`. Its heuristics are
`PlannerConfig`'s (`_config`), each with its evidence in docs/strategies.md.

Evidence, in the order it is used:

1. The tuning cache: the plan that a previous run of the same function and shapes measured
   best (`_tuning`). A hit skips the search; it is still checked against today's budget.
   The executable that ran is stored beside it (`finished`), and a hit on the same program
   and data loads it instead of compiling (`_executable_store`).
2. XLA's compiled analysis. The loop-free `vmap` is compiled first when the jaxpr's bound on
   its temporaries leaves any chance that it fits; its `memory_analysis()` gives the real
   temporaries per draw, after fusion. It runs when those stay under `vmap_temp_bytes` and
   its peak under `comfort_fraction` of the budget: then nothing beats it, as it compiles
   fastest and runs one wide computation. Otherwise the chunk is sized from the compiled
   temporaries per draw (a working set near `target_chunk_bytes` on a CPU; a fraction of
   the room left on an accelerator), and checked against the budget by its own compiled
   peak.
3. Measured time on the real draws: the online tuner (`_tuner`), which may also try the chunk
   compiled without XLA's CPU library fusions (`_library_fusions`). The result goes to the
   tuning cache.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _executor, _tuning
from ._chunked import resolve_chunk_size
from ._config import current
from ._disk_output import DISK_CHUNK_BYTES, QUEUE_CHUNKS, chunk_draws
from ._executor import CompileOutOfMemory, Executable, distrust_foreign, persist, release
from ._host_output import Transfer, default_transfer
from ._memory import free_bytes
from ._messages import budget_text, mib, warn
from ._problem import Problem, cpu_cores, is_out_of_memory, product_bytes
from ._program import Request
from ._resources import (
    STAGED_CHUNKS,
    check_budget,
    host_fits,
    host_is_the_device,
    host_staging_room,
    lanes_for,
    largest_output_bytes_per_draw,
    output_bytes_per_draw,
    output_memory_for,
)
from ._tuner import CompileCandidate, Tuner
from ._types import Loop, Origin, Plan

__all__ = ["Attempt", "finished", "first_attempt", "next_attempt", "retries"]


@dataclasses.dataclass
class Attempt:
    """One try at a call: the plan, its executable, and the tuner that may change its size."""

    plan: Plan
    exe: Executable
    tuner: Tuner | None = None


@dataclasses.dataclass(frozen=True)
class _Call:
    """What every step of planning one call reads."""

    jax_fn: Callable
    problem: Problem
    budget: int | None
    donate: tuple[int, ...]
    progress: bool
    tic: float

    @property
    def limit(self) -> float:
        return math.inf if self.budget is None else self.budget

    def request(self, strategy: str, loop: Loop, size: int | None, **options: Any) -> Request:
        options.setdefault("vector_width", vector_width(self.problem))
        return Request(strategy, loop, size, self.donate, self.progress, **options)

    def plan(self, exe: Executable, strategy: str, reason: str, source: str) -> Plan:
        """The plan of `exe`, timed from the start of planning."""
        seconds = time.perf_counter() - self.tic
        return _make_plan(self.problem, self.budget, exe, strategy, reason, source, seconds)


def _host_output_attempt(
    call: _Call, chunk_size: int | None, why_host: str, held: int = 0, disk: bool = False
) -> Attempt:
    """Chunks computed on the device and landed in host memory: the device holds the draws,
    two chunks' outputs and one chunk's temporaries per lane (`_host_output`); `held`: bytes
    of the budget that the outputs take (a CPU's lanes, whose host memory is the device's).

    Two memories bound the chunk: the device's budget bounds every lane's compiled chunk
    (beside `held`), and host memory bounds the outputs with the chunks in flight to them:
    on an accelerator `STAGED_CHUNKS` per lane within `host_staging_room`; on a CPU, where
    the device's memory is the host's, every lane's compiled chunk. Where host memory cannot
    hold the outputs, `MemoryError` before any work. `disk`: the chunks go on to disk
    (`_disk_output`), so host memory holds the chunks in flight and the writer's queue,
    never the outputs, and each chunk's outputs keep within `DISK_CHUNK_BYTES`."""
    problem, budget = call.problem, call.budget
    n = problem.n_local
    per_item = problem.per_item_bytes + problem.intermediate_bytes
    lanes, _ = lanes_for(problem)
    cpu = problem.device.platform == "cpu"
    if held:  # host memory is the device's: `output_memory_for` checked the host otherwise
        check_budget(problem, budget)
    staged = STAGED_CHUNKS * lanes * output_bytes_per_draw(problem)
    if disk:  # and the writer's queue
        staged += QUEUE_CHUNKS * output_bytes_per_draw(problem)
    host_most = n if cpu else max(1, host_staging_room(problem, disk) // staged)
    if chunk_size is not None:
        size, why, source = min(chunk_size, n), "as requested", "requested"
    elif problem.device.platform == "cpu":
        size, why = _fast_chunk_size(problem, float(problem.intermediate_bytes), None)
        source = "rule"
        if lanes > 1:  # every lane streams chunks of its own
            most = -(-n // (lanes * current().lane_chunks))
            if size > most:
                size, why = most, f"{current().lane_chunks} chunks per lane"
    else:  # a fraction of the budget: two chunks in flight, temporaries, the autotuner
        size = n
        if budget is not None:
            chunk_bytes = int(budget * current().host_output_chunk_fraction)
            size = max(1, min(n, chunk_bytes // max(per_item, 1)))
        why, source = "a quarter of the device budget per chunk", "rule"
    if size > host_most:
        size, why = host_most, f"the chunks in flight to the host within {mib(host_most * staged)}"
    if chunk_size is None and _small_host_copies_pay(problem):
        most = current().land_chunk_bytes // largest_output_bytes_per_draw(problem)
        if size > most:
            size, why = most, f"at most {mib(current().land_chunk_bytes)} of an output per chunk"
    if chunk_size is None and disk:
        # On a CPU, chunks of a few MiB (the cache's rule) pay for themselves in compute
        # but not in writes: there the chunk is what fits `DISK_CHUNK_BYTES`.
        aligned = chunk_draws(problem.draws, output_bytes_per_draw(problem), None if cpu else size)
        if aligned != size:
            size, why = aligned, f"within {mib(DISK_CHUNK_BYTES)}, a divisor of the draws"
    where = "on disk" if disk else "in host memory"
    while True:
        request = _host_request(call, size, lanes, "disk" if disk else "host")
        exe = _compile(call.jax_fn, problem, request)
        if exe is not None:
            # `exe.peak_bytes` (its one owner) counts every lane's chunk alive at once; on a
            # CPU they are in the memory the outputs take.
            peak = held + exe.peak_bytes
            queued = QUEUE_CHUNKS * size * output_bytes_per_draw(problem) if disk else 0
            host_ok = not cpu or held or host_fits(problem, peak + queued, disk)
            if peak <= call.limit and host_ok:
                streams = f" by {lanes} lanes" if lanes > 1 else ""
                reason = (
                    f"Chunks of {size} draws ({why}), each landed {where} ({why_host})"
                    f"{streams}: {mib(peak)} on the device, within {budget_text(budget)}."
                )
                plan = call.plan(exe, "chunked", reason, source)
                return Attempt(dataclasses.replace(plan, peak_bytes=peak), exe)
        if size == 1:
            raise MemoryError(
                "Even one draw at a time does not fit the device's memory with the outputs "
                "in host memory. Nothing was run; the draws are untouched. Post-process on "
                "the CPU (`postprocessing_backend='cpu'`)."
            )
        why = "halved until the device's compiled peak fits the budget"
        size = smaller(n, size)


def _small_host_copies_pay(problem: Problem) -> bool:
    """Whether chunks landed in host memory should keep each output's part within
    `land_chunk_bytes`: where the runtime's host copy of a chunk is a buffer of its own
    (`Transfer.DIRECT`, a TPU's), which the allocator reuses only while it is small; where
    threads populate the outputs (small chunks written into fresh pages by one thread were
    slower still); and where one draw fits (docs/host_output.md, "Fresh host pages")."""
    config = current()
    try:
        direct = default_transfer(problem.device) is Transfer.DIRECT
    except ValueError:  # no host memory kind: no host outputs either
        return False
    fits = 0 < largest_output_bytes_per_draw(problem) <= config.land_chunk_bytes
    return direct and config.populate_threads > 0 and fits


def loop_for(problem: Problem) -> Loop:
    """The loop that chunks of `problem` run in: the one place this is decided.

    An XLA loop, as `jax.lax.map` runs it (for `auto`, dispatched in segments, so that the
    tuner can change the chunk size between them), except where the host calls one
    straight-line chunk step per chunk: on a model with many buffers, whose XLA loops take
    minutes to compile, and for random draws on a CPU (`Problem.random`), whose elementwise
    work XLA's CPU runtime spreads over the cores outside its loops only
    (docs/predictive.md, "Chunks of random draws on a CPU").
    """
    if problem.n_buffers > current().host_loop_many_buffers:
        return Loop.HOST
    if problem.random and problem.device.platform == "cpu":
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
    largest divisor at most `target` and within `round_down_within` below it, else the
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
    within = current().round_down_within
    below = [d for d in divisors if (1 - within) * target <= d <= target]
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
        lanes=exe.request.lanes,
    )


def _fast_chunk_size(problem: Problem, per_item_temp: float, budget: int | None) -> tuple[int, str]:
    """The chunk size that should run fastest, and why (before any measurement)."""
    config = current()
    n = problem.n_local
    per_item = problem.per_item_bytes + per_item_temp
    if budget is None:
        fits = n
    else:
        room = max(budget - problem.output_bytes // problem.n_shards, 0)
        fits = max(1, int(room // max(per_item, 1)))
    if problem.device.platform != "cpu":
        # Accelerators want wide chunks: a fraction of the room left after the outputs (the
        # rest leaves room for XLA's GPU autotuner, which allocates while compiling).
        fraction = config.accelerator_room_fraction
        if budget is None:
            return max(1, int(n * fraction)), "half the draws, as the free memory is unknown"
        return max(1, min(n, int(fits * fraction))), "half the memory left after the outputs"
    # Shards on one CPU run at once, up to one per core, and split its cores and caches: the
    # target is for one device running on all of them.
    together = min(problem.n_local_shards, cpu_cores())
    target = config.target_chunk_bytes // together
    # The data every draw reads (a design matrix) shares the cache with the chunk's own
    # buffers; the chunk keeps at least half of the target.
    room = max(target - problem.shared_bytes, target // 2)
    cache_size = int(room // max(per_item, 1))
    overhead = problem.n_buffers * config.overhead_bytes_per_buffer
    overhead_size = -(-overhead // max(int(per_item), 1))
    size = min(max(cache_size, overhead_size, 1), fits, n)
    of = f"the target of {mib(target)}" + (
        f" ({mib(config.target_chunk_bytes)} split over {together} devices running at once)"
        if together > 1
        else ""
    )
    if overhead_size > cache_size:
        why = f"enough work per chunk to amortise the loop's cost over {problem.n_buffers} buffers"
    elif problem.shared_bytes:
        why = (
            f"a working set near {mib(room)} per chunk: {of}, less the "
            f"{mib(problem.shared_bytes)} of data that every draw reads"
        )
    else:
        why = f"a working set near {of} per chunk"
    return size, why


def _rule_chunk(
    problem: Problem, loop: Loop, per_item_temp: float, budget: int | None
) -> tuple[int, str]:
    """The rule's chunk size for `loop`, and why: `_fast_chunk_size`, at most
    `host_loop_max_chunks` chunks in a host loop, rounded to a divisor of the draws."""
    n = problem.n_local
    size, why = _fast_chunk_size(problem, per_item_temp, budget)
    if loop is Loop.HOST:
        config = current()
        most = config.random_max_chunks if problem.random else config.host_loop_max_chunks
        size = max(size, -(-n // most))
        over = "of random draws" if problem.random else f"over {problem.n_buffers} buffers"
        why += f"; a host loop of at most {most} chunks {over}"
    return _rule_divisor(n, size), why


def _compile(
    jax_fn: Callable, problem: Problem, request: Request, *, stored: bool = False
) -> Executable | None:
    """`_executor.obtain(...)`, or None if compiling ran out of device memory.

    On a GPU, XLA's autotuner runs candidate kernels on buffers of the chunk's real size while
    compiling, so a large chunk can fail to compile where a smaller one fits. With `stored`,
    the executable may come from, and go to, the on-disk store (with the tuning cache).
    """
    try:
        return _executor.obtain(jax_fn, problem, request, stored=stored)
    except CompileOutOfMemory:
        return None


def _vmap_may_fit(problem: Problem, sharing: int) -> bool:
    """Whether the loop-free vmap's compiled temporaries may come under `vmap_temp_bytes`,
    judged from the jaxpr's bound before compiling it (`vmap_bound_slack`,
    `vmap_bound_per_output`)."""
    config = current()
    bound = sharing * problem.n_local * problem.intermediate_bytes
    if bound <= config.vmap_temp_bytes:
        return True
    outputs = sharing * problem.output_bytes // problem.n_shards
    return (
        bound <= config.vmap_bound_slack * config.vmap_temp_bytes
        and bound <= config.vmap_bound_per_output * outputs
    )


def _host_request(call: _Call, size: int, lanes: int, output_memory: str = "host") -> Request:
    """Chunks of `size` landed in host memory by `lanes` threads (and on to disk, for
    `output_memory="disk"`): nothing donated."""
    width = vector_width(call.problem)
    return Request(
        "chunked",
        Loop.HOST,
        size,
        (),
        call.progress,
        output_memory,
        lanes=lanes,
        vector_width=width,
    )


def vector_width(problem: Problem) -> int:
    """XLA's preferred vector width for `problem`'s steps: `random_vector_width` for random
    draws on a CPU (docs/predictive.md, "Random numbers"), else XLA's default (0)."""
    if problem.random and problem.device.platform == "cpu":
        return current().random_vector_width
    return 0


def _vmap_may_pay(problem: Problem) -> bool:
    """Whether the loop-free vmap may run as fast as chunks: not for random draws on a CPU
    whose products (`_problem.product_bytes`) over all draws exceed
    `random_vmap_product_bytes`. Decided from the jaxpr, before any compile: the vmap's
    compile would cost a quarter of a cold call (0.14 s of the logistic regression's
    0.55 s)."""
    if not (problem.random and problem.device.platform == "cpu") or problem.jaxpr is None:
        return True
    products = product_bytes(problem.jaxpr.jaxpr) * problem.n_local
    return products <= current().random_vmap_product_bytes


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
    disk: bool = False,
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
        output_memory: "auto", "device", "host" or "disk" (see `output_memory_for`).
        use_cache: read and write the tuning cache ("auto" only).
        disk: an output path is set, so "auto" may choose "disk".

    Raises:
        MemoryError: the budget cannot hold the outputs, or a fixed strategy's compiled peak
            exceeds an explicit budget; nothing has run.
        CompileOutOfMemory: a fixed strategy ran out of memory while compiling (the retry
            policy's to handle).
    """
    call = _Call(jax_fn, problem, budget, tuple(donate), progress, time.perf_counter())
    planned = strategy in ("auto", "chunked")
    if planned:
        where, why_host = output_memory_for(problem, output_memory, budget, disk)
        if where == "disk":
            return _host_output_attempt(call, chunk_size, why_host, disk=True)
        if where == "host":
            held = problem.output_bytes if host_is_the_device(problem, output_memory) else 0
            return _host_output_attempt(call, chunk_size, why_host, held)
    check_budget(problem, budget)
    if not planned:
        return _fixed_attempt(call, strategy)
    # The tuning cache and the executables stored beside it serve `auto` alone (when the
    # planner chooses the size): a fixed request compiles what it names.
    tuned = strategy == "auto" and chunk_size is None
    width = vector_width(problem)  # timed with other vectors: a key of its own
    tuned_as = "auto|device" + (f"|vectors of {width} bits" if width else "")
    key = _tuning.tuning_key(problem, tuned_as) if tuned else ""
    stored = tuned and use_cache
    if stored:
        cached = _from_cache(call, key)
        if cached is not None:
            return cached
    per_item_temp = float(problem.intermediate_bytes)
    if tuned and _vmap_may_fit(problem, problem.memory_sharing) and _vmap_may_pay(problem):
        whole, per_item_temp = _vmap_attempt(call, key, stored, per_item_temp)
        if whole is not None:
            return whole
    loop = loop_for(problem)
    if chunk_size is None:
        size, why = _rule_chunk(problem, loop, per_item_temp, budget)
        source = "rule"
    else:
        size, why = resolve_chunk_size(problem.n_local, chunk_size, None), "as requested"
        source = "requested"
    sizing = _Sizing(loop, size, why, source, per_item_temp, chunk_size is not None)
    return _sized_attempt(call, sizing, tuned, stored, key)


def _fixed_attempt(call: _Call, strategy: str) -> Attempt:
    """A fixed strategy, as requested: refused before work when its compiled peak exceeds
    an explicit budget."""
    exe = _executor.obtain(call.jax_fn, call.problem, call.request(strategy, Loop.NONE, None))
    budget = call.budget
    if budget is not None and exe.peak_bytes > budget:
        raise MemoryError(
            f"Strategy {strategy!r} needs {mib(exe.peak_bytes)} per device at its peak "
            f"(outputs plus XLA's temporaries), over the memory budget of {mib(budget)}. "
            "Nothing was run; the draws are untouched. Pass "
            "`postprocessing_vectorize='auto'` to plan within the budget."
        )
    reason = f"Strategy {strategy!r} was requested."
    return Attempt(_make_plan(call.problem, budget, exe, strategy, reason, "requested"), exe)


def _vmap_attempt(
    call: _Call, key: str, stored: bool, per_item_temp: float
) -> tuple[Attempt | None, float]:
    """The loop-free vmap, if its compiled temporaries come under `vmap_temp_bytes` and its
    peak under `comfort_fraction` of the budget; else None, and the compiled temporaries per
    draw (which overrule the jaxpr's bound) where it compiled."""
    config, problem = current(), call.problem
    request = call.request("vmap", Loop.NONE, None)
    whole = _compile(call.jax_fn, problem, request, stored=stored)
    if whole is None:
        return None, per_item_temp
    sharing = problem.memory_sharing
    temps = sharing * whole.temp_bytes
    if temps <= config.vmap_temp_bytes and whole.peak_bytes <= config.comfort_fraction * call.limit:
        reason = (
            f"No loop: the loop-free vmap needs {mib(temps)} of temporaries"
            + (f" ({sharing} devices sharing one memory)" if sharing > 1 else "")
            + f" and {mib(whole.peak_bytes)} per device in all, within "
            f"{config.comfort_fraction:.0%} of {budget_text(call.budget)}."
        )
        entry = {"loop": Loop.NONE.value, "chunk_size": None, "why": "compiled analysis"}
        _tuning.store(key, entry)
        return Attempt(call.plan(whole, "vmap", reason, "rule"), whole), per_item_temp
    release(whole)
    return None, whole.temp_bytes / max(problem.n_local, 1)


@dataclasses.dataclass
class _Sizing:
    """Where the chunk-size search stands: the size to compile next, and why."""

    loop: Loop
    size: int
    why: str
    source: str
    per_item_temp: float
    requested: bool  # the caller named the size: no jump check, no refinement
    refined: bool = False


def _sized_attempt(call: _Call, sizing: _Sizing, tuned: bool, stored: bool, key: str) -> Attempt:
    """Chunks of `sizing.size`, halved (`smaller`) until the compiled peak fits the budget
    and XLA's temporaries do not "jump"; on a CPU, sized once more from the first compiled
    chunk's temporaries where the jaxpr's bound was far off."""
    config, problem = current(), call.problem
    while True:
        size = sizing.size
        if not sizing.requested and one_chunk_runs_whole(problem, size):
            whole = _whole_instead(call, tuned, stored, key)
            if whole is not None:
                return whole
        request = call.request("chunked", sizing.loop, size, segmented=tuned)
        exe = _compile(call.jax_fn, problem, request, stored=stored)
        expected = size * (sizing.per_item_temp + problem.per_item_bytes)
        jumped = (  # a smaller chunk may avoid the jump; at one draw there is none
            exe is not None
            and not sizing.requested
            and size > 1
            and exe.temp_bytes > config.jump_factor * expected + config.jump_slack_bytes
        )
        if exe is not None and exe.peak_bytes <= call.limit and not jumped:
            if _refine(call, sizing, exe):
                release(exe)
                continue
            reason = (
                f"Chunks of {size} draws ({sizing.why}): {mib(exe.temp_bytes)} of temporaries, "
                f"{mib(exe.peak_bytes)} in all, within {budget_text(call.budget)}."
            )
            plan = call.plan(exe, "chunked", reason, sizing.source)
            tuner = Tuner(exe, _candidate_compiler(call, exe), key) if tuned else None
            return Attempt(plan, exe, tuner)
        if size == 1:
            raise _one_draw_error(exe, problem, call.limit)
        if exe is None:
            sizing.why = f"compiling at {size} ran out of device memory; halved"
        elif jumped:
            sizing.why = f"XLA's temporaries jumped to {mib(exe.temp_bytes)} at {size}; halved"
        else:
            sizing.why = "halved until the compiled peak fits the budget"
        release(exe)
        sizing.size = smaller(problem.n_local, size)


def one_chunk_runs_whole(problem: Problem, size: int | None) -> bool:
    """Whether a plan of chunks of `size` runs as the loop-free program instead.

    Invariant: off a CPU, `auto` never plans a loop of one chunk. That chunk computes what the
    loop-free vmap computes, and then writes it row by row into the outputs at each draw's
    (chain, draw) (`_program._write_for`): on a TPU v5e a 1.6 GB deterministic took 0.098 s
    warm so, against 0.0039 s loop-free (docs/strategies.md). On a CPU the chunk is written
    through a free flat view, and the loop is kept.
    """
    return size is not None and size >= problem.n_local and problem.device.platform != "cpu"


def _whole_instead(call: _Call, tuned: bool, stored: bool, key: str) -> Attempt | None:
    """The loop-free vmap where one chunk would cover every draw (`one_chunk_runs_whole`),
    if its compiled peak fits the budget; else None."""
    request = call.request("vmap", Loop.NONE, None)
    whole = _compile(call.jax_fn, call.problem, request, stored=stored)
    if whole is None or whole.peak_bytes > call.limit:
        release(whole)
        return None
    reason = (
        f"No loop: one chunk would hold all {call.problem.n_local} draws, and the loop-free "
        f"program writes its outputs directly; {mib(whole.peak_bytes)} per device in all, "
        f"within {budget_text(call.budget)}."
    )
    if tuned:
        _tuning.store(key, {"loop": Loop.NONE.value, "chunk_size": None, "why": "one chunk"})
    return Attempt(call.plan(whole, "vmap", reason, "rule"), whole)


def _refine(call: _Call, sizing: _Sizing, exe: Executable) -> bool:
    """On a CPU, once, for a size the rule chose: size again from this chunk's compiled
    temporaries (the jaxpr's bound may be far off: XLA fuses gathers), and take that size
    if it moves `refine_ratio` times or more (a second compile costs more than a size
    within that of the best). True where `sizing` now holds a new size to compile."""
    problem = call.problem
    if sizing.requested or sizing.refined or problem.device.platform != "cpu":
        return False
    sizing.refined = True
    size, ratio = sizing.size, current().refine_ratio
    measured = exe.temp_bytes / size
    better, better_why = _rule_chunk(problem, sizing.loop, measured, call.budget)
    if size / ratio < better < size * ratio:
        return False
    sizing.size, sizing.per_item_temp = better, measured
    sizing.why = better_why + " (from the compiled temporaries per draw)"
    return True


def _one_draw_error(exe: Executable | None, problem: Problem, limit: float) -> MemoryError:
    if exe is None:
        return MemoryError(
            "Compiling even one draw at a time ran out of device memory (XLA's GPU "
            "autotuner allocates buffers of the chunk's size). Nothing was run; the "
            "draws are untouched. Free device memory, or post-process on the CPU "
            "(`postprocessing_backend='cpu'`)."
        )
    return MemoryError(
        f"Even one draw at a time needs {mib(exe.peak_bytes)} (outputs "
        f"{mib(problem.output_bytes // problem.n_shards)} plus XLA temporaries), over "
        f"the memory budget of {mib(limit)}. Nothing was run; the draws are untouched."
    )


def _candidate_compiler(call: _Call, first: Executable) -> CompileCandidate:
    """How the tuner compiles a candidate: `first`'s program at another size (or without
    library fusions), from and to the on-disk store, None where its compiled peak exceeds
    the budget."""

    def compile_candidate(size: int, library_fusions: bool) -> Executable | None:
        request = dataclasses.replace(
            first.request, chunk_size=size, library_fusions=library_fusions
        )
        exe = _compile(call.jax_fn, call.problem, request, stored=True)
        if exe is None or exe.peak_bytes > call.limit:
            release(exe)
            return None
        return exe

    return compile_candidate


#: What a plan says of an executable that this process did not compile.
_ORIGIN_TEXT = {
    Origin.LOADED: "loaded from disk",
    Origin.MOVED: "moved from another device",
}


def _cached_entry(entry: dict[str, Any], problem: Problem) -> tuple[Loop, int | None, bool] | None:
    """The tuning cache's (loop, chunk size, library fusions), if `entry` is whole and makes
    sense for `problem`."""
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
    if one_chunk_runs_whole(problem, size):
        return Loop.NONE, None, True
    return loop, size, library


def _from_cache(call: _Call, key: str) -> Attempt | None:
    """The tuning cache's plan for the call, if it has one that fits today's budget."""
    problem = call.problem
    entry = _tuning.load(key)
    parsed = None if entry is None else _cached_entry(entry, problem)
    if entry is None or parsed is None:
        return None
    loop, size, library = parsed
    strategy = "vmap" if loop is Loop.NONE else "chunked"
    # The same executable the tuned run had (its segments cost one dispatch more).
    request = call.request(strategy, loop, size, segmented=True, library_fusions=library)
    try:
        exe = _compile(call.jax_fn, problem, request, stored=True)
    except jax.errors.JaxRuntimeError:
        if library:
            raise
        return None  # this XLA no longer knows the option: plan afresh
    if exe is None or exe.peak_bytes > call.limit:
        release(exe)
        return None
    what = "No loop" if size is None else f"Chunks of {size} draws"
    reason = (
        f"{what}, from the tuning cache ({entry.get('why', 'measured before')}"
        + (f"; its executable {_ORIGIN_TEXT[exe.origin]}" if exe.origin in _ORIGIN_TEXT else "")
        + f"): {mib(exe.peak_bytes)} in all, within {budget_text(call.budget)}."
    )
    return Attempt(call.plan(exe, strategy, reason, "cache"), exe)


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
        if size == tuner.best and step.library_fusions == tuner.library_fusions:
            persist(step)
        else:
            release(step)
    rates = tuner.seconds_per_draw
    library = tuner.library.reason()
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
    ) + f"; {mib(tuner.peak_bytes)} in all, within {budget_text(plan.budget_bytes)}."
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
    call = _Call(jax_fn, problem, budget, tuple(donate), progress, time.perf_counter())
    if failed is not None and failed.tuner is not None:
        failed.tuner.abandon()
    foreign = _foreign_failure(failed, error)
    if failed is not None and foreign is not None:
        here = _compiled_here(call, failed, foreign, error, lost)
        if here is not None:
            return here
        # Compiling here ran out of memory: the memory policy below goes on from its plan.
    return _smaller_attempt(call, failed, failed_strategy, error, lost)


def _compiled_here(
    call: _Call, failed: Attempt, foreign: Origin, error: Exception, lost: Sequence[int]
) -> Attempt | None:
    """The failed plan compiled here, after an executable from `foreign` failed to run (one
    loaded from the store is replaced there); None where compiling it ran out of memory."""
    origin = _ORIGIN_TEXT[foreign]
    distrust_foreign()
    if lost:
        raise RuntimeError(
            f"Post-processing failed in an executable {origin} ({error}), and inputs "
            f"{list(lost)} had been donated to it and are lost."
        ) from error
    failed_exe, size = failed.exe, failed.exe.chunk_size
    request = call.request(
        failed_exe.strategy,
        failed_exe.loop,
        size,
        output_memory=failed_exe.output_memory,
        segmented=failed_exe.segments,
        lanes=failed_exe.request.lanes,
    )
    replace = foreign is Origin.LOADED
    exe = _compile(call.jax_fn, call.problem, request, stored=replace)
    done = "compiling it here ran out of memory" if exe is None else "compiled it here"
    if exe is not None and replace:
        done += " and stored it in place of the one that failed"
    warn(f"An executable {origin} failed to run ({error}); {done}. The draws are intact.")
    if exe is None:
        return None
    what = "No loop" if size is None else f"Chunks of {size} draws"
    reason = f"{what}, as planned, compiled here: the executable {origin} failed to run."
    plan = _make_plan(call.problem, call.budget, exe, failed.plan.strategy, reason, "retry")
    return Attempt(plan, exe)


def _smaller_attempt(
    call: _Call,
    failed: Attempt | None,
    failed_strategy: str,
    error: Exception,
    lost: Sequence[int],
) -> Attempt:
    """The out-of-memory policy: the failed chunk halved, in the loop it had."""
    problem, n = call.problem, call.problem.n_local
    if failed is not None:
        current_size = failed.exe.chunk_size or _effective_chunk(problem, failed.exe.strategy)
        loop = failed.exe.loop
    else:  # a fixed strategy that ran out while compiling
        current_size = _effective_chunk(problem, failed_strategy)
        loop = Loop.NONE
    if loop is Loop.NONE:  # a plan without a loop of ours: the planner's loop for chunks
        loop = loop_for(problem)
    host = failed is not None and failed.exe.output_memory in ("host", "disk")
    _check_retry(problem, failed_strategy, current_size, error, lost, host)
    size = smaller(n, current_size)
    warn(
        f"Post-processing ran out of memory with {failed_strategy!r} at {current_size} "
        f"draw(s) per chunk; retrying with chunks of {size}. The draws are intact."
    )
    while True:
        if host:
            lanes = failed.exe.request.lanes if failed is not None else 1
            where = failed.exe.output_memory if failed is not None else "host"
            request = _host_request(call, size, lanes, where)
        else:
            request = call.request("chunked", loop, size)
        exe = _compile(call.jax_fn, problem, request)
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
    return Attempt(_make_plan(problem, call.budget, exe, "chunked", reason, "retry"), exe)


def _check_retry(
    problem: Problem,
    failed_strategy: str,
    size: int,
    error: Exception,
    lost: Sequence[int],
    host: bool,
) -> None:
    """Raise `MemoryError` where smaller chunks cannot help: the device has less free than
    the outputs alone need, the chunk was one draw, or donated draws were lost."""
    free = free_bytes(problem.device)
    needed = 0 if host else problem.output_bytes // problem.n_shards
    if not lost and free is not None and free < needed:
        raise MemoryError(
            f"Post-processing ran out of memory with {failed_strategy!r} at {size} draw(s) "
            f"per chunk, and smaller chunks cannot help: the outputs alone need "
            f"{mib(needed)} and {problem.device} has {mib(free)} free. The raw draws are "
            "intact: free device memory (delete arrays you no longer need), or post-process "
            "on the CPU (`postprocessing_backend='cpu'`)."
        ) from error
    if lost or size <= 1:
        raise MemoryError(
            f"Post-processing ran out of memory with {failed_strategy!r} at "
            f"{size} draw(s) per chunk ({error}). "
            + (
                f"Inputs {list(lost)} were donated and are lost."
                if lost
                else "The raw draws are intact: pass a larger `memory_budget` after "
                "freeing memory, or post-process on the CPU "
                "(`postprocessing_backend='cpu'`)."
            )
        ) from error


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


def stored_plan(problem: Problem) -> Plan:
    """The plan of a call resumed on a complete store: nothing to compute or compile."""
    return Plan(
        strategy="chunked",
        chunk_size=None,
        n_chunks=None,
        output_bytes=problem.output_bytes,
        peak_bytes=0,
        budget_bytes=None,
        reason="The store at the output path was complete: nothing was computed.",
        loop=Loop.HOST,
        source="requested",
        output_memory="disk",
    )
