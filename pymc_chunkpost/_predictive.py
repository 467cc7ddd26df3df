"""The predictive route: `sample_posterior_predictive` as one compiled, chunked program.

pymc's `sample_posterior_predictive` calls one compiled function per draw in a Python loop.
Here the model's forward graph, from the trace's variables to the requested ones, is built
once (`_graph.random_function`: data frozen at their current values, every random variable
drawn by our samplers from a key input) and mapped over all draws by the engine
(`_postprocess.run`), within the memory budget. The result is packed by pymc's own
functions into what pymc returns (pymc 6: `xarray.DataTree`; pymc 5: `arviz.InferenceData`).

Which variables are drawn anew and which are taken from the trace follows the installed
pymc's own rules (`_resolve_v5`, `_resolve_v6`). A trace variable whose length along a dim
differs from the model's (pymc 6 keeps it after `set_dim`) is computed with at the trace's
length, as pymc does; a length fixed in the variable's type is checked as pymc checks it.

Some calls run pymc's own function, said on the `pymc_chunkpost` logger as loudly as they
deserve: a `MultiTrace`, which pymc's function reads itself, at DEBUG (the records above it
are pymc's own); a non-JAX compile mode or pymc-only `compile_kwargs`, which the user asked
for, at INFO; a graph the route cannot build (a random variable with no sampler of ours),
which costs speed, as a one-line `UserWarning` (a log warning when `patch` routed the call).

Keys: random generator `j` of the graph, in draw `i` (its index in the flattened sample
dims), draws from the JAX key of the 64-bit seed `seed * 2**32 + i * n_generators + j`, so
the draws depend on the seed and the draw alone, bit for bit, never on the strategy, the chunk
size, the devices or where the outputs live, and no two draws share a stream (a function of
several draws, such as a `Deterministic` mean, up to the order of its floating-point sum).
They differ from pymc's for the same seed (docs/predictive.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _postprocess
from ._cache import FunctionCache
from ._graph import RandomFunction, random_function
from ._pymc_model import Fallback, compile_fallback, expected_shapes, pymc6
from ._route import Options, as_draws, cached_graph, evaluate, fall_back, split

__all__ = ["sample_posterior_predictive"]

# pymc logs which variables it samples here ("Sampling: [y]"); so does this route.
_pymc_log = logging.getLogger("pymc.sampling.forward")

# pymc's default compile arguments, which change nothing in a JAX program.
_NEUTRAL_COMPILE_KWARGS = frozenset({"mode", "allow_input_downcast", "accept_inplace"})
_CACHE_PER_MODEL = 8  # forward graphs kept per model (each holds its compiled executables)
_GRAPHS = FunctionCache(per_function=_CACHE_PER_MODEL)


def sample_posterior_predictive(
    trace: Any,
    model: Any = None,
    var_names: Sequence[str] | str | None = None,
    *,
    sample_vars: Sequence[str] | str | None = None,
    freeze_vars: Sequence[str] | str | None = None,
    sample_dims: Sequence[str] | None = None,
    random_seed: Any = None,
    progressbar: bool = True,
    progressbar_theme: Any = None,
    return_inferencedata: bool = True,
    extend_inferencedata: bool = False,
    predictions: bool = False,
    idata_kwargs: dict | None = None,
    backend: str | None = None,
    compile_kwargs: dict | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: int | float | None = None,
    output_memory: str = "auto",
    matmul_precision: str | None = "highest",
    output_path: str | os.PathLike | None = None,
    resume: bool = False,
) -> Any:
    """Draw the posterior predictive: every draw's forward samples in one compiled program.

    `pymc.sample_posterior_predictive`, with the installed pymc's arguments, rules and
    result (groups, names, dims, coords, dtypes and attrs; pymc 6: a `DataTree`, pymc 5: an
    `InferenceData`, or a dict of arrays with `return_inferencedata=False`). The draws come
    from the same distribution as pymc's, but not the same numbers for the same seed: draw
    `i` draws from JAX keys made of the seed and `i` alone, so the draws do not depend on the
    strategy, the chunk size, the devices, or where the outputs live (functions of several
    draws, up to the order of a floating-point sum).

    Args:
        trace: pymc 6: a `DataTree` or `Dataset`; pymc 5: an `InferenceData` or `Dataset`;
            or a list of points (dicts). A `MultiTrace` runs pymc's own function (said at
            DEBUG on the `pymc_chunkpost` logger).
        model: the model; default the one on the context stack.
        var_names: the variables to return (see pymc's documentation: on pymc 5 they are
            also drawn anew; on pymc 6 only `sample_vars` are).
        sample_vars: pymc 6: trace variables to draw anew rather than copy.
        freeze_vars: pymc 6: trace variables to keep, silencing `ImplicitFreezeWarning`.
        sample_dims: the trace's sample dims; default ("chain", "draw").
        random_seed: an int, `numpy.random.Generator` or `SeedSequence`, as pymc takes it;
            None draws a fresh seed.
        progressbar: show a progress bar over chunks while a loop runs.
        progressbar_theme: pymc's, accepted and unused (the bar is tqdm's).
        return_inferencedata: return pymc's inference data type (True) or a dict.
        extend_inferencedata: add the result to `trace` and return it.
        predictions: put the draws in a `predictions` group (out-of-sample data).
        idata_kwargs: passed to pymc's `to_inference_data`/`predictions_to_inference_data`.
        backend: pymc 6's compile backend: None or "jax" take this route; any other runs
            pymc's own function, as asked (logged at INFO on the `pymc_chunkpost` logger).
        compile_kwargs: pymc's compile arguments; only a JAX `mode` (and pymc's defaults
            `allow_input_downcast`, `accept_inplace`) can be honoured here; others run
            pymc's own function, as asked (logged at INFO).
        postprocessing_backend: the device: None (the default device), "cpu" or "gpu".
        postprocessing_vectorize: the strategy, one of `STRATEGIES` (see
            `postprocess_samples` for what each costs); default "auto", the fastest plan
            within the budget.
        chunk_size: draws per chunk ("chunked"/"auto"): smaller uses less memory, and takes
            longer.
        n_chunks: alternatively, the number of chunks.
        memory_budget: bytes the outputs and temporaries may take; default the device's
            free memory. The outputs (draws x every requested variable) are the floor.
        output_memory: "auto", "device", "host" or "disk": where the outputs live while
            computed ("host" lands each chunk in host memory, for outputs larger than the
            device; "disk" writes each chunk into a Zarr store at `output_path`, and the
            drawn variables of the result are read from it lazily: docs/memory.md). "auto"
            chooses disk only with a path. The store holds the trace's sample dims (any
            number; a list of points: `(chain, draw)` of one chain).
        output_path: the store's folder for "disk" (default: `configure_memory`'s); its
            group is "posterior_predictive" (or "predictions").
        resume: continue a store that a run of the same call (draws, `random_seed`,
            data) did not finish; needs a `random_seed`.
        matmul_precision: the precision of float32 products, as in
            `compute_log_likelihood`: "highest" (default) is float32's own on any device.

    Returns:
        What pymc returns for these arguments.

    Raises:
        ValueError: bad input (unknown names, a trace without the variables the graph
            needs, a rank or a fixed length that differs from the model's, lengths the
            model cannot compute with, bad options), before any work.
        IndexError: a constant index (`pm.Data`) out of range of what it indexes, before
            any work (pymc 5 raises it; JAX would clamp it).
        TypeError: an argument the installed pymc does not take (pymc 5 has no
            `sample_vars`, `freeze_vars` or `backend`).
    """
    return _sample(locals())


def _sample(arguments: dict[str, Any]) -> Any:
    """The route: check, resolve pymc's rules, build (cached), run, pack as pymc does."""
    import pymc

    pymc_args, options = _split(arguments)
    trace = arguments["trace"]
    fallback = _fallback_reason(pymc_args, trace)
    if fallback is not None:
        return _fall_back(fallback, trace, pymc_args)
    model = pymc.modelcontext(pymc_args.get("model"))
    read = _read_trace(trace, pymc_args.get("sample_dims"), model)
    if model.potentials:
        warnings.warn(
            "The effect of Potentials on other parameters is ignored during posterior "
            "predictive sampling. This is likely to lead to invalid or biased predictive "
            "samples.",
            UserWarning,
            stacklevel=3,
        )
    forward = (_resolve_v6 if pymc6() else _resolve_v5)(model, pymc_args, read)
    if not forward.names:
        return _empty(pymc_args, read)
    built = _build(model, forward, read) if forward.outputs else None
    if isinstance(built, str):
        return _fall_back(
            Fallback(built, logging.WARNING), trace, pymc_args
        )  # logs what it samples
    _pymc_log.info(f"Sampling: [{', '.join(forward.sampled)}]")
    values: dict[str, Any] = {}
    group = "predictions" if pymc_args.get("predictions") else "posterior_predictive"
    on_disk = None
    if built is not None:
        seed = pymc_args.get("random_seed")
        values, on_disk = _evaluate(built, forward, read, seed, options, group, model)
    for name in forward.copied:
        values[name] = np.array(read.values(name))
    ppc = {name: values[name] for name in forward.names}
    if on_disk is None or built is None or not pymc_args["return_inferencedata"]:
        return _pack(ppc, model, pymc_args, read)
    drawn = built.output_names
    placeholders = {  # no memory: pymc packs them, then the store's variables replace them
        name: np.broadcast_to(np.zeros((), x.dtype), x.shape) if name in drawn else x
        for name, x in ppc.items()
    }
    result = _pack(placeholders, model, pymc_args, read)
    return _from_store(result, on_disk, group, drawn)


