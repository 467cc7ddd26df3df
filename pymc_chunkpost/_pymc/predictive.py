"""The predictive route: `sample_posterior_predictive` as one compiled, chunked program.

pymc's `sample_posterior_predictive` calls one compiled function per draw in a Python loop.
Here the model's forward graph, from the trace's variables to the requested ones, is built
once (`forward_graph.build`: data frozen at their current values, every random variable
drawn by our samplers from a key input) and mapped over all draws by the engine
(`_postprocess.run`), within the memory budget. The result is packed by pymc's own
functions into what pymc returns (pymc 6: `xarray.DataTree`; pymc 5: `arviz.InferenceData`).

The trace is read as pymc reads it (`trace`). Which variables are drawn anew and which are
taken from the trace follows the installed pymc's own rules (`forward_graph`); this module is
the route around them: pymc's arguments and ours, the fallbacks, the draws' keys, where the
outputs live, and the packing.

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

import numpy as np

from .._engine.call import postprocess as _postprocess
from .._frontend.seam import Fallback, Options, as_draws, evaluate, fall_back, split
from . import forward_graph
from .model import compile_fallback, pymc6
from .trace import Trace, read_trace

__all__ = ["sample_posterior_predictive"]

# pymc logs which variables it samples here ("Sampling: [y]"); so does this route.
_pymc_log = logging.getLogger("pymc.sampling.forward")

# pymc's default compile arguments, which change nothing in a JAX program.
_NEUTRAL_COMPILE_KWARGS = frozenset({"mode", "allow_input_downcast", "accept_inplace"})


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
    read = read_trace(trace, pymc_args.get("sample_dims"), model)
    if model.potentials:
        warnings.warn(
            "The effect of Potentials on other parameters is ignored during posterior "
            "predictive sampling. This is likely to lead to invalid or biased predictive "
            "samples.",
            UserWarning,
            stacklevel=3,
        )
    resolve = forward_graph.resolve_v6 if pymc6() else forward_graph.resolve_v5
    forward = resolve(model, pymc_args, read)
    if not forward.names:
        return _empty(pymc_args, read)
    # looked up on the module at each call: the benchmarks time it by replacing it there
    built = forward_graph.build(model, forward, read) if forward.outputs else None
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


# --- the run: the draws' keys, where the outputs live -------------------------------------


def _seed_and_index(
    random_seed: Any, lead: tuple[int, int], built: forward_graph.Built
) -> np.ndarray:
    """`[seed, i]` for every draw `i` (its index in the flattened sample dims), of shape
    `lead + (2,)`: the per-draw input from which `forward_graph._per_draw` makes the draw's
    keys.

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


def _store_for(
    model: Any, built: forward_graph.Built, read: Trace, ours: dict[str, Any], group: str
) -> Any:
    """Where the outputs may go to disk (`_postprocess.StoreLayout`), or None: a path is set,
    `output_memory` is "disk" or "auto", and the trace has sample dims (else "disk" is
    refused, "auto" keeps to memory). The store's sample dims are the trace's, under the
    store's names (`_zarr_store.sample_dims`), with the trace's coordinates where they are
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

    from .._store.zarr import sample_dims

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
    from .._store.zarr import open_group

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
    built: forward_graph.Built,
    forward: forward_graph.Forward,
    read: Trace,
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


def _empty(pymc_args: dict[str, Any], read: Trace) -> Any:
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


def _pack(ppc: dict[str, np.ndarray], model: Any, pymc_args: dict[str, Any], read: Trace) -> Any:
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
