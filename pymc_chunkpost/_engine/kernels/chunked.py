"""`chunked_vmap`: `jax.vmap` evaluated in chunks under one loop.

The mapped axis of length `n` is cut into `ceil(n / chunk_size)` chunks, evaluated by a
`lax.fori_loop` that reads each chunk with `dynamic_slice` from the (loop-invariant) inputs
and writes each result in place into preallocated outputs with `dynamic_update_slice`. When
`chunk_size` does not divide `n`, the last chunk overlaps the one before it (it starts at
`n - chunk_size`), recomputing fewer than `chunk_size` items and writing the same values
again. Nothing is padded, concatenated, transposed or swapped: the only full-size buffers
are the inputs and the outputs.

Under reverse-mode autodiff the loop becomes a `scan`. With `remat=True` each chunk is wrapped
in `jax.checkpoint`, so the scan keeps only the loop index per iteration (the inputs are
loop-invariant) and recomputes one chunk's residuals at a time on the way back.

The backward pass accumulates the cotangent of every loop-invariant input over the
iterations. JAX writes that as `acc + dynamic_update_slice(zeros, ct, start)` (mapped inputs)
and `acc + scatter_add(zeros, idx, ct)` (a gather from a broadcast input), which would be
O(n) work per iteration, quadratic overall. XLA rewrites both into in-place updates of `acc`
(`dynamic_update_slice(acc, acc[start] + ct, start)` and `scatter_add(acc, idx, ct)`), so the
gradient's time does not grow with the number of chunks (docs/chunked_vmap.md has the HLO
check and the measurements), and `tests/test_chunked_vmap.py` asserts through
`memory_analysis()` that no full-size cotangent is materialised per chunk. The loop keeps one
path for every axis: reading the mapped inputs through the scan's `xs` would only serve a
leading axis that the chunk divides.

A mapped axis split over several devices stays split: `jax.shard_map` hands each device its
own part, and the chunked loop runs inside each shard (docs/chunked_vmap.md). Without it, XLA
would gather the whole mapped axis onto every device to `dynamic_slice` it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["chunked_vmap", "check_chunking", "resolve_chunk_size"]


#: Progress callbacks per loop, at most (each one is a host round trip of tens of us).
PROGRESS_UPDATES = 20


def check_chunking(
    chunk_size: Any,
    n_chunks: Any,
    names: tuple[str, str] = ("chunk_size", "n_chunks"),
    unset: str = "for no chunking",
) -> None:
    """Validate `chunk_size`/`n_chunks` before any tracing.

    Args:
        chunk_size: the value to check.
        n_chunks: the value to check.
        names: what the caller calls the two options, for the messages.
        unset: what passing None means to the caller, for the messages.

    Raises:
        ValueError: if both are given, or either is not a positive int.
    """
    if chunk_size is not None and n_chunks is not None:
        raise ValueError(
            f"Pass `{names[0]}` or `{names[1]}`, not both (got {names[0]}={chunk_size!r}, "
            f"{names[1]}={n_chunks!r})."
        )
    for name, value in zip(names, (chunk_size, n_chunks)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | jnp.integer):
            raise ValueError(
                f"`{name}` must be a positive int, got {value!r} of type "
                f"{type(value).__name__}. Pass `{name}=None` {unset}."
            )
        if value <= 0:
            raise ValueError(
                f"`{name}` must be a positive int, got {value}. Pass `{name}=None` {unset}."
            )


def resolve_chunk_size(n: int, chunk_size: int | None, n_chunks: int | None) -> int:
    """The chunk size actually used for `n` items (at most `n`, at least 1)."""
    if chunk_size is None:
        if n_chunks is None:
            return max(n, 1)
        chunk_size = -(-n // min(int(n_chunks), max(n, 1)))
    return max(1, min(int(chunk_size), n))


#: `lax.dynamic_slice_in_dim` and `lax.dynamic_update_slice_in_dim`, for starts known in range:
#: the loop computes every start itself, in range; without the flag each slice and update also
#: wraps negative starts (a compare and a select), which XLA compiles for every buffer (a few
#: percent of a small model's compile time: docs/strategies.md).
read_slice = functools.partial(lax.dynamic_slice_in_dim, allow_negative_indices=False)
write_slice = functools.partial(lax.dynamic_update_slice_in_dim, allow_negative_indices=False)


def chunk_start(i, size: int, n: int):
    """Where chunk `i` of `size` items starts among `n`: the last chunk overlaps the one
    before instead of being smaller. A separate remainder step after the loop would make XLA
    copy every output (its compiled temporaries would grow with `n`), and would compile
    the mapped function twice. The clamp is compiled only where `size` does not divide `n`."""
    return i * size if n % size == 0 else jnp.minimum(i * size, n - size)


def _check_axes(axes: Any, what: str, allow_none: bool) -> None:
    """Validate a pytree of axes (ints, and `None` where allowed) before any tracing."""
    if what == "in_axes" and not isinstance(axes, int | tuple | list) and axes is not None:
        raise TypeError(
            f"`in_axes` must be an int, None, or a tuple with one entry per positional "
            f"argument (as for `jax.vmap`), got {axes!r}."
        )
    for axis in jax.tree.leaves(axes, is_leaf=lambda x: x is None):
        if axis is None and allow_none:
            continue
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(
                f"`{what}` leaves must be ints{' or None' if allow_none else ''}, got "
                f"{axis!r} in {what}={axes!r}."
            )


def _normalise_axis(axis: int | None, ndim: int, what: str) -> int | None:
    if axis is None:
        return None
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what} axis {axis} is out of range for an array with {ndim} dims.")
    return axis % ndim


def _broadcast_prefix(axes: Any, tree: Any, what: str) -> list[int | None]:
    """Per-leaf axes of `tree`, from `axes` given as a pytree prefix of it (as `jax.vmap`)."""
    axis_leaves, axes_def = jax.tree.flatten(axes, is_leaf=lambda x: x is None)
    try:
        # A public PyTreeDef method (jax.vmap's own prefix rule) missing from jax's type stubs.
        subtrees = axes_def.flatten_up_to(tree)  # type: ignore[attr-defined]
    except ValueError as e:
        raise ValueError(f"`{what}` must be a pytree prefix of the {what[:-5]}s: {e}") from None
    return [axis for axis, sub in zip(axis_leaves, subtrees) for _ in jax.tree.leaves(sub)]


def chunked_vmap(
    f: Callable,
    in_axes: Any = 0,
    out_axes: Any = 0,
    *,
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    remat: bool = True,
    axis_name: str | tuple[str, ...] | None = None,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
) -> Callable:
    """Like `jax.vmap(f, in_axes, out_axes)`, evaluated `chunk_size` items at a time.

    A mapped axis split over several devices stays split: each device runs the chunked loop
    over its own part (`jax.shard_map`), and the outputs are split the same way along their
    `out_axes`. The split is read from the mapped arguments where JAX can tell it: arrays
    passed outside `jit`, and, inside `jit`, arrays whose mesh axes are `Explicit`. Inside
    `jit` with JAX's default (`Auto`) axes the split is unknown while tracing: pass
    `axis_name` (and `mesh`, unless one is set with `jax.set_mesh`). Without a split, XLA
    gathers the whole mapped axis onto every device to slice it.

    Args:
        f: the function to map.
        in_axes: as for `jax.vmap`: an int, `None`, or a tuple with one pytree prefix per
            positional argument; negative axes count from the end. `None` broadcasts an
            argument to every item. Keyword arguments are mapped over axis 0, as in `jax.vmap`.
        out_axes: as for `jax.vmap`: an int or a pytree prefix of the outputs. `None` marks an
            output that does not depend on the mapped axis (taken from the last chunk).
        chunk_size: items per chunk. When it does not divide the mapped length, the last
            chunk overlaps the one before (recomputing fewer than `chunk_size` items); this
            costs no output copy.
            Memory: temporaries, including the backward pass's residuals with `remat=True`,
            scale with `chunk_size`, not with the mapped length. Time: one loop iteration per
            chunk (about 10-40 us of loop overhead each on CPU); very small chunks lose
            vectorisation.
        n_chunks: alternatively, the number of chunks (`chunk_size = ceil(n / n_chunks)`).
        remat: under reverse-mode autodiff, recompute each chunk's residuals in the backward
            pass (`jax.checkpoint`), so that it holds one chunk's residuals instead of all
            of them. Costs one extra forward evaluation of `f` in the backward pass. Without
            it the forward pass stores every chunk's residuals: as much as `jax.vmap`.
        axis_name: the mesh axis (or axes) that split the mapped axis over devices. The
            chunk size, or `n_chunks`, is then per device, and the mapped length must be a
            multiple of the number of pieces. Broadcast (`None`) arguments are whole on every
            device, and outputs with `out_axes=None` come from the first device. Costs
            nothing where the arguments are already split that way; otherwise XLA moves
            them into place first. None: split as the arguments are (see above), or not.
        mesh: the mesh of `axis_name`; None means the mesh set with `jax.set_mesh` (or
            `jax.sharding.use_mesh`). Only with `axis_name`.

    Returns:
        A function with the signature of `jax.vmap(f, in_axes, out_axes)`. With
        `chunk_size=None` and `n_chunks=None` it *is* `jax.vmap(f, in_axes, out_axes)`.

    Raises:
        ValueError: bad `chunk_size`/`n_chunks`, `axis_name` or `mesh` (raised here, before
            tracing), or, when called: mapped arguments whose sizes disagree, no mesh for
            `axis_name`, or a mapped length that its pieces do not divide.
        TypeError: `in_axes`/`out_axes` that are not ints (or `None`), raised here.
    """
    check_chunking(chunk_size, n_chunks)
    _check_axes(in_axes, "in_axes", allow_none=True)
    _check_axes(out_axes, "out_axes", allow_none=True)
    axis_name = _check_split(axis_name, mesh)
    if chunk_size is None and n_chunks is None:
        return jax.vmap(f, in_axes, out_axes)
    return _chunked(
        f, in_axes, out_axes, chunk_size, n_chunks, remat, None, axis_name=axis_name, mesh=mesh
    )


def _check_split(axis_name: Any, mesh: Any) -> tuple[str, ...] | None:
    """`axis_name` as a tuple of mesh axis names, validated with `mesh` before tracing."""
    if axis_name is None:
        if mesh is not None:
            raise ValueError(
                f"`mesh` was given without `axis_name` (mesh axes {tuple(mesh.axis_names)}). "
                "Pass `axis_name=` the mesh axis (or axes) that split the mapped axis."
            )
        return None
    names = (axis_name,) if isinstance(axis_name, str) else axis_name
    if (
        not isinstance(names, tuple | list)
        or not names
        or not all(isinstance(a, str) for a in names)
    ):
        raise ValueError(
            f"`axis_name` must be a mesh axis name or a tuple of them, got {axis_name!r}. "
            "Pass `axis_name=None` to split as the arguments are split."
        )
    names = tuple(names)
    if mesh is not None:
        if not isinstance(mesh, jax.sharding.Mesh | jax.sharding.AbstractMesh):
            raise ValueError(
                f"`mesh` must be a `jax.sharding.Mesh` or None, got {type(mesh).__name__}."
            )
        _check_names(names, mesh)
    return names


def _check_names(names: tuple[str, ...], mesh) -> None:
    missing = [a for a in names if a not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"`axis_name={names if len(names) > 1 else names[0]!r}` names {missing}, which "
            f"the mesh does not have; its axes are {tuple(mesh.axis_names)}."
        )


def _pieces(mesh, names: tuple[str, ...]) -> int:
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    return int(np.prod([sizes[a] for a in names], dtype=np.int64))


def _context_mesh():
    """The mesh set with `jax.set_mesh` / `jax.sharding.use_mesh`, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    return mesh if mesh is not None and mesh.axis_names else None