# --- arguments ----------------------------------------------------------------------------


def _pymc_function() -> Callable:
    """pymc's own `sample_posterior_predictive` (the original while patched)."""
    from pymc.sampling import forward

    function = forward.sample_posterior_predictive
    return getattr(function, "_pymc_chunkpost_original", function)


def _split(arguments: dict[str, Any]) -> tuple[dict[str, Any], Options]:
    """pymc's arguments (those the installed pymc takes) and our checked options
    (`_route.split`), and pymc's `sample_dims` checked.

    Raises:
        TypeError: an argument the installed pymc does not take, set to a non-default.
        ValueError: a bad option of ours, or bad `sample_dims`.
    """
    pymc_args, options = split(
        "sample_posterior_predictive",
        sample_posterior_predictive,
        _pymc_function(),
        arguments,
        skip=("trace",),
    )
    if pymc_args.get("progressbar_theme", False) is None:  # None: pymc's default
        del pymc_args["progressbar_theme"]
    sample_dims = pymc_args.get("sample_dims")
    if sample_dims is not None and (
        isinstance(sample_dims, str) or not all(isinstance(d, str) for d in sample_dims)
    ):
        raise ValueError(
            f"`sample_dims` must be a sequence of dimension names, got {sample_dims!r}. Pass, "
            'for example, `sample_dims=["chain", "draw"]`.'
        )
    if options.engine.get("resume") and pymc_args.get("random_seed") is None:
        raise ValueError(
            "`resume=True` needs the `random_seed` of the call that wrote the store: without "
            "one, each call draws from a new seed, whose draws cannot continue the store's. "
            "Pass the same `random_seed` (and draws) as that call."
        )
    return pymc_args, options


