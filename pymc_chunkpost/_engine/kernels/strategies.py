"""The post-processing strategies: one small function each, looked up in `STRATEGY_TABLE`.

Each strategy maps a per-draw function `fn(*values) -> list[array]` over samples of shape
`(chains, draws, ...)` and returns outputs of shape `(chains, draws, ...)`. They run inside the
single `jax.jit` built by `_postprocess`, which also owns validation, device placement,
planning and donation. None of them copies a whole sample array: loops read slices in place
and write results in place (see `_chunked`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from .chunked import _chunked
from .jaxpr_eval import vmap_draws

__all__ = ["CHUNK_STRATEGIES", "STRATEGIES", "STRATEGY_TABLE"]

# A per-chunk host callback: `progress(items_done, n_items)`, or None.
_Progress = Callable[[jax.Array, int], None] | None


def _vmap(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """Both axes vmapped: pymc's default. Fast; temporaries scale with chains x draws."""
    del chunk_size, progress
    return vmap_draws(fn, 2)(*samples)


def flat_vmap(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """The "vmap" strategy as one vmap over the flattened chain x draw axis, for a function
    whose gathers and scatters of a draw's values write much (`flattens_vmap`): under two
    batch dimensions XLA lays such results out transposed and copies them into the outputs
    (docs/strategies.md)."""
    del chunk_size, progress
    return _over_flat(vmap_draws(fn, 1), samples)


def _vmap_scan(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """Chains vmapped, draws looped: pymc's "scan", without its two swapaxes copies."""
    del chunk_size
    return _chunked(vmap_draws(fn, 1), 1, 1, 1, None, False, progress)(*samples)


def _scan_vmap(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """Chains looped, draws vmapped. Temporaries scale with draws."""
    del chunk_size
    return _chunked(vmap_draws(fn, 1), 0, 0, 1, None, False, progress)(*samples)


def _nested_scan(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """Both axes looped, one draw at a time, chain after chain. Smallest temporaries, slowest.

    One loop over the flattened chain x draw axis: a loop nested inside a loop over chains
    would build each chain's outputs in a temporary before copying them (its temporaries
    would grow with draws).
    """
    del chunk_size
    return _flat_chunked(fn, samples, 1, progress)


def _flat_chunked(
    fn: Callable, samples: Sequence[jax.Array], chunk_size: int | None, progress: _Progress
) -> list[jax.Array]:
    """The flattened chain x draw axis in chunks of `chunk_size`, vmapped inside a chunk."""
    return _over_flat(_chunked(fn, 0, 0, chunk_size, None, False, progress), samples)


def _over_flat(mapped: Callable, samples: Sequence[jax.Array]) -> list[jax.Array]:
    """`mapped` (a map over one leading axis) over the flattened chain x draw axis."""
    chains, draws = samples[0].shape[:2]
    flat = [x.reshape((chains * draws,) + x.shape[2:]) for x in samples]  # free: a bitcast
    return [y.reshape((chains, draws) + y.shape[1:]) for y in mapped(*flat)]


STRATEGY_TABLE: dict[str, Callable] = {
    "vmap": _vmap,
    "scan": _vmap_scan,
    "vmap_scan": _vmap_scan,
    "scan_vmap": _scan_vmap,
    "nested_scan": _nested_scan,
    "chunked": _flat_chunked,
}

#: Every name `postprocess_samples` accepts as `postprocessing_vectorize`.
STRATEGIES: tuple[str, ...] = (*STRATEGY_TABLE, "auto")
#: The strategies the planner sizes: they take `chunk_size`/`n_chunks`, may spread over
#: devices, and choose where the outputs live.
CHUNK_STRATEGIES: tuple[str, ...] = ("chunked", "auto")
