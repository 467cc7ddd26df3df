"""The draws of the NumPyro routes: their batch shape, and their layout for the engine and back.

numpyro's draws have shape `batch_shape + site shape` (`batch_ndims` leading axes); the
engine maps inputs of shape `(chains, draws, ...)`. Here: the draws' common batch shape
(checked) and `Predictive`'s rule for it, each draw's key as numpyro derives it, the draws
as `(chains, draws, ...)` where they already are, and the outputs reshaped back to
`batch_shape + ...`, each without a copy where it can be.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.sharding import NamedSharding, PartitionSpec

from .._support.messages import warn
from .arguments import is_key

__all__ = [
    "as_chains_draws",
    "batch_shape_of",
    "chains_draws",
    "place_like",
    "predictive_batch",
    "split_keys",
    "unbatch",
]


def batch_shape_of(posterior_samples: Any, batch_ndims: int) -> tuple[int, ...] | None:
    """The draws' common batch shape, None without draws. Checks every draw array: each
    site's value is a pytree (a `param` site holding a dict, a flow guide's `$params`), and
    each of its leaves has the batch axes.

    Raises:
        ValueError: not a dict of pytrees of arrays, too few axes, batch shapes that differ,
            no draws.
    """
    if not isinstance(posterior_samples, dict):
        raise ValueError(
            "`posterior_samples` must be a dict of site name to draws, got "
            f"{type(posterior_samples).__name__}."
        )
    shape: tuple[int, ...] | None = None
    first = None
    leaves = (
        (name, f"`posterior_samples[{name!r}]{jax.tree_util.keystr(path)}`", value)
        for name, site in posterior_samples.items()
        for path, value in jax.tree_util.tree_flatten_with_path(site)[0]
    )
    for name, where, value in leaves:
        if not isinstance(name, str):
            raise ValueError(f"{where}: site names must be strings.")
        if isinstance(value, jax.Array) and value.is_deleted():
            raise ValueError(f"{where} has been deleted (donated before?).")
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ValueError(f"{where} must be an array, got {type(value).__name__}.")
        if len(value.shape) < batch_ndims:
            raise ValueError(
                f"{where} has shape {tuple(value.shape)}: fewer axes than "
                f"batch_ndims={batch_ndims}."
            )
        batch = tuple(value.shape[:batch_ndims])
        if shape is not None and batch != shape:
            raise ValueError(
                f"Batch shapes at {where} and {first} should be the same, but got "
                f"{batch} and {shape} (`posterior_samples` with batch_ndims={batch_ndims})."
            )
        shape, first = batch, where
    if shape is not None and 0 in shape:
        raise ValueError(f"`posterior_samples` has no draws: batch shape {shape}.")
    return shape


def predictive_batch(
    posterior_samples: dict[str, Any], batch_ndims: int, num_samples: int | None
) -> tuple[tuple[int, ...], int]:
    """numpyro's `Predictive` batch shape and `num_samples` (its constructor's rule)."""
    shape = batch_shape_of(posterior_samples, batch_ndims)
    if shape is not None:
        size = int(np.prod(shape))
        if num_samples is not None and num_samples != size:
            warn(
                f"Sample's batch dimension size {size} is different from the provided "
                f"{num_samples} num_samples argument. Defaulting to {size}.",
                UserWarning,
            )
        return shape, size
    if num_samples is None:
        raise ValueError("No sample sites in posterior samples to infer `num_samples`.")
    return (1,) * (batch_ndims - 1) + (num_samples,), num_samples


def chains_draws(batch_shape: tuple[int, ...]) -> tuple[int, int]:
    """The engine's `(chains, draws)` for a batch shape: its last axis is the draws."""
    if not batch_shape:
        return 1, 1
    return math.prod(batch_shape[:-1]), batch_shape[-1]


def as_chains_draws(x: Any, batch_shape: tuple[int, ...]) -> Any:
    """`x` with its batch axes as the engine's `(chains, draws)`.

    Two batch axes: `x` itself (a sharded array stays where it is). Otherwise a reshaped
    view: free for numpy arrays and for arrays on one CPU device (a numpy view of the same
    memory, which the engine places without a copy); elsewhere a reshaped copy of this input.
    """
    shape = chains_draws(batch_shape) + tuple(x.shape[len(batch_shape) :])
    if tuple(x.shape) == shape:
        return x
    if isinstance(x, jax.Array) and (is_key(x) or _device_of(x) is None):
        return jnp.reshape(x, shape)
    return np.reshape(np.asarray(x), shape)


def _device_of(x: jax.Array) -> Any:
    """The one CPU device that holds `x`, or None."""
    devices = x.devices()
    device = next(iter(devices))
    return device if len(devices) == 1 and device.platform == "cpu" else None


def place_like(x: Any, reference: Any) -> Any:
    """`x`, of shape `(chains, draws, ...)`, where the `reference` draws are: on the mesh that
    splits them on their chain/draw axes, or on their device (the engine then runs there
    without moving anything). Beside numpy draws, `x` stays as it is."""
    if not isinstance(reference, jax.Array):
        return x
    sharding = reference.sharding
    if isinstance(sharding, NamedSharding) and len(sharding.device_set) > 1:
        spec = (tuple(sharding.spec) + (None, None))[:2]
        return jax.device_put(x, NamedSharding(sharding.mesh, PartitionSpec(*spec)))
    if len(sharding.device_set) == 1:
        return jax.device_put(x, next(iter(sharding.device_set)))
    return x


@functools.partial(jax.jit, static_argnums=1)
def split_keys(key_data: jax.Array, lead: tuple[int, int]) -> jax.Array:
    """Each draw's key data in the engine's `(chains, draws, 2)` layout, exactly as numpyro's
    `_predictive` derives them: one split into a key per draw, in the draws' order."""
    keys = random.split(key_data, math.prod(lead))
    return keys.reshape(lead + keys.shape[1:])


@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
def _reshape_donated(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return x.reshape(shape)


def unbatch(y: Any, batch_shape: tuple[int, ...], forwarded: bool) -> Any:
    """An output of shape `(chains, draws, ...)` as `batch_shape + ...`, without a copy: a
    numpy view; on one CPU device, an array placed from a numpy view of the same memory (no
    program to compile); elsewhere a reshape into the donated output's own buffer. A
    passed-through input is not ours to donate: it is reshaped into a new array."""
    shape = tuple(batch_shape) + tuple(y.shape[2:])
    if tuple(y.shape) == shape:
        return y
    if isinstance(y, np.ndarray):
        return y.reshape(shape)
    device = None if is_key(y) else _device_of(y)
    if device is not None:
        return jax.device_put(np.asarray(y).reshape(shape), device)
    if forwarded:
        return jnp.reshape(y, shape)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return _reshape_donated(y, shape)
