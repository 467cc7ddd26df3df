"""Where a call runs and what it may use: policy, as the rest of the planner.

The devices (`spread`: single-device draws over several accelerators; `shard_by_shard`: shards
one after another where a jaxlib can deadlock), the memory budget per device
(`resolve_budget`, `check_budget`), where the outputs live (`output_memory_for`), the lanes
(`lanes_for`) and host memory's room (`host_room`, `host_staging_room`, `host_fits`). Each rule
lives here once; a call asks them once, through its facts (`facts.gather`), which the chunk
plan reads.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh

from ..._support import compat as _compat
from ..._support.config import current
from ..._support.memory import HOST_BUDGET_ENV, free_bytes, host_budget_setting, host_free_bytes
from ..._support.messages import budget_text, mib, warn
from ..data.problem import Placement, Problem, cpu_cores
from ..execute.host_output import host_memory_kind

__all__ = [
    "STAGED_CHUNKS",
    "check_budget",
    "check_host",
    "host_fits",
    "host_room",
    "host_staging_room",
    "host_is_the_device",
    "lanes_for",
    "loo_backend",
    "largest_output_bytes_per_draw",
    "on_host_if_small",
    "output_bytes_per_draw",
    "output_memory_for",
    "resolve_budget",
    "shard_by_shard",
    "small_work_on_host",
    "spread",
]


#: Chunks' outputs in host memory per lane while outputs stream to the host: on an
#: accelerator, chunk `k` in pinned memory being landed, chunk `k + 1`'s pinned copy in
#: flight, and a landing copy where the runtime's numpy view of pinned memory is a copy.
STAGED_CHUNKS = 3


def check_budget(problem: Problem, budget: int | None) -> None:
    """Raise `MemoryError` if `budget` cannot even hold the outputs (None: no known limit)."""
    per_device = problem.output_bytes // problem.n_shards
    if budget is not None and per_device > budget:
        where = (
            _host_budget_words() if problem.device.platform == "cpu" else "raise `memory_budget`"
        )
        raise MemoryError(
            f"Post-processing needs at least {mib(per_device)} per device for its outputs "
            f"({problem.chains} chains x {problem.draws} draws), but the memory budget is "
            f"{mib(budget)}. Free memory, {where}, post-process fewer variables "
            f"(`var_names`), thin the draws, or {DISK_WORDS}. Nothing was run; the draws "
            "are untouched."
        )


#: How the messages of a host too small name the disk tier.
DISK_WORDS = (
    "write the outputs to disk (`output_memory='disk', output_path=...`, or a default path "
    "through `pymc_chunkpost.configure_memory(output_path=...)`, which 'auto' then uses)"
)


def host_room() -> int:
    """Host bytes a call may take, beyond `host_margin_bytes` (negative: not even that)."""
    return host_free_bytes() - _host_margin()


def host_staging_room(problem: Problem, room: int, disk: bool = False) -> int:
    """Bytes of host memory that the chunks in flight to outputs in host memory may take:
    `host_staging_bytes`, or less where the host's `room` (`host_room`) has less beside the
    outputs (negative: not even the margin). `disk`: the outputs go on to disk, so host
    memory holds none of them."""
    held = 0 if disk else problem.output_bytes
    return min(current().host_staging_bytes, room - held)


def _host_margin() -> int:
    """`host_margin_bytes`, kept free for the rest of the process; none under the user's
    own host budget, which already says what our calls may take."""
    return 0 if host_budget_setting() is not None else current().host_margin_bytes


def check_host(problem: Problem, lanes: int = 1) -> None:
    """Raise `MemoryError`, before any work, where host memory cannot hold the outputs with
    one draw's staging per lane and `host_margin_bytes` (the outputs of an accelerator,
    landed in host memory chunk by chunk)."""
    one_draw = STAGED_CHUNKS * lanes * output_bytes_per_draw(problem)
    if host_staging_room(problem, host_room()) >= one_draw:
        return
    host = host_free_bytes()
    needed = problem.output_bytes + one_draw + _host_margin()
    raise MemoryError(
        f"The outputs need {mib(problem.output_bytes)} of host memory ({problem.chains} "
        f"chains x {problem.draws} draws; {mib(needed)} with the chunks in flight and a "
        f"margin), but host memory has {mib(host)} for them ({_host_budget_source()}). "
        f"Post-process fewer variables (`var_names`), thin the draws, {_host_budget_words()}, "
        f"or {DISK_WORDS}. Nothing was run; the draws are untouched."
    )


def host_fits(problem: Problem, room: int, staging: int, disk: bool = False) -> bool:
    """Whether the host's `room` (`host_room`) holds the outputs and `staging` bytes beside
    them (a CPU's chunks in flight, which live in the same memory); `disk`: the outputs go on
    to disk, and only `staging` counts."""
    return (0 if disk else problem.output_bytes) + staging <= room


def largest_output_bytes_per_draw(problem: Problem) -> int:
    """Bytes per draw of the largest computed output (at least 1)."""
    specs = [problem.out_specs[j] for j in problem.computed]
    return max([math.prod(s.shape[2:]) * np.dtype(s.dtype).itemsize for s in specs] + [1])


def output_bytes_per_draw(problem: Problem) -> int:
    """Bytes of computed outputs per draw, rounded up (at least 1)."""
    return max(-(-problem.output_bytes // max(problem.n_items, 1)), 1)


def _host_budget_source() -> str:
    budget = host_budget_setting()
    if budget is None:
        return "the host's available memory"
    return f"the host budget of {mib(budget)}, {HOST_BUDGET_ENV}"


def _host_budget_words() -> str:
    if host_budget_setting() is None:
        return "free host memory"
    return (
        "raise the host budget (`pymc_chunkpost.configure_memory(host_budget=...)`, "
        f"{HOST_BUDGET_ENV})"
    )


def resolve_budget(problem: Problem, memory_budget: float | None) -> int | None:
    """The budget per device in bytes: `memory_budget`, or the free memory if None.

    On a CPU every device shares one RAM, so it is counted once and split over the shards.
    None when the device cannot say what it has free (an accelerator whose allocator keeps
    no statistics, as with `XLA_PYTHON_CLIENT_ALLOCATOR=platform`): the plan then has no
    limit, and the out-of-memory retry is what keeps the draws safe. A warning says so.
    """
    shards = problem.n_local_shards
    if memory_budget is not None:
        return int(memory_budget) // shards
    placement, cpu = problem.placement, problem.device.platform == "cpu"
    devices = [problem.device] if placement.mesh is None or cpu else placement.local_devices
    frees = [free_bytes(d) for d in devices]
    if any(free is None for free in frees):
        warn(
            f"{problem.device} reports no memory statistics (as with "
            "`XLA_PYTHON_CLIENT_ALLOCATOR=platform`), so its free memory is unknown: planning "
            "without a memory limit, with the out-of-memory retry as the safety net. Pass "
            "`memory_budget` (bytes) to plan under a limit."
        )
        return None
    free = min(f for f in frees if f is not None)
    return free // shards if cpu else free


def lanes_for(problem: Problem) -> tuple[int, str]:
    """How many host threads stream chunks at once (`_host_output.stream_to_host`), and why:
    the one place this is decided.

    One, but for a problem of one-draw programs (each draw computed by a program of one
    draw, in a loop that XLA runs on one thread) on one CPU device: there one per core, up
    to `max_lanes` and to a chunk each. Not where the jaxlib deadlock of `shard_by_shard`
    could strike: concurrent LAPACK kernels.
    """
    config = current()
    if not problem.one_draw_programs or problem.device.platform != "cpu" or problem.n_shards != 1:
        return 1, "one lane"
    if _lapack_may_deadlock(problem):
        return 1, "one lane: concurrent LAPACK kernels can deadlock in this jaxlib"
    lanes = min(cpu_cores(), config.max_lanes, problem.n_local)
    return max(lanes, 1), "XLA runs a loop of one-draw programs on one thread"


def loo_backend(requested: str | None, values: int) -> tuple[str | None, str]:
    """Where `loo` computes its log-likelihood blocks (a `postprocessing_backend`), and why:
    the caller's backend where one is named, else `small_work_on_host`'s answer for the
    draws x observations (`values`) of every block together: "cpu", or None (the default
    device)."""
    if requested is not None:
        return requested, "the caller's backend"
    host, why = small_work_on_host(jax.default_backend(), values)
    return ("cpu" if host else None), why


def small_work_on_host(platform: str, values: int) -> tuple[bool, str]:
    """Whether work of `values` output values, whose default device is of `platform`, runs
    on the host CPU instead, and why: the one place this is decided.

    Yes where `platform` is an accelerator, JAX has its CPU backend, and the values are at
    most `host_values_per_core` per host core: there the accelerator's compiles (seconds
    each on a TPU) cost more than its run saves, and the host's float32 is pymc's own.
    """
    if platform == "cpu":
        return False, "the default device"
    try:
        jax.local_devices(backend="cpu")
    except RuntimeError:  # JAX started without its CPU backend (JAX_PLATFORMS=tpu, say)
        return False, "no host CPU backend"
    limit = current().host_values_per_core * cpu_cores()
    if values > limit:
        return False, f"{values} values: the {platform}'s run saves more than its compiles cost"
    return True, f"{values} values, at most {limit}: the {platform}'s compiles cost more"


def on_host_if_small(problem: Problem) -> Problem:
    """`problem` on the host CPU where its outputs are small work (`small_work_on_host`) and
    its draws are on one device: the placement of a route whose outputs come back to the
    host anyway, and whose caller named no device."""
    placement = problem.placement
    if placement.mesh is not None:
        return problem
    values = sum(math.prod(spec.shape) for spec in problem.out_specs)
    host, why = small_work_on_host(placement.device.platform, values)
    if not host:
        return problem
    cpu = jax.local_devices(backend="cpu")[0]
    return problem.with_placement(Placement(cpu, reason=f"the host CPU: {why}"))


def host_is_the_device(problem: Problem, request: str) -> bool:
    """Whether outputs in host memory are the planner's choice on a CPU (lanes), not the
    caller's: there host memory is the device's own, so the outputs count in its budget and
    are returned as `jax.Array`s on the device."""
    return request != "host" and problem.device.platform == "cpu"


def shard_by_shard(problem: Problem) -> str | None:
    """Why the shards of `problem` must run one after another, each as a one-device run, or
    None when they run together.

    Only for the jaxlib deadlock of `_compat.lapack_may_deadlock`, whatever the strategy:
    draws split over CPU devices, a per-draw function that calls a LAPACK kernel, and fewer
    than twice as many CPU devices in the process as shards (4 of 8 ran). The cost: the
    shards' runs add up instead of overlapping (they compile once in all: `_executor`
    moves one shard's executable to the others).
    """
    if problem.n_local_shards < 2 or problem.device.platform != "cpu":
        return None
    cpu_devices = _cpu_device_count()
    if cpu_devices >= 2 * problem.n_local_shards or not _lapack_may_deadlock(problem):
        return None
    import jaxlib

    return (
        f"{problem.n_local_shards} devices, one shard after another: jaxlib "
        f"{jaxlib.__version__} can deadlock when {problem.n_local_shards} of {cpu_devices} CPU "
        "devices run LAPACK kernels at once"
    )


def _lapack_may_deadlock(problem: Problem) -> bool:
    """Whether this jaxlib can deadlock running `problem`'s LAPACK kernels concurrently: it
    is one that can (`_compat.lapack_may_deadlock`), and the per-draw function calls one."""
    return problem.calls_lapack and _compat.lapack_may_deadlock()


def _cpu_device_count() -> int:
    return len(jax.local_devices(backend="cpu"))


def _local_devices(platform: str) -> list[jax.Device]:
    """This process's devices of `platform`."""
    return [d for d in jax.local_devices() if d.platform == platform]


