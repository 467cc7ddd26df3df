"""`postprocess_samples_with_plan`: `postprocess_samples` that also returns the plan that ran."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..data.types import Plan
from . import postprocess as _postprocess


def postprocess_samples_with_plan(
    jax_fn: Callable,
    raw_mcmc_samples: Sequence,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    donate_samples: bool = False,
    **options: Any,
) -> tuple[list[Any], Plan]:
    """`postprocess_samples(...)`, returning `(outputs, plan)`: the same outputs, and the
    `Plan` that produced them (the strategy, chunk size and loop that ran, why, and the
    compile and planning seconds), where `plan` gives only the plan `auto` would start with.

    The engine's entry point, as every route calls it: the benchmarks time `auto` through it.
    The arguments and keywords (`chunk_size`, `n_chunks`, `memory_budget`, `progressbar`,
    `output_memory`) are `postprocess_samples`'s, and so are its errors.
    """
    return _postprocess.run(
        jax_fn,
        raw_mcmc_samples,
        postprocessing_backend,
        postprocessing_vectorize,
        donate_samples,
        **options,
    )
