"""One call's facts, gathered once, each with why: where it runs, the budget, host memory's
room, where the outputs live, the lanes, and whether XLA takes donated draws.

`gather` asks the machine and `_resources`' rules every question of a call, once, before any
work (so a bad request fails before the draws move); the planner then reads the answers from
`CallFacts` and asks the machine nothing. After an out-of-memory failure, `read_again` asks
again what the failure may have changed (free device and host memory): the retry policy
plans from those.

Invariant: `CallFacts` is frozen, and every decision of a call about resources is one of its
fields; a plan that reads a fact reads it here.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

import jax

from ..._support.memory import free_bytes, host_budget_setting
from ..data.problem import Placement, Problem
from ..kernels.strategies import CHUNK_STRATEGIES
from .resources import (
    host_fits,
    host_is_the_device,
    host_room,
    host_staging_room,
    lanes_for,
    output_memory_for,
    resolve_budget,
    spread,
)

__all__ = ["CallFacts", "Fact", "gather", "xla_may_donate"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Fact(Generic[T]):
    """A fact of the call and why it holds."""

    value: T
    why: str


@dataclasses.dataclass(frozen=True)
class CallFacts:
    """What one call may use and where it runs, read once (`gather`)."""

    problem: Problem  # on the devices it runs on: `placement` says which, and why
    budget: Fact[int | None]  # bytes per device for outputs and temporaries; None: no limit
    output_memory: Fact[str]  # "device", "host" or "disk"
    lanes: Fact[int]  # host threads streaming chunks at once
    donation: Fact[bool]  # whether XLA itself takes donated draws (else: freed after success)
    host_room: Fact[int]  # host bytes the call may take beyond the margin (may be negative)
    device_free: Fact[int | None]  # the device's free bytes; None where it cannot say
    # Outputs in host memory are the planner's choice on a CPU (lanes), not the caller's:
    # there host memory is the device's own, so they count in its budget and come back as
    # `jax.Array`s on the device.
    host_is_the_device: bool

    @property
    def placement(self) -> Fact[Placement]:
        placement = self.problem.placement
        return Fact(placement, placement.reason or "where the draws are")

    def staging_room(self, disk: bool = False) -> int:
        """Host bytes for the chunks in flight (`resources.host_staging_room`)."""
        return host_staging_room(self.problem, self.host_room.value, disk)

    def host_fits(self, staging: int, disk: bool = False) -> bool:
        """Whether host memory holds the outputs and `staging` (`resources.host_fits`)."""
        return host_fits(self.problem, self.host_room.value, staging, disk)

    def read_again(self) -> CallFacts:
        """The facts after an out-of-memory failure: free device and host memory read from
        the machine again (`memory.read_again` first); the rest is the call's."""
        return dataclasses.replace(
            self, host_room=_host_room(), device_free=_device_free(self.problem)
        )


def gather(
    problem: Problem,
    strategy: str,
    *,
    memory_budget: float | None = None,
    output_memory: str = "auto",
    disk: bool = False,
) -> CallFacts:
    """Every fact of a call, asked once, before any work.

    A planned strategy (`auto`, `chunked`) may spread single-device draws over several
    accelerators (`spread`) and chooses where the outputs live (`output_memory_for`); a fixed
    strategy runs where the draws are, its outputs on the device, and is checked only against
    an explicit `memory_budget`. `disk`: an output path is set.

    Raises:
        ValueError: outputs in host memory or on disk asked where they cannot stream.
        MemoryError: the outputs fit neither the device budget nor host memory.
    """
    planned = strategy in CHUNK_STRATEGIES
    if planned:
        problem = spread(problem)
    budget: Fact[int | None] = Fact(None, "a fixed strategy, no `memory_budget`: no limit")
    if planned or memory_budget is not None:
        given = memory_budget is not None
        budget = Fact(
            resolve_budget(problem, memory_budget),
            "the `memory_budget` given" if given else "the device's free memory",
        )
    lanes = Fact(*lanes_for(problem))
    where = Fact("device", "a fixed strategy keeps its outputs on the device")
    if planned:
        where = Fact(*output_memory_for(problem, output_memory, budget.value, disk))
    return CallFacts(
        problem=problem,
        budget=budget,
        output_memory=where,
        lanes=lanes,
        donation=_donation(problem),
        host_room=_host_room(),
        device_free=_device_free(problem),
        host_is_the_device=host_is_the_device(problem, output_memory),
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


def _host_room() -> Fact[int]:
    own = host_budget_setting() is not None
    why = "the host budget" if own else "the host's available memory, less the margin"
    return Fact(host_room(), why)


def _device_free(problem: Problem) -> Fact[int | None]:
    free = free_bytes(problem.device)
    return Fact(free, "the device's memory statistics" if free is not None else "not reported")
