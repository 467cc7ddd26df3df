"""What the pymc routes read of a pymc model and give back: the installed pymc's major version,
whether a compile mode is JAX, a model's fingerprint (its variables and a digest of its data),
its free variables' shapes, and outputs as writable numpy arrays, as pymc's are.

The post-hoc and the predictive routes both read models this way; one place for each rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ._cache import FunctionCache

__all__ = [
    "Fallback",
    "compile_fallback",
    "expected_shapes",
    "fingerprint",
    "host_array",
    "is_jax_mode",
    "pymc6",
]

# Shapes that depend on data, evaluated once per model and fingerprint (weakly keyed on the
# model; `clear_caches` empties it).
_SHAPES = FunctionCache(per_function=4)


def pymc6() -> bool:
    """Whether the installed pymc is 6 or later (its routes differ from 5's)."""
    import pymc

    return int(pymc.__version__.split(".")[0]) >= 6


def is_jax_mode(mode: Any) -> bool:
    """Whether pytensor compiles `mode` (a name or a `Mode`) with its JAX linker."""
    from pytensor.compile.mode import get_mode
    from pytensor.link.jax.linker import JAXLinker

    try:
        return isinstance(get_mode(mode).linker, JAXLinker)
    except (ValueError, KeyError, TypeError, AttributeError):  # not a mode pytensor knows
        return False


class Fallback(NamedTuple):
    """Why a route runs pymc's own function instead of its JAX route, and how loudly it says so.

    `level` is a `logging` level: DEBUG where pymc's own function is the route for that input
    (a `MultiTrace`: nothing is lost, so nothing is said above DEBUG); INFO where the user
    asked for pymc's compile; WARNING where the JAX route fails the call (it costs speed):
    a one-line `UserWarning`, or a log warning while `patch` routes the call.
    """

    reason: str
    level: int


def compile_fallback(pymc_args: dict[str, Any], neutral: frozenset[str]) -> str | None:
    """Why pymc's compile arguments ask for pymc's own function: a `backend` or
    `compile_kwargs['mode']` that is not JAX, or `compile_kwargs` other than `neutral`, which
    only pymc's compiled function takes. None where the JAX route honours them.

    Raises:
        ValueError: both `backend` and `compile_kwargs['mode']` (pymc 6's own check).
    """
    backend = pymc_args.get("backend")
    compile_kwargs = pymc_args.get("compile_kwargs") or {}
    if backend is not None and "mode" in compile_kwargs:  # pymc 6's own check and message
        raise ValueError("Can only define one of `backend` or `compile_kwargs['mode']`")
    mode = backend if backend is not None else compile_kwargs.get("mode")
    if mode is not None and not is_jax_mode(mode):
        what = "backend" if backend is not None else "compile_kwargs['mode']"
        return f"`{what}={mode!r}` is not JAX"
    if others := sorted(set(compile_kwargs) - neutral):
        return f"`compile_kwargs` {others} apply to pymc's compiled function only"
    return None


def fingerprint(model: Any) -> tuple:
    """The model's variables, check_bounds, and a digest of its data (`pm.Data`, dims)."""
    from pytensor.compile.sharedvalue import SharedVariable

    digest = hashlib.blake2b(digest_size=16)
    shared = [v for v in model.named_vars.values() if isinstance(v, SharedVariable)]
    shared += [v for v in model.dim_lengths.values() if isinstance(v, SharedVariable)]
    for variable in shared:
        value = np.ascontiguousarray(variable.get_value(borrow=True))
        digest.update(f"{variable.name}{value.dtype}{value.shape}".encode())
        digest.update(value.data if value.size else b"")
    return (
        tuple(rv.name for rv in model.free_RVs),
        tuple(rv.name for rv in model.observed_RVs),
        bool(getattr(model, "check_bounds", True)),
        digest.hexdigest(),
    )


def expected_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Each free variable's shape: static, else from its dims, else evaluated (cached)."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant

    def length(dim):
        value = model.dim_lengths.get(dim)
        if isinstance(value, SharedVariable):
            return int(value.get_value())
        if isinstance(value, Constant):
            return int(value.data)
        return None

    shapes: dict[str, Any] = {}
    for rv in model.free_RVs:
        dims = model.named_vars_to_dims.get(rv.name) or (None,) * rv.type.ndim
        shapes[rv.name] = tuple(
            s if s is not None else (length(d) if d is not None else None)
            for s, d in zip(rv.type.shape, dims)
        )
    if all(None not in shape for shape in shapes.values()):
        return shapes
    key = ("shapes", fingerprint(model))
    evaluated = _SHAPES.get(model, key)
    if evaluated is None:  # shapes that depend on data: one small function, compiled once
        evaluated = model.eval_rv_shapes()
        _SHAPES.put(model, key, evaluated)
    return {name: tuple(int(n) for n in evaluated[name]) for name in shapes}


class _Writable:
    """Exposes a host array that only this object owns as writable (numpy's protocol)."""

    def __init__(self, view: np.ndarray, owner: Any):
        self._owner = (view, owner)  # keeps the memory alive as long as the array
        self.__array_interface__ = view.__array_interface__ | {
            "data": (view.__array_interface__["data"][0], False)
        }


def host_array(output: Any, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """`output` as a writable numpy array, as pymc's are, without copying it when possible.

    On the CPU, `np.asarray` of a jax array is a read-only view of its buffer. The buffer
    belongs to this output alone (nothing else holds the jax array once `run` has
    returned), so it is handed to numpy as writable. An output that passes an input through
    may share the caller's draws, so it is copied, as pymc's would be.
    """
    if isinstance(output, np.ndarray):  # `output_memory="host"`: already a host array
        return output if output.flags.writeable else np.array(output)
    view = np.asarray(output)
    if view.size == 0 or any(np.may_share_memory(view, x) for x in inputs):
        return np.array(view)
    # Off the CPU, `view` is a host copy: the device buffer need not stay alive with it.
    on_cpu = all(device.platform == "cpu" for device in output.devices())
    return np.asarray(_Writable(view, output if on_cpu else None))