def _fallback_reason(pymc_args: dict[str, Any], trace: Any) -> Fallback | None:
    """Why this route cannot give pymc's answer for these arguments; None when it can."""
    from pymc.backends.base import MultiTrace

    reason = compile_fallback(pymc_args, _NEUTRAL_COMPILE_KWARGS)
    if reason is not None:
        return Fallback(reason, logging.INFO)
    if isinstance(trace, MultiTrace):
        # pymc's own function is the route for a MultiTrace: its per-draw loop reads the
        # trace's chains as they are, and a MultiTrace holds neither data nor coords, so pymc
        # draws anew whatever depends on them. Nothing is lost: nothing to say above DEBUG,
        # so that the records are pymc's own.
        return Fallback("the trace is a MultiTrace", logging.DEBUG)
    return None


def _fall_back(fallback: Fallback, trace: Any, pymc_args: dict[str, Any]) -> Any:
    """pymc's own function (`_route.fall_back`)."""
    name = "sample_posterior_predictive"
    return fall_back(name, fallback, _pymc_function(), trace, **pymc_args)


# --- the trace ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Trace:
    """The trace's draws and what pymc reads from around them.

    `sample_shape` is the leading shape of pymc's outputs: the lengths of the sample dims for
    a `Dataset`, `(1, n)` for a list of `n` points (`stacked_dims` is then None).
    """

    idata: Any  # the inference data given (extended in place), else None
    posterior: Any  # the posterior `Dataset`, or the list of points
    sample_dims: list[str]
    stacked_dims: dict[str, Any] | None
    sample_shape: tuple[int, ...]
    names: list[str]  # the trace's variables
    constant_data: dict[str, np.ndarray]
    coords: dict[str, np.ndarray]
    observed_data: Any

    def values(self, name: str) -> np.ndarray:
        """`name`'s draws, of shape `sample_shape + event shape` (a view where possible)."""
        if self.stacked_dims is None:
            stacked = np.stack([np.asarray(point[name]) for point in self.posterior])
            return stacked.reshape(self.sample_shape + stacked.shape[1:])
        return self.posterior[name].transpose(*self.sample_dims, ...).values

    def event_shape(self, name: str) -> tuple[int, ...]:
        if self.stacked_dims is None:
            return tuple(np.shape(self.posterior[0][name]))
        return tuple(self.posterior[name].shape[len(self.sample_dims) :])


def _read_trace(trace: Any, sample_dims: Sequence[str] | None, model: Any) -> _Trace:
    """What pymc reads from `trace`, checked before any work.

    Raises:
        TypeError: a trace of a type pymc does not take (pymc's own message).
        ValueError: sample dims the trace does not have, or points without the same keys.
    """
    import xarray

    dims = ["chain", "draw"] if sample_dims is None else list(sample_dims)
    constant_data: dict[str, np.ndarray] = {}
    coords: dict[str, np.ndarray] = {}
    idata, observed_data = None, None
    if _is_inference_data(trace):
        given = getattr(trace, "constant_data", None)
        if given is not None:
            coords.update({str(k): v.data for k, v in given.coords.items()})
            constant_data.update({str(k): v.data for k, v in given.items()})
        idata, observed_data = trace, trace.get("observed_data", None)
        if not pymc6():
            trace = trace["posterior"]
        else:
            trace = trace["posterior"].dataset if "posterior" in trace.children else trace.dataset
    if isinstance(trace, xarray.Dataset):
        return _read_dataset(trace, dims, idata, constant_data, coords, observed_data)
    if isinstance(trace, list) and trace and all(isinstance(x, dict) for x in trace):
        names = list(trace[0])
        if any(list(point) != names for point in trace):
            raise ValueError(
                "Every point of `trace` must have the same variables, in the same order; "
                f"the first has {names}."
            )
        shape = (1, len(trace))
        return _Trace(None, trace, dims, None, shape, names, {}, {}, None)
    raise TypeError(f"Unsupported type for `trace` argument: {type(trace)}.")


