"""The data types that several layers share: how chunks are driven, where an executable came
from, and the `Plan` that a call returns.

They sit below everything that uses them (the planner, the executor, the pymc routes), so
that none of those imports another layer for a type.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["Loop", "Origin", "Plan"]


class Loop(enum.StrEnum):
    """How chunks are driven. The one list of loop kinds."""

    #: No loop of ours: every draw at once (`vmap`), or a fixed strategy's own structure.
    NONE = "none"
    #: One compiled XLA loop over the chunks.
    XLA = "xla"
    #: The host calls one compiled chunk step per chunk (straight-line code: it compiles like
    #: the loop-free vmap, where XLA's loops over many buffers compile for minutes).
    HOST = "host"


class Origin(enum.StrEnum):
    """Where an executable came from. The one list of origins."""

    #: XLA compiled it in this call.
    COMPILED = "compiled"
    #: Loaded from the on-disk store (`_executable_store.load`).
    LOADED = "loaded"
    #: Compiled for another device of its kind, and moved here (`_executor`).
    MOVED = "moved"


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
        output_memory: where the outputs live: "device", "host" or "disk".
        tuning_seconds: seconds per draw measured for each chunk size tried, if tuned
            (of the chunks compiled as `library_fusions` says).
        library_fusions: whether XLA's CPU library fusions were on (the default); False
            where the tuner measured the chunk faster without them.
        lanes: host threads that streamed chunks at once (outputs in host memory; more
            than one for a loop of one-draw programs on a CPU: `_resources.lanes_for`).
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
    lanes: int = 1
