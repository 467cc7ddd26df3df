"""`patch`: route PyMC's JAX NUTS post-processing through `pymc_chunkpost`.

`patch()` replaces four attributes of `pymc.sampling.jax`:

- `_postprocess_samples`, which pymc calls for the posterior and, through
  `_get_log_likelihood`, for the pointwise log-likelihood;
- `sample_jax_nuts`, which takes the plugin's options, checks them before any sampling,
  runs pymc's own `sample_jax_nuts` and records the plan in `idata.posterior.attrs`;
- `sample_numpyro_nuts` and `sample_blackjax_nuts`, which pymc binds to the original
  `sample_jax_nuts` with `functools.partial` at import time.

`pm.sample(nuts_sampler="numpyro" | "blackjax")` looks up `pymc.sampling.jax.sample_jax_nuts` at
call time, so it goes through the patch too. The options of one sampling call travel to the
patched `_postprocess_samples` in a context variable; pymc's own code is not modified.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from .._engine.call import postprocess as _postprocess
from .._engine.call.options import check_options
from .._engine.data.types import Plan
from .._frontend import seam as _route
from .._support.memory import resolve_device
from .sample_store import SampleStore

__all__ = ["patch", "unpatch", "is_patched", "patched"]

#: The options that `pm.sample` and `sample_*_nuts` accept while patched, and the
#: `postprocess_samples` argument each one becomes.
OPTIONS: dict[str, str] = {
    "postprocessing_vectorize": "postprocessing_vectorize",
    "postprocessing_chunk_size": "chunk_size",
    "postprocessing_n_chunks": "n_chunks",
    "postprocessing_memory_budget": "memory_budget",
    "postprocessing_output_memory": "output_memory",
    "postprocessing_matmul_precision": "matmul_precision",
    "postprocessing_output_path": "output_path",
}
#: Options of the other routes that a sampling call refuses, and why.
_REFUSED = {
    "postprocessing_resume": (
        "a sampling call draws new samples, so its store on disk cannot be resumed. Pass a "
        "new `postprocessing_output_path`, or post-process an existing posterior with "
        "`pymc_chunkpost.compute_deterministics(..., resume=True)`."
    ),
}
_PYMC_STRATEGIES = ("vmap", "scan")  # what pymc's own `_postprocess_samples` knows
_TARGETS = (
    "_postprocess_samples",
    "sample_jax_nuts",
    "sample_numpyro_nuts",
    "sample_blackjax_nuts",
)

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
_ANY = object()  # "any default": the plugin does not depend on this parameter's default
# The signatures the plugin knows (pymc 5.28 and 6.4), as (name, kind, default). A default of
# `_ANY` is not compared; the others are read or relied on by the plugin.
_KNOWN_SIGNATURES: dict[str, tuple[tuple[str, Any, Any], ...]] = {
    "_postprocess_samples": (
        ("jax_fn", _P.POSITIONAL_OR_KEYWORD, _EMPTY),
        ("raw_mcmc_samples", _P.POSITIONAL_OR_KEYWORD, _EMPTY),
        ("postprocessing_backend", _P.POSITIONAL_OR_KEYWORD, None),
        ("postprocessing_vectorize", _P.POSITIONAL_OR_KEYWORD, "vmap"),
        ("donate_samples", _P.POSITIONAL_OR_KEYWORD, False),
    ),
    "sample_jax_nuts": (
        ("draws", _P.POSITIONAL_OR_KEYWORD, _ANY),
        *(
            (name, _P.KEYWORD_ONLY, _ANY)
            for name in (
                "tune",
                "chains",
                "target_accept",
                "random_seed",
                "initvals",
                "jitter",
                "model",
                "var_names",
            )
        ),
        ("nuts_kwargs", _P.KEYWORD_ONLY, None),
        ("progressbar", _P.KEYWORD_ONLY, True),
        ("quiet", _P.KEYWORD_ONLY, False),
        ("keep_untransformed", _P.KEYWORD_ONLY, _ANY),
        ("chain_method", _P.KEYWORD_ONLY, _ANY),
        ("postprocessing_backend", _P.KEYWORD_ONLY, None),
        ("postprocessing_vectorize", _P.KEYWORD_ONLY, None),
        ("postprocessing_chunks", _P.KEYWORD_ONLY, _ANY),
        ("idata_kwargs", _P.KEYWORD_ONLY, _ANY),
        ("compute_convergence_checks", _P.KEYWORD_ONLY, _ANY),
        ("nuts_sampler", _P.KEYWORD_ONLY, _EMPTY),
    ),
}
# The names each function must look up as module globals at call time, for the patch to reach.
_GLOBALS_USED = {
    "sample_jax_nuts": ("_postprocess_samples", "_get_log_likelihood"),
    "_get_log_likelihood": ("_postprocess_samples",),
}


@dataclasses.dataclass
class _Session:
    """The plugin's options for one sampling call, and the plans that ran in it."""

    strategy: str
    chunk_size: int | None
    n_chunks: int | None
    memory_budget: int | float | None
    output_memory: str
    progressbar: bool
    matmul_precision: str | None = None
    disk: SampleStore | None = None  # where the outputs go with output memory "disk"
    plans: list[Plan] = dataclasses.field(default_factory=list)