def _read_dataset(dataset, dims, idata, constant_data, coords, observed_data) -> _Trace:
    names = [str(name) for name in dataset.data_vars]
    if not names:
        raise ValueError("`trace` has no variables: pass the posterior that `pm.sample` returned.")
    for name in names:
        if absent := [d for d in dims if d not in dataset[name].dims]:
            raise ValueError(
                f"`sample_dims={dims}` names {absent}, which `trace[{name!r}]` does not have "
                f"(its dims: {dataset[name].dims}). Pass the dims that index its draws."
            )
    coords.update({str(k): v.data for k, v in dataset.coords.items()})
    stacked = {d: dataset[names[0]][d] for d in dims}  # as pymc's `dataset_to_point_list`
    shape = tuple(len(coord) for coord in stacked.values())
    return _Trace(idata, dataset, dims, stacked, shape, names, constant_data, coords, observed_data)


def _is_inference_data(trace: Any) -> bool:
    if pymc6():
        import xarray

        return isinstance(trace, xarray.DataTree)
    from arviz import InferenceData

    return isinstance(trace, InferenceData)


# --- which variables: pymc's rules --------------------------------------------------------


@dataclasses.dataclass
class _Forward:
    """What one call computes, by the installed pymc's rules."""

    names: list[str]  # the result's variables, in pymc's order
    outputs: list[Any]  # the model variables the graph computes
    inputs: list[Any]  # the trace variables the graph takes (as pymc's compiled function)
    copied: list[str]  # pymc 6: variables copied from the trace
    sampled: list[str]  # the random variables drawn anew ("Sampling: [...]")


def _model_variables(model: Any, names: Any, argument: str) -> list[Any]:
    if isinstance(names, str):
        names = [names]
    if unknown := [n for n in names if n not in model.named_vars]:
        raise ValueError(
            f"`{argument}` has {unknown}, which the model does not have. Its variables: "
            f"{list(model.named_vars)}."
        )
    return [model[n] for n in names]


def _resolve_v5(model: Any, pymc_args: dict[str, Any], read: _Trace) -> _Forward:
    """pymc 5.28: every variable in `var_names` is drawn anew, and whatever depends on a
    drawn variable, on changed `pm.Data` or on changed coords (pymc's
    `compile_forward_sampling_function`)."""
    from pymc.sampling.forward import get_constant_coords, observed_dependent_deterministics
    from pymc.util import get_default_varnames
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.tensor.random.var import RandomGeneratorSharedVariable

    var_names = pymc_args.get("var_names")
    if var_names is not None:
        chosen = _model_variables(model, var_names, "var_names")
    else:
        observed = list(model.observed_RVs)
        if read.observed_data is not None:
            observed += [model[x] for x in read.observed_data if x in model]
        chosen = observed + observed_dependent_deterministics(model, observed)
    outputs = list(dict.fromkeys(get_default_varnames(chosen, include_transformed=False)))
    if not outputs:
        return _Forward([], [], [], [], [])
    in_trace = {model[n] for n in read.names if n in _traceable(model)}
    constant_coords = get_constant_coords(read.coords, model)
    basic = set(model.basic_RVs)
    volatile: set[Any] = set()
    for var in _toposort(outputs):
        if (
            var in outputs
            or (
                isinstance(var, SharedVariable)
                and not isinstance(var, RandomGeneratorSharedVariable)
                and not _shared_matches(var, read.constant_data, constant_coords)
            )
            or (var in basic and var not in in_trace)
            or (var.owner is not None and any(i in volatile for i in var.owner.inputs))
        ):
            volatile.add(var)
    inputs = _inputs(outputs, in_trace, volatile)
    sampled = sorted(v.name for v in basic & volatile)
    return _Forward([v.name for v in outputs], outputs, inputs, [], sampled)


def _shared_matches(var: Any, constant_data: dict, constant_coords: set) -> bool:
    """pymc 5: whether shared `var` holds what it held at inference time."""
    if var.name not in constant_data:
        return var.name in constant_coords
    return bool(np.array_equal(constant_data[var.name], var.get_value(borrow=True)))


def _traceable(model: Any) -> set[str]:
    return {v.name for v in model.free_RVs + model.deterministics}


def _toposort(outputs: Sequence[Any]) -> list[Any]:
    from pytensor.graph.traversal import general_toposort

    return list(general_toposort(outputs, deps=lambda x: x.owner.inputs if x.owner else []))