def spread(problem: Problem) -> Problem:
    """The problem on the devices it should run on.

    Draws already split over several devices stay there. Draws on one device of a platform
    in `spread_platforms` (accelerators) are spread over the local devices of that platform
    when the run is large enough to repay it (`spread_min_bytes`), along the chain axis (or
    else the draw axis) when the device count divides it: no padded copy.
    """
    config = current()
    placement = problem.placement
    device = placement.device
    if placement.mesh is not None or device.platform not in config.spread_platforms:
        return problem
    local = _local_devices(device.platform)
    work = problem.output_bytes + problem.n_items * problem.intermediate_bytes
    if len(local) < 2 or work < config.spread_min_bytes:
        return problem
    for axis, length in ((0, problem.chains), (1, problem.draws)):
        for d in range(len(local), 1, -1):
            if length % d == 0:
                devices = [device] + [x for x in local if x != device][: d - 1]
                mesh = Mesh(np.array(devices), ("spread",))
                spec = ("spread", None) if axis == 0 else (None, "spread")
                reason = (
                    f"spread over {d} {device.platform} devices on the "
                    f"{'chain' if axis == 0 else 'draw'} axis: {mib(work)} of work"
                )
                return problem.with_placement(Placement(device, mesh, spec, reason))
    return problem


def output_memory_for(
    problem: Problem, request: str, budget: int | None, disk: bool = False
) -> tuple[str, str]:
    """Where the outputs go, "device", "host" or "disk", and why: the one place this is
    decided.

    "auto" keeps them on the device when they fit its budget with room for one draw's work;
    otherwise, on an accelerator with a host memory kind, they land in host memory chunk by
    chunk. On a CPU, where both are the same RAM, it chooses "host" only for lanes
    (`lanes_for`): chunks streamed by several host threads at once. Where neither holds
    them and `disk` (an output path is set), they go on to disk, chunk by chunk; "auto"
    never chooses disk without a path.

    Raises:
        ValueError: "host" asked of draws split over several devices, or of an accelerator
            without host memory; nothing has run.
        MemoryError: the outputs fit neither the device budget nor host memory; the message
            says what is needed on each side. Nothing has run.
    """
    per_device = problem.output_bytes // problem.n_shards
    if request == "device":
        return "device", "as requested"
    device = problem.device
    placement = problem.placement
    # Split draws stream shard by shard, each into a block of whole chains of the outputs.
    chain_split = placement.spec[1] is None and problem.n_local_shards == problem.n_shards
    can_stream = (problem.n_shards == 1 or chain_split) and (
        device.platform == "cpu" or host_memory_kind(device) is not None
    )
    if request == "host":
        if not can_stream:
            raise ValueError(
                "`output_memory='host'` streams chunks into host arrays, but "
                + (
                    f"device {device} has no host memory kind"
                    if problem.n_shards == 1 or chain_split
                    else "the draws are split on their draw axis or over several processes"
                )
                + ". Pass `output_memory='device'` (or 'auto'). Nothing was run."
            )
        check_host(problem, lanes_for(problem)[0])
        return "host", "as requested"
    if request == "disk":
        if not can_stream:
            raise ValueError(
                "`output_memory='disk'` streams chunks through host memory to disk, but "
                "these draws cannot be streamed (split on their draw axis, over several "
                "processes, or on a device without host memory). Pass `output_memory="
                "'device'` (or 'auto'). Nothing was run."
            )
        return "disk", "as requested"
    room = per_device + problem.per_item_bytes + problem.intermediate_bytes
    fits = budget is None or room <= budget
    lanes, why_lanes = lanes_for(problem)
    if fits and lanes > 1:
        return "host", f"{why_lanes}: lanes of chunks stream into it on {lanes} cores"
    if fits:
        return "device", "they fit the device's budget"
    on_disk = (
        f"the outputs ({mib(problem.output_bytes)}) exceed {budget_text(budget)} and host "
        "memory: chunk by chunk to the output path"
    )
    if disk and can_stream and (device.platform == "cpu" or not host_fits(problem, host_room(), 0)):
        return "disk", on_disk
    if device.platform == "cpu" or not can_stream:
        return "device", "no host memory to stream to"  # check_budget raises what is short
    check_host(problem, lanes)
    return "host", (
        f"the outputs ({mib(problem.output_bytes)}) exceed {budget_text(budget)} on the "
        f"device; host memory has {mib(host_free_bytes())} for them"
    )