def _split_of(x, axis: int):
    """(mesh, axis names) that split axis `axis` of `x`, where JAX can tell; else None.

    A concrete array knows its sharding; a traced one knows it only for `Explicit` mesh axes
    (`jax.typeof`): with `Auto` axes, its type's spec is all None while tracing.
    """
    try:
        sharding = x.sharding  # concrete arrays
    except AttributeError:  # a tracer (or not an array)
        if not hasattr(x, "shape"):
            return None
        sharding = getattr(jax.typeof(x), "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (len(x.shape) - len(sharding.spec))
    entry = spec[axis]
    if entry is None:
        return None
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    return (sharding.mesh, names) if names else None


def _find_split(leaves, leaf_axes, n: int, axis_name, mesh):
    """The mesh and axis names that split the mapped axis, or None (one device's loop)."""
    if axis_name is not None:
        mesh = mesh if mesh is not None else _context_mesh()
        if mesh is None:
            raise ValueError(
                f"`axis_name={axis_name!r}` needs a mesh: pass `mesh=`, or call under "
                "`jax.set_mesh(mesh)`."
            )
        _check_names(axis_name, mesh)
        pieces = _pieces(mesh, axis_name)
        if n % pieces:
            raise ValueError(
                f"The mapped length {n} is not a multiple of the {pieces} pieces of "
                f"`axis_name={axis_name!r}`. Pass a length that they divide, or "
                "`axis_name=None`."
            )
        return mesh, axis_name
    for x, axis in zip(leaves, leaf_axes):
        found = None if axis is None else _split_of(x, axis)
        if found is not None and _pieces(*found) > 1:  # JAX splits arrays only evenly
            return found
    return None


def shard_map_unchecked(fn: Callable, mesh, in_specs, out_specs) -> Callable:
    """`jax.shard_map` without the replication check: the outputs are per-shard results, and
    `fn` may use any primitive."""
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _spec(axis: int | None, names: tuple[str, ...]) -> PartitionSpec:
    if axis is None:
        return PartitionSpec()
    return PartitionSpec(*(None,) * axis, names if len(names) > 1 else names[0])


def _chunked(
    f: Callable,
    in_axes: Any,
    out_axes: Any,
    chunk_size: int | None,
    n_chunks: int | None,
    remat: bool,
    on_chunk: Callable[[jax.Array, int], None] | None,
    *,
    axis_name: tuple[str, ...] | None = None,
    mesh=None,
) -> Callable:
    """The implementation of `chunked_vmap`, with an optional per-chunk host callback.

    `on_chunk(items_done, n_items)` is called through `jax.debug.callback` after every few
    chunks (at most about `PROGRESS_UPDATES` times) and after the last; on a split axis, by
    every device for its own part.
    """

    def loop(apply: Callable, leaves: list, n: int):
        """The chunked loop over `n` items of `leaves` (one device's, or one shard's)."""
        size = resolve_chunk_size(n, chunk_size, n_chunks)
        if size >= n:  # One chunk: plain vmap, no loop.
            return apply(0, n, leaves)
        return _loop(apply, leaves, n, size, out_axes, remat, on_chunk)

    @functools.wraps(f)
    def mapped(*args, **kwargs):
        leaves, leaf_axes, n, apply = _mapped(f, in_axes, out_axes, args, kwargs)
        split = None if n == 0 else _find_split(leaves, leaf_axes, n, axis_name, mesh)
        if split is None:
            return loop(apply, leaves, n)
        return _split_loop(loop, apply, leaves, leaf_axes, n, split, out_axes)

    return mapped


def _mapped(f: Callable, in_axes: Any, out_axes: Any, args: tuple, kwargs: dict):
    """The arguments' leaves, the mapped axis of each (None: broadcast), the mapped length,
    and `apply(start, length, leaves)`: `f` vmapped over items `[start, start + length)`.

    Raises:
        ValueError: `in_axes` that do not fit the arguments, no mapped argument, or mapped
            arguments whose lengths disagree.
    """
    axes = tuple(in_axes) if isinstance(in_axes, list | tuple) else (in_axes,) * len(args)
    if len(axes) != len(args):
        raise ValueError(
            f"`in_axes` has {len(axes)} entries but the function got {len(args)} "
            "positional arguments."
        )
    # Keyword arguments are mapped over axis 0, as in `jax.vmap`.
    call_axes = (axes, 0)
    leaves, treedef = jax.tree.flatten((args, kwargs))
    leaf_axes = [
        _normalise_axis(ax, jnp.ndim(x), "in_axes")
        for x, ax in zip(
            leaves, _broadcast_prefix(call_axes, (args, kwargs), "in_axes"), strict=True
        )
    ]
    sizes = {jnp.shape(x)[ax] for x, ax in zip(leaves, leaf_axes) if ax is not None}
    if not sizes:
        raise ValueError("`chunked_vmap` needs at least one mapped argument (in_axes).")
    if len(sizes) > 1:
        raise ValueError(f"Mapped arguments disagree on the mapped size: {sorted(sizes)}.")
    (n,) = sizes

    def f_kwargs(args, kwargs):
        return f(*args, **kwargs)

    def apply(start, length, leaves):
        sliced = [
            x if ax is None else read_slice(x, start, length, ax)
            for x, ax in zip(leaves, leaf_axes)
        ]
        return jax.vmap(f_kwargs, call_axes, out_axes)(*jax.tree.unflatten(treedef, sliced))

    return leaves, leaf_axes, n, apply


def _out_axes(out_shape: Any, out_axes: Any) -> tuple[list, Any, list[int | None]]:
    """The output leaves' shapes, their tree, and the mapped axis of each."""
    out_leaves_shape, out_treedef = jax.tree.flatten(out_shape)
    out_leaf_axes = [
        _normalise_axis(ax, len(s.shape), "out_axes")
        for s, ax in zip(out_leaves_shape, _broadcast_prefix(out_axes, out_shape, "out_axes"))
    ]
    return out_leaves_shape, out_treedef, out_leaf_axes


def _split_loop(loop, apply, leaves, leaf_axes, n: int, split, out_axes: Any):
    """`loop` run by each device on its own part of the mapped axis (`jax.shard_map`)."""
    split_mesh, names = split
    n_local = n // _pieces(split_mesh, names)
    # The outputs' structure, from shapes alone: slicing a traced array whose type says
    # it is split (`Explicit` axes) into one item would not type-check.
    shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]
    out_shape = jax.eval_shape(lambda *xs: apply(0, 1, list(xs)), *shapes)
    _, out_treedef, out_leaf_axes = _out_axes(out_shape, out_axes)

    def local(*local_leaves):
        return jax.tree.leaves(loop(apply, list(local_leaves), n_local))

    outs = shard_map_unchecked(
        local,
        split_mesh,
        tuple(_spec(ax, names) for ax in leaf_axes),
        [_spec(ax, names) for ax in out_leaf_axes],
    )(*leaves)
    return jax.tree.unflatten(out_treedef, outs)


