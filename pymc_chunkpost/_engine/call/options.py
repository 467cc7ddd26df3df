"""Every check of the caller's options, made before any work.

This module reads nothing but the values it is given (and the strategy table), so that
`patch` can check a sampling call's options before sampling, and `postprocess_samples`
before it touches the draws.
"""

from __future__ import annotations

import os
from typing import Any

from ..kernels.chunked import check_chunking
from ..kernels.strategies import CHUNK_STRATEGIES, STRATEGIES

__all__ = [
    "MATMUL_PRECISIONS",
    "OUTPUT_MEMORY",
    "check_budget_value",
    "check_options",
]

#: Where the outputs may live: "device" (the draws' device), "host" (host memory, each chunk
#: copied there as it is computed), "disk" (a Zarr store at an output path, each chunk
#: written there through host memory), or "auto" (the planner's choice).
OUTPUT_MEMORY: tuple[str, ...] = ("auto", "device", "host", "disk")
#: The precisions of float32 products (`jax.default_matmul_precision`'s names), or None for
#: JAX's default: "highest" is float32's own (on a TPU, six bfloat16 passes; on a CPU or GPU
#: float32 anyway), "high" three bfloat16 passes on a TPU, "default" one.
MATMUL_PRECISIONS: tuple[str | None, ...] = (
    None,
    "default",
    "high",
    "highest",
    "bfloat16",
    "tensorfloat32",
    "float32",
)

_DEFAULT_NAMES = {
    "strategy": "postprocessing_vectorize",
    "chunk_size": "chunk_size",
    "n_chunks": "n_chunks",
    "memory_budget": "memory_budget",
    "output_memory": "output_memory",
    "matmul_precision": "matmul_precision",
    "output_path": "output_path",
    "resume": "resume",
}


def check_budget_value(memory_budget: Any, name: str = "memory_budget") -> None:
    """Raise `ValueError` unless `memory_budget` is None or a positive number of bytes."""
    if memory_budget is None:
        return
    if (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, int | float)
        or not memory_budget > 0
    ):
        raise ValueError(
            f"`{name}` must be a positive number of bytes, got {memory_budget!r}. "
            "Pass None to use the device's free memory."
        )


def check_options(
    strategy: Any,
    chunk_size: Any = None,
    n_chunks: Any = None,
    memory_budget: Any = None,
    output_memory: Any = "auto",
    matmul_precision: Any = None,
    names: dict[str, str] | None = None,
    output_path: Any = None,
    resume: Any = False,
) -> None:
    """The checks on the options alone, before any work.

    Args:
        strategy: `postprocessing_vectorize`.
        chunk_size: the chunk size option.
        n_chunks: the number-of-chunks option.
        memory_budget: the memory budget option.
        output_memory: where the outputs go.
        matmul_precision: the precision of float32 products.
        names: what the caller calls each option, for the messages (pymc's sampler calls
            them `postprocessing_chunk_size`, ...), keyed by the names above.
        output_path: the disk tier's store (the caller's, or `configure_memory`'s default).
        resume: continue a store that a run did not finish.

    Raises:
        ValueError: naming the option, the value, and what to pass instead.
    """
    names = _DEFAULT_NAMES | (names or {})
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown `{names['strategy']}={strategy!r}`. Valid strategies: "
            f"{', '.join(STRATEGIES)}."
        )
    chunk_names = (names["chunk_size"], names["n_chunks"])
    check_chunking(chunk_size, n_chunks, chunk_names, "to let the planner choose")
    if strategy not in CHUNK_STRATEGIES and (chunk_size is not None or n_chunks is not None):
        raise ValueError(
            f"`{chunk_names[0]}`/`{chunk_names[1]}` apply to the strategies "
            f"{CHUNK_STRATEGIES}, not to {strategy!r}. Pass "
            f"`{names['strategy']}='chunked'` to set the chunk size."
        )
    check_budget_value(memory_budget, names["memory_budget"])
    if not isinstance(output_memory, str) or output_memory not in OUTPUT_MEMORY:
        raise ValueError(
            f"`{names['output_memory']}` must be one of {OUTPUT_MEMORY}, got "
            f"{output_memory!r}. Pass 'host' to land the outputs in host memory chunk by "
            "chunk (for outputs larger than the accelerator), 'disk' with an output path for "
            "outputs larger than host memory, or 'auto' to let the planner choose."
        )
    if output_memory in ("host", "disk") and strategy not in CHUNK_STRATEGIES:
        raise ValueError(
            f"`{names['output_memory']}={output_memory!r}` streams the outputs chunk by "
            f"chunk, so it applies to the strategies {CHUNK_STRATEGIES}, not to {strategy!r}. "
            f"Pass `{names['strategy']}='chunked'` or 'auto'."
        )
    if matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(
            f"`{names['matmul_precision']}` must be one of {MATMUL_PRECISIONS}, got "
            f"{matmul_precision!r}. Pass 'highest' for float32's own precision, or None for "
            "JAX's default (on a TPU, float32 products in one bfloat16 pass)."
        )
    if output_memory == "disk" and output_path is None:
        raise ValueError(
            f"`{names['output_memory']}='disk'` writes the outputs into a Zarr store, so it "
            f"needs `{names['output_path']}` (a folder), or a default path set with "
            "`pymc_chunkpost.configure_memory(output_path=...)`."
        )
    if output_path is not None and (
        not isinstance(output_path, str | os.PathLike) or not os.fspath(output_path)
    ):
        raise ValueError(
            f"`{names['output_path']}` must be a folder path (str or os.PathLike) or None, "
            f"got {output_path!r}."
        )
    if not isinstance(resume, bool):
        raise ValueError(f"`{names['resume']}` must be True or False, got {resume!r}.")
