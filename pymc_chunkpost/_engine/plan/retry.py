"""The one retry policy's steps: what `next_attempt` (`_planner`) tries after a failure.

An executable that this process did not compile that failed to run is compiled here with
the same plan (`compiled_here`; `foreign_failure` says where it came from); after running
out of memory, the chunk that failed is halved in the loop it had (`smaller_attempt`), unless
smaller chunks cannot help (`_check_retry`: then `MemoryError`, with the draws intact).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from ..._support.messages import mib, warn
from ..data.problem import Problem, is_out_of_memory
from ..data.types import Loop, Origin
from ..execute.executor import distrust_foreign
from .attempt import ORIGIN_TEXT, Attempt, Call, make_plan, try_compile
from .facts import CallFacts
from .host import host_request
from .sizing import loop_for, smaller

__all__ = ["compiled_here", "foreign_failure", "smaller_attempt"]


def compiled_here(
    call: Call, failed: Attempt, foreign: Origin, error: Exception, lost: Sequence[int]
) -> Attempt | None:
    """The failed plan compiled here, after an executable from `foreign` failed to run (one
    loaded from the store is replaced there); None where compiling it ran out of memory."""
    origin = ORIGIN_TEXT[foreign]
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
    exe = try_compile(call.jax_fn, call.problem, request, stored=replace)
    done = "compiling it here ran out of memory" if exe is None else "compiled it here"
    if exe is not None and replace:
        done += " and stored it in place of the one that failed"
    warn(f"An executable {origin} failed to run ({error}); {done}. The draws are intact.")
    if exe is None:
        return None
    what = "No loop" if size is None else f"Chunks of {size} draws"
    reason = f"{what}, as planned, compiled here: the executable {origin} failed to run."
    plan = make_plan(call.problem, call.budget, exe, failed.plan.strategy, reason, "retry")
    return Attempt(plan, exe)


def smaller_attempt(
    call: Call,
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
    _check_retry(call.facts, failed_strategy, current_size, error, lost, host)
    size = smaller(n, current_size)
    warn(
        f"Post-processing ran out of memory with {failed_strategy!r} at {current_size} "
        f"draw(s) per chunk; retrying with chunks of {size}. The draws are intact."
    )
    while True:
        if host:
            lanes = failed.exe.request.lanes if failed is not None else 1
            where = failed.exe.output_memory if failed is not None else "host"
            request = host_request(call, size, lanes, where)
        else:
            request = call.request("chunked", loop, size)
        exe = try_compile(call.jax_fn, problem, request)
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
    return Attempt(make_plan(problem, call.budget, exe, "chunked", reason, "retry"), exe)


def _check_retry(
    facts: CallFacts,
    failed_strategy: str,
    size: int,
    error: Exception,
    lost: Sequence[int],
    host: bool,
) -> None:
    """Raise `MemoryError` where smaller chunks cannot help: the device has less free than
    the outputs alone need (free memory as read after the failure), the chunk was one draw,
    or donated draws were lost."""
    problem, free = facts.problem, facts.device_free.value
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


def foreign_failure(failed: Attempt | None, error: Exception) -> Origin | None:
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
