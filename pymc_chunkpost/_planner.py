"""`auto`: choose a strategy and chunk size under a memory budget.

The planner reads XLA's own `memory_analysis()` of compiled candidates: it never guesses what
XLA will allocate. Every candidate it compiles is kept in the executable cache, so the plan
that wins is not compiled twice, and the compile seconds it spent are reported in the `Plan`.

How it chooses (measured on a 2-core x86 CPU; see docs/strategies.md):

1. No loop when the loop-free computation (`vmap`) has small temporaries (under 64 MiB)
   and fits the budget.
   It compiles fastest (XLA can take minutes to compile a loop around a large per-draw
   function) and runs fastest when its working set is small.
2. Otherwise chunks of the flattened chain x draw axis, sized so that one chunk's working set
   (its temporaries, inputs and outputs) stays near `TARGET_CHUNK_BYTES`, less the data that
   every draw reads (`Problem.shared_bytes`), which shares the cache: vectorised enough
   to amortise the per-iteration cost, small enough to stay in cache and to keep XLA's
   temporaries (which jump with the chunk size) small. Chunk sizes that divide chains x draws
   are preferred: they need no remainder step, so the per-draw function is compiled once.
3. The chosen executable's compiled peak (outputs + temporaries - donated aliases) must fit
   the budget; if not, the chunk is halved, down to 1. A budget that cannot hold the outputs
   raises `MemoryError` before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ._chunked import resolve_chunk_size
from ._executable import HOST_CHUNKED, Executable, Problem, executable, is_out_of_memory
from ._memory import free_bytes

__all__ = ["Plan", "make_plan", "plan_problem", "TARGET_CHUNK_BYTES", "SMALL_TEMP_BYTES"]

#: Loop-free `vmap` is chosen when its temporaries stay under this (and the budget allows):
#: below it, a loop's extra compile time costs more than the temporaries do (measured on
#: the fixtures in docs/strategies.md: 25 MiB of temporaries cost ~0.01 s, a loop ~0.3 s of
#: compiling; 140 MiB and more cost seconds).
SMALL_TEMP_BYTES = 64 * 2**20
#: Per-iteration cost of a loop, per buffer it slices or updates, in bytes of work that take
#: as long (measured: about 1.5 us per buffer per iteration on a 2-core x86 CPU).
OVERHEAD_BYTES_PER_BUFFER = 64 * 2**10
#: `auto` drives chunks from a host loop when the loop body has more buffers (inputs plus
#: computed outputs) than this: XLA's CPU compile time of a loop grows steeply with them
#: (jax 0.12, 16 draws per chunk: 0.9 s at 33 buffers, 3 s at 97, 146 s at 401), while one
#: straight-line chunk step compiles like the loop-free vmap (0.7 s at 401).
HOST_LOOP_MIN_BUFFERS = 48
#: A host loop runs at most this many chunks (each costs a dispatch, ~1 ms at 400 buffers).
HOST_LOOP_MAX_CHUNKS = 64
#: A compiled chunk whose temporaries exceed this many times the estimate is a "jump" (XLA
#: changed its layout or fusion at that size): the planner tries a smaller chunk.
JUMP_FACTOR = 4


def cache_bytes() -> int:
    """The CPU's L2 cache size per core, from sysfs (2 MiB where it cannot be read)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        scale = {"K": 2**10, "M": 2**20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return 2 * 2**20