def _loop(apply, leaves, n: int, size: int, out_axes: Any, remat: bool, on_chunk):
    """`n` items in chunks of `size` (less than `n`), in one `lax.fori_loop` that writes each
    chunk into preallocated outputs in place; with `on_chunk`, in segments of chunks."""

    def chunk(start, length, leaves):
        def run(start, leaves):
            return apply(start, length, leaves)

        run = jax.named_call(run, name=f"chunk_{length}")
        if remat:
            # Inside a loop, so CSE across iterations is impossible anyway.
            run = jax.checkpoint(run, prevent_cse=False)
        return run(start, leaves)

    out_shape = jax.eval_shape(lambda *xs: apply(0, size, list(xs)), *leaves)
    out_leaves_shape, out_treedef, out_leaf_axes = _out_axes(out_shape, out_axes)

    def write(outs, ys, start):
        return [
            y if ax is None else write_slice(o, y, start, ax)
            for o, y, ax in zip(outs, jax.tree.leaves(ys), out_leaf_axes)
        ]

    n_iterations = -(-n // size)
    outs = [
        jnp.zeros(s.shape if ax is None else s.shape[:ax] + (n,) + s.shape[ax + 1 :], s.dtype)
        for s, ax in zip(out_leaves_shape, out_leaf_axes)
    ]

    def body(i, outs):
        start = chunk_start(i, size, n)
        return write(outs, chunk(start, size, leaves), start)

    if on_chunk is None:
        outs = lax.fori_loop(0, n_iterations, body, outs)
    else:
        # Segments of chunks, with one host callback after each: at most PROGRESS_UPDATES
        # callbacks, and no branch inside the loop over chunks.
        per_segment = -(-n_iterations // PROGRESS_UPDATES)
        n_segments = -(-n_iterations // per_segment)

        def segment(k, outs):
            last = jnp.minimum((k + 1) * per_segment, n_iterations)
            outs = lax.fori_loop(k * per_segment, last, body, outs)
            jax.debug.callback(on_chunk, jnp.minimum(last * size, n), n)
            return outs

        outs = lax.fori_loop(0, n_segments, segment, outs)
    return jax.tree.unflatten(out_treedef, outs)
