"""`loo`: PSIS-LOO-CV of a PyMC model without the draws x observations matrix.

The observed variable's log-likelihood is computed by the engine in blocks of observations x
all draws; `_stats.loo` smooths each block and fills ArviZ's result (memory is one block
plus O(observations) results).

Blocks (pymc): the observed variable's elementwise log-density is sliced along its first
axis, `logp[start:start + size]`, with `start` a constant of the block, before pytensor's
rewrites: they lift the slice through elementwise operations, products, reductions and
joins into the data, and `_lift_slices` where they stop (a gather, a variable whose every
use is the same slice), and fold the data's slices into constants. pymc's parameter checks
over a vector of parameters read every observation: where they keep a block from slicing,
their outcome at each draw is computed once and given to every block (`_Checks`). Every
block has the same size (the last one overlaps the one before), so every block's program
has the same jaxpr, its constants aside. Where the slice still cannot reach the data
(checked on the block's jaxpr: no operation other than a slice may produce the whole first
axis), each block computes the whole log-density and keeps its slice: the same numbers,
more work, said by a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._engine.plan.resources import loo_backend
from .._frontend.seam import Options, evaluate
from .._stats.loo import (
    DEFAULT_BUDGET,
    SAMPLE_DIMS,
    LogLikelihoodBlocks,
    bar_label,
    blocked,
    check_block_size,
    choose_block_size,
    default_reff,
    pointwise_dims,
    result,
    scale_value_of,
)
from .._stats.psis import arviz_generation
from .._stats.workflow import check_same_observations
from .bambi import as_pymc

__all__ = [
    "check_observed_data",
    "log_likelihood_blocks",
    "loo",
    "model_observations",
]


def loo(
    idata: Any,
    model: Any = None,
    *,
    var_name: str | None = None,
    pointwise: bool | None = None,
    reff: float | None = None,
    scale: str | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> Any:
    """PSIS-LOO-CV of a PyMC model, as ArviZ's `loo`, without the log-likelihood matrix.

    The numbers of ArviZ's `loo(idata_with_log_likelihood, ...)` (the installed ArviZ's:
    `arviz.loo` on 0.x, `arviz_stats.loo` on 1.x), computed in blocks of observations x
    all draws: memory is one block plus O(observations), whatever the number of
    observations. The smoothed `log_weights` (draws x observations) are left out.

    Args:
        idata: pymc 6: an `xarray.DataTree`; pymc 5: an `arviz.InferenceData`; with a
            `posterior` group of `(chain, draw)` holding every free variable.
        model: the model the draws came from, a PyMC model or a Bambi model (its PyMC
            model, at the draws as Bambi's `_re_center_intercept` gives them back); default
            the one on the context stack.
        var_name: the observed variable; needed where the model has several.
        pointwise: return `loo_i`/`elpd_i` and `pareto_k` (O(observations)); default
            ArviZ's `stats.ic_pointwise` rcParam. `az.compare` needs them.
        reff: relative MCMC efficiency; default ArviZ's, from the posterior's mean ESS.
        scale: ArviZ 0.x's `scale` ("log", "negative_log" or "deviance"); ArviZ 1.x reports
            on the log scale only.
        postprocessing_backend: the device that computes the log-likelihood: None (the
            default device; on an accelerator, the host CPU where draws x observations
            are at most `PlannerConfig.host_values_per_core` per host core, since the
            device's compiles would cost more than its run saves), "cpu", "gpu" or "tpu".
            PSIS runs on the host.
        postprocessing_vectorize: the engine's strategy for each block (see
            `postprocess_samples`).
        memory_budget: bytes for one block: its log-likelihood on the device and its
            smoothing on the host (about 6 x 8 bytes per draw and observation; the engine
            may take 2 x 8 of them). Default 1 GiB. Smaller budgets mean more blocks:
            more compiles, same numbers.
        block_size: observations (along the variable's first axis) per block, instead of
            sizing it from `memory_budget`.
        progressbar: show a bar over the observations, moved as each block is smoothed.
        matmul_precision: the precision of float32 products, as in
            `compute_log_likelihood`: "highest" (default) is float32's own on any device.

    Returns:
        ArviZ's own result: on 0.x an `arviz.ELPDData` (its `attrs["log_weights"]` says
        they are left out); on 1.x an `arviz_stats` `ELPDDataLOO` with `log_weights=None`
        (and a `log_weights_note`).

    Raises:
        ValueError: before any work: no posterior, an unknown `var_name`, several observed
            variables without `var_name`, draws that do not match the model, an
            `observed_data` group whose `var_name` differs from the model's observations
            (ArviZ reads them there; the blocks, from the model), bad options.
        MemoryError: before any work, where one row of the variable's first axis (all its
            draws) needs more than `memory_budget`.
    """
    given = idata
    idata, model = as_pymc(idata, model, "loo")
    generation = arviz_generation()
    scale_value = scale_value_of(scale, generation)
    blocks = log_likelihood_blocks(
        idata,
        model,
        var_name,
        reff=reff,
        reff_draws=given,
        generation=generation,
        postprocessing_backend=postprocessing_backend,
        postprocessing_vectorize=postprocessing_vectorize,
        memory_budget=memory_budget,
        block_size=block_size,
        matmul_precision=matmul_precision,
    )
    bar = bar_label(blocks.name, progressbar)
    n_samples = blocks.n_samples
    elpd_i, pareto_k, lppd_i = blocked(
        blocks.block, blocks.shape, blocks.size, n_samples, blocks.reff, bar
    )
    return result(
        elpd_i,
        pareto_k,
        lppd_i,
        n_samples,
        blocks.name,
        blocks.dims,
        blocks.coords,
        pointwise,
        scale_value,
        generation,
    )


def log_likelihood_blocks(
    idata: Any,
    model: Any,
    var_name: str | None,
    *,
    reff: float | None,
    reff_draws: Any = None,
    generation: int,
    postprocessing_backend: str | None,
    postprocessing_vectorize: str,
    memory_budget: int | float | None,
    block_size: int | None,
    matmul_precision: str | None,
    bytes_per_row: int = 0,
) -> LogLikelihoodBlocks:
    """The blocks of `var_name`'s log-likelihood at `idata`'s posterior draws, checked
    before any work (see `loo` for the options). Blocks are sized from the budget for
    loo's smoothing plus `bytes_per_row` a draw of each observation along the first axis (a
    caller's own arrays of a block); `reff` None is ArviZ's default of `generation` at the
    posterior of `reff_draws` (default `idata`: the draws ArviZ reads, where a Bambi
    model's were re-centred, `bambi.as_pymc`)."""
    import pymc

    from .posthoc import _draws, _posterior, _to_dataset

    engine = {"memory_budget": memory_budget, "matmul_precision": matmul_precision}
    # The engine's own bar (over one block's draws) is off: `progressbar` is loo's bar.
    options = Options(postprocessing_backend, postprocessing_vectorize, False, engine)
    options.check()
    check_block_size(block_size)
    posterior = _posterior(idata)
    model = pymc.modelcontext(model)
    name = _observed_name(model, var_name)
    check_observed_data(idata, model, name)
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    draws = _draws(dataset, model, SAMPLE_DIMS, "idata.posterior")
    if draws is None:
        raise ValueError("`idata.posterior` has no draws: LOO needs (chain, draw) samples.")
    chains, n_draws = draws.sample_shape
    n_samples = chains * n_draws
    if reff is None:
        read = dataset if reff_draws is None else _posterior(reff_draws)
        read = read.to_dataset() if hasattr(read, "to_dataset") else read
        reff = default_reff(read, n_samples, generation)
    graph = _LogpBlocks(model, name, [draws.arrays[v.name] for v in model.free_RVs])
    budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
    size = choose_block_size(graph.shape, n_samples, budget, block_size, bytes_per_row)
    backend, _ = loo_backend(postprocessing_backend, n_samples * math.prod(graph.shape))
    options = dataclasses.replace(options, backend=backend)
    # The engine's share of an explicit budget: the block's log-likelihood and as much again
    # for its temporaries (the rest is the smoothing's workspace and the next block).
    rest = math.prod(graph.shape[1:]) if graph.shape else 1
    engine_budget = None if memory_budget is None else 2 * 8 * n_samples * size * rest
    # `loo_backend` decided where every block runs: no block is moved on its own size.
    options = options.with_engine(memory_budget=engine_budget, small_on_host=False)
    arrays = [draws.arrays[n] for n in graph.input_names]

    def block(start: int) -> np.ndarray:
        label = f"Log-likelihood of {name!r} [{start}:{start + size}]"
        # Decided at the first block, in the block loop's thread: the garbage of the graphs
        # built to decide is collected with each block's (what exists before it is not).
        inputs = graph.block_inputs(arrays, size, options)
        values, _ = evaluate(graph.block_function(start, size), inputs, options, label)
        return np.asarray(values[0])

    # As `pm.compute_log_likelihood` names the matrix: pymc's own conversion.
    dims, coords = pointwise_dims(
        name,
        (*draws.sample_shape, *graph.shape),
        lambda trace: _to_dataset(model, list(trace), list(trace.values()), draws, SAMPLE_DIMS),
    )
    return LogLikelihoodBlocks(
        name, graph.shape, size, (chains, n_draws), float(reff), block, dims, coords
    )


def check_observed_data(idata: Any, model: Any, name: str) -> None:
    """Raise where `idata`'s `observed_data` holds `name` with other values than the model's
    (ArviZ reads the observations there; the blocks, from the model). Nothing where it has
    no such group or variable."""
    from .posthoc import _groups

    if "observed_data" not in (_groups(idata) or []):
        return
    group = idata["observed_data"]
    if name not in getattr(group, "data_vars", group):
        return
    check_same_observations(np.asarray(group[name].values), model_observations(model, name), name)


def model_observations(model: Any, name: str) -> np.ndarray:
    """The observations of `name` in `model` now: its data (a constant or `pm.Data`)."""
    data = model.rvs_to_values[model[name]]
    if hasattr(data, "get_value"):  # a shared variable: `pm.Data`
        return np.asarray(data.get_value())
    if hasattr(data, "data"):  # a constant
        return np.asarray(data.data)
    return np.asarray(data.eval())


# --- blocks (pymc) -----------------------------------------------------------------------


class _LogpBlocks:
    """The observed variable's elementwise log-density, and its blocks as JAX functions.

    pymc's parameter checks (`check_bounds`, the default) make the whole log-density -inf at
    a draw where any check fails, `switch(all(p >= 0), logp, -inf)`: a check over a vector
    of parameters (a Bernoulli's `p`, a Poisson's `mu`) reads every observation, so a block
    that holds it computes them all. There (`_Checks`), the checks go out of the blocks:
    each check's outcome at each draw is computed once over every observation, and each
    block takes it as an argument, `switch(outcome, logp[start:stop], -inf)`: pymc's
    numbers, with each block's own work. The checks stay inside the blocks where the blocks
    slice with them (a scalar `sigma > 0`): no program more."""

    def __init__(self, model: Any, name: str, first_draw: Sequence[np.ndarray]):
        from pymc.logprob.utils import (
            local_check_parameter_to_ninf_switch,
            local_remove_check_parameter,
        )
        from pymc.model.transform.conditioning import remove_value_transforms
        from pytensor import config
        from pytensor.graph.fg import FunctionGraph
        from pytensor.graph.rewriting.basic import in2out
        from pytensor.graph.traversal import graph_inputs

        self.model, self.name = model, name
        with config.change_flags(traceback__limit=0):
            umodel = remove_value_transforms(model)
            roots = list(umodel.value_vars)
            logp = umodel.logp(vars=[umodel[name]], sum=False)[0]
            others = [v for v in graph_inputs([logp]) if v.owner is None and v not in roots]
            fgraph = FunctionGraph([*roots, *others], [logp], clone=True)
            check_bounds = bool(getattr(model, "check_bounds", True))
            self.checks = _Checks.apart(fgraph.clone(), len(roots)) if check_bounds else None
            rewrite = (
                local_check_parameter_to_ninf_switch
                if check_bounds
                else local_remove_check_parameter
            )
            # pymc's compile applies this: an invalid parameter gives -inf, as in pymc.
            in2out(rewrite).rewrite(fgraph)
        self.inputs = list(fgraph.inputs[: len(roots)])
        self.input_names = [v.name for v in roots]
        self.logp: Any = fgraph.outputs[0]
        self.shape = self._shape(umodel, first_draw)
        self._apart = False
        self._first: Callable | None = None  # the first block's function, built to decide
        self._inputs: list[np.ndarray] | None = None

    def _shape(self, umodel: Any, first_draw: Sequence[np.ndarray]) -> tuple[int, ...]:
        import pytensor

        static = self.logp.type.shape
        if all(d is not None for d in static):  # pytensor's type guarantees it: no compile
            return tuple(int(d) for d in static)
        by_name = {rv.name: a for rv, a in zip(self.model.free_RVs, first_draw)}
        values = [by_name[v.name][0, 0] for v in self.inputs]
        # FAST_COMPILE: the shape graph is tiny; a C compile of it took 1.4 s.
        shape = pytensor.function(
            self.inputs, self.logp.shape, on_unused_input="ignore", mode="FAST_COMPILE"
        )
        return tuple(int(d) for d in shape(*values))

    def block_inputs(
        self, arrays: Sequence[np.ndarray], size: int, options: Options
    ) -> list[np.ndarray]:
        """The blocks' arguments: the draws `arrays`; and, where the parameter checks keep a
        block from slicing and going apart lets it slice, each check's outcome at each draw
        (computed at the first call, over every observation). Where no form slices, a
        warning says so. Decided at the first call, the same after."""
        if self._inputs is None:
            self._inputs = self._block_inputs(list(arrays), size, options)
        return self._inputs

    def _block_inputs(self, arrays: list[np.ndarray], size: int, options: Options) -> list[Any]:
        if not self.shape or size >= self.shape[0]:
            return arrays  # one block: nothing to slice
        specs = [(a.shape[2:], a.dtype) for a in arrays]
        first = self._function(0, size, apart=False)
        whole = self._unsliced(first, specs)
        if whole is None:
            self._first = first
            return arrays
        if self.checks is not None and arrays:
            first = self._function(0, size, apart=True)
            outcomes = [((), np.dtype(bool))] * len(self.checks.inputs)
            if self._unsliced(first, [*specs, *outcomes]) is None:
                self._apart, self._first = True, first
                label = f"Parameter checks of {self.name!r}"
                values, _ = evaluate(self.checks.function(), arrays, options, label)
                return [*arrays, *np.moveaxis(np.asarray(values[0]), -1, 0)]
        warnings.warn(
            f"pymc_chunkpost.loo: the log-likelihood of {self.name!r} could not be "
            f"sliced to blocks of {size} observations ({whole} computes all "
            f"{self.shape[0]}): each block computes them all and keeps its slice. Same "
            "numbers, more work; a larger `memory_budget` means fewer blocks.",
            UserWarning,
            stacklevel=3,
        )
        return arrays

    def block_function(self, start: int, size: int) -> Callable:
        """The per-draw JAX function of `logp[start:start + size]`; where the checks are
        apart, of the checks' outcomes too, after the draws."""
        if start == 0 and self._first is not None:
            first, self._first = self._first, None
            return first
        return self._function(start, size, self._apart)

    def _function(self, start: int, size: int, apart: bool) -> Callable:
        from pytensor import config

        from .graph import funcify, jax_graph

        logp, inputs = self.logp, self.inputs
        if apart:
            assert self.checks is not None
            logp, inputs = self.checks.logp, [*self.checks.roots, *self.checks.inputs]
        with config.change_flags(traceback__limit=0):
            output = logp if not self.shape or size == self.shape[0] else logp[start : start + size]
            fgraph = jax_graph(inputs, [output])
            _lift_slices(fgraph)
        return funcify(fgraph)

    def _unsliced(self, jax_fn: Callable, specs: Sequence[tuple[Any, Any]]) -> str | None:
        """The first operation of a block's program, given its arguments' `(shape, dtype)`
        at one draw, that computes the whole first axis (a slice of it aside), or None: the
        block computes its own observations alone."""
        import jax

        args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]
        jaxpr = jax.make_jaxpr(jax_fn)(*args)
        slicing = {"slice", "dynamic_slice", "gather", "squeeze", "reshape"}
        n_leading = self.shape[0]
        for eqn in jaxpr.jaxpr.eqns:
            if eqn.primitive.name not in slicing and any(
                n_leading in getattr(v.aval, "shape", ()) for v in eqn.outvars
            ):
                return str(eqn.primitive.name)
        return None