_session: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "pymc_chunkpost_session", default=None
)
_lock = threading.Lock()
_originals: dict[str, Any] | None = None  # pymc's objects while patched, else None


def patch(*, posterior_predictive: bool = False) -> None:
    """Make PyMC's JAX samplers post-process their draws with `pymc_chunkpost`.

    Afterwards `pm.sample(nuts_sampler="numpyro" | "blackjax", ...)`,
    `pymc.sampling.jax.sample_jax_nuts`, `sample_numpyro_nuts` and `sample_blackjax_nuts`
    post-process the posterior and the log-likelihood with `postprocess_samples`, and accept
    these options, alongside pymc's own (pymc 6: inside `nuts={...}`; pymc 5: inside
    `nuts_sampler_kwargs={...}`; `sample_*_nuts`: as keyword arguments):

    - `postprocessing_vectorize`: a strategy from `STRATEGIES` (see `postprocess_samples`
      for what each costs); default "auto", the fastest plan that fits the memory budget.
      pymc's "vmap" (fast, temporaries scale with chains x draws) and "scan" keep their
      meaning.
    - `postprocessing_chunk_size` / `postprocessing_n_chunks`: draws per chunk, or the number
      of chunks, for "chunked" and "auto". Smaller chunks use less memory and take longer.
    - `postprocessing_output_memory`: "auto" (default), "device", "host" or "disk": where the
      outputs live. "host" computes chunk by chunk on the device and lands each chunk in host
      memory, for outputs larger than an accelerator; "auto" does so when they do not fit it.
      "disk" writes each chunk into a Zarr store at `postprocessing_output_path`, and the
      call returns pymc's InferenceData (pymc 6: DataTree) opened from that store: every
      group pymc returns (the posterior and the log-likelihood read lazily; sample stats,
      observed and constant data written beside them). Host memory then holds a few chunks,
      never the outputs; costs the disk's write time. "auto" never chooses disk here.
    - `postprocessing_output_path`: the store's folder for "disk" (default:
      `configure_memory(output_path=...)`'s); it must be empty or absent, writable, and have
      room for the outputs, checked before sampling (the exact bytes again before the
      post-processing writes). A call that fails after sampling removes what it wrote. A
      store cannot be resumed: each call draws new samples (`postprocessing_resume` is
      refused). Needs zarr (`pip install "pymc-chunkpost[disk]"`).
    - `postprocessing_memory_budget`: bytes the outputs and temporaries may take; default the
      device's free memory.
    - `postprocessing_matmul_precision`: the precision of float32 products; default None,
      JAX's, as pymc's own JAX post-processing has it (on a TPU, one bfloat16 pass). Pass
      "highest" for float32's own products there (see `postprocess_samples`).

    They are checked before sampling starts: a bad value is a `ValueError` (naming the valid
    strategies for an unknown one), and nothing is sampled. pymc's `postprocessing_backend`
    works as before; the post-processing progress bar follows pymc's `progressbar`/`quiet`.
    The strategy and chunk size that ran are recorded in `idata.posterior.attrs` as
    `postprocessing_strategy` and `postprocessing_chunk_size` (absent without chunks).
    Post-processing is deterministic: with the same seed, the draws and the log-likelihood
    equal those of unpatched pymc. pymc's warning that `postprocessing_vectorize` "will be
    removed" is not emitted, as the plugin owns the option.

    It also routes pymc's post-hoc functions (`compute_log_likelihood`, `compute_log_prior`,
    `compute_deterministics`, wherever pymc exposes them; see `POSTHOC_TARGETS`) to
    `pymc_chunkpost`'s, which return the same result and take the same options as keyword
    arguments (`postprocessing_vectorize`, `chunk_size`, ...). A non-JAX `backend=` or
    `compile_kwargs` runs pymc's own function, as asked (logged at INFO on the
    `pymc_chunkpost` logger, not warned).

    With `posterior_predictive=True` it also routes `pm.sample_posterior_predictive` to
    `pymc_chunkpost.sample_posterior_predictive` (same arguments and structure, our options as
    keywords): only when asked, as its numbers for a seed differ from pymc's (docs/predictive.md).
    Calling `patch()` again does nothing (with `posterior_predictive=True`, it adds that route).

    Args:
        posterior_predictive: also route `pm.sample_posterior_predictive`.

    Raises:
        RuntimeError: pymc's `_postprocess_samples` or `sample_jax_nuts` has a signature the
            plugin does not know. Nothing is patched then.
    """
    global _originals
    import pymc.sampling.jax as pymc_jax

    with _lock:
        if _originals is not None:
            if posterior_predictive:
                _patch_predictive()
            return
        originals = {name: getattr(pymc_jax, name) for name in _TARGETS}
        _check_pymc(pymc_jax)
        sample_jax_nuts = _make_sample_jax_nuts(originals["sample_jax_nuts"])
        replacements = {
            "_postprocess_samples": _make_postprocess_samples(originals["_postprocess_samples"]),
            "sample_jax_nuts": sample_jax_nuts,
            "sample_numpyro_nuts": functools.partial(sample_jax_nuts, nuts_sampler="numpyro"),
            "sample_blackjax_nuts": functools.partial(sample_jax_nuts, nuts_sampler="blackjax"),
        }
        try:
            for name, value in replacements.items():
                setattr(pymc_jax, name, value)
            _patch_posthoc()  # the post-hoc route (see the block at the end of this module)
            if posterior_predictive:
                _patch_predictive()
        except BaseException:
            for name, value in originals.items():
                setattr(pymc_jax, name, value)
            _unpatch_posthoc()
            _unpatch_predictive()
            raise
        _originals = originals


