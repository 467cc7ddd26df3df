"""The first attempt with the outputs in device memory: a fixed strategy as requested, or, for
`auto` and `chunked`, the search for the chunk from evidence.

In the order `first_attempt` (`_planner`) tries them: the tuning cache's plan (`from_cache`,
`auto` alone), the loop-free vmap judged by its compiled analysis (`vmap_attempt`), then
chunks of the rule's size halved until their compiled peak fits the budget and XLA's
temporaries do not jump, sized once more on a CPU from the compiled temporaries
(`sized_attempt`); for `auto`, with the online tuner and the candidates it compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ..._support.config import current
from ..._support.messages import budget_text, mib
from ..data.problem import Problem
from ..data.types import Loop
from ..execute import executor as _executor
from ..execute.executor import Executable, release
from . import tuning as _tuning
from .attempt import ORIGIN_TEXT, Attempt, Call, make_plan, try_compile
from .sizing import one_chunk_runs_whole, rule_chunk, smaller
from .tuner import CompileCandidate, Tuner

__all__ = ["Sizing", "fixed_attempt", "from_cache", "sized_attempt", "vmap_attempt"]


def fixed_attempt(call: Call, strategy: str) -> Attempt:
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
    return Attempt(make_plan(call.problem, budget, exe, strategy, reason, "requested"), exe)


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


def from_cache(call: Call, key: str) -> Attempt | None:
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
        exe = try_compile(call.jax_fn, problem, request, stored=True)
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
        + (f"; its executable {ORIGIN_TEXT[exe.origin]}" if exe.origin in ORIGIN_TEXT else "")
        + f"): {mib(exe.peak_bytes)} in all, within {budget_text(call.budget)}."
    )
    return Attempt(call.plan(exe, strategy, reason, "cache"), exe)


def vmap_attempt(
    call: Call, key: str, stored: bool, per_item_temp: float
) -> tuple[Attempt | None, float]:
    """The loop-free vmap, if its compiled temporaries come under `vmap_temp_bytes` and its
    peak under `comfort_fraction` of the budget; else None, and the compiled temporaries per
    draw (which overrule the jaxpr's bound) where it compiled."""
    config, problem = current(), call.problem
    request = call.request("vmap", Loop.NONE, None)
    whole = try_compile(call.jax_fn, problem, request, stored=stored)
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
class Sizing:
    """Where the chunk-size search stands: the size to compile next, and why."""

    loop: Loop
    size: int
    why: str
    source: str
    per_item_temp: float
    requested: bool  # the caller named the size: no jump check, no refinement
    refined: bool = False


def sized_attempt(call: Call, sizing: Sizing, tuned: bool, stored: bool, key: str) -> Attempt:
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
        exe = try_compile(call.jax_fn, problem, request, stored=stored)
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


def _whole_instead(call: Call, tuned: bool, stored: bool, key: str) -> Attempt | None:
    """The loop-free vmap where one chunk would cover every draw (`one_chunk_runs_whole`),
    if its compiled peak fits the budget; else None."""
    request = call.request("vmap", Loop.NONE, None)
    whole = try_compile(call.jax_fn, call.problem, request, stored=stored)
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


def _refine(call: Call, sizing: Sizing, exe: Executable) -> bool:
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
    better, better_why = rule_chunk(problem, sizing.loop, measured, call.budget)
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


def _candidate_compiler(call: Call, first: Executable) -> CompileCandidate:
    """How the tuner compiles a candidate: `first`'s program at another size (or without
    library fusions), from and to the on-disk store, None where its compiled peak exceeds
    the budget."""

    def compile_candidate(size: int, library_fusions: bool) -> Executable | None:
        request = dataclasses.replace(
            first.request, chunk_size=size, library_fusions=library_fusions
        )
        exe = try_compile(call.jax_fn, call.problem, request, stored=True)
        if exe is None or exe.peak_bytes > call.limit:
            release(exe)
            return None
        return exe

    return compile_candidate
