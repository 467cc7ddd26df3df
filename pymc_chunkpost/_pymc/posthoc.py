"""The post-hoc route: `compute_log_likelihood`, `compute_log_prior`, `compute_deterministics`.

pymc computes these with `pymc.backends.arviz.apply_function_over_dataset`: a Python loop
that calls a compiled function once per draw (4,000 calls for 4 x 1000 draws) and gathers
the results. Here the same per-draw graph (pymc's, with pymc's rewrites) is jaxified once and
evaluated over all draws by `postprocess_samples`'s engine, and the result is packed into
the very xarray objects pymc returns (pymc 6: `xarray.DataTree`/`Dataset`; pymc 5:
`arviz.InferenceData`/`Dataset`).

What the JAX route cannot honour runs pymc's own function: the answer is always pymc's. Where
the user asked for it (a non-JAX `backend=`, pymc-only `compile_kwargs`) that is said at INFO
on the `pymc_chunkpost` logger, not as a warning (pymc's own tests turn warnings into errors);
where the route fails them (a graph with no JAX implementation, sample dims pymc 5 cannot
take) it is a one-line `UserWarning`, or a log warning where `patch` routed pymc's own call
here. The arguments, the fallback, the graph cache and the evaluation are the pymc routes'
shared seam (`_route`); this module keeps pymc's rules for these three functions.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._engine.call import postprocess as _postprocess
from .._frontend.seam import (
    Fallback,
    MissingVariableError,
    Options,
    as_draws,
    evaluate,
    fall_back,
    split,
)
from .._store import zarr as _zarr_store
from .._support.cache import FunctionCache
from .graph import jaxify
from .model import cached_graph, compile_fallback, expected_shapes, pymc6

__all__ = ["compute_log_likelihood", "compute_log_prior", "compute_deterministics"]

#: pymc's functions that this module replaces, as (module, name): where `_pymc` finds pymc's
#: own function to fall back on. `_patch` installs the replacements at every place pymc
#: exposes them.
PYMC_FUNCTIONS: dict[str, tuple[str, str]] = {
    "compute_log_likelihood": ("pymc.stats.log_density", "compute_log_likelihood"),
    "compute_log_prior": ("pymc.stats.log_density", "compute_log_prior"),
    "compute_deterministics": ("pymc.sampling.deterministic", "compute_deterministics"),
}
#: The attribute a replacement carries, naming the pymc function it replaced.
ORIGINAL_ATTRIBUTE = "_pymc_chunkpost_original"

_KIND_TARGETS = {"likelihood": "observed_RVs", "prior": "free_RVs"}
_CACHE_PER_MODEL = 8  # jaxified graphs kept per model (each holds its compiled executables)
# Weakly keyed on the model: a model that is gone takes its graphs, and their compiled
# executables, with it; `clear_caches` empties it.
_GRAPHS = FunctionCache(per_function=_CACHE_PER_MODEL)
#: Added to the log-likelihood's `MemoryError`: model comparison needs no matrix.
_LOO_HINT = (
    "For PSIS-LOO-CV, `pymc_chunkpost.loo(idata, model)` computes ArviZ's `loo` without "
    "the draws x observations matrix, in blocks within a memory budget."
)
#: The `compile_kwargs` this route honours: a JAX `mode`.
_NEUTRAL_COMPILE_KWARGS = frozenset({"mode"})


def compute_log_likelihood(
    idata: Any,
    *,
    var_names: Sequence[str] | None = None,
    extend_inferencedata: bool = True,
    model: Any = None,
    sample_dims: Sequence[str] = ("chain", "draw"),
    progressbar: bool = True,
    backend: str | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: int | float | None = None,
    matmul_precision: str | None = "highest",
    **options: Any,
) -> Any:
    """Pointwise log-likelihood of every observed variable at every posterior draw.

    `pymc.compute_log_likelihood`, with the same arguments and the same result (groups,
    names, dims, coords, dtypes and attrs), computed by one jitted, chunked evaluation of
    the model's `logp(sum=False)` instead of one compiled call per draw.

    Args:
        idata: pymc 6: an `xarray.DataTree`; pymc 5: an `arviz.InferenceData`; with a
            `posterior` group holding every free variable (untransformed).
        var_names: observed variables to compute; default all of them.
        extend_inferencedata: add a `log_likelihood` group to `idata` and return `idata`
            (True), or return the new `Dataset` (False).
        model: the model; default the one on the context stack.
        sample_dims: the posterior's sample dimensions: ("chain", "draw"), one dimension
            (such as "sample" from `arviz.extract`), or (pymc 6) none, for one point.
        progressbar: show a progress bar over chunks while a loop runs.
        backend: pymc 6's compile backend. None or "jax" take this route; any other runs
            pymc's own function, as asked (logged at INFO on the `pymc_chunkpost` logger).
        compile_kwargs: pymc's extra compile arguments. Only `{"mode": "JAX"}` (or a JAX
            `Mode`) can be honoured here; anything else runs pymc's own function, as asked
            (logged at INFO).
        postprocessing_backend: the device to compute on: None (the default device), "cpu"
            or "gpu". The result is always numpy arrays on the host, as pymc's.
        postprocessing_vectorize: the strategy, one of `STRATEGIES` (see
            `postprocess_samples`); default "auto", the fastest plan within the budget.
        chunk_size: draws per chunk, for "chunked"/"auto": smaller uses less memory and
            takes longer.
        n_chunks: alternatively, the number of chunks.
        memory_budget: bytes the outputs and temporaries may take; default the device's
            free memory. The outputs themselves (chains x draws x observations) are the
            floor.
        matmul_precision: the precision of float32 products (`MATMUL_PRECISIONS`):
            "highest" (default) gives pymc's answers, which it computes on the host, to
            float32's accuracy on any device; None is JAX's default, one bfloat16 pass on
            a TPU (an error of up to 1e-2 of a log-likelihood), which compiles and runs
            faster there. On a CPU or GPU float32 products are float32's whatever the
            setting.
        **options: further options of `postprocess_samples`, passed on unchanged.

    Returns:
        What pymc returns: `idata` with a `log_likelihood` group, or the `Dataset`.

    Raises:
        ValueError: bad input (unknown `var_names`, a posterior without a free variable
            or with other shapes than the model's, unknown sample dims, bad options),
            before any work.
    """
    return _log_density("likelihood", locals())


def compute_log_prior(
    idata: Any,
    *,
    var_names: Sequence[str] | None = None,
    extend_inferencedata: bool = True,
    model: Any = None,
    sample_dims: Sequence[str] = ("chain", "draw"),
    progressbar: bool = True,
    backend: str | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: int | float | None = None,
    matmul_precision: str | None = "highest",
    **options: Any,
) -> Any:
    """Pointwise log-prior density of every free variable at every posterior draw.

    `pymc.stats.compute_log_prior` with the same arguments and result, computed as
    `compute_log_likelihood` is (see there for every argument). With
    `extend_inferencedata=True` the group added is `log_prior`.

    Raises:
        ValueError: as `compute_log_likelihood`, before any work.
    """
    return _log_density("prior", locals())


def compute_deterministics(
    dataset: Any,
    *,
    group: str | None = None,
    var_names: Sequence[str] | None = None,
    model: Any = None,
    sample_dims: Sequence[str] = ("chain", "draw"),
    merge_dataset: bool = False,
    extend_dataset: bool = False,
    progressbar: bool = True,
    backend: str | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: int | float | None = None,
    matmul_precision: str | None = "highest",
    **options: Any,
) -> Any:
    """The model's deterministics at every draw of `dataset`.

    `pymc.compute_deterministics`, with the same arguments and the same result, computed by
    one jitted, chunked evaluation instead of one compiled call per draw. `group` and
    `extend_dataset` exist on pymc 6 only, as in pymc; the options after `compile_kwargs`
    are ours, as in `compute_log_likelihood`.

    Args:
        dataset: a `Dataset` with every free variable, such as `idata.posterior` (pymc 6:
            also a `DataTree`, or a whole one, of which `group` is used).
        group: pymc 6: the group of a whole `DataTree`; default "posterior", else "prior".
        var_names: deterministics to compute; default all of them.
        model: the model; default the one on the context stack.
        sample_dims: as in `compute_log_likelihood`.
        merge_dataset: include `dataset`'s own variables in the result (deprecated in
            pymc 6, as there).
        extend_dataset: pymc 6: add the deterministics to `dataset` in place and return it.
        progressbar: show a progress bar over chunks while a loop runs.
        backend: as in `compute_log_likelihood`.
        compile_kwargs: as in `compute_log_likelihood`.
        postprocessing_backend: as in `compute_log_likelihood`.
        postprocessing_vectorize: as in `compute_log_likelihood`.
        chunk_size: as in `compute_log_likelihood`.
        n_chunks: as in `compute_log_likelihood`.
        memory_budget: as in `compute_log_likelihood`.
        **options: as in `compute_log_likelihood`.

    Returns:
        What pymc returns: a `Dataset` of the deterministics (or, with `extend_dataset`,
        the input object).

    Raises:
        ValueError: bad input, before any work.
    """
    import xarray

    name = "compute_deterministics"
    pymc_args, ours = _split(name, locals())
    original = _pymc(name)
    if pymc_args.get("merge_dataset") and pymc_args.get("extend_dataset"):
        raise ValueError(
            "`merge_dataset` and `extend_dataset` cannot be combined. "
            "`extend_dataset` already keeps the values of the original dataset."
        )
    fallback = _fallback_reason(pymc_args)
    if fallback is not None:
        return fall_back(name, fallback, original, dataset, **pymc_args)
    import pymc

    if pymc_args.get("merge_dataset") and pymc6():
        warnings.warn(
            "`merge_dataset` is deprecated and will be removed in a future release. "
            "Use `extend_dataset=True` to add the deterministics to the original dataset, "
            "passing a `.copy()` of it if it should not be mutated.",
            FutureWarning,
            stacklevel=2,
        )
    original_object = dataset
    if pymc6():
        # pymc's own private helper, for pymc's own rule and errors on whole DataTrees.
        from pymc.sampling.deterministic import _select_group

        dataset = _select_group(dataset, group)
    model = pymc.modelcontext(model)
    names = _deterministic_names(model, var_names)
    group_dataset = dataset.dataset if isinstance(dataset, xarray.DataTree) else dataset
    draws = _draws(group_dataset, model, sample_dims, "dataset")
    if not names or draws is None:  # nothing to compute: pymc's loop costs nothing
        return original(original_object, **pymc_args)
    key = ("deterministics", tuple(names))
    outputs = [model[n] for n in names]
    graph = _graph(model, key, lambda: (model, list(model.free_RVs), outputs, names))
    if isinstance(graph, str):
        return fall_back(
            name, Fallback(graph, logging.WARNING), original, original_object, **pymc_args
        )
    label = "Computing deterministics"
    where = "posterior" if group is None else group
    new_dataset = _dataset(model, graph, draws, ours, label, sample_dims, where)
    if pymc_args.get("extend_dataset"):
        dataset.update(new_dataset)
        return original_object
    if pymc_args.get("merge_dataset"):
        new_dataset = xarray.merge([group_dataset, new_dataset], compat="override")
    return new_dataset


def _log_density(kind: str, arguments: dict[str, Any]) -> Any:
    """`compute_log_likelihood` (kind "likelihood") or `compute_log_prior` ("prior")."""
    import pymc

    name = f"compute_log_{kind}"
    idata = arguments["idata"]
    pymc_args, ours = _split(name, arguments)
    original = _pymc(name)
    fallback = _fallback_reason(pymc_args)
    if fallback is not None:
        return fall_back(name, fallback, original, idata, **pymc_args)
    posterior = _posterior(idata)
    model = pymc.modelcontext(pymc_args["model"])
    target = _KIND_TARGETS[kind]
    names = _density_names(model, pymc_args["var_names"], target)
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    draws = _draws(dataset, model, pymc_args["sample_dims"], "idata.posterior")
    if not names or draws is None:  # nothing to compute: pymc's loop costs nothing
        return original(idata, **pymc_args)

    def build():
        from pymc.model.transform.conditioning import remove_value_transforms

        # The posterior holds untransformed values, so pymc disables the transforms.
        umodel = remove_value_transforms(model)
        # pymc names the outputs in the order of `umodel`'s variables, not `model`'s.
        rvs = getattr(umodel, target) if var_names is None else [umodel[n] for n in names]
        graph = umodel.logp(vars=rvs, sum=False)
        return umodel, list(umodel.value_vars), graph, [rv.name for rv in rvs]

    var_names = pymc_args["var_names"]
    key = (kind, None if var_names is None else tuple(names))
    graph = _graph(model, key, build)
    if isinstance(graph, str):
        return fall_back(name, Fallback(graph, logging.WARNING), original, idata, **pymc_args)
    label, sample_dims = f"Computing log-{kind}", pymc_args["sample_dims"]
    try:
        result = _dataset(model, graph, draws, ours, label, sample_dims, f"log_{kind}")
    except MemoryError as error:
        if kind != "likelihood":
            raise
        raise MemoryError(f"{error} {_LOO_HINT}") from error
    if not pymc_args["extend_inferencedata"]:
        return result
    if pymc6():
        idata[f"log_{kind}"] = result
    else:
        idata.add_groups({f"log_{kind}": result})
    return idata


# --- arguments ---------------------------------------------------------------------------


def _pymc(name: str) -> Callable:
    """pymc's own function `name` (the original while patched)."""
    import importlib

    module, attribute = PYMC_FUNCTIONS[name]
    function = getattr(importlib.import_module(module), attribute)
    return getattr(function, ORIGINAL_ATTRIBUTE, function)


