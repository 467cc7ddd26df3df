"""The planner's rules for a call's loop and chunk size, from the problem alone: no compile.

The loop that chunks run in (`loop_for`), the chunk size that should run fastest before any
measurement (`fast_chunk_size`, `rule_chunk`, rounded to a divisor of the draws), the one rule
for halving (`smaller`), the vector width of the steps (`vector_width`), and what the jaxpr
says of the loop-free vmap before it is compiled (`vmap_may_fit`, `vmap_may_pay`,
`one_chunk_runs_whole`). Each is a pure function of the problem and `PlannerConfig`
(`_config`): the attempts (`_device`, `_host`, `_retry`) compile what these rules name.
"""

from __future__ import annotations

import math

from ..._support.config import current
from ..._support.messages import mib
from ..data.problem import Problem, cpu_cores, product_bytes
from ..data.types import Loop

__all__ = [
    "fast_chunk_size",
    "loop_for",
    "one_chunk_runs_whole",
    "rule_chunk",
    "smaller",
    "vector_width",
    "vmap_may_fit",
    "vmap_may_pay",
]


def loop_for(problem: Problem) -> Loop:
    """The loop that chunks of `problem` run in: the one place this is decided.

    An XLA loop, as `jax.lax.map` runs it (for `auto`, dispatched in segments, so that the
    tuner can change the chunk size between them), except where the host calls one
    straight-line chunk step per chunk: on a model with many buffers, whose XLA loops take
    minutes to compile, and for random draws on a CPU (`Problem.random`), whose elementwise
    work XLA's CPU runtime spreads over the cores outside its loops only
    (docs/predictive.md, "Chunks of random draws on a CPU").
    """
    if problem.n_buffers > current().host_loop_many_buffers:
        return Loop.HOST
    if problem.random and problem.device.platform == "cpu":
        return Loop.HOST
    return Loop.XLA


