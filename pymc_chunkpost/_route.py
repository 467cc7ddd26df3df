"""The seam of the pymc routes: pymc model + draws -> per-draw JAX function -> engine -> arrays.

Every pymc route (`_posthoc`, `_predictive`) takes pymc's arguments and ours. This module
holds what they share, so that each route keeps only pymc's own rules (which variables,
which graph, how the result is packed):

- `split`: pymc's arguments (those the installed pymc takes) apart from ours, gathered in one
  `Options`, checked once, before any work;
- `fall_back`: pymc's own function where the route cannot give pymc's answer, said the same
  way on every route (`ROUTED`: a call that `patch` routed here logs, never warns);
- `cached_graph`: a route's per-draw function, built once per model, its data and the key;
- `as_draws` and `evaluate`: pymc's draws as the engine's `(a, b, ...)` arrays, and the
  engine (`_postprocess.run`) over them, outputs as writable numpy arrays, as pymc's are.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _postprocess
from ._cache import FunctionCache
from ._memory import output_path_setting, resolve_device
from ._options import check_options
from ._pymc_model import Fallback, fingerprint, host_array

__all__ = [
    "OPTIONS",
    "ROUTED",
    "Options",
    "as_draws",
    "cached_graph",
    "evaluate",
    "fall_back",
    "output_path",
    "split",
]

_log = logging.getLogger("pymc_chunkpost")

#: True while `patch` routes pymc's own call here: a fallback is then logged, not warned
#: (pymc's own tests turn warnings into errors).
ROUTED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pymc_chunkpost_routed", default=False
)

#: Our options on every pymc route (their defaults are each route's): everything else is pymc's.
OPTIONS: tuple[str, ...] = (
    "postprocessing_backend",
    "postprocessing_vectorize",
    "chunk_size",
    "n_chunks",
    "memory_budget",
    "output_memory",
    "matmul_precision",
    "output_path",
    "resume",
)


@dataclasses.dataclass(frozen=True)
class Options:
    """Our options of one routed call, checked once (`check`).

    Attributes:
        backend: `postprocessing_backend`: the device to compute on (None: the default).
        strategy: `postprocessing_vectorize`.
        progressbar: show the engine's progress bar.
        engine: the rest, as `_postprocess.run`'s keyword arguments.
    """

    backend: str | None
    strategy: str
    progressbar: bool
    engine: dict[str, Any]

    def with_engine(self, **changes: Any) -> Options:
        """These options with `changes` to the engine's."""
        return dataclasses.replace(self, engine=self.engine | changes)

    def check(self) -> None:
        """Every check of the options alone, before any work.

        Raises:
            ValueError: naming the option, the value, and what to pass instead.
        """
        engine = self.engine
        check_options(
            self.strategy,
            engine.get("chunk_size"),
            engine.get("n_chunks"),
            engine.get("memory_budget"),
            engine.get("output_memory", "auto"),
            engine.get("matmul_precision"),
            output_path=engine.get("output_path"),
            resume=engine.get("resume", False),
        )
        # None is the default device, which every JAX has: not looked up here, so that a
        # call handed to pymc's own function starts no JAX backend (whose start logs).
        if self.backend is not None:
            resolve_device(self.backend)


