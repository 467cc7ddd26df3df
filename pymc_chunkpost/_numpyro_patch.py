"""numpyro's public `Predictive` and `log_likelihood` routed to the engine, for code that calls
them by numpyro's names (ArviZ's `from_numpyro`, which computes the log-likelihood with
`numpyro.infer.log_likelihood`; a library's helpers): `patch`, `unpatch`, `patched`,
`is_patched`.

Invariant: only the public spellings in `TARGETS` are replaced, and only where they are
numpyro's own objects (or this patch's); `unpatch` puts numpyro's very objects back where
this patch's still stand, so another library's replacement is never overwritten. numpyro's
modules that bound the names for themselves at import (`numpyro.infer.autoguide`,
`numpyro.infer.calibration`) keep numpyro's. The route's fallbacks (`_numpyro._fallback`)
call numpyro's functions bound at import, never the patched names, so a routed call cannot
come back to itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _numpyro

__all__ = ["TARGETS", "is_patched", "patch", "patched", "unpatch"]

#: Where numpyro exposes the two functions, as (module, attribute).
TARGETS: tuple[tuple[str, str], ...] = (
    ("numpyro.infer", "Predictive"),
    ("numpyro.infer", "log_likelihood"),
    ("numpyro.infer.util", "Predictive"),
    ("numpyro.infer.util", "log_likelihood"),
)

_lock = threading.Lock()
_installed: dict[tuple[str, str], Any] = {}  # our object at each target, while patched
_options: dict[str, Any] | None = None  # the options of the patch in effect, else None


def patch(**options: Any) -> None:
    """Make `numpyro.infer.Predictive` and `numpyro.infer.log_likelihood` (and their
    `numpyro.infer.util` spellings) those of `pymc_chunkpost.numpyro`.

    Code that calls numpyro's names then runs on the engine: the same arguments, and the same
    numbers as numpyro's default `parallel=False`, bit for bit (docs/numpyro.md). For example,
    `arviz.from_numpyro(mcmc, log_likelihood=True)` computes its log-likelihood so. A caller's
    `parallel=True` is read only where numpyro's own function runs (the route's fallbacks).

    Args:
        **options: our options for every routed call, as `Predictive` takes them:
            `postprocessing_vectorize`, `chunk_size`, `memory_budget`, `output_memory`,
            `progressbar`, `exact`. A call that passes one itself overrides it. Calling
            `patch` again replaces the options.

    Raises:
        ValueError: an unknown or bad option, before anything is patched.
    """
    global _options
    checked = _checked(options)
    routed = {
        "Predictive": _routed_predictive(checked),
        "log_likelihood": _routed_log_likelihood(checked),
    }
    with _lock:
        _options = checked
        for module_name, name in TARGETS:
            module = importlib.import_module(module_name)
            current = vars(module).get(name)
            if current is _numpyro_own(name) or current is _installed.get((module_name, name)):
                _installed[(module_name, name)] = routed[name]
                setattr(module, name, routed[name])


def unpatch() -> None:
    """Put numpyro's own objects back where `patch`'s still stand; nothing if not patched."""
    global _options
    with _lock:
        for (module_name, name), ours in _installed.items():
            module = importlib.import_module(module_name)
            if vars(module).get(name) is ours:
                setattr(module, name, _numpyro_own(name))
        _installed.clear()
        _options = None


def is_patched() -> bool:
    """Whether `patch` is in effect."""
    return _options is not None


@contextlib.contextmanager
def patched(**options: Any) -> Iterator[None]:
    """`patch(**options)` for the body of a `with` block; on exit, even when the body raises,
    numpyro is as it was on entry (unpatched, or patched with the options it had).

    Raises:
        ValueError: as `patch`, before the body runs.
    """
    before = _options
    patch(**options)
    try:
        yield
    finally:
        if before is None:
            unpatch()
        else:
            patch(**before)


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """The options, checked as `Predictive` checks them."""
    known = [f.name for f in dataclasses.fields(_numpyro._Options)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {', '.join(map(repr, unknown))}: `patch` takes "
            f"{', '.join(known)}. Nothing was patched."
        )
    _numpyro._Options(**options)  # raises ValueError on a bad value
    return dict(options)


def _numpyro_own(name: str) -> Any:
    """numpyro's own object, as the route bound it at import."""
    return {
        "Predictive": _numpyro._NumpyroPredictive,
        "log_likelihood": _numpyro._numpyro_log_likelihood,
    }[name]


def _routed_predictive(options: dict[str, Any]) -> type:
    """`pymc_chunkpost.numpyro.Predictive`, with `options` as defaults."""

    class Predictive(_numpyro.Predictive):
        __doc__ = (
            "numpyro's `Predictive`, routed by `pymc_chunkpost.numpyro.patch` to "
            "`pymc_chunkpost.numpyro.Predictive`.\n\n" + (_numpyro.Predictive.__doc__ or "")
        )

        def __init__(self, model: Callable, posterior_samples: Any = None, **kwargs: Any):
            super().__init__(model, posterior_samples, **{**options, **kwargs})

    return Predictive


def _routed_log_likelihood(options: dict[str, Any]) -> Callable:
    """`pymc_chunkpost.numpyro.log_likelihood`, with `options` as defaults."""

    @functools.wraps(_numpyro.log_likelihood)
    def log_likelihood(model: Callable, posterior_samples: Any, *args: Any, **kwargs: Any):
        return _numpyro.log_likelihood(model, posterior_samples, *args, **{**options, **kwargs})

    log_likelihood.__doc__ = (
        "numpyro's `log_likelihood`, routed by `pymc_chunkpost.numpyro.patch` to "
        "`pymc_chunkpost.numpyro.log_likelihood`.\n\n" + (_numpyro.log_likelihood.__doc__ or "")
    )
    return log_likelihood