class _Checks:
    """pymc's parameter checks apart from the log-density: each replaceable check
    `CheckParameterValue(expr, *conditions)` is `switch(outcome, expr, -inf)`, its outcome
    an input (a boolean per draw) where pymc's rewrite has `all(conditions)`."""

    def __init__(self, roots: list[Any], inputs: list[Any], outcomes: list[Any], logp: Any):
        self.roots, self.inputs, self.outcomes, self.logp = roots, inputs, outcomes, logp

    @classmethod
    def apart(cls, fgraph: Any, n_roots: int) -> _Checks | None:
        """The checks of `fgraph` (a copy of the log-density's, theirs not yet rewritten)
        apart, or None where it has none."""
        import pytensor.tensor as pt
        from pymc.logprob.utils import CheckParameterValue

        roots = list(fgraph.inputs[:n_roots])
        inputs, outcomes = [], []
        for node in fgraph.toposort():
            if not (isinstance(node.op, CheckParameterValue) and node.op.can_be_replaced_by_ninf):
                continue
            expr, *conditions = node.inputs
            # As pymc's `local_check_parameter_to_ninf_switch`, the outcome an input.
            outcome = pt.all(conditions) if len(conditions) > 1 else conditions[0]
            if outcome.ndim != 0:
                return None
            given = outcome.type()
            fgraph.add_input(given)
            out = pt.switch(given, expr, -np.inf)
            if out.dtype != node.outputs[0].dtype:
                out = pt.cast(out, node.outputs[0].dtype)
            fgraph.replace(node.outputs[0], out, import_missing=True)
            inputs.append(given)
            outcomes.append(outcome)
        return cls(roots, inputs, outcomes, fgraph.outputs[0]) if inputs else None

    def function(self) -> Callable:
        """The per-draw JAX function of every check's outcome, stacked, over every
        observation (a check inside another's condition rewritten as pymc does)."""
        import pytensor.tensor as pt
        from pymc.logprob.utils import local_check_parameter_to_ninf_switch
        from pytensor import config
        from pytensor.graph.rewriting.basic import in2out

        from .graph import funcify, jax_graph

        with config.change_flags(traceback__limit=0):
            fgraph = jax_graph(self.roots, [pt.stack(self.outcomes)])
            in2out(local_check_parameter_to_ninf_switch).rewrite(fgraph)
        return funcify(fgraph)