_PUBLIC: dict[str, Callable] = {}  # filled below: name -> our public function


def _split(name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], Options]:
    """pymc's arguments (those the installed pymc takes) and our checked options
    (`_route.split`), and pymc's `sample_dims` checked.

    Raises:
        TypeError: an argument the installed pymc does not take (pymc 5 has no `backend`,
            `group` or `extend_dataset`), or an unknown option, as Python would for pymc.
        ValueError: a bad option of ours, or bad `sample_dims`.
    """
    public = _PUBLIC[name]
    first = next(iter(inspect.signature(public).parameters))
    pymc_args, options = split(
        name, public, _pymc(name), arguments, skip=(first,), extra=arguments["options"]
    )
    sample_dims = pymc_args["sample_dims"]
    if isinstance(sample_dims, str) or not all(isinstance(d, str) for d in sample_dims):
        raise ValueError(
            f"`sample_dims` must be a sequence of dimension names, got {sample_dims!r}. Pass, "
            'for example, `sample_dims=("chain", "draw")` or `sample_dims=("sample",)`.'
        )
    return pymc_args, options


def _fallback_reason(pymc_args: dict[str, Any]) -> Fallback | None:
    """Why the JAX route cannot give pymc's answer for these arguments; None when it can."""
    reason = compile_fallback(pymc_args, _NEUTRAL_COMPILE_KWARGS)
    if reason is not None:
        return Fallback(reason, logging.INFO)
    if len(pymc_args["sample_dims"]) != 2 and not pymc6():
        return Fallback("pymc 5 takes two `sample_dims` only", logging.WARNING)
    return None


