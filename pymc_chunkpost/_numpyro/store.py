"""The Zarr layout of NumPyro's outputs, where they may go to disk.

With `output_memory="disk"` (or "auto" with an output path), each site of a call with a
store group is an array of numpyro's shape `batch_shape + site shape`, named as the site
(`store_layout`); a site that a store cannot hold (PRNG keys, a name that Zarr reads as a
path) is refused before any work, or kept in memory under "auto".
"""

from __future__ import annotations

from typing import Any

import jax

from .._engine.call import postprocess as _postprocess
from .._store.zarr import sample_dims
from .arguments import Options, is_key
from .trace import Traced

__all__ = ["store_layout"]


def store_layout(
    traced: Traced, batch_shape: tuple[int, ...], options: Options, group: str | None
) -> tuple[str, _postprocess.StoreLayout | None]:
    """The engine's `output_memory`, and the store's layout where the outputs may go to disk
    ("disk", or "auto" with an output path, of a call with a `group`): in `group`, each site
    an array of numpyro's shape `batch_shape + site shape`, named as the site (a leaf of a
    site's pytree: `site['key']`, `jax.tree_util.keystr`'s path), its sample dims named by
    `_zarr_store.sample_dims` (`draw`; `chain`, `draw`; ...).

    Raises:
        ValueError: "disk" asked of outputs that a store cannot hold (PRNG keys, a name
            that Zarr reads as a path or that is a sample dim's), before any work.
    """
    where = options.output_memory
    if group is None or options.output_path is None or where not in ("auto", "disk"):
        return ("auto" if where == "disk" else where), None  # a guide's draws: in memory
    leaves = jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(traced.out_tree, range(traced.out_tree.num_leaves))
    )[0]
    names = [_site_name(path) for path, _ in leaves]
    reason = next(
        (
            why
            for name, spec in zip(names, traced.out_specs)
            if (why := _unstorable(name, spec, len(batch_shape))) is not None
        ),
        None,
    )
    if reason is None:
        return where, _postprocess.StoreLayout(names, group, sample_shape=batch_shape)
    if where == "auto":  # "auto" keeps what a store cannot hold in memory
        return where, None
    raise ValueError(
        f"`output_memory='disk'` cannot store these sites: {reason}. Leave them out of "
        "`return_sites`, or pass another `output_memory`. Nothing was run."
    )


def _site_name(path: tuple) -> str:
    """A site's name in the store: its own, and a pytree leaf's path after it."""
    first, *rest = path
    return str(getattr(first, "key", first)) + jax.tree_util.keystr(tuple(rest))


def _unstorable(name: str, spec: Any, n_sample_dims: int) -> str | None:
    """Why the store cannot hold the output `name` of one draw's `spec`, or None."""
    if is_key(spec):
        return f"{name!r} holds PRNG keys, which a Zarr array cannot hold"
    if "/" in name or name.startswith("__") or name in (".", ".."):
        return f"Zarr would read the name {name!r} as a path (or reserve it)"
    if name in sample_dims(n_sample_dims):
        return f"{name!r} is the name of a sample dim's coordinate in the store"
    return None