def _lift_slices(fgraph: Any) -> None:
    """Push slices of the first axis into the data where pytensor's rewrites stop, until
    nothing changes:
    - a slice of a gather `x[i, j]` (a parameter indexed by group, a category's probability
      at each observation) is `x[i[s], j[s]]`, whose constant indices fold to the block's;
    - a gather whose first index is a constant within rows `[lo, hi)` of `x` reads only
      them: `x[lo:hi][i - lo, j]`, whose slice is lifted in turn;
    - pytensor lifts a slice through an operation only where the slice is its one client
      (elsewhere the whole would be computed twice): where every client of a variable takes
      the same slice of its first axis, they take it from one slice of it (`_share_slices`),
      which pytensor's rewrites then lift (a mixture's `logsumexp` over its components,
      say)."""
    from pytensor.graph.rewriting.basic import in2out
    from pytensor.tensor.rewriting.basic import constant_folding

    # A rewrite that fails leaves its node as it was: the block's jaxpr says whether it slices.
    lift = in2out(
        *_gather_rewrites(),
        *_pytensor_lifts(),
        constant_folding,
        failure_callback=lambda *failure: None,
    )
    for _ in range(_MAX_LIFT_ROUNDS):
        lift.rewrite(fgraph)
        if not _share_slices(fgraph):
            return