def _posterior(idata: Any) -> Any:
    groups = _groups(idata)
    if groups is None or "posterior" not in groups:
        found = f"its groups: {groups}" if groups is not None else f"got {type(idata).__name__}"
        raise ValueError(
            f"`idata` has no `posterior` group ({found}). Pass the whole inference data that "
            "`pm.sample` returned, not one of its groups."
        )
    return idata["posterior"]


def _groups(idata: Any) -> list[str] | None:
    if hasattr(idata, "children"):  # xarray.DataTree
        return list(idata.children)
    if hasattr(idata, "groups") and callable(idata.groups):  # arviz.InferenceData
        return list(idata.groups())
    return None


def _density_names(model: Any, var_names: Any, target: str) -> list[str]:
    valid = [rv.name for rv in getattr(model, target)]
    if var_names is None:
        return valid
    if isinstance(var_names, str):
        raise ValueError(
            f"`var_names` must be a list of names, got {var_names!r}; pass [{var_names!r}]."
        )
    names = list(var_names)
    if unknown := [n for n in names if n not in model.named_vars]:
        raise ValueError(
            f"`var_names` has {unknown}, which the model does not have. Its {target}: {valid}."
        )
    if wrong := [n for n in names if n not in valid]:
        raise ValueError(
            f"var_names must refer to {target} in the model. Got: {var_names}; {wrong} are not "
            f"among them ({valid})."
        )
    return names


