"""What a call of the NumPyro routes is given, checked before any work: our options (in place
of numpyro's `parallel`), the PRNG key, the model, `batch_ndims`, and numpyro's reading of
`condition_deterministic`.

One unit: the checks that `Predictive`, `log_likelihood`, the patch and `loo` share, each a
`ValueError` that names the argument. It sits at the bottom of `_numpyro/`: it imports none
of its modules.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from .._frontend import seam as _route
from .._support.messages import warn

__all__ = [
    "Options",
    "check_batch_ndims",
    "check_callable",
    "check_key",
    "condition_deterministic_of",
    "is_key",
]


@dataclasses.dataclass(frozen=True)
class Options:
    """Our options, in place of numpyro's `parallel`; checked when made."""

    postprocessing_vectorize: str = "auto"
    chunk_size: int | None = None
    memory_budget: int | float | None = None
    output_memory: str = "auto"
    progressbar: bool = False
    exact: bool = True
    output_path: str | os.PathLike | None = None
    resume: bool = False

    @classmethod
    def of(cls, arguments: dict[str, Any]) -> Options:
        """The options among a call's `arguments` (its `locals()`), checked."""
        return cls(**{field.name: arguments[field.name] for field in dataclasses.fields(cls)})

    def __post_init__(self) -> None:
        # `configure_memory`'s default path where none is given, resolved once, here, as
        # every route resolves it.
        object.__setattr__(self, "output_path", _route.output_path(self.output_path))
        self.engine().check()
        if not isinstance(self.progressbar, bool):
            raise ValueError(f"`progressbar` must be True or False, got {self.progressbar!r}.")
        if not isinstance(self.exact, bool):
            raise ValueError(
                f"`exact` must be True or False, got {self.exact!r}. Pass False to compute a "
                "chunk's draws together, vectorised (faster, last bits may differ)."
            )

    def engine(self) -> _route.Options:
        """These options as every route hands them to the engine (`seam.run`): NumPyro's
        draws stay where they are (no `postprocessing_backend`), and its outputs are
        `jax.Array`s on the draws' device, small or not (`small_on_host=False`)."""
        engine = {
            "chunk_size": self.chunk_size,
            "memory_budget": self.memory_budget,
            "output_memory": self.output_memory,
            "output_path": self.output_path,
            "resume": self.resume,
            "small_on_host": False,
        }
        return _route.Options(None, self.postprocessing_vectorize, self.progressbar, engine)


def is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def check_key(rng_key: Any) -> None:
    try:
        if jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
            if rng_key.shape == ():
                return
        elif tuple(rng_key.shape) == (2,) and rng_key.dtype == np.uint32:
            return
    except AttributeError:
        pass
    raise ValueError(
        f"`rng_key` must be one PRNG key, such as `jax.random.key(0)` or "
        f"`jax.random.PRNGKey(0)`, got {_describe(rng_key)}."
    )


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"a {type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    return repr(x)


def check_callable(fn: Any, name: str) -> None:
    if not callable(fn):
        raise ValueError(f"`{name}` must be a callable numpyro model, got {type(fn).__name__}.")


def check_batch_ndims(batch_ndims: Any) -> None:
    if isinstance(batch_ndims, bool) or not isinstance(batch_ndims, int) or batch_ndims < 0:
        raise ValueError(
            f"`batch_ndims` must be a non-negative int, got {batch_ndims!r}. Pass 1 for draws "
            "of shape (num_samples, ...), 2 for (chains, draws, ...)."
        )


def condition_deterministic_of(condition: bool | None, exclude: bool | None) -> bool:
    """numpyro's reading of `condition_deterministic` and its deprecated inverse."""
    if exclude is None:
        return bool(condition)
    if condition is not None:
        raise ValueError(
            "Only one of `condition_deterministic` or the deprecated `exclude_deterministic` "
            "can be provided, not both."
        )
    warn(
        "`exclude_deterministic` is deprecated, use `condition_deterministic` instead "
        "(`exclude_deterministic=True` corresponds to `condition_deterministic=False`).",
        FutureWarning,
    )
    return not exclude
