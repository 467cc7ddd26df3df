"""What every step of planning shares: an `Attempt` (a plan and its executable), the `Call`
being planned, the `Plan` of an executable (`make_plan`), and the one way the planner
compiles (`try_compile`: None where compiling ran out of device memory).

The first attempt (`_device`, `_host`), the retry (`_retry`) and the entry points
(`_planner`) all build on these. Of this folder, the module imports only the call's facts
(`facts`), the size rules (`sizing`) and the tuner (`tuner`), so that every step may import
it without a cycle.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from ..data.problem import Problem
from ..data.types import Loop, Origin, Plan
from ..execute import executor as _executor
from ..execute.executor import CompileOutOfMemory, Executable
from ..execute.program import Request
from .facts import CallFacts
from .sizing import vector_width
from .tuner import Tuner

__all__ = ["ORIGIN_TEXT", "Attempt", "Call", "make_plan", "try_compile"]


@dataclasses.dataclass
class Attempt:
    """One try at a call: the plan, its executable, and the tuner that may change its size."""

    plan: Plan
    exe: Executable
    tuner: Tuner | None = None


@dataclasses.dataclass(frozen=True)
class Call:
    """What every step of planning one call reads: the call's facts, and what it runs."""

    jax_fn: Callable
    facts: CallFacts
    donate: tuple[int, ...]
    progress: bool
    tic: float

    @property
    def problem(self) -> Problem:
        return self.facts.problem

    @property
    def budget(self) -> int | None:
        return self.facts.budget.value

    @property
    def limit(self) -> float:
        return math.inf if self.budget is None else self.budget

    def request(self, strategy: str, loop: Loop, size: int | None, **options: Any) -> Request:
        options.setdefault("vector_width", vector_width(self.problem))
        return Request(strategy, loop, size, self.donate, self.progress, **options)

    def plan(self, exe: Executable, strategy: str, reason: str, source: str) -> Plan:
        """The plan of `exe`, timed from the start of planning."""
        seconds = time.perf_counter() - self.tic
        return make_plan(self.problem, self.budget, exe, strategy, reason, source, seconds)


def make_plan(
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


def try_compile(
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


#: What a plan says of an executable that this process did not compile.
ORIGIN_TEXT = {
    Origin.LOADED: "loaded from disk",
    Origin.MOVED: "moved from another device",
}