@functools.cache
def _takes() -> tuple[type, ...]:
    """The ops of a gather `x[i, j]`: pytensor 2 takes `x[i]` with AdvancedSubtensor1,
    pytensor 3 with AdvancedSubtensor."""
    from pytensor.tensor import subtensor

    return tuple(
        getattr(subtensor, op)
        for op in ("AdvancedSubtensor1", "AdvancedSubtensor")
        if hasattr(subtensor, op)
    )


def _gather_indices(node: Any) -> list[Any] | None:
    """The integer arrays of a gather `x[i, j, ...]` at `node` (no slices, one number of
    dimensions for all), or None."""
    if node is None or not isinstance(node.op, _takes()):
        return None
    indices = list(node.inputs[1:])
    if tuple(getattr(node.op, "idx_list", range(len(indices)))) != tuple(range(len(indices))):
        return None
    kinds = {(getattr(i.type, "ndim", None), str(getattr(i, "dtype", ""))[:3]) for i in indices}
    if not indices or len({ndim for ndim, _ in kinds}) != 1:
        return None
    if any(ndim in (None, 0) or kind not in ("int", "uin") for ndim, kind in kinds):
        return None
    return indices


def _gather_rewrites() -> list[Any]:
    """A slice of a gather lifted into its index arrays, and a gather of constant rows
    reading only them (see `_lift_slices`)."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.rewriting.basic import node_rewriter
    from pytensor.tensor import subtensor

    @node_rewriter([subtensor.Subtensor])
    def lift_slice_of_gather(fgraph, node):
        source = node.inputs[0]
        indices = _gather_indices(source.owner)
        index = subtensor.indices_from_subtensor(node.inputs[1:], node.op.idx_list)
        if indices is None or not index or not isinstance(index[0], slice):
            return None
        if index[0] == slice(None):
            return None  # `x[i, j][:, k]`: nothing to lift
        if any(i.type.shape[0] is None for i in indices):
            return None  # an axis of length 1 (broadcast, not sliced) or not: unknown
        sliced = [i if i.type.shape[0] == 1 else i[index[0]] for i in indices]
        out = source.owner.inputs[0][tuple(sliced)]
        return [out[(slice(None), *index[1:])] if index[1:] else out]

    @node_rewriter(list(_takes()))
    def gather_rows(fgraph, node):
        indices = _gather_indices(node)
        x = node.inputs[0]
        if indices is None or not isinstance(indices[0], Constant) or x.type.shape[0] is None:
            return None
        rows = np.asarray(indices[0].data)
        if rows.size == 0 or rows.min() < 0:
            return None
        lo, hi = int(rows.min()), int(rows.max()) + 1
        if hi - lo >= x.type.shape[0]:
            return None
        out = x[lo:hi][(rows - lo, *indices[1:])]
        return [out.astype(node.outputs[0].dtype)]

    return [lift_slice_of_gather, gather_rows]


def _pytensor_lifts() -> list[Any]:
    """pytensor's own lifts (`_PYTENSOR_LIFTS`, those the version has), each where the sliced
    variable's node has one output: pytensor 2's lift fails on a fused node of several (the
    JAX rewrites fuse; pytensor's own pipeline lifts before it fuses)."""
    from pytensor.graph.rewriting.basic import node_rewriter
    from pytensor.tensor.rewriting import subtensor as subtensor_rewrites
    from pytensor.tensor.rewriting import subtensor_lift

    def of_one_output(rewrite: Any) -> Any:
        @node_rewriter(rewrite.tracks())
        def lift(fgraph, node):
            source = node.inputs[0].owner
            if source is not None and len(source.outputs) > 1:
                return None
            return rewrite.transform(fgraph, node)

        return lift

    modules = {"lift": subtensor_lift, "subtensor": subtensor_rewrites}
    return [
        of_one_output(getattr(modules[m], name))
        for m, name in _PYTENSOR_LIFTS
        if hasattr(modules[m], name)
    ]


#: pytensor's rewrites that lift a slice through an operation or merge slices, by module
#: (`pytensor.tensor.rewriting.subtensor_lift` or `.subtensor`), where the version has them.
_PYTENSOR_LIFTS = (
    ("lift", "local_subtensor_of_batch_dims"),
    ("lift", "local_subtensor_of_dot"),
    ("lift", "local_subtensor_of_reduce"),
    ("lift", "local_subtensor_of_join"),
    ("lift", "local_subtensor_of_expand_dims"),
    ("lift", "local_subtensor_of_squeeze"),
    ("lift", "local_subtensor_of_transpose"),
    ("lift", "local_subtensor_of_alloc"),
    ("lift", "local_subtensor_of_softmax"),
    ("subtensor", "local_subtensor_merge"),  # pytensor 2
    ("subtensor", "local_subtensor_merge_slice"),  # pytensor 3
    ("subtensor", "local_useless_subtensor"),
    ("subtensor", "local_useless_slice"),
)
_MAX_LIFT_ROUNDS = 64  # each round shares the slices of one more level of the graph


def _share_slices(fgraph: Any) -> bool:
    """Where every client of a variable is a slice of its first axis, the same one, each
    takes its indices from one slice of it: `v[s, i]` and `v[s]` are `w[:, i]` and `w`, with
    `w = v[s]` (the same values). Whether the graph changed."""
    from pytensor.tensor.subtensor import Subtensor, indices_from_subtensor

    changed = False
    for node in list(fgraph.toposort()):
        for var in node.outputs:
            clients = fgraph.clients.get(var, ())
            if len(clients) < 2:
                continue
            indices = []
            for client, position in clients:
                if not isinstance(getattr(client, "op", None), Subtensor) or position != 0:
                    break
                index = indices_from_subtensor(client.inputs[1:], client.op.idx_list)
                if not index or not isinstance(index[0], slice):
                    break
                indices.append((client, index))
            else:
                keys = {_slice_key(index[0]) for _, index in indices}
                if len(keys) != 1 or None in keys or keys == {(None, None, None)}:
                    continue  # different slices, or the whole axis: nothing to share
                shared = var[indices[0][1][0]]
                for client, index in indices:
                    rest = index[1:]
                    new = shared[(slice(None), *rest)] if rest else shared
                    fgraph.replace(client.outputs[0], new, import_missing=True)
                changed = True
    return changed


def _slice_key(index: Any) -> tuple | None:
    """A slice's constant `(start, stop, step)`, or None where one is not a constant."""
    from pytensor.graph.basic import Constant

    key: list[int | None] = []
    for part in (index.start, index.stop, index.step):
        if part is None:
            key.append(None)
        elif isinstance(part, Constant):
            key.append(int(part.data))
        else:
            return None
    return tuple(key)


# --- the observed variable ------------------------------------------------------------------


def _observed_name(model: Any, var_name: str | None) -> str:
    names = [rv.name for rv in model.observed_RVs]
    if not names:
        raise ValueError("The model has no observed variables: LOO needs a likelihood.")
    if var_name is None:
        if len(names) > 1:
            raise ValueError(
                f"The model has several observed variables ({names}): pass `var_name`, one "
                "of them, as ArviZ's loo asks."
            )
        return names[0]
    if not isinstance(var_name, str) or var_name not in names:
        raise ValueError(
            f"`var_name={var_name!r}` is not an observed variable of the model; pass one of "
            f"{names}."
        )
    return var_name