def _deterministic_names(model: Any, var_names: Any) -> list[str]:
    valid = [d.name for d in model.deterministics]
    if var_names is None:
        return valid
    if isinstance(var_names, str):
        raise ValueError(
            f"`var_names` must be a list of names, got {var_names!r}; pass [{var_names!r}]."
        )
    names = list(var_names)
    if unknown := [n for n in names if n not in model.named_vars]:
        raise ValueError(
            f"`var_names` has {unknown}, which the model does not have. Its deterministics: "
            f"{valid}."
        )
    if wrong := [n for n in names if n not in valid]:
        raise ValueError(
            f"Not all var_names corresponded to model deterministics: {wrong} are not among "
            f"them ({valid})."
        )
    return names


# --- draws in, datasets out --------------------------------------------------------------


class _Draws:
    """The free variables' draws as `(a, b, ...)` arrays for `run`, and how to undo that.

    Two sample dims are `(a, b)` as they are; one (or three or more) become `(1, n)`; none
    (pymc 6's single point) `(1, 1)`. Outputs are reshaped back to `sample_shape`.
    """

    def __init__(self, arrays: dict[str, np.ndarray], sample_shape: tuple[int, ...], stacked: dict):
        self.arrays = arrays  # by variable name
        self.sample_shape = sample_shape
        self.stacked_dims = stacked