def split(
    name: str,
    ours: Callable,
    pymc: Callable,
    arguments: dict[str, Any],
    *,
    skip: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Options]:
    """pymc's arguments (those the installed pymc takes) and our checked `Options`.

    Args:
        name: the route's public name, for the messages.
        ours: the route's public function (its signature lists pymc's arguments and ours).
        pymc: pymc's own function of the installed pymc.
        arguments: the call's arguments by name (`locals()` of `ours`).
        skip: names of `ours` that are neither pymc's keyword arguments nor options (the
            first, positional argument).
        extra: further keyword options for the engine (`**options`), each a keyword-only
            argument of `_postprocess.run`.

    Raises:
        TypeError: an argument the installed pymc does not take, set to a non-default, or an
            unknown option, as Python would for pymc.
        ValueError: a bad option of ours, before any work.
    """
    import pymc as pm

    ours_signature = inspect.signature(ours).parameters
    pymc_signature = inspect.signature(pymc).parameters
    pymc_args: dict[str, Any] = {}
    for key, parameter in ours_signature.items():
        if key in skip or key in OPTIONS or parameter.kind is parameter.VAR_KEYWORD:
            continue
        if key in pymc_signature:
            pymc_args[key] = arguments[key]
        elif arguments[key] is not parameter.default:
            raise TypeError(
                f"{name}() got an unexpected keyword argument {key!r}: the installed pymc "
                f"{pm.__version__} has no `{key}` there."
            )
    run_parameters = inspect.signature(_postprocess.run).parameters
    for key in extra or {}:
        found = run_parameters.get(key)
        if found is None or found.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
    engine = {key: arguments[key] for key in OPTIONS if key in ours_signature}
    engine |= extra or {}
    # Every route that splits its arguments here may write to disk.
    engine["output_path"] = output_path(engine.get("output_path"))
    options = Options(
        backend=engine.pop("postprocessing_backend", None),
        strategy=engine.pop("postprocessing_vectorize", "auto"),
        progressbar=bool(arguments.get("progressbar", True)),
        engine=engine,
    )
    options.check()
    return pymc_args, options


def output_path(given: Any) -> Any:
    """The disk tier's store folder of a call that may write to disk: the one `given`, else
    `configure_memory(output_path=...)`'s default (None where neither is set). Every route
    resolves it here, once, before any work."""
    return output_path_setting() if given is None else given


def fall_back(name: str, fallback: Fallback, original: Callable, *args: Any, **kwargs: Any) -> Any:
    """pymc's own `original(*args, **kwargs)`, said at `fallback.level`: below WARNING on the
    `pymc_chunkpost` logger; at WARNING a one-line `UserWarning` at the user's call, or a log
    warning where `patch` routed the call here (`ROUTED`)."""
    message = f"`{name}` runs pymc's own function ({fallback.reason})."
    if fallback.level < logging.WARNING:
        _log.log(fallback.level, message)
    elif ROUTED.get():
        _log.warning("pymc_chunkpost: %s", message)
    else:
        warnings.warn(f"pymc_chunkpost: {message}", UserWarning, stacklevel=_user_level())
    return original(*args, **kwargs)


def _user_level() -> int:
    """The `stacklevel` of the first frame outside this package: the user's call."""
    frame, level = inspect.currentframe(), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__):
        frame, level = frame.f_back, level + 1
    return level


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


def as_draws(values: np.ndarray, n_sample_dims: int) -> np.ndarray:
    """`values`, whose `n_sample_dims` leading axes are pymc's sample dims, as the engine's
    `(a, b, ...)` draws: two sample dims as they are; one, or three or more, as `(1, n)`;
    none (pymc 6's single point) as `(1, 1)`. Outputs are reshaped back to the sample shape."""
    shape = values.shape[:n_sample_dims]
    lead = shape if n_sample_dims == 2 else (1, int(np.prod(shape, dtype=np.int64)))
    return values.reshape(lead + values.shape[n_sample_dims:])


def evaluate(
    jax_fn: Callable,
    arrays: Sequence[Any],
    options: Options,
    label: str,
    *,
    random: bool = False,
    host_inputs: Sequence[np.ndarray] = (),
    store: Any = None,
) -> tuple[list[Any], bool]:
    """Every output of `jax_fn` at every draw of `arrays` (`(chains, draws, ...)` each), by
    the engine within `options`: writable numpy arrays (copies only of outputs that share
    memory with `host_inputs`, the caller's draws), and False; or, where they went to disk,
    laid out as `store` (a `_postprocess.StoreLayout`) says, the store's arrays and True.
    `random`: `jax_fn` draws random numbers (`Problem.random`)."""
    engine = options.engine if store is None else options.engine | {"store": store}
    outputs, plan = _postprocess.run(
        jax_fn,
        list(arrays),
        options.backend,
        options.strategy,
        False,
        progressbar=options.progressbar,
        progress_label=label,
        random=random,
        **engine,
    )
    if plan.output_memory == "disk":
        return list(outputs), True
    values: list[Any] = []
    while outputs:  # each output handed over, and released here, in turn
        values.append(host_array(outputs.pop(0), host_inputs))
    return values, False