def _inputs(outputs: Sequence[Any], in_trace: set, volatile: set) -> list[Any]:
    """The trace variables pymc's compiled function takes, that the outputs need.

    pymc's walk (`compile_forward_sampling_function`) takes every non-volatile trace variable
    it meets and every free root; of those, only the ones the outputs reach without passing
    through another are needed. A free root that is not in the trace is an error in pymc.
    """
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors, walk

    taken: list[Any] = []

    def expand(var):
        free_root = var.owner is None and not isinstance(var, Constant | SharedVariable)
        if (free_root or var in in_trace) and var not in volatile:
            taken.append(var)
        return var.owner.inputs if var.owner else None

    list(walk(list(outputs), expand))
    needed = set(ancestors(list(outputs), blockers=taken))
    return [v for v in dict.fromkeys(taken) if v in needed and v not in outputs]


def _resolve_v6(model: Any, pymc_args: dict[str, Any], read: _Trace) -> _Forward:
    """pymc 6.4: trace variables are kept unless in `sample_vars` (with
    `ImplicitFreezeWarning` where something upstream changed); variables missing from the
    trace are drawn; `var_names` only selects the outputs."""
    from pymc.sampling import forward as pymc_forward
    from pytensor.graph.fg import FunctionGraph

    var_names, sample_vars = (
        _names(pymc_args.get("var_names")),
        _names(pymc_args.get("sample_vars")),
    )
    freeze_vars = _names(pymc_args.get("freeze_vars"))
    constant_data = pymc_forward._build_constant_data(read.constant_data, read.coords, model)
    in_trace = [model[n] for n in read.names if n in _traceable(model)]
    outputs = _outputs_v6(model, var_names, sample_vars, read)
    volatile_vars: set[Any] = set()
    if sample_vars is not None:
        allowed = set(model.basic_RVs) | set(model.deterministics)
        chosen = _model_variables(model, sample_vars, "sample_vars")
        if invalid := [v.name for v in chosen if v not in allowed]:
            raise ValueError(
                f"sample_vars {sorted(invalid)} are not random variables or "
                f"deterministics; only those can have trace values to override."
            )
        volatile_vars = set(chosen)
    rv_set, in_trace_set = set(model.basic_RVs), set(in_trace)
    frozen = _frozen_v6(model, freeze_vars, sample_vars, in_trace)
    auto_frozen = [
        rv
        for rv in in_trace
        if rv in rv_set and rv.name not in set(sample_vars or ()) and rv not in frozen
    ]
    frozen.update(auto_frozen)
    closure = pymc_forward._compute_volatile_vars(
        FunctionGraph(outputs=list(outputs) + auto_frozen, clone=False),
        vars_in_trace=in_trace_set,
        rvs=rv_set,
        constant_data=constant_data,
        volatile_vars=volatile_vars,
        freeze_vars=frozen,
    )
    outputs = list(dict.fromkeys(outputs))
    if not outputs:
        return _Forward([], [], [], [], [])
    compiled = [v for v in outputs if not (v in in_trace_set and v not in closure)]
    pymc_forward._maybe_warn_implicit_freeze(
        auto_frozen=auto_frozen,
        volatile_closure=closure,
        volatile_vars=volatile_vars,
        rv_set=rv_set,
        vars_in_trace_set=in_trace_set,
        constant_data=constant_data,
        model=model,
        trace_coords=read.coords,
    )
    return _evaluated_v6(
        model, outputs, compiled, in_trace_set, constant_data, volatile_vars, frozen
    )


def _names(names: Any) -> list[str] | None:
    return [names] if isinstance(names, str) else (None if names is None else list(names))


def _outputs_v6(model: Any, var_names: Any, sample_vars: Any, read: _Trace) -> list[Any]:
    """pymc 6.4's outputs: `var_names`, else `sample_vars`, else the observed variables and
    the deterministics that depend on them."""
    from pymc.sampling.forward import observed_dependent_deterministics

    if var_names is not None:
        return _model_variables(model, var_names, "var_names")
    if sample_vars is not None:
        return _model_variables(model, sample_vars, "sample_vars")
    extra: list[Any] = []
    outputs = list(model.observed_RVs)
    if read.observed_data is not None:
        for name in read.observed_data:
            if name in model and model[name] not in outputs:
                outputs.append(model[name])
                extra.append(model[name])
    known = set(outputs)
    outputs += [d for d in observed_dependent_deterministics(model, extra) if d not in known]
    return outputs


