"""The post-processing strategies: one small function each, looked up in `STRATEGY_TABLE`.

Each strategy maps a per-draw function `fn(*values) -> list[array]` over samples of shape
`(chains, draws, ...)` and returns outputs of shape `(chains, draws, ...)`. They run inside the
single `jax.jit` built by `_postprocess`, which also owns validation, device placement,
planning and donation. None of them copies a whole sample array: loops read slices in place
and write results in place (see `_chunked`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ._chunked import _chunked

__all__ = ["STRATEGIES", "STRATEGY_TABLE", "Progress"]

# A per-chunk host callback: `progress(items_done, n_items)`, or None.
Progress = Callable[[jax.Array, int], None] | None


def _vmap(fn, samples, chunk_size, progress):
    """Both axes vmapped: pymc's default. Fast; temporaries scale with chains x draws."""
    del chunk_size, progress
    return jax.vmap(jax.vmap(fn))(*samples)


def _vmap_scan(fn, samples, chunk_size, progress):
    """Chains vmapped, draws looped: pymc's "scan", without its two swapaxes copies."""
    del chunk_size
    return _chunked(jax.vmap(fn), 1, 1, 1, None, False, progress)(*samples)


def _scan_vmap(fn, samples, chunk_size, progress):
    """Chains looped, draws vmapped. Temporaries scale with draws."""
    del chunk_size
    return _chunked(jax.vmap(fn), 0, 0, 1, None, False, progress)(*samples)


def _nested_scan(fn, samples, chunk_size, progress):
    """Both axes looped, one draw at a time. Smallest temporaries, slowest."""
    del chunk_size
    per_chain = _chunked(fn, 0, 0, 1, None, False, None)
    return _chunked(per_chain, 0, 0, 1, None, False, progress)(*samples)


def _flat_chunked(fn, samples, chunk_size, progress):
    """The flattened chain x draw axis in chunks of `chunk_size`, vmapped inside a chunk."""
    chains, draws = samples[0].shape[:2]
    flat = [x.reshape((chains * draws,) + x.shape[2:]) for x in samples]  # free: a bitcast
    packed_fn, packed, unpack = _pack_small(fn, flat)
    outs = _chunked(packed_fn, 0, 0, chunk_size, None, False, progress)(*packed)
    return [y.reshape((chains, draws) + y.shape[1:]) for y in unpack(outs)]


#: Per-draw arrays of at most this many elements are packed together inside loops.
PACK_MAX_SIZE = 16
#: Packing starts at this many small per-draw arrays (inputs and outputs together).
PACK_MIN_COUNT = 16


def _pack_small(fn, flat):
    """Pack many small per-draw arrays into one buffer per dtype, around a loop.

    XLA's CPU compile time of a loop grows steeply with the number of buffers that the loop
    slices and updates (a model with 200 scalars: minutes at some chunk sizes). Packing the
    small ones into one `(n, k)` buffer per dtype keeps the loop body to a few buffers. It
    copies only the small arrays (at most `PACK_MAX_SIZE` elements per draw each), once in and
    once out; large arrays are left alone. Returns `(packed_fn, packed_inputs, unpack)`.
    """
    out_shapes = jax.eval_shape(lambda *xs: fn(*(x[0] for x in xs)), *flat)
    small_in = [i for i, x in enumerate(flat) if _is_small(x.shape[1:])]
    small_out = [j for j, s in enumerate(out_shapes) if _is_small(s.shape)]
    if len(small_in) + len(small_out) < PACK_MIN_COUNT:
        return fn, flat, lambda outs: outs
    n = flat[0].shape[0]
    in_groups = _group(small_in, [flat[i].dtype for i in small_in])
    out_groups = _group(small_out, [out_shapes[j].dtype for j in small_out])
    big_in = [i for i in range(len(flat)) if i not in small_in]
    big_out = [j for j in range(len(out_shapes)) if j not in small_out]
    packed = [flat[i] for i in big_in] + [
        jnp.concatenate([flat[i].reshape(n, -1) for i in group], axis=1) for group in in_groups
    ]

    def packed_fn(*args):
        values = [None] * len(flat)
        for i, x in zip(big_in, args):
            values[i] = x
        for group, buffer in zip(in_groups, args[len(big_in) :]):
            offset = 0
            for i in group:
                shape = flat[i].shape[1:]
                values[i] = buffer[offset : offset + math.prod(shape)].reshape(shape)
                offset += math.prod(shape)
        outs = fn(*values)
        return [outs[j] for j in big_out] + [
            jnp.concatenate([jnp.ravel(outs[j]) for j in group]) for group in out_groups
        ]

    def unpack(outs):
        result = [None] * len(out_shapes)
        for j, y in zip(big_out, outs):
            result[j] = y
        for group, buffer in zip(out_groups, outs[len(big_out) :]):
            offset = 0
            for j in group:
                shape = out_shapes[j].shape
                result[j] = buffer[:, offset : offset + math.prod(shape)].reshape((n,) + shape)
                offset += math.prod(shape)
        return result

    return packed_fn, packed, unpack


def _is_small(shape) -> bool:
    return math.prod(shape) <= PACK_MAX_SIZE


def _group(indices, dtypes):
    groups: dict = {}
    for i, dtype in zip(indices, dtypes):
        groups.setdefault(jnp.dtype(dtype), []).append(i)
    return list(groups.values())


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