def unpatch() -> None:
    """Restore PyMC's own functions (the very objects `patch` replaced).

    Calling `unpatch()` when not patched does nothing.
    """
    global _originals
    with _lock:
        if _originals is None:
            return
        import pymc.sampling.jax as pymc_jax

        for name, value in _originals.items():
            setattr(pymc_jax, name, value)
        _unpatch_posthoc()
        _unpatch_predictive()
        _originals = None


def is_patched() -> bool:
    """Whether `patch` is in effect."""
    return _originals is not None


@contextlib.contextmanager
def patched(*, posterior_predictive: bool = False) -> Iterator[None]:
    """`patch` for the body of a `with` block; the previous state returns on exit.

    PyMC is restored even when the body raises. If pymc was already patched on entry, it
    stays patched (the predictive route as it was).

    Args:
        posterior_predictive: as in `patch`.

    Raises:
        RuntimeError: as `patch`.
    """
    was_patched, had_predictive = is_patched(), bool(_predictive_originals)
    patch(posterior_predictive=posterior_predictive)
    try:
        yield
    finally:
        if not was_patched:
            unpatch()
        elif not had_predictive:
            with _lock:
                _unpatch_predictive()


def _check_pymc(pymc_jax) -> None:
    """Refuse a pymc whose functions the plugin does not know, before anything is patched."""
    import pymc

    for name, known in _KNOWN_SIGNATURES.items():
        params = inspect.signature(getattr(pymc_jax, name)).parameters.values()
        difference = _difference(tuple((p.name, p.kind, p.default) for p in params), known)
        if difference:
            raise RuntimeError(
                f"pymc_chunkpost cannot patch pymc {pymc.__version__}: the signature of "
                f"`pymc.sampling.jax.{name}` is not one it knows ({difference}). Nothing was "
                "patched. Call `pymc_chunkpost.postprocess_samples` directly, or use a pymc "
                "version the plugin supports (5.28 and 6.4 are tested)."
            )
    for name, needed in _GLOBALS_USED.items():
        code = getattr(getattr(pymc_jax, name), "__code__", None)
        missing = [g for g in needed if code is None or g not in code.co_names]
        if missing:
            raise RuntimeError(
                f"pymc_chunkpost cannot patch pymc {pymc.__version__}: "
                f"`pymc.sampling.jax.{name}` does not call {missing} through the module, so "
                "the patch would not reach it. Nothing was patched."
            )


