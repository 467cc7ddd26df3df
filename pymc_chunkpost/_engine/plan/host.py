"""The first attempt with the outputs landed in host memory, or on to disk: chunks computed on
the device, sized within both memories (the device's budget and host memory's room for the
chunks in flight), and the `Request` of such chunks (`host_request`, which the retry reuses).

Where the outputs go is a fact of the call (`facts.gather`, from `resources.output_memory_for`);
this module sizes and compiles the chunks once it has chosen host memory or disk, within the
lanes and host memory's room that the facts give.
"""

from __future__ import annotations

import dataclasses

from ..._support.config import current
from ..._support.messages import budget_text, mib
from ..data.problem import Problem
from ..data.types import Loop
from ..execute.disk_sink import DISK_CHUNK_BYTES, QUEUE_CHUNKS, chunk_draws
from ..execute.host_output import Transfer, default_transfer
from ..execute.program import Request
from .attempt import Attempt, Call, try_compile
from .resources import (
    STAGED_CHUNKS,
    check_budget,
    largest_output_bytes_per_draw,
    output_bytes_per_draw,
)
from .sizing import fast_chunk_size, smaller, vector_width

__all__ = ["host_output_attempt", "host_request"]


def host_output_attempt(
    call: Call, chunk_size: int | None, why_host: str, held: int = 0, disk: bool = False
) -> Attempt:
    """Chunks computed on the device and landed in host memory: the device holds the draws,
    two chunks' outputs and one chunk's temporaries per lane (`_host_output`); `held`: bytes
    of the budget that the outputs take (a CPU's lanes, whose host memory is the device's).

    Two memories bound the chunk: the device's budget bounds every lane's compiled chunk
    (beside `held`), and host memory bounds the outputs with the chunks in flight to them:
    on an accelerator `STAGED_CHUNKS` per lane within `CallFacts.staging_room`; on a CPU, where
    the device's memory is the host's, every lane's compiled chunk. Where host memory cannot
    hold the outputs, `MemoryError` before any work. `disk`: the chunks go on to disk
    (`_disk_sink`), so host memory holds the chunks in flight and the writer's queue,
    never the outputs, and each chunk's outputs keep within `DISK_CHUNK_BYTES`."""
    problem, budget = call.problem, call.budget
    n = problem.n_local
    per_item = problem.per_item_bytes + problem.intermediate_bytes
    lanes = call.facts.lanes.value
    cpu = problem.device.platform == "cpu"
    if held:  # host memory is the device's: `output_memory_for` checked the host otherwise
        check_budget(problem, budget)
    staged = STAGED_CHUNKS * lanes * output_bytes_per_draw(problem)
    if disk:  # and the writer's queue
        staged += QUEUE_CHUNKS * output_bytes_per_draw(problem)
    host_most = n if cpu else max(1, call.facts.staging_room(disk) // staged)
    if chunk_size is not None:
        size, why, source = min(chunk_size, n), "as requested", "requested"
    elif problem.device.platform == "cpu":
        size, why = fast_chunk_size(problem, float(problem.intermediate_bytes), None)
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
        request = host_request(call, size, lanes, "disk" if disk else "host")
        exe = try_compile(call.jax_fn, problem, request)
        if exe is not None:
            # `exe.peak_bytes` (its one owner) counts every lane's chunk alive at once; on a
            # CPU they are in the memory the outputs take.
            peak = held + exe.peak_bytes
            queued = QUEUE_CHUNKS * size * output_bytes_per_draw(problem) if disk else 0
            host_ok = not cpu or held or call.facts.host_fits(peak + queued, disk)
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


def host_request(call: Call, size: int, lanes: int, output_memory: str = "host") -> Request:
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