def _frozen_v6(model: Any, freeze_vars: Any, sample_vars: Any, in_trace: list) -> set[Any]:
    if freeze_vars is None:
        return set()
    frozen = set(_model_variables(model, freeze_vars, "freeze_vars"))
    if missing := {x for x in freeze_vars if x not in {v.name for v in in_trace}}:
        raise ValueError(
            f"freeze_vars {sorted(missing)} are not present in the trace. "
            f"Cannot freeze variables without stored values."
        )
    if sample_vars is not None and (overlap := (set(freeze_vars) & set(sample_vars))):
        raise ValueError(
            f"Variables {sorted(overlap)} are in both sample_vars and freeze_vars. "
            f"A variable cannot be both resampled and frozen."
        )
    return frozen


def _evaluated_v6(model, outputs, compiled, in_trace, constant_data, volatile_vars, frozen):
    """What pymc 6.4's `compile_forward_sampling_function` compiles for `compiled`: outputs
    are not volatile in themselves there, so it computes volatility again on them alone."""
    from pymc.sampling import forward as pymc_forward
    from pymc.util import get_default_varnames
    from pytensor.graph.fg import FunctionGraph

    evaluated = list(get_default_varnames(compiled, include_transformed=False))
    copied = [v.name for v in outputs if v.name not in {e.name for e in evaluated}]
    if not evaluated:
        return _Forward([v.name for v in outputs], [], [], copied, [])
    closure = pymc_forward._compute_volatile_vars(
        FunctionGraph(outputs=evaluated, clone=False),
        vars_in_trace=in_trace,
        rvs=set(model.basic_RVs),
        constant_data=constant_data,
        volatile_vars=volatile_vars,
        freeze_vars=frozen,
    )
    inputs = _inputs(evaluated, in_trace, closure)
    sampled = sorted(v.name for v in set(model.basic_RVs) & closure)
    names = [v.name for v in evaluated] + copied  # the order of pymc's inserts
    return _Forward(names, evaluated, inputs, copied, sampled)


# --- the program --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Built:
    """The per-draw function `fn(seed_and_index, *inputs)` and what it takes and gives."""

    fn: Callable
    input_names: list[str]
    output_names: list[str]
    impl: str
    n_generators: int


def _build(model: Any, forward: _Forward, read: _Trace) -> _Built | str:
    """The forward graph as a per-draw JAX function, cached per model; a reason if none.

    The cache keys weakly on the model, and on the names, the trace's shapes, the PRNG
    implementation and a digest of the model's data: `pm.set_data` gives a new program, as
    the data are constants in it. Whether it traces (a random variable whose size is not
    static cannot) is checked here, before any work.

    Raises:
        ValueError: a trace variable whose shape the variable's static shape refuses, or
            whose length along a resized dim the graph cannot compute with (where pymc's
            own function raises too).
        IndexError: a constant index out of range of what it indexes (pymc 5 raises it).
    """
    impl = str(jax.config.values["jax_default_prng_impl"])  # JAX's default, as set by the user
    shapes = [_checked_shape(v, read) for v in forward.inputs]
    signature = tuple(
        (v.name, shape, v.type.dtype) for v, shape in zip(forward.inputs, shapes, strict=True)
    )
    outputs = tuple(v.name for v in forward.outputs)

    def build() -> _Built | str:
        try:
            graph = random_function(forward.inputs, forward.outputs, shapes)
            if isinstance(graph, str):
                return graph
            names = [v.name for v in forward.inputs]
            built = _Built(_per_draw(graph, impl), names, list(outputs), impl, graph.n_generators)
            key_spec = jax.ShapeDtypeStruct((2,), np.uint32)
            specs = [jax.ShapeDtypeStruct(s, v.type.dtype) for v, s in zip(forward.inputs, shapes)]
            jax.eval_shape(built.fn, key_spec, *specs)
        except jax.errors.ConcretizationTypeError as error:
            return f"a random variable's size is not static: {str(error).splitlines()[0]}"
        except NotImplementedError as error:  # e.g. a pytensor Op that JAX has no dispatch for
            return f"no JAX implementation: {str(error).splitlines()[0]}"
        except (ValueError, TypeError) as error:
            _raise_shape_error(model, forward, shapes, error)
        return built

    return cached_graph(_GRAPHS, model, ("predictive", outputs, signature, impl), build)