def _draws(dataset: Any, model: Any, sample_dims: Sequence[str], what: str) -> _Draws | None:
    """Check the dataset against the model, before any work; None when there are no draws.

    The posterior holds untransformed values: the dtypes and shapes of the random variables.
    """
    free = list(model.free_RVs)
    names = [rv.name for rv in free]
    if missing := [n for n in names if n not in dataset.data_vars]:
        raise MissingVariableError(
            f"`{what}` has no {missing}: every free variable of the model ({names}) is needed. "
            "Was it sampled from another model, or with `var_names` that left them out?"
        )
    sample_dims = list(sample_dims)
    expected = expected_shapes(model)
    arrays, sample_shape = {}, None
    for rv in free:
        data = dataset[rv.name]
        if absent := [d for d in sample_dims if d not in data.dims]:
            raise ValueError(
                f"`sample_dims={tuple(sample_dims)}` names {absent}, which `{what}[{rv.name!r}]` "
                f"does not have (its dims: {data.dims}). Pass the dims that index its draws."
            )
        values = data.transpose(*sample_dims, ...).values
        n = len(sample_dims)
        shape, event = values.shape[:n], values.shape[n:]
        # JAX would clamp an out-of-range index where pymc raises: shapes must match.
        if event != expected[rv.name]:
            raise ValueError(
                f"`{what}[{rv.name!r}]` has shape {event} per draw, but the model's "
                f"{rv.name!r} has shape {expected[rv.name]}. Pass the model the draws "
                "came from (with the same data and coords)."
            )
        sample_shape = shape if sample_shape is None else sample_shape
        arrays[rv.name] = as_draws(values.astype(rv.type.dtype, copy=False), n)
    if not free or sample_shape is None or 0 in sample_shape:
        return None
    stacked = {d: dataset[names[0]][d] for d in sample_dims}  # as pymc takes them
    return _Draws(arrays, tuple(sample_shape), stacked)


class _Graph:
    """A jaxified per-draw function, and what pymc's compiled function would return."""

    def __init__(self, jax_fn: Callable, input_names: list[str], outputs: list, names: list):
        self.jax_fn = jax_fn
        self.input_names = input_names  # the draws it takes, in order
        self.output_names = list(names)
        self.dtypes = [np.dtype(v.type.dtype) for v in outputs]


def _graph(model: Any, key: tuple, build: Callable) -> _Graph | str:
    """The jaxified graph of `build()`, cached per model (`model.cached_graph`: a model that
    is gone takes its graphs with it); a reason to fall back if none.

    `build` returns `(model, inputs, outputs, output names)`.
    """

    def jaxified() -> _Graph | str:
        graph_model, inputs, outputs, names = build()
        try:
            return _jaxify(graph_model, inputs, outputs, names)
        except NotImplementedError as error:  # an Op with no JAX implementation
            return f"no JAX implementation: {error}"
        except ValueError as error:
            if "RandomType" not in str(error):
                raise
            return "the graph draws random numbers"

    return cached_graph(_GRAPHS, model, key, jaxified)


