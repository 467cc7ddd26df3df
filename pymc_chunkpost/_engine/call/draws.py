"""The caller's draws: every check before any work (`validate`), and placed where the problem
runs (`place`, which says which of them may be donated).

A caller's array is never written: `place` copies what is not already where the problem runs,
and never donates a numpy array whose memory a device array shares.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..._support.memory import resolve_device
from ..data.problem import Problem, analyse, locate

__all__ = ["place", "validate"]


def validate(jax_fn: Callable, raw_mcmc_samples: Any, backend: str | None):
    """Every check of the draws, before any work. Returns the problem and the samples."""
    if not callable(jax_fn):
        raise ValueError(f"`jax_fn` must be callable, got {type(jax_fn).__name__}.")
    if isinstance(raw_mcmc_samples, dict) or not isinstance(raw_mcmc_samples, list | tuple):
        raise ValueError(
            "`raw_mcmc_samples` must be a list of arrays, one per input of `jax_fn`, got "
            f"{type(raw_mcmc_samples).__name__}."
        )
    if not raw_mcmc_samples:
        raise ValueError("`raw_mcmc_samples` is empty: pass one array per input of `jax_fn`.")
    n_inputs = _n_inputs(jax_fn)
    if n_inputs is not None and n_inputs != len(raw_mcmc_samples):
        raise ValueError(
            f"`jax_fn` takes {n_inputs} inputs but {len(raw_mcmc_samples)} arrays were given in "
            "`raw_mcmc_samples`; pass one array per model value variable, in order."
        )
    samples = []
    for i, x in enumerate(raw_mcmc_samples):
        if isinstance(x, jax.Array) and x.is_deleted():
            raise ValueError(f"`raw_mcmc_samples[{i}]` has been deleted (donated before?).")
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            x = np.asarray(x)
        if len(x.shape) < 2:
            raise ValueError(
                f"`raw_mcmc_samples[{i}]` has shape {tuple(x.shape)}; every array needs at "
                "least 2 dimensions, (chains, draws, ...)."
            )
        samples.append(x)
    lead = tuple(samples[0].shape[:2])
    for i, x in enumerate(samples):
        if tuple(x.shape[:2]) != lead:
            raise ValueError(
                f"`raw_mcmc_samples[{i}]` has (chains, draws) = {tuple(x.shape[:2])}, but "
                f"`raw_mcmc_samples[0]` has {lead}. All arrays must share them."
            )
    if 0 in lead:
        raise ValueError(f"No draws to post-process: (chains, draws) = {lead}.")
    device = None if backend is None else resolve_device(backend)
    placement = locate(samples, device)
    in_specs = [
        jax.ShapeDtypeStruct(tuple(x.shape), jax.dtypes.canonicalize_dtype(x.dtype))
        for x in samples
    ]
    return analyse(jax_fn, in_specs, placement), samples


def _n_inputs(jax_fn) -> int | None:
    try:
        params = inspect.signature(jax_fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def place(samples, donate_samples: bool, problem: Problem):
    """Put the samples where the problem runs; the indices that may be donated.

    Arrays already there are used as they are (no copy). A caller's numpy array is never
    donated when the device array shares its memory, and a passed-through input is returned
    as an output, so it is never donated either.
    """
    sharding = problem.placement.sharding
    placed, donate = [], []
    passed_through = {k for k in problem.forwarded if k is not None}
    for i, x in enumerate(samples):
        there = isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim)
        y = x if there else jax.device_put(x, sharding)
        placed.append(y)
        if not donate_samples or i in passed_through:
            continue
        if isinstance(x, np.ndarray) and _shares_memory(x, y):
            continue
        donate.append(i)
    return placed, tuple(donate)


def _shares_memory(x: np.ndarray, y: jax.Array) -> bool:
    try:
        return x.__array_interface__["data"][0] == y.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001 - any failure to tell means "assume shared".
        return True