#: One chunk's working set that the planner aims for on a CPU: twice the L2 cache of a core.
#: Measured (docs/strategies.md): on a 2 MiB-L2 CPU the fastest chunks held 2.5-4 MiB; chunks
#: of one or two draws ran 20-40% slower, chunks of 32+ draws 10-40% slower.
TARGET_CHUNK_BYTES = 2 * cache_bytes()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `auto` runs, and why.

    Attributes:
        strategy: the strategy name ("vmap" or "chunked", or as forced by the caller).
        chunk_size: draws per chunk of the flattened chain x draw axis; None without chunks.
        n_chunks: chunk evaluations (the last one may be smaller); None without chunks.
        output_bytes: bytes of the outputs that must be allocated (pass-through outputs
            such as untransformed variables reuse the input arrays and are not counted).
        peak_bytes: predicted new memory at the peak: XLA's compiled outputs plus
            temporaries, less outputs written into donated inputs.
        budget_bytes: the memory budget the plan was made for.
        reason: one readable sentence.
        compile_seconds: XLA compile time of the chosen executable.
        planning_seconds: wall time of planning, all compiles of candidates included.
        loop: how chunks are driven: "xla" (one compiled loop), "host" (a Python loop over
            one compiled chunk step, for models with many variables, whose XLA loops take
            minutes to compile), or None without chunks.
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
    loop: str | None = None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_budget(problem: Problem, budget: int | None) -> None:
    """Raise `MemoryError` if `budget` cannot even hold the outputs (None: no known limit)."""
    if budget is not None and problem.output_bytes > budget:
        raise MemoryError(
            f"Post-processing needs at least {_mib(problem.output_bytes)} for its outputs "
            f"({problem.chains} chains x {problem.draws} draws), but the memory budget is "
            f"{_mib(budget)}. Free memory, raise `memory_budget`, post-process fewer variables "
            "(`var_names`), or thin the draws. Nothing was run; the draws are untouched."
        )


def check_budget_value(memory_budget: Any, name: str = "memory_budget") -> None:
    """Raise `ValueError` unless `memory_budget` is None or a positive number of bytes."""
    if memory_budget is None:
        return
    if (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, int | float)
        or not memory_budget > 0
    ):
        raise ValueError(
            f"`{name}` must be a positive number of bytes, got {memory_budget!r}. "
            "Pass None to use the device's free memory."
        )


def resolve_budget(problem: Problem, memory_budget: int | None) -> int | None:
    """The budget in bytes: `memory_budget`, or the device's free memory if None.

    None when the device cannot say what it has free (an accelerator whose allocator keeps no
    statistics, such as `XLA_PYTHON_CLIENT_ALLOCATOR=platform`): the plan then has no limit,
    and the out-of-memory retry is what keeps the draws safe. A warning says so.
    """
    check_budget_value(memory_budget)
    if memory_budget is not None:
        return int(memory_budget)
    free = free_bytes(problem.device)
    if free is None:
        warnings.warn(
            f"{problem.device} reports no memory statistics (as with "
            "`XLA_PYTHON_CLIENT_ALLOCATOR=platform`), so its free memory is unknown: planning "
            "without a memory limit, with the out-of-memory retry as the safety net. Pass "
            "`memory_budget` (bytes) to plan under a limit.",
            RuntimeWarning,
            stacklevel=3,
        )
    return free


def wants_host_loop(problem: Problem) -> bool:
    """Whether chunks of `problem` should be driven from the host (see HOST_LOOP_MIN_BUFFERS)."""
    return len(problem.in_specs) + len(problem.computed) > HOST_LOOP_MIN_BUFFERS


def _budget_text(budget: int | None) -> str:
    return "no known memory limit" if budget is None else f"the budget of {_mib(budget)}"


