"""What the pymc routes read of a pymc model: the installed pymc's major version, whether a
compile mode is JAX, a model's fingerprint (its variables and a digest of its data), its free
variables' shapes, and a route's graph cached per model and fingerprint (`cached_graph`).

The post-hoc and the predictive routes both read models this way; one place for each rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .._support.cache import FunctionCache

__all__ = [
    "cached_graph",
    "compile_fallback",
    "expected_shapes",
    "fingerprint",
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


def cached_graph(cache: FunctionCache, model: Any, key: tuple, build: Callable[[], Any]) -> Any:
    """`build()`, cached weakly on `model` by `key` and the model's variables and data (a
    model that is gone takes its graphs with it; `pm.set_data` gives another graph). A
    `str` from `build` is a reason to fall back, and is not cached.

    pytensor records a Python stack trace on every node it builds, for errors in the user's
    own graph; these graphs are ours, built from a model that already compiled: off here.
    """
    from pytensor import config

    key = (*key, fingerprint(model))
    cached = cache.get(model, key)
    if cached is not None:
        return cached
    with config.change_flags(traceback__limit=0):
        built = build()
    if not isinstance(built, str):
        cache.put(model, key, built)
    return built
