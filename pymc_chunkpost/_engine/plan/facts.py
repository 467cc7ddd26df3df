"""One call's facts, each with why: where it runs, the budget, where the outputs live, the
lanes, whether XLA takes donated draws, host memory's room and the device's free memory.

`where_it_runs` puts a call on the devices it runs on; once the draws are there, `gather` asks
`resources`' rules every other question of the call, once, before any work; the planner then
reads the answers from `CallFacts` and asks the machine nothing. The free memories
(`host_room`, `device_free`) are read the first time a plan needs them, within the call's one
reading of the machine (`memory.one_reading`). After an out-of-memory failure, `read_again`
(after `memory.read_again`) gives facts whose free memories are read anew: the retry policy
plans from those.

Invariant: `CallFacts` is frozen (its free memories read once each), and every decision of a
call about resources is one of its facts; a plan that reads a fact reads it here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Generic, TypeVar

import jax

from ..._support.memory import free_bytes, host_budget_setting
from ..data.problem import Problem
from ..kernels.strategies import CHUNK_STRATEGIES
from . import resources

__all__ = ["CallFacts", "Fact", "gather", "where_it_runs", "xla_may_donate"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Fact(Generic[T]):
    """A fact of the call and why it holds."""

    value: T
    why: str


@dataclasses.dataclass(frozen=True)
class CallFacts:
    """What one call may use and where it runs, read once (`gather`)."""

    problem: Problem  # on the devices it runs on: its `placement` says which, and why
    budget: Fact[int | None]  # bytes per device for outputs and temporaries; None: no limit
    output_memory: Fact[str]  # "device", "host" or "disk"
    lanes: Fact[int]  # host threads streaming chunks at once
    donation: Fact[bool]  # whether XLA itself takes donated draws (else: freed after success)
    # Outputs in host memory are the planner's choice on a CPU (lanes), not the caller's:
    # there host memory is the device's own, so they count in its budget and come back as
    # `jax.Array`s on the device.
    host_is_the_device: bool

    @functools.cached_property
    def host_room(self) -> Fact[int]:
        """Host bytes the call may take beyond `host_margin_bytes` (may be negative): none
        kept under the user's own host budget, which already says what our calls may take."""
        own = host_budget_setting() is not None
        why = "the host budget" if own else "the host's available memory, less the margin"
        return Fact(resources.host_room(), why)

    @functools.cached_property
    def device_free(self) -> Fact[int | None]:
        """The device's free bytes; None where it cannot say."""
        free = free_bytes(self.problem.device)
        return Fact(free, "the device's memory statistics" if free is not None else "unknown")

    def staging_room(self, disk: bool = False) -> int:
        """Host bytes for the chunks in flight (`resources.host_staging_room`)."""
        return resources.host_staging_room(self.problem, self.host_room.value, disk)

    def host_fits(self, staging: int, disk: bool = False) -> bool:
        """Whether host memory holds the outputs and `staging` (`resources.host_fits`)."""
        return resources.host_fits(self.problem, self.host_room.value, staging, disk)

    def read_again(self) -> CallFacts:
        """The facts after an out-of-memory failure, `memory.read_again` called: the free
        memories read from the machine anew when next needed; the rest is the call's."""
        return dataclasses.replace(self)


def where_it_runs(problem: Problem, strategy: str, *, small_on_host: bool = False) -> Problem:
    """`problem` on the devices it runs on: a planned strategy (`auto`, `chunked`) may spread
    single-device draws over several accelerators (`resources.spread`), or, where
    `small_on_host` (a route whose caller named no device), run small work on the host CPU
    instead of an accelerator (`resources.on_host_if_small`); a fixed strategy runs where
    the draws are."""
    if strategy not in CHUNK_STRATEGIES:
        return problem
    if small_on_host:
        moved = resources.on_host_if_small(problem)
        if moved is not problem:
            return moved
    return resources.spread(problem)


def gather(
    problem: Problem,
    strategy: str,
    *,
    memory_budget: float | None = None,
    output_memory: str = "auto",
    disk: bool = False,
) -> CallFacts:
    """Every fact of a call whose draws are where it runs (`where_it_runs`), asked
    once, before any work.

    A planned strategy (`auto`, `chunked`) chooses where the outputs live
    (`output_memory_for`); a fixed strategy keeps its outputs on the device, and is checked
    only against an explicit `memory_budget`. `disk`: an output path is set.

    Raises:
        ValueError: outputs in host memory or on disk asked where they cannot stream.
        MemoryError: the outputs fit neither the device budget nor host memory.
    """
    planned = strategy in CHUNK_STRATEGIES
    budget: Fact[int | None] = Fact(None, "a fixed strategy, no `memory_budget`: no limit")
    if planned or memory_budget is not None:
        given = memory_budget is not None
        budget = Fact(
            resources.resolve_budget(problem, memory_budget),
            "the `memory_budget` given" if given else "the device's free memory",
        )
    where = Fact("device", "a fixed strategy keeps its outputs on the device")
    if planned:
        where = Fact(*resources.output_memory_for(problem, output_memory, budget.value, disk))
    return CallFacts(
        problem=problem,
        budget=budget,
        output_memory=where,
        lanes=Fact(*resources.lanes_for(problem)),
        donation=_donation(problem),
        host_is_the_device=resources.host_is_the_device(problem, output_memory),
    )


def xla_may_donate(device: jax.Device) -> bool:
    """Whether donated draws may be handed to XLA itself (else: deleted after success).

    On a GPU, XLA deletes donated buffers even when the execution then fails to allocate its
    outputs (docs/memory.md), which would lose the draws that an out-of-memory retry needs.
    There the draws are deleted only after success: the same memory is freed, later. On the
    CPU, running out of memory means the kernel's OOM killer, not an error to retry, so XLA
    takes the donation and outputs reuse the draws' buffers.
    """
    return device.platform == "cpu"


def _donation(problem: Problem) -> Fact[bool]:
    if xla_may_donate(problem.device):
        return Fact(True, "XLA takes the donated draws: the outputs may reuse their buffers")
    return Fact(False, "donated draws are deleted after success: a retry still needs them")
