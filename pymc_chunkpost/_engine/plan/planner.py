"""`auto` and the one retry policy (out of memory; an executable not compiled here that failed to
run): policy only.

The planner decides, from evidence, what to run; `_executor` runs it. Every decision about a
call lives in this folder (the loop kind, the chunk size, what to try after running out of
memory) or, for the devices, the budget and where the outputs go, in `_resources`. Its
heuristics are `PlannerConfig`'s (`_config`), each with its evidence in docs/strategies.md.

This module holds the entry points that `run` (`_postprocess`) calls: `first_attempt`,
`retries` and `next_attempt`, `finished` (and `stored_plan` for a store already complete).
Their steps live below it: the size rules, from the problem alone (`_sizing`); what every
step shares, `Attempt` and `Call` (`_attempt`); the first attempt with the outputs in device
memory (`_device`) or landed in host memory or on disk (`_host`); the retry's steps
(`_retry`).

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
import time
from collections.abc import Callable, Sequence

from ..._support.messages import budget_text, mib
from ..data.problem import Problem, is_out_of_memory
from ..data.types import Loop, Plan
from ..execute.executor import persist, release
from ..kernels.chunked import resolve_chunk_size
from ..kernels.strategies import CHUNK_STRATEGIES
from . import tuning as _tuning
from .attempt import Attempt, Call
from .device import Sizing, fixed_attempt, from_cache, sized_attempt, vmap_attempt
from .facts import CallFacts
from .host import host_output_attempt
from .resources import check_budget
from .retry import compiled_here, foreign_failure, smaller_attempt
from .sizing import loop_for, rule_chunk, vector_width, vmap_may_fit, vmap_may_pay

__all__ = ["finished", "first_attempt", "next_attempt", "retries", "stored_plan"]


def first_attempt(
    jax_fn: Callable,
    facts: CallFacts,
    strategy: str,
    *,
    chunk_size: int | None = None,
    donate: Sequence[int] = (),
    progress: bool = False,
    use_cache: bool = True,
) -> Attempt:
    """The first thing to try for a call.

    Args:
        jax_fn: the per-draw function.
        facts: the call's facts (`gather`): the problem on its devices, the budget, where
            the outputs live, the lanes, host memory's room.
        strategy: the requested strategy; "auto" and "chunked" are planned.
        chunk_size: a requested chunk size (for "auto"/"chunked"), already resolved.
        donate: input indices handed to XLA.
        progress: compile with progress reporting.
        use_cache: read and write the tuning cache ("auto" only).

    Raises:
        MemoryError: the budget cannot hold the outputs, or a fixed strategy's compiled peak
            exceeds an explicit budget; nothing has run.
        CompileOutOfMemory: a fixed strategy ran out of memory while compiling (the retry
            policy's to handle).
    """
    call = Call(jax_fn, facts, tuple(donate), progress, time.perf_counter())
    problem, budget = facts.problem, facts.budget.value
    planned = strategy in CHUNK_STRATEGIES
    if planned:
        where, why_host = facts.output_memory.value, facts.output_memory.why
        if where == "disk":
            return host_output_attempt(call, chunk_size, why_host, disk=True)
        if where == "host":
            held = problem.output_bytes if facts.host_is_the_device else 0
            return host_output_attempt(call, chunk_size, why_host, held)
    check_budget(problem, budget)
    if not planned:
        return fixed_attempt(call, strategy)
    # The tuning cache and the executables stored beside it serve `auto` alone (when the
    # planner chooses the size): a fixed request compiles what it names.
    tuned = strategy == "auto" and chunk_size is None
    width = vector_width(problem)  # timed with other vectors: a key of its own
    tuned_as = "auto|device" + (f"|vectors of {width} bits" if width else "")
    key = _tuning.tuning_key(problem, tuned_as) if tuned else ""
    stored = tuned and use_cache
    if stored:
        cached = from_cache(call, key)
        if cached is not None:
            return cached
    per_item_temp = float(problem.intermediate_bytes)
    if tuned and vmap_may_fit(problem, problem.memory_sharing) and vmap_may_pay(problem):
        whole, per_item_temp = vmap_attempt(call, key, stored, per_item_temp)
        if whole is not None:
            return whole
    loop = loop_for(problem)
    if chunk_size is None:
        size, why = rule_chunk(problem, loop, per_item_temp, budget)
        source = "rule"
    else:
        size, why = resolve_chunk_size(problem.n_local, chunk_size, None), "as requested"
        source = "requested"
    sizing = Sizing(loop, size, why, source, per_item_temp, chunk_size is not None)
    return sized_attempt(call, sizing, tuned, stored, key)


def next_attempt(
    jax_fn: Callable,
    facts: CallFacts,
    failed: Attempt | None,
    failed_strategy: str,
    error: Exception,
    *,
    lost: Sequence[int],
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
    call = Call(jax_fn, facts, tuple(donate), progress, time.perf_counter())
    if failed is not None and failed.tuner is not None:
        failed.tuner.abandon()
    foreign = foreign_failure(failed, error)
    if failed is not None and foreign is not None:
        here = compiled_here(call, failed, foreign, error, lost)
        if here is not None:
            return here
        # Compiling here ran out of memory: the memory policy below goes on from its plan.
    return smaller_attempt(call, failed, failed_strategy, error, lost)


def retries(failed: Attempt | None, error: Exception) -> bool:
    """Whether `next_attempt` has something to try after `error` (raised while compiling or
    running `failed`): out of memory, or an executable that this process did not compile
    failed to run."""
    return is_out_of_memory(error) or foreign_failure(failed, error) is not None


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