def _raise_shape_error(model: Any, forward: _Forward, shapes: list, error: Exception) -> None:
    """pymc's `ValueError` for shapes that do not broadcast: pytensor raises ValueError as it
    rebuilds the graph at the trace's shapes, JAX a TypeError as it traces it. Any other
    error is raised as it is."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(error, TypeError) and "incompatible shapes" not in first:
        raise error
    if resized := _resized(model, forward.inputs, shapes):
        raise ValueError(
            f"The trace's {'; '.join(resized)} (a dim resized since sampling), and the "
            f"model's graph does not compute with that: {first} Pass `sample_vars` "
            "(pymc 6) to draw it anew at the model's length, or the model the draws "
            "came from."
        ) from error
    if isinstance(error, TypeError):
        raise ValueError(f"The model's shapes do not broadcast: {first}") from error
    raise error


def _per_draw(graph: RandomFunction, impl: str) -> Callable:
    """`graph.fn` for draw `i`, from `[seed, i]`: generator `j` of the graph draws from the
    key of the 64-bit seed `seed * 2**32 + i * n_generators + j`.

    For threefry (JAX's default) that key is the pair of words `[seed, i * n + j]`, built
    here without a hash (as `jax.random.key` builds it: one threefry hash less for XLA to
    compile per program); for other implementations, `fold_in(key(seed), i * n + j)`.
    """
    fn, n = graph.fn, graph.n_generators
    offsets = np.arange(n, dtype=np.uint32)

    def keys_of(seed_and_index):
        counters = seed_and_index[1] * np.uint32(n) + offsets
        if impl == "threefry2x32":
            words = jax.numpy.stack([jax.numpy.broadcast_to(seed_and_index[0], (n,)), counters])
            return jax.random.wrap_key_data(words.T, impl=impl)
        base = jax.random.key(seed_and_index[0], impl=impl)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, counters)

    def per_draw(seed_and_index, *values):
        return fn(keys_of(seed_and_index) if n else None, *values)

    return per_draw


def _checked_shape(var: Any, read: _Trace) -> tuple[int, ...]:
    """The trace's per-draw shape of `var`, checked as pymc's compiled function checks its
    inputs: the variable's rank, and the lengths fixed in its type (`shape=3`, or a model
    after `freeze_dims_and_data`).

    A length that a dim gives (`dims=`, resizable by `set_dim`) is not fixed in the type:
    pymc computes with the trace's length there (pymc 6 keeps a trace variable after its
    dim was resized, and warns `ImplicitFreezeWarning`), and so does the graph, built for the
    trace's shapes. What cannot compute with it fails when the graph is built (`_build`), and
    a constant index out of its range raises there (`_graph`), not clamped as JAX would.
    """
    shape = read.event_shape(var.name)
    static = tuple(var.type.shape)
    if len(shape) != len(static) or any(
        n is not None and n != m for n, m in zip(static, shape, strict=False)
    ):
        raise ValueError(
            f"The trace's {var.name!r} has shape {shape} per draw, but the model's is fixed "
            f"at {static}. Pass the model the draws came from (with the same data and coords)."
        )
    return shape


def _resized(model: Any, inputs: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> list[str]:
    """ "`name` has shape (trace's) per draw, the model's (current's)" for each free variable
    among `inputs` whose trace shape is not the model's current one."""
    free = [(v, s) for v, s in zip(inputs, shapes, strict=True) if v in model.free_RVs]
    if not free:
        return []
    expected = expected_shapes(model)
    return [
        f"{v.name!r} has shape {s} per draw, the model's {expected[v.name]}"
        for v, s in free
        if s != expected[v.name]
    ]


def _seed_and_index(random_seed: Any, lead: tuple[int, int], built: _Built) -> np.ndarray:
    """`[seed, i]` for every draw `i` (its index in the flattened sample dims), of shape
    `lead + (2,)`: the per-draw input from which `_per_draw` makes the draw's keys.

    The seed is pymc's (`_get_seeds_per_chain(random_seed, 1)`, which also takes numpy
    generators), taken modulo 2**32; None draws one from the operating system.
    """
    from pymc.util import _get_seeds_per_chain

    if random_seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    else:
        (seed,) = _get_seeds_per_chain(random_seed, 1)
    n_draws = lead[0] * lead[1]
    if n_draws * max(built.n_generators, 1) > 2**32:
        raise ValueError(
            f"{n_draws} draws of {built.n_generators} random generators need more than 2**32 "
            "keys: pass fewer draws per call."
        )
    out = np.empty(lead + (2,), np.uint32)
    out[..., 0] = int(seed) % 2**32
    out[..., 1] = np.arange(n_draws, dtype=np.uint32).reshape(lead)
    return out


def _store_for(model: Any, built: _Built, read: _Trace, ours: dict[str, Any], group: str) -> Any:
    """Where the outputs may go to disk (`_postprocess.StoreLayout`), or None: a path is set,
    `output_memory` is "disk" or "auto", and the trace has sample dims (else "disk" is
    refused, "auto" keeps to memory). The store's sample dims are the trace's, under the
    store's names (`_disk_output.sample_dims`), with the trace's coordinates where they are
    plain values (`_from_store` gives them pymc's names and coordinates back).

    Raises:
        ValueError: "disk" asked of a trace without sample dims, before any work.
    """
    where = ours.get("output_memory", "auto")
    if ours.get("output_path") is None or where not in ("auto", "disk"):
        return None
    if not read.sample_shape:
        if where == "disk":
            raise ValueError(
                "`output_memory='disk'` stores draws along sample dims; `sample_dims=[]` "
                "gives one point. Pass `output_memory='host'`, or draws with sample dims."
            )
        return None
    from pymc.backends.arviz import coords_and_dims_for_inferencedata

    from ._disk_output import sample_dims

    coords, dims = coords_and_dims_for_inferencedata(model)
    stacked = list((read.stacked_dims or {}).values())
    names = sample_dims(len(read.sample_shape))
    sample = {k: np.asarray(v) for k, v in zip(names, stacked) if np.asarray(v).dtype != object}
    layout = _postprocess.StoreLayout(built.output_names, group, dims, {**coords, **sample})
    return dataclasses.replace(layout, sample_shape=read.sample_shape)