def _divisor_near(n: int, target: int) -> int:
    """The divisor of `n` nearest to `target` within [target/2, target]; else `target`."""
    target = max(1, min(target, n))
    for size in range(target, max(target // 2, 1) - 1, -1):
        if n % size == 0:
            return size
    return target


def make_plan(
    problem: Problem,
    budget: int | None,
    exe: Executable,
    strategy: str,
    size: int | None,
    reason: str,
    planning_seconds: float = 0.0,
) -> Plan:
    """The `Plan` that running `exe` (compiled for `strategy` at `size`) amounts to."""
    chunks = None if size is None else -(-problem.n_items // size)
    loop = None if size is None else ("host" if exe.strategy == HOST_CHUNKED else "xla")
    return Plan(
        strategy=strategy,
        chunk_size=size,
        n_chunks=chunks,
        output_bytes=problem.output_bytes,
        peak_bytes=exe.peak_bytes,
        budget_bytes=budget,
        reason=reason,
        compile_seconds=exe.compile_seconds,
        planning_seconds=planning_seconds,
        loop=loop,
    )


def _fast_chunk_size(problem: Problem, per_item_temp: float, budget: int | None) -> tuple[int, str]:
    """The chunk size that should run fastest, and why."""
    n = problem.n_items
    per_item = problem.per_item_bytes + per_item_temp
    if budget is None:
        fits = n
    else:
        room = max(budget - problem.output_bytes, 0)
        fits = max(1, int(room // max(per_item, 1)))
    if problem.device.platform != "cpu":
        # Accelerators want wide chunks: take half the room left after the outputs (the
        # other half leaves room for XLA's GPU autotuner, which allocates while compiling).
        if budget is None:
            return max(1, n // 2), "half the draws, as the free memory is unknown"
        return max(1, min(n, fits // 2)), "half the memory left after the outputs"
    n_buffers = len(problem.in_specs) + len(problem.computed)
    # The data every draw reads (a design matrix) shares the cache with the chunk's own
    # buffers; the chunk keeps at least half of the target.
    room = max(TARGET_CHUNK_BYTES - problem.shared_bytes, TARGET_CHUNK_BYTES // 2)
    cache_size = int(room // max(per_item, 1))
    overhead_size = -(-n_buffers * OVERHEAD_BYTES_PER_BUFFER // max(int(per_item), 1))
    size = min(max(cache_size, overhead_size, 1), fits, n)
    if overhead_size > cache_size:
        why = f"enough work per chunk to amortise the loop's cost over {n_buffers} buffers"
    elif problem.shared_bytes:
        why = (
            f"a working set near {_mib(room)} per chunk: twice the L2 cache, less the "
            f"{_mib(problem.shared_bytes)} of data that every draw reads"
            + (", keeping half the cache for the chunk" if room == TARGET_CHUNK_BYTES // 2 else "")
        )
    else:
        why = f"a working set near {_mib(TARGET_CHUNK_BYTES)} per chunk (twice the L2 cache)"
    return size, why


def plan_problem(
    problem: Problem,
    budget: int | None,
    *,
    donate: Sequence[int] = (),
    progress: bool = False,
    force_chunked: bool = False,
    chunk_size: int | None = None,
) -> tuple[Plan, Executable]:
    """Plan `problem` under `budget` bytes; returns the plan and its compiled executable.

    Compiles one candidate in the common case: the loop-free vmap when the jaxpr says its
    temporaries are small, else one chunked loop. Further compiles happen only when XLA's
    memory analysis of a candidate shows a temporary "jump" or a peak over the budget.

    Args:
        problem: the shapes to plan for.
        budget: bytes available for the outputs and temporaries; None: no known limit.
        donate: input indices that will be donated (they change XLA's aliasing).
        progress: compile with the progress callback.
        force_chunked: skip the loop-free candidate (the caller asked for "chunked").
        chunk_size: start from this chunk size instead of the planner's choice.
    """
    tic = time.perf_counter()
    check_budget(problem, budget)
    limit = math.inf if budget is None else budget
    n = problem.n_items
    n_buffers = len(problem.in_specs) + len(problem.computed)
    host_loop = not force_chunked and wants_host_loop(problem)
    per_item_temp = float(problem.intermediate_bytes)
    small = SMALL_TEMP_BYTES
    if not force_chunked and chunk_size is None and n * per_item_temp <= small:
        whole = _compile(problem, "vmap", None, donate, progress)
        if whole is not None and whole.peak_bytes <= limit and whole.temp_bytes <= small:
            reason = (
                f"No loop: the loop-free vmap needs {_mib(whole.temp_bytes)} of temporaries "
                f"and {_mib(whole.peak_bytes)} in all, within {_budget_text(budget)}."
            )
            elapsed = time.perf_counter() - tic
            return make_plan(problem, budget, whole, "vmap", None, reason, elapsed), whole
        if whole is not None:
            per_item_temp = max(per_item_temp, whole.temp_bytes / max(n, 1))
    if chunk_size is None:
        size, why = _fast_chunk_size(problem, per_item_temp, budget)
        if host_loop:
            size = max(size, -(-n // HOST_LOOP_MAX_CHUNKS))
            why += (
                f"; a host loop of at most {HOST_LOOP_MAX_CHUNKS} chunks over {n_buffers} buffers"
            )
        size = _divisor_near(n, size)
    else:
        size, why = resolve_chunk_size(n, chunk_size, None), "the requested chunk size"
    while True:
        # One chunk of every draw is the loop-free vmap (a loop of one step compiles slower).
        whole = size >= n and not force_chunked and not host_loop
        strategy = "vmap" if whole else HOST_CHUNKED if host_loop else "chunked"
        exe = _compile(problem, strategy, None if whole else size, donate, progress)
        expected = size * (per_item_temp + problem.per_item_bytes)
        jumped = (  # a smaller chunk may avoid the jump; at one draw there is none
            exe is not None
            and chunk_size is None
            and size > 1
            and exe.temp_bytes > JUMP_FACTOR * expected + 2**24
        )
        if exe is not None and exe.peak_bytes <= limit and not jumped:
            what = (
                f"No loop, every draw at once ({why})"
                if whole
                else f"Chunks of {size} draws ({why})"
            )
            reason = (
                f"{what}: {_mib(exe.temp_bytes)} of temporaries, "
                f"{_mib(exe.peak_bytes)} in all, within {_budget_text(budget)}."
            )
            elapsed = time.perf_counter() - tic
            if whole:
                return make_plan(problem, budget, exe, "vmap", None, reason, elapsed), exe
            return make_plan(problem, budget, exe, "chunked", size, reason, elapsed), exe
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
                f"{_mib(problem.output_bytes)} plus XLA temporaries), over the memory budget "
                f"of {_mib(limit)}. Nothing was run; the draws are untouched."
            )
        if exe is None:
            why = f"compiling at {size} ran out of device memory; halved"
        elif jumped:
            why = f"XLA's temporaries jumped to {_mib(exe.temp_bytes)} at {size}; halved"
        else:
            why = "halved until the compiled peak fits the budget"
        size = _divisor_near(n, size // 2)


def _compile(problem, strategy, size, donate, progress) -> Executable | None:
    """`executable(...)`, or None if compiling ran out of device memory.

    On a GPU, XLA's autotuner runs candidate kernels on buffers of the chunk's real size while
    compiling, so a large chunk can fail to compile where a smaller one fits.
    """
    try:
        return executable(problem, strategy, size, donate, progress)
    except jax.errors.JaxRuntimeError as error:
        if is_out_of_memory(error):
            return None
        raise


def plan(
    jax_fn: Callable,
    raw_mcmc_samples: Sequence,
    postprocessing_backend: str | None = None,
    *,
    memory_budget: int | None = None,
) -> Plan:
    """The plan that `postprocess_samples(..., "auto")` would run; compiles, runs nothing.

    Args:
        jax_fn: as for `postprocess_samples`.
        raw_mcmc_samples: as for `postprocess_samples` (only shapes and dtypes are read).
        postprocessing_backend: None, "cpu" or "gpu".
        memory_budget: bytes for outputs and temporaries; None means the device's free memory
            (available RAM on a CPU, the pool left after preallocation on a GPU).

    Returns:
        A `Plan`. Its compiled executable is cached: running the plan without donation
        costs no second compile.

    Raises:
        ValueError: for bad input (see `postprocess_samples`).
        MemoryError: if the budget cannot hold the outputs.
    """
    from ._postprocess import _validate  # the one validation path

    problem, _ = _validate(
        jax_fn, raw_mcmc_samples, postprocessing_backend, "auto", None, None, memory_budget
    )
    budget = resolve_budget(problem, memory_budget)
    return plan_problem(problem, budget)[0]