def _difference(found, known) -> str:
    """How signature `found` differs from `known`, in words; "" where they agree."""
    found_by_name = {name: (kind, default) for name, kind, default in found}
    known_by_name = {name: (kind, default) for name, kind, default in known}
    notes = []
    if missing := [name for name in known_by_name if name not in found_by_name]:
        notes.append(f"missing parameters {missing}")
    if unknown := [name for name in found_by_name if name not in known_by_name]:
        notes.append(f"unknown parameters {unknown}")
    for name, (kind, default) in known_by_name.items():
        if name not in found_by_name:
            continue
        found_kind, found_default = found_by_name[name]
        if found_kind is not kind:
            notes.append(f"`{name}` is {found_kind.description}, expected {kind.description}")
        if default is not _ANY and not (
            type(found_default) is type(default) and found_default == default
        ):
            notes.append(f"`{name}` defaults to {found_default!r}, expected {default!r}")
    if not notes and [f[0] for f in found] != [k[0] for k in known]:
        notes.append("the parameters are in another order")
    return "; ".join(notes)


def _make_postprocess_samples(original: Callable) -> Callable:
    def _postprocess_samples(
        jax_fn,
        raw_mcmc_samples,
        postprocessing_backend=None,
        postprocessing_vectorize="vmap",
        donate_samples=False,
    ):
        """pymc's `_postprocess_samples`, patched by `pymc_chunkpost.patch`.

        Inside a patched sampling call, the sampling call's options decide (pymc's
        `postprocessing_vectorize` argument is then its own placeholder and is ignored).
        Outside one, "vmap" and "scan" run pymc's own function, and the other strategies of
        `STRATEGIES` run `postprocess_samples`.
        """
        session = _session.get()
        if session is None:
            if postprocessing_vectorize in _PYMC_STRATEGIES:
                return original(
                    jax_fn,
                    raw_mcmc_samples,
                    postprocessing_backend,
                    postprocessing_vectorize,
                    donate_samples,
                )
            outputs, _ = _postprocess.run(
                jax_fn,
                raw_mcmc_samples,
                postprocessing_backend,
                postprocessing_vectorize,
                donate_samples,
            )
            return outputs
        on_disk = {} if session.disk is None else session.disk.next_run()
        outputs, plan = _postprocess.run(
            jax_fn,
            raw_mcmc_samples,
            postprocessing_backend,
            session.strategy,
            donate_samples,
            chunk_size=session.chunk_size,
            n_chunks=session.n_chunks,
            memory_budget=session.memory_budget,
            progressbar=session.progressbar,
            matmul_precision=session.matmul_precision,
            **({"output_memory": session.output_memory} | on_disk),
        )
        session.plans.append(plan)
        return outputs if session.disk is None else session.disk.placeholders(outputs)

    return _postprocess_samples