def _jaxify(model: Any, inputs: list, outputs: list, names: list[str]) -> _Graph:
    """pymc's per-draw graph, with the rewrites pymc's compile applies, jaxified.

    pymc compiles with `local_check_parameter_to_ninf_switch` (or, with
    `check_bounds=False`, `local_remove_check_parameter`): an invalid parameter gives -inf,
    as it does in pymc. `get_jaxified_graph` alone would drop the check instead.
    """
    from pymc.logprob.utils import (
        local_check_parameter_to_ninf_switch,
        local_remove_check_parameter,
    )
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.replace import clone_replace
    from pytensor.graph.rewriting.basic import in2out

    # Fresh root inputs: deterministics take the random variables themselves as inputs.
    roots = [variable.type(name=variable.name) for variable in inputs]
    graph = clone_replace(list(outputs), replace=dict(zip(inputs, roots)))
    from pytensor.graph.traversal import graph_inputs

    root_ids = {id(root) for root in roots}
    others = [v for v in graph_inputs(graph) if v.owner is None and id(v) not in root_ids]
    fgraph = FunctionGraph([*roots, *others], graph, clone=False)
    check_bounds = bool(getattr(model, "check_bounds", True))
    rewrite = local_check_parameter_to_ninf_switch if check_bounds else local_remove_check_parameter
    in2out(rewrite).rewrite(fgraph)
    jax_fn = jaxify(roots, list(fgraph.outputs))
    return _Graph(jax_fn, [v.name for v in inputs], list(outputs), names)


def _dataset(
    model: Any,
    graph: _Graph,
    draws: _Draws,
    options: Options,
    label: str,
    sample_dims: Sequence[str],
    group: str,
) -> Any:
    """The `Dataset` of every output over every draw, as pymc builds it: in memory, or,
    where the outputs went to disk (`output_memory="disk"`, or "auto" with an output path),
    opened lazily from the store's `group`.

    Raises:
        ValueError: outputs asked on disk with other sample dims than
            `("chain", "draw")`, before any work.
    """
    path = options.engine.get("output_path")  # `_route.split` resolved the default
    where = options.engine.get("output_memory", "auto")
    if tuple(sample_dims) != ("chain", "draw") and where != "disk":
        # "auto" never puts other sample dims on disk: the store's layout has two.
        path, options = None, options.with_engine(output_path=None)
    store = None
    if path is not None and where in ("auto", "disk"):
        if tuple(sample_dims) != ("chain", "draw"):
            raise ValueError(
                f"Outputs on disk are stored with the sample dims ('chain', 'draw'), got "
                f"`sample_dims={tuple(sample_dims)}`. Pass the posterior with its chain and "
                "draw dims, or `output_memory='host'`."
            )
        from pymc.backends.arviz import coords_and_dims_for_inferencedata

        coords, dims = coords_and_dims_for_inferencedata(model)
        samples = {d: np.asarray(v.values) for d, v in draws.stacked_dims.items()}
        store = _postprocess.StoreLayout(
            graph.output_names, group, dims, {**coords, **samples}, graph.dtypes
        )
    values = _evaluate(graph, draws, options, label, store)
    if values is None:
        return _zarr_store.open_group(path, group)[graph.output_names]  # pymc's order
    return _to_dataset(model, graph.output_names, values, draws, sample_dims)


def _evaluate(
    graph: _Graph,
    draws: _Draws,
    options: Options,
    label: str,
    store: _postprocess.StoreLayout | None = None,
) -> list[np.ndarray] | None:
    """Every output over every draw, as writable numpy arrays of pymc's shapes and dtypes;
    None where they went to disk, laid out as `store` says."""
    arrays = [draws.arrays[name] for name in graph.input_names]
    values, on_disk = evaluate(
        graph.jax_fn, arrays, options, label, host_inputs=arrays, store=store
    )
    if on_disk:
        return None
    for i, (array, dtype) in enumerate(zip(values, graph.dtypes)):
        array = array.reshape(draws.sample_shape + array.shape[2:])
        values[i] = array if array.dtype == dtype else array.astype(dtype)
    return values


def _to_dataset(model: Any, names: list[str], values: list, draws: _Draws, sample_dims) -> Any:
    """The `Dataset` that pymc's `apply_function_over_dataset` builds from these values."""
    import pymc
    from pymc.backends.arviz import coords_and_dims_for_inferencedata, dict_to_dataset

    coords, dims = coords_and_dims_for_inferencedata(model)
    trace = dict(zip(names, values))
    if pymc6():
        return dict_to_dataset(
            trace,
            inference_library=pymc,
            dims=dims,
            coords={**coords, **draws.stacked_dims},
            sample_dims=list(sample_dims),
            skip_event_dims=True,
        )
    return dict_to_dataset(
        trace,
        library=pymc,
        dims=dims,
        coords=coords,
        default_dims=list(sample_dims),
        skip_event_dims=True,
    )


_PUBLIC.update(
    compute_log_likelihood=compute_log_likelihood,
    compute_log_prior=compute_log_prior,
    compute_deterministics=compute_deterministics,
)