def _divisor_near(n: int, target: int) -> int:
    """The divisor of `n` nearest to `target` within [target/2, target]; else `target`."""
    target = max(1, min(target, n))
    for size in range(target, max(target // 2, 1) - 1, -1):
        if n % size == 0:
            return size
    return target


def _rule_divisor(n: int, target: int) -> int:
    """The rule's size `target` rounded to a divisor of `n` (no overlapping last chunk): the
    largest divisor at most `target` and within `round_down_within` below it, else the
    divisor nearest by ratio within a factor of 2, else `target` itself (a prime count).

    Past the target a chunk's working set leaves the cache and the time per draw climbs
    (docs/strategies.md, "Rounding to a divisor"); below it only the loop's cost per chunk
    grows, which matters where the next divisor down is far: 3 goes to 4, not 2, which
    would cost a third of the work per chunk.
    """
    target = max(1, min(target, n))
    divisors = [d for d in range(max(target // 2, 1), min(2 * target, n) + 1) if n % d == 0]
    if not divisors:
        return target
    within = current().round_down_within
    below = [d for d in divisors if (1 - within) * target <= d <= target]
    if below:
        return max(below)
    return min(divisors, key=lambda d: abs(math.log(d / target)))


def smaller(n: int, size: int) -> int:
    """The next chunk size to try below `size`: about half, a divisor of `n` where one is
    near (it then needs no overlapping last chunk). The one rule for halving, used by the
    planner and by the out-of-memory retry alike."""
    return _divisor_near(n, max(1, size // 2))


def fast_chunk_size(problem: Problem, per_item_temp: float, budget: int | None) -> tuple[int, str]:
    """The chunk size that should run fastest, and why (before any measurement)."""
    config = current()
    n = problem.n_local
    per_item = problem.per_item_bytes + per_item_temp
    if budget is None:
        fits = n
    else:
        room = max(budget - problem.output_bytes // problem.n_shards, 0)
        fits = max(1, int(room // max(per_item, 1)))
    if problem.device.platform != "cpu":
        # Accelerators want wide chunks: a fraction of the room left after the outputs (the
        # rest leaves room for XLA's GPU autotuner, which allocates while compiling).
        fraction = config.accelerator_room_fraction
        if budget is None:
            return max(1, int(n * fraction)), "half the draws, as the free memory is unknown"
        return max(1, min(n, int(fits * fraction))), "half the memory left after the outputs"
    # Shards on one CPU run at once, up to one per core, and split its cores and caches: the
    # target is for one device running on all of them.
    together = min(problem.n_local_shards, cpu_cores())
    target = config.target_chunk_bytes // together
    # The data every draw reads (a design matrix) shares the cache with the chunk's own
    # buffers; the chunk keeps at least half of the target.
    room = max(target - problem.shared_bytes, target // 2)
    cache_size = int(room // max(per_item, 1))
    overhead = problem.n_buffers * config.overhead_bytes_per_buffer
    overhead_size = -(-overhead // max(int(per_item), 1))
    size = min(max(cache_size, overhead_size, 1), fits, n)
    of = f"the target of {mib(target)}" + (
        f" ({mib(config.target_chunk_bytes)} split over {together} devices running at once)"
        if together > 1
        else ""
    )
    if overhead_size > cache_size:
        why = f"enough work per chunk to amortise the loop's cost over {problem.n_buffers} buffers"
    elif problem.shared_bytes:
        why = (
            f"a working set near {mib(room)} per chunk: {of}, less the "
            f"{mib(problem.shared_bytes)} of data that every draw reads"
        )
    else:
        why = f"a working set near {of} per chunk"
    return size, why


def rule_chunk(
    problem: Problem, loop: Loop, per_item_temp: float, budget: int | None
) -> tuple[int, str]:
    """The rule's chunk size for `loop`, and why: `fast_chunk_size`, at most
    `host_loop_max_chunks` chunks in a host loop, rounded to a divisor of the draws."""
    n = problem.n_local
    size, why = fast_chunk_size(problem, per_item_temp, budget)
    if loop is Loop.HOST:
        config = current()
        most = config.random_max_chunks if problem.random else config.host_loop_max_chunks
        size = max(size, -(-n // most))
        over = "of random draws" if problem.random else f"over {problem.n_buffers} buffers"
        why += f"; a host loop of at most {most} chunks {over}"
    return _rule_divisor(n, size), why


def vector_width(problem: Problem) -> int:
    """XLA's preferred vector width for `problem`'s steps: `random_vector_width` for random
    draws on a CPU (docs/predictive.md, "Random numbers"), else XLA's default (0)."""
    if problem.random and problem.device.platform == "cpu":
        return current().random_vector_width
    return 0


def vmap_may_fit(problem: Problem, sharing: int) -> bool:
    """Whether the loop-free vmap's compiled temporaries may come under `vmap_temp_bytes`,
    judged from the jaxpr's bound before compiling it (`vmap_bound_slack`,
    `vmap_bound_per_output`)."""
    config = current()
    bound = sharing * problem.n_local * problem.intermediate_bytes
    if bound <= config.vmap_temp_bytes:
        return True
    outputs = sharing * problem.output_bytes // problem.n_shards
    return (
        bound <= config.vmap_bound_slack * config.vmap_temp_bytes
        and bound <= config.vmap_bound_per_output * outputs
    )


def vmap_may_pay(problem: Problem) -> bool:
    """Whether the loop-free vmap may run as fast as chunks: not for random draws on a CPU
    whose products (`_problem.product_bytes`) over all draws exceed
    `random_vmap_product_bytes`. Decided from the jaxpr, before any compile: the vmap's
    compile would cost a quarter of a cold call (0.14 s of the logistic regression's
    0.55 s)."""
    if not (problem.random and problem.device.platform == "cpu") or problem.jaxpr is None:
        return True
    products = product_bytes(problem.jaxpr.jaxpr) * problem.n_local
    return products <= current().random_vmap_product_bytes


def one_chunk_runs_whole(problem: Problem, size: int | None) -> bool:
    """Whether a plan of chunks of `size` runs as the loop-free program instead.

    Invariant: off a CPU, `auto` never plans a loop of one chunk. That chunk computes what the
    loop-free vmap computes, and then writes it row by row into the outputs at each draw's
    (chain, draw) (`_program._write_for`): on a TPU v5e a 1.6 GB deterministic took 0.098 s
    warm so, against 0.0039 s loop-free (docs/strategies.md). On a CPU the chunk is written
    through a free flat view, and the loop is kept.
    """
    return size is not None and size >= problem.n_local and problem.device.platform != "cpu"