def _pop_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the plugin's options out of `kwargs` and out of `kwargs["nuts_kwargs"]`.

    pymc 6's `pm.sample(nuts={...})` lifts `postprocessing_vectorize` to a keyword argument
    but leaves the others in `nuts_kwargs`, meant for the NUTS kernel; none may reach it.
    """
    for name, reason in _REFUSED.items():
        if name in kwargs or name in (kwargs.get("nuts_kwargs") or {}):
            raise ValueError(f"`{name}` is not an option of a sampling call: {reason}")
    options = {name: kwargs.pop(name) for name in OPTIONS if name in kwargs}
    nuts_kwargs = kwargs.get("nuts_kwargs")
    if nuts_kwargs and any(name in nuts_kwargs for name in OPTIONS):
        nuts_kwargs = dict(nuts_kwargs)
        for name in OPTIONS:
            if name not in nuts_kwargs:
                continue
            if name in options:
                raise ValueError(
                    f"`{name}` was given twice, as a keyword argument and in `nuts_kwargs`. "
                    "Pass it once."
                )
            options[name] = nuts_kwargs.pop(name)
        kwargs["nuts_kwargs"] = nuts_kwargs
    return options


def _check_options(options: dict[str, Any], original: Callable, args: tuple, kwargs: dict) -> Any:
    """Every check `postprocess_samples` would make on the options, before sampling; and,
    for outputs on disk, the checks of the place (`SampleStore.plan`). Returns the store
    where the outputs go to disk, else None.

    `postprocessing_output_path` (default `configure_memory`'s) is read for "disk" only: a
    sampling call's "auto" never chooses disk (the store holds the whole InferenceData,
    decided before sampling).
    """
    where = options["postprocessing_output_memory"] or "auto"
    given = options["postprocessing_output_path"]
    try:
        if given is not None and where != "disk":
            raise ValueError(
                f"`postprocessing_output_path={given!r}` is the store of "
                "`postprocessing_output_memory='disk'`, but the output memory is "
                f"{where!r}. Pass `postprocessing_output_memory='disk'` to write the "
                "InferenceData there, or no path."
            )
        path = _route.output_path(given) if where == "disk" else None
        check_options(
            options["postprocessing_vectorize"],
            options["postprocessing_chunk_size"],
            options["postprocessing_n_chunks"],
            options["postprocessing_memory_budget"],
            where,
            options["postprocessing_matmul_precision"],
            names={argument: option for option, argument in OPTIONS.items()},
            output_path=path,
        )
        resolve_device(kwargs.get("postprocessing_backend"))
        if path is None:
            return None
        import pymc

        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        model = pymc.modelcontext(bound.arguments["model"])
        return SampleStore.plan(path, model, bound.arguments)
    except ValueError as error:
        raise ValueError(f"{error} Nothing was sampled.") from None


def _make_sample_jax_nuts(original: Callable) -> Callable:
    def sample_jax_nuts(*args, **kwargs):
        """pymc's `sample_jax_nuts`, post-processing with `pymc_chunkpost` (see `patch`).

        Takes pymc's arguments and the options `patch` lists (`postprocessing_vectorize`,
        any of `STRATEGIES`, default "auto"; `postprocessing_chunk_size`, ...,
        `postprocessing_output_path`), as keyword arguments or inside `nuts_kwargs`. They
        are checked before sampling (for "disk", the store's place too); the plan that ran
        is recorded in `idata.posterior.attrs`.
        """
        options = dict.fromkeys(OPTIONS) | _pop_options(kwargs)
        if options["postprocessing_vectorize"] is None:
            options["postprocessing_vectorize"] = "auto"
        disk = _check_options(options, original, args, kwargs)
        checks = kwargs.get("compute_convergence_checks", True)
        if disk is not None:  # on the store's posterior, once it is written (`finish`)
            kwargs["compute_convergence_checks"] = False
        session = _Session(
            strategy=str(options["postprocessing_vectorize"]),
            chunk_size=options["postprocessing_chunk_size"],
            n_chunks=options["postprocessing_n_chunks"],
            memory_budget=options["postprocessing_memory_budget"],
            output_memory=options["postprocessing_output_memory"] or "auto",
            matmul_precision=options["postprocessing_matmul_precision"],
            progressbar=bool(kwargs.get("progressbar", True)) and not kwargs.get("quiet", False),
            disk=disk,
        )
        try:
            with _pymc_session(session, kwargs):
                # pymc's own, called from here: its warnings' `stacklevel` counts from this
                # frame, as it would from pymc's own caller (a helper's frame would be named).
                # None: pymc then neither warns that the option "will be removed" nor uses it.
                idata = original(*args, postprocessing_vectorize=None, **kwargs)
            if not session.plans:
                warnings.warn(
                    "pymc_chunkpost did not post-process this sampling run (was `unpatch()` "
                    "called while a reference to the patched sampler was kept?); pymc's own "
                    "post-processing ran.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                if disk is not None:
                    disk.abandon()
                return idata
            _record(idata, session.plans[-1])  # pymc post-processes the posterior last
            if disk is not None:
                idata = disk.finish(idata, checks, bool(kwargs.get("quiet", False)))
        except BaseException:
            if disk is not None:
                disk.abandon()
            raise
        return idata

    # pymc's signature plus the plugin's options, for `help()` and `inspect`.
    parameters = list(inspect.signature(original).parameters.values())
    extra = [_P(name, _P.KEYWORD_ONLY, default=None) for name in list(OPTIONS)[1:]]
    signature = inspect.signature(original)
    signature = signature.replace(parameters=parameters[:-1] + extra + parameters[-1:])
    vars(sample_jax_nuts)["__signature__"] = signature
    return sample_jax_nuts


@contextlib.contextmanager
def _pymc_session(session: _Session, kwargs: dict) -> Iterator[None]:
    """pymc's own `sample_jax_nuts` (called with `kwargs`) in the body post-processes within
    `session`; a known incompatibility's `TypeError` says what to do."""
    token = _session.set(session)
    try:
        yield
    except TypeError as error:
        if kwargs.get("nuts_sampler") == "blackjax" and (
            "unexpected keyword argument 'progress_bar'" in str(error)
        ):
            raise TypeError(
                f"{error}. This is a known incompatibility of pymc's blackjax sampler "
                "with blackjax >= 1.6 (patched or not); install `blackjax<1.6`, or use "
                "`nuts_sampler='numpyro'`."
            ) from error
        raise
    finally:
        _session.reset(token)


def _record(idata: Any, plan: Plan) -> None:
    """Write the posterior's plan to `idata.posterior.attrs` (InferenceData or DataTree)."""
    attrs = idata.posterior.attrs
    attrs["postprocessing_strategy"] = plan.strategy
    if plan.chunk_size is None:
        attrs.pop("postprocessing_chunk_size", None)
    else:
        attrs["postprocessing_chunk_size"] = int(plan.chunk_size)


# --- The post-hoc route: pymc's compute_log_likelihood / compute_log_prior /
# compute_deterministics, routed to `pymc_chunkpost._pymc.posthoc`. ------------------------------

#: Every place pymc exposes a post-hoc function, as (module, attribute); the attribute is
#: also the name of our function. A module or attribute the installed pymc lacks is skipped
#: (pymc 6 resolves `pymc.compute_log_prior` lazily, from `pymc.stats`, which is patched).
#: pymc's own callers (`pm.sample(idata_kwargs={"log_likelihood": True})`, `to_inference_data`)
#: import from `pymc.stats.log_density` at call time, so they take the route too.
POSTHOC_TARGETS: tuple[tuple[str, str], ...] = (
    ("pymc", "compute_log_likelihood"),
    ("pymc", "compute_log_prior"),
    ("pymc", "compute_deterministics"),
    ("pymc.stats", "compute_log_likelihood"),
    ("pymc.stats", "compute_log_prior"),
    ("pymc.stats.log_density", "compute_log_likelihood"),
    ("pymc.stats.log_density", "compute_log_prior"),
    ("pymc.sampling", "compute_deterministics"),
    ("pymc.sampling.deterministic", "compute_deterministics"),
)
_posthoc_originals: dict[tuple[str, str], Any] = {}  # what was replaced, while patched


def _patch_posthoc() -> None:
    """Replace pymc's post-hoc functions wherever they are the very objects pymc defines."""
    import importlib

    from . import posthoc as _posthoc

    replacements: dict[str, Callable] = {}
    for module_name, name in POSTHOC_TARGETS:
        try:
            module = importlib.import_module(module_name)
            original = _posthoc._pymc(name)
        except (ImportError, AttributeError):
            continue
        if vars(module).get(name) is not original:  # absent, lazy, or someone else's
            continue
        if name not in replacements:
            replacements[name] = _make_posthoc(original, getattr(_posthoc, name))
        _posthoc_originals[(module_name, name)] = original
        setattr(module, name, replacements[name])


def _unpatch_posthoc() -> None:
    import importlib

    for (module_name, name), original in list(_posthoc_originals.items()):
        setattr(importlib.import_module(module_name), name, original)
        del _posthoc_originals[(module_name, name)]


def _make_posthoc(original: Callable, ours: Callable) -> Callable:
    from .posthoc import ORIGINAL_ATTRIBUTE

    @functools.wraps(ours)
    def replacement(*args, **kwargs):
        token = _route.ROUTED.set(True)  # a fallback is logged, not warned
        try:
            return ours(*args, **kwargs)
        finally:
            _route.ROUTED.reset(token)

    replacement.__doc__ = (
        f"pymc's `{original.__name__}`, routed by `pymc_chunkpost.patch` to "
        f"`pymc_chunkpost.{ours.__name__}`, which takes the same arguments and returns the "
        "same result.\n\n" + (ours.__doc__ or "")
    )
    setattr(replacement, ORIGINAL_ATTRIBUTE, original)
    return replacement


# --- The predictive route, only when asked: pm.sample_posterior_predictive routed to
# `pymc_chunkpost._pymc.predictive`. ------------------------------------------------------------

#: Every place pymc exposes `sample_posterior_predictive`, as (module, attribute).
PREDICTIVE_TARGETS: tuple[tuple[str, str], ...] = (
    ("pymc", "sample_posterior_predictive"),
    ("pymc.sampling", "sample_posterior_predictive"),
    ("pymc.sampling.forward", "sample_posterior_predictive"),
)
_predictive_originals: dict[tuple[str, str], Any] = {}  # what was replaced, while patched


def _patch_predictive() -> None:
    """Replace pymc's `sample_posterior_predictive` where it is the very object pymc defines."""
    import importlib

    from . import predictive as _predictive

    original = _predictive._pymc_function()
    replacement = _make_predictive(original, _predictive)
    for module_name, name in PREDICTIVE_TARGETS:
        module = importlib.import_module(module_name)
        if vars(module).get(name) is original:
            _predictive_originals[(module_name, name)] = original
            setattr(module, name, replacement)


def _unpatch_predictive() -> None:
    import importlib

    for (module_name, name), original in list(_predictive_originals.items()):
        setattr(importlib.import_module(module_name), name, original)
        del _predictive_originals[(module_name, name)]


def _make_predictive(original: Callable, predictive: Any) -> Callable:
    """pymc's signature (pymc 5 takes its arguments positionally too) and our options."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def sample_posterior_predictive(*args, **kwargs):
        ours = {k: kwargs.pop(k) for k in _route.OPTIONS if k in kwargs}
        bound = signature.bind(*args, **kwargs)
        token = _route.ROUTED.set(True)
        try:
            return predictive.sample_posterior_predictive(**bound.arguments, **ours)
        finally:
            _route.ROUTED.reset(token)

    sample_posterior_predictive.__doc__ = (
        "pymc's `sample_posterior_predictive`, routed by `pymc_chunkpost.patch("
        "posterior_predictive=True)` to `pymc_chunkpost.sample_posterior_predictive`, which "
        "takes the same arguments and returns the same structure (the same distribution, "
        "not pymc's numbers for a seed).\n\n"
        + (predictive.sample_posterior_predictive.__doc__ or "")
    )
    vars(sample_posterior_predictive)["_pymc_chunkpost_original"] = original
    return sample_posterior_predictive
