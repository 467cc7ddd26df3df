"""numpyro's public `Predictive` and `log_likelihood` routed to the engine, for code that calls
them by numpyro's names (ArviZ's `from_numpyro`, which computes the log-likelihood with
`numpyro.infer.log_likelihood`; a library's helpers): `patch`, `unpatch`, `patched`,
`is_patched`.

Invariant: only the public spellings in `TARGETS` are replaced, and only where they are
numpyro's own objects (bound from `numpyro.infer.util`, where numpyro defines them) or a routed
object of this module's (marked `ROUTED`); `unpatch` puts numpyro's own objects back where
routed ones stand, so another library's replacement is never overwritten. Modules that bound
the names for themselves keep what they bound: numpyro's (`numpyro.infer.autoguide`,
`numpyro.infer.calibration`), or, if bound while patched, the routed object with that patch's
options. The route's fallbacks (`_numpyro._fallback`) call numpyro's objects bound at import,
never the patched names, so a routed call cannot come back to itself. The patch is
process-wide: `patched` blocks nest in one thread, not across threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import routes as _numpyro
from .arguments import Options

__all__ = ["ROUTED", "TARGETS", "is_patched", "patch", "patched", "unpatch"]

#: Where numpyro exposes the two functions, as (module, attribute).
TARGETS: tuple[tuple[str, str], ...] = (
    ("numpyro.infer", "Predictive"),
    ("numpyro.infer", "log_likelihood"),
    ("numpyro.infer.util", "Predictive"),
    ("numpyro.infer.util", "log_likelihood"),
)

#: The attribute that marks a routed object (its value: the options it was made with).
ROUTED = "_pymc_chunkpost_routed"

_lock = threading.Lock()
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
            `output_path`, `resume`, `progressbar`, `exact`. A call that passes one itself
            overrides it, so a model keyword argument of one of these names is taken as the
            option (ArviZ passes the model's keywords through). Calling `patch` again
            replaces the options. A path given here is every routed call's: with
            `output_memory="disk"` the first call's store fills it, and a second call there
            is refused before any work (the folder holds other outputs); pass `output_path`
            per call, or `patch` again, for each store.

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
            if current is _numpyro_own(name) or hasattr(current, ROUTED):
                setattr(module, name, routed[name])


def unpatch() -> None:
    """Put numpyro's own objects back where routed ones stand; nothing if not patched."""
    global _options
    with _lock:
        for module_name, name in TARGETS:
            module = importlib.import_module(module_name)
            if hasattr(vars(module).get(name), ROUTED):
                setattr(module, name, _numpyro_own(name))
        _options = None


def is_patched() -> bool:
    """Whether `patch` is in effect."""
    return _options is not None


@contextlib.contextmanager
def patched(**options: Any) -> Iterator[None]:
    """`patch(**options)` for the body of a `with` block; on exit, even when the body raises,
    numpyro is as it was on entry (unpatched, or patched with the options it had).

    Process-wide, as `patch` is: blocks nest in one thread; blocks in several threads at once
    leave numpyro as the last one to exit found it.

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
    known = [f.name for f in dataclasses.fields(Options)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {', '.join(map(repr, unknown))}: `patch` takes "
            f"{', '.join(known)}. Nothing was patched."
        )
    Options(**options)  # raises ValueError on a bad value
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

    setattr(Predictive, ROUTED, dict(options))
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
    setattr(log_likelihood, ROUTED, dict(options))
    return log_likelihood