def _from_store(result: Any, path: Any, group: str, names: Sequence[str]) -> Any:
    """`result` (pymc's packing, with placeholders for `names` in `group`) with those
    variables read lazily from the store at `path`, under pymc's dims and coordinates (the
    stored variables' own are dropped: a stacked sample dim's may be a `MultiIndex`)."""
    from ._disk_output import open_group

    stored = open_group(path, group)
    packed = result[group]
    dataset = packed.to_dataset() if hasattr(packed, "to_dataset") else packed
    for name in names:
        variable = stored[name]
        renamed = dict(zip(variable.dims, dataset[name].dims))
        variable = variable.rename({k: v for k, v in renamed.items() if k != v}).variable
        variable.attrs = dict(dataset[name].attrs)
        dataset[name] = variable  # a `Variable`: the dataset's coordinates, no alignment
    if pymc6():
        result[group] = dataset
    else:
        setattr(result, group, dataset)
    return result


def _evaluate(
    built: _Built,
    forward: _Forward,
    read: _Trace,
    random_seed: Any,
    options: Options,
    group: str = "posterior_predictive",
    model: Any = None,
) -> tuple[dict[str, Any], Any]:
    """Every output at every draw, as writable numpy arrays of pymc's shapes, and None; or,
    where they went to disk, the store's Zarr arrays and the store's path."""
    store = None if model is None else _store_for(model, built, read, options.engine, group)
    if store is None:
        options = options.with_engine(output_path=None)
    n_sample_dims = len(read.sample_shape)
    arrays = []
    for name, var in zip(built.input_names, forward.inputs, strict=True):
        draws = read.values(name).astype(var.type.dtype, copy=False)  # allow_input_downcast
        arrays.append(as_draws(draws, n_sample_dims))
    n_draws = int(np.prod(read.sample_shape, dtype=np.int64))
    lead = read.sample_shape if len(read.sample_shape) == 2 else (1, n_draws)
    keys = _seed_and_index(random_seed, lead, built)
    label = f"Sampling {', '.join(built.output_names)}"
    values, on_disk = evaluate(
        built.fn, [keys, *arrays], options, label, random=True, host_inputs=arrays, store=store
    )
    if on_disk:
        return dict(zip(built.output_names, values)), options.engine["output_path"]
    shaped = {
        name: array.reshape(read.sample_shape + array.shape[2:])
        for name, array in zip(built.output_names, values)
    }
    return shaped, None


# --- the result, as pymc packs it ---------------------------------------------------------


def _empty(pymc_args: dict[str, Any], read: _Trace) -> Any:
    """pymc's result when there is nothing to sample."""
    if pymc_args["return_inferencedata"] and not pymc_args["extend_inferencedata"]:
        if pymc6():
            import xarray

            return xarray.DataTree()
        from arviz import InferenceData

        return InferenceData()
    if pymc_args["return_inferencedata"]:
        return read.posterior if read.idata is None else read.idata
    return {}


def _pack(ppc: dict[str, np.ndarray], model: Any, pymc_args: dict[str, Any], read: _Trace) -> Any:
    """pymc's own packing of the draws (`to_inference_data`, `predictions_to_inference_data`)."""
    import pymc

    if not pymc_args["return_inferencedata"]:
        return ppc
    idata_kwargs = dict(pymc_args.get("idata_kwargs") or {})
    idata_kwargs.setdefault("coords", {})
    ikwargs: dict[str, Any] = dict(model=model, **idata_kwargs)
    ikwargs.setdefault("sample_dims", read.sample_dims)
    if read.stacked_dims is not None:
        ikwargs["coords"] = {**read.stacked_dims, **ikwargs.get("coords", {})}
    extend, idata = pymc_args["extend_inferencedata"], read.idata
    if pymc_args["predictions"]:
        if extend:
            ikwargs.setdefault("idata_orig", idata)
            ikwargs.setdefault("inplace", True)
        return pymc.predictions_to_inference_data(ppc, **ikwargs)
    idata_pp = pymc.to_inference_data(posterior_predictive=ppc, **ikwargs)
    if not (extend and idata is not None):
        return idata_pp
    if not pymc6():
        idata.extend(idata_pp)
        return idata
    conflicting = (set(idata.children) & set(idata_pp.children)) - {
        "observed_data",
        "constant_data",
    }
    if conflicting:
        warnings.warn(
            f"groups {conflicting} already exist in the DataTree and will be overwritten. "
            "To avoid this, set extend_inferencedata=False.",
            UserWarning,
            stacklevel=4,
        )
    idata.update(idata_pp)
    return idata
