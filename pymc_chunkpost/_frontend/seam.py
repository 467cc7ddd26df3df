"""The seam every route shares: library model + draws -> per-draw JAX function -> engine -> arrays.

Every route (`_pymc.posthoc`, `_pymc.predictive`, `_numpyro.routes`, the loo blocks) takes its
library's arguments and ours. This module holds what they share, so that each route keeps only
its library's own rules (which variables, which graph, how the result is packed):

- `split`: the library's arguments (those the installed pymc takes) apart from ours, gathered
  in one `Options`, checked once, before any work;
- `fall_back`: the library's own function where the route cannot give its answer, said the
  same way on every route (`Fallback`; `ROUTED`: a call that `patch` routed here logs, never
  warns);
- `as_draws` and `evaluate`: the draws as the engine's `(a, b, ...)` arrays, and the engine
  (`postprocess.run`) over them, outputs as writable numpy arrays (`host_array`), as pymc's are.

It imports neither library: what a route reads of a model lives in the route's folder.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._engine.call import postprocess as _postprocess
from .._engine.call.options import check_options
from .._support.memory import output_path_setting, resolve_device

__all__ = [
    "OPTIONS",
    "ROUTED",
    "Fallback",
    "MissingVariableError",
    "Options",
    "as_draws",
    "evaluate",
    "fall_back",
    "host_array",
    "output_path",
    "run",
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


class MissingVariableError(ValueError, KeyError):
    """The draws lack a variable that the route needs: a `ValueError` whose message says what
    to pass instead, and a `KeyError`, which is what pymc's own function raises for it, so
    that code written for either `except` still catches it."""

    def __str__(self) -> str:  # KeyError's would quote the message as a key
        return str(self.args[0]) if self.args else ""


class Fallback(NamedTuple):
    """Why a route runs its library's own function instead of its JAX route, and how loudly
    it says so.

    `level` is a `logging` level: DEBUG where the library's own function is the route for
    that input (pymc's `MultiTrace`: nothing is lost, so nothing is said above DEBUG); INFO
    where the user asked for it (pymc's compile) or where the engine has nothing to add
    (NumPyro's single draw); WARNING where the JAX route fails the call (it costs speed): a
    one-line `UserWarning`, or a log warning while `patch` routes the call. `library` names
    whose function runs.
    """

    reason: str
    level: int
    library: str = "pymc"


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
    """The library's own `original(*args, **kwargs)`, said at `fallback.level`: below WARNING
    on the `pymc_chunkpost` logger; at WARNING a one-line `UserWarning` at the user's call, or
    a log warning where `patch` routed the call here (`ROUTED`)."""
    message = f"`{name}` runs {fallback.library}'s own function ({fallback.reason})."
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


def as_draws(values: np.ndarray, n_sample_dims: int) -> np.ndarray:
    """`values`, whose `n_sample_dims` leading axes are pymc's sample dims, as the engine's
    `(a, b, ...)` draws: two sample dims as they are; one, or three or more, as `(1, n)`;
    none (pymc 6's single point) as `(1, 1)`. Outputs are reshaped back to the sample shape."""
    shape = values.shape[:n_sample_dims]
    lead = shape if n_sample_dims == 2 else (1, int(np.prod(shape, dtype=np.int64)))
    return values.reshape(lead + values.shape[n_sample_dims:])


def run(
    jax_fn: Callable, arrays: Sequence[Any], options: Options, label: str, **more: Any
) -> tuple[list[Any], Any]:
    """Every output of `jax_fn` at every draw of `arrays` (`(chains, draws, ...)` each), by
    the engine within `options` (`postprocess.run`'s outputs and plan): the one call of the
    engine for every route that maps a library's function (pymc's post-hoc, predictive and
    loo, NumPyro's; `pm.sample`'s patch is `postprocess_samples` itself). `more`: the
    route's own keywords of `postprocess.run` (`store`, `random`, `one_draw_programs`, an
    `output_memory` it chose), over the options'.

    Invariant: where the caller named no device, small work on an accelerator runs on the
    host CPU (`small_on_host`), unless the route decided the device itself (its engine
    options say `small_on_host=False`): every route's outputs come back to the host."""
    return _postprocess.run(
        jax_fn,
        list(arrays),
        options.backend,
        options.strategy,
        False,
        progressbar=options.progressbar,
        progress_label=label,
        **({"small_on_host": options.backend is None} | options.engine | more),
    )


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
    """Every output of `jax_fn` at every draw of `arrays` (`run`), as pymc returns them:
    writable numpy arrays (copies only of outputs that share memory with `host_inputs`, the
    caller's draws), and False; or, where they went to disk, laid out as `store` (a
    `postprocess.StoreLayout`) says, the store's arrays and True. `random`: `jax_fn` draws
    random numbers (`Problem.random`)."""
    more = {"random": random} | ({} if store is None else {"store": store})
    outputs, plan = run(jax_fn, arrays, options, label, **more)
    if plan.output_memory == "disk":
        return list(outputs), True
    values: list[Any] = []
    while outputs:  # each output handed over, and released here, in turn
        values.append(host_array(outputs.pop(0), host_inputs))
    return values, False


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
