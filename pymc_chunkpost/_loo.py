"""`loo`: PSIS-LOO-CV without the draws x observations matrix.

ArviZ's `loo` takes the pointwise log-likelihood, draws x observations (at 4,000 draws and
2.6 million observations, 83 GB in float64). PSIS needs only one observation's column of
draws at a time, so here the log-likelihood is computed by the engine in blocks of
observations x all draws, each block is smoothed at once (`_psis`, ArviZ's algorithm
vectorised) and reduced to per-observation results (elpd_i, Pareto k, lppd_i): memory is
one block, sized from the budget, plus O(observations) results.

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
import gc
import importlib
import math
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ._config import current
from ._problem import cpu_cores
from ._progress import counter
from ._psis import Workspace, arviz_generation, psis_loo_block, summary, tail_rows_bytes
from ._resources import loo_backend
from ._route import Options, evaluate

__all__ = ["loo"]

#: The default memory budget of `loo`: one block's log-likelihood and its smoothing.
DEFAULT_BUDGET = 1 << 30
SAMPLE_DIMS = ("chain", "draw")  # of the draws, as ArviZ's loo takes them
_LOG_WEIGHTS_NOTE = (
    "pymc_chunkpost.loo leaves out the smoothed log_weights (draws x observations): they "
    "are never held in memory. Use ArviZ's loo on the full log-likelihood for them."
)
_SCALES = {"log": 1, "negative_log": -1, "deviance": -2}
_HIGH_K = (
    "Estimated shape parameter of Pareto distribution is greater than {good_k:.2f} for one "
    "or more samples. You should consider using a more robust model, this is because "
    "importance sampling is less likely to work well if the marginal posterior and LOO "
    "posterior are very different. This is more likely to happen with a non-robust model "
    "and highly influential observations."
)
_SAME_POINTWISE = (
    "The point-wise LOO is the same with the sum LOO, please double check the Observed RV in "
    "your model to make sure it returns element-wise logp."
)


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
        model: the model the draws came from; default the one on the context stack.
        var_name: the observed variable; needed where the model has several.
        pointwise: return `loo_i`/`elpd_i` and `pareto_k` (O(observations)); default
            ArviZ's `stats.ic_pointwise` rcParam. `az.compare` needs them.
        reff: relative MCMC efficiency; default ArviZ's, from the posterior's mean ESS.
        scale: ArviZ 0.x's `scale` ("log", "negative_log" or "deviance"); ArviZ 1.x reports
            on the log scale only.
        postprocessing_backend: the device that computes the log-likelihood: None (the
            default device; on an accelerator, the host CPU where draws x observations
            are at most `PlannerConfig.loo_host_values_per_core` per host core, since the
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
            variables without `var_name`, draws that do not match the model, bad options.
        MemoryError: before any work, where one row of the variable's first axis (all its
            draws) needs more than `memory_budget`.
    """
    import pymc

    from ._posthoc import _draws, _posterior, _to_dataset

    generation = arviz_generation()
    scale_value = _scale_value(scale, generation)
    engine = {"memory_budget": memory_budget, "matmul_precision": matmul_precision}
    # The engine's own bar (over one block's draws) is off: `progressbar` is loo's bar.
    options = Options(postprocessing_backend, postprocessing_vectorize, False, engine)
    options.check()
    _check_block_size(block_size)
    posterior = _posterior(idata)
    model = pymc.modelcontext(model)
    name = _observed_name(model, var_name)
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    draws = _draws(dataset, model, SAMPLE_DIMS, "idata.posterior")
    if draws is None:
        raise ValueError("`idata.posterior` has no draws: LOO needs (chain, draw) samples.")
    chains, n_draws = draws.sample_shape
    n_samples = chains * n_draws
    if reff is None:
        reff = _reff(dataset, n_samples, generation)
    graph = _LogpBlocks(model, name, [draws.arrays[v.name] for v in model.free_RVs])
    budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
    size = _block_size(graph.shape, n_samples, budget, block_size)
    backend, _ = loo_backend(postprocessing_backend, n_samples * math.prod(graph.shape))
    options = dataclasses.replace(options, backend=backend)
    # The engine's share of an explicit budget: the block's log-likelihood and as much again
    # for its temporaries (the rest is the smoothing's workspace and the next block).
    rest = math.prod(graph.shape[1:]) if graph.shape else 1
    engine_budget = None if memory_budget is None else 2 * 8 * n_samples * size * rest
    options = options.with_engine(memory_budget=engine_budget)
    arrays = [draws.arrays[n] for n in graph.input_names]

    def block(start: int) -> np.ndarray:
        label = f"Log-likelihood of {name!r} [{start}:{start + size}]"
        # Decided at the first block, in `_blocked`'s thread: the garbage of the graphs built
        # to decide is collected with each block's (what exists before `_blocked` is not).
        inputs = graph.block_inputs(arrays, size, options)
        values, _ = evaluate(graph.block_function(start, size), inputs, options, label)
        return np.asarray(values[0])

    bar = _bar_label(name, progressbar)
    elpd_i, pareto_k, lppd_i = _blocked(block, graph.shape, size, n_samples, reff, bar)
    # As `pm.compute_log_likelihood` names the matrix: pymc's own conversion.
    dims, coords = _pointwise_dims(
        name,
        (*draws.sample_shape, *graph.shape),
        lambda trace: _to_dataset(model, list(trace), list(trace.values()), draws, SAMPLE_DIMS),
    )
    return _result(
        elpd_i, pareto_k, lppd_i, n_samples, name, dims, coords, pointwise, scale_value, generation
    )


# --- blocks -------------------------------------------------------------------------------


def _blocked(
    block: Callable[[int], np.ndarray],
    shape: tuple[int, ...],
    size: int,
    n_samples: int,
    reff: float,
    bar: str | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-observation results over all blocks, each of `shape`, with a progress bar over
    the observations labelled `bar` (None: no bar).

    `block(start)` returns the log-likelihood of observations `[start, start + size)` along
    the first axis of `shape`, as `(chains, draws, size, *shape[1:])`. Every block has the
    same size: the last one starts at `shape[0] - size` and overlaps the one before, whose
    results it recomputes identically."""
    # What exists now is not the blocks' garbage: frozen, the collection before each block
    # scans only what was made since (0.5-0.7 s a collection with pymc and JAX loaded,
    # milliseconds frozen). Unfrozen after, for Python's own collections.
    gc.freeze()
    try:
        total = math.prod(shape)
        with counter(total, bar or "", "obs", bar is not None) as progress:
            return _blocks(block, shape, size, n_samples, reff, progress)
    finally:
        gc.unfreeze()


def _bar_label(name: str, progressbar: bool) -> str | None:
    return f"PSIS-LOO of {name!r}" if progressbar else None


def _blocks(
    block: Callable[[int], np.ndarray],
    shape: tuple[int, ...],
    size: int,
    n_samples: int,
    reff: float,
    progress: Callable[[int], None],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_leading = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if shape else 1
    total = n_leading * rest
    elpd_i, pareto_k, lppd_i = (np.empty(total) for _ in range(3))
    starts = list(range(0, n_leading - size, size)) + [n_leading - size]
    # Each observation is smoothed on its own: the block's rows in one part per core (up to
    # `psis_parts`), each smoothed by a thread of its own (numpy releases the GIL) in passes
    # of `psis_rows_per_pass` rows, in the part's own workspace: the same numbers.
    config = current()
    n_parts = max(1, min(cpu_cores(), config.psis_parts, size * rest))
    bounds = np.linspace(0, size * rest, n_parts + 1).astype(int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    rows = max(1, min(config.psis_rows_per_pass, bounds[1] - bounds[0]))
    workspaces = [Workspace(rows, n_samples) for _ in parts]
    # The engine computes the next block in a thread while this one is smoothed (numpy and
    # XLA release the GIL): at most two blocks' log-likelihood are alive at once.
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="loo-block") as pool,
        ThreadPoolExecutor(max_workers=n_parts, thread_name_prefix="loo-psis") as smoothing,
    ):
        pending = pool.submit(_collected, block, starts[0])
        for i, start in enumerate(starts):
            values = pending.result().reshape(n_samples, size * rest)
            if i + 1 < len(starts):
                pending = pool.submit(_collected, block, starts[i + 1])
            offset = start * rest
            smooth = _smoothed(values, reff)
            for part, result in zip(parts, smoothing.map(smooth, parts, workspaces)):
                where = slice(offset + part.start, offset + part.stop)
                elpd_i[where] = result.elpd_i
                pareto_k[where] = result.pareto_k
                lppd_i[where] = result.lppd_i
            del values, smooth
            progress(offset + size * rest)
    return elpd_i.reshape(shape), pareto_k.reshape(shape), lppd_i.reshape(shape)


def _smoothed(values: np.ndarray, reff: float) -> Callable[[slice, Workspace], Any]:
    """PSIS of the block's observations at a slice, in a workspace: `values` is the engine's
    block, `(draws, observations)`, read transposed by each part (no copy of the block)."""

    def smooth(rows: slice, workspace: Workspace) -> Any:
        return psis_loo_block(values[:, rows].T, reff, workspace)

    return smooth


def _collected(block: Callable[[int], np.ndarray], start: int) -> np.ndarray:
    """`block(start)` after a garbage collection: each block's graph and program are cyclic
    garbage (pytensor's graphs), which Python's thresholds let pile up block after block.
    In the worker thread, while the main thread smooths the block before."""
    gc.collect()
    return block(start)


def _block_size(shape: tuple[int, ...], n_samples: int, budget: int, block_size: int | None) -> int:
    n_leading = shape[0] if shape else 1
    if block_size is not None:
        return min(block_size, n_leading)
    rest = math.prod(shape[1:]) if shape else 1
    per_leading = rest * (8 * n_samples + tail_rows_bytes(n_samples))
    if per_leading > budget:
        raise MemoryError(
            f"One observation along the first axis ({rest} values x {n_samples} draws) "
            f"needs about {per_leading / 2**20:.1f} MiB, over `memory_budget` of "
            f"{budget / 2**20:.1f} MiB. Pass a larger `memory_budget`."
        )
    return max(1, min(n_leading, budget // per_leading))


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

        from ._graph import funcify, jax_graph

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

        from ._graph import funcify, jax_graph

        with config.change_flags(traceback__limit=0):
            fgraph = jax_graph(self.roots, [pt.stack(self.outcomes)])
            in2out(local_check_parameter_to_ninf_switch).rewrite(fgraph)
        return funcify(fgraph)


def _pointwise_dims(
    name: str, shape: tuple[int, ...], to_dataset: Callable[[dict], Any]
) -> tuple[list[str], dict[str, Any]]:
    """The dims and coords of ArviZ's pointwise results: those that `to_dataset`, the
    library's own conversion of `{name: matrix}`, gives a log-likelihood matrix of `shape`
    (`SAMPLE_DIMS` first) after its sample dims. The matrix converted is zero-strided (no
    memory); the conversion's warnings about its shape are not the user's (ArviZ's `loo`
    gives none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matrix = to_dataset({name: np.broadcast_to(np.zeros(()), shape)})[name]
    dims = [str(d) for d in matrix.dims[len(SAMPLE_DIMS) :]]
    return dims, {d: matrix.coords[d].values for d in dims if d in matrix.coords}


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


# --- checks and ArviZ's defaults --------------------------------------------------------------


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


def _check_block_size(block_size: Any) -> None:
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(
            f"`block_size` must be a positive int, got {block_size!r}. Pass "
            "`block_size=None` to size blocks from `memory_budget`."
        )


def _scale_value(scale: str | None, generation: int) -> int:
    if scale is None:
        if generation == 0:
            from arviz import rcParams

            scale = rcParams["stats.ic_scale"]
        else:
            scale = "log"
    if not isinstance(scale, str) or scale.lower() not in _SCALES:
        raise ValueError(f"`scale` must be one of {list(_SCALES)}, got {scale!r}.")
    if generation == 1 and scale.lower() != "log":
        raise ValueError(
            f"`scale={scale!r}`: ArviZ 1.x's loo reports on the log scale only; pass None."
        )
    return _SCALES[scale.lower()]


def _reff(posterior: Any, n_samples: int, generation: int) -> float:
    """ArviZ's default `reff`: the posterior's mean ESS over all its values, per draw."""
    if posterior.sizes["chain"] == 1:
        return 1.0
    if generation == 0:
        from arviz import ess

        ess_p = ess(posterior, method="mean")
    else:
        importlib.import_module("arviz_stats")  # registers the `azstats` accessor

        ess_p = posterior.azstats.ess(method="mean")
    values = [ess_p[v].values.flatten() for v in ess_p.data_vars]
    return float(np.hstack(values).mean() / n_samples)


def _pointwise_default(generation: int) -> bool:
    rc_params = importlib.import_module("arviz" if generation == 0 else "arviz_base").rcParams
    return bool(rc_params["stats.ic_pointwise"])


# --- ArviZ's result -------------------------------------------------------------------------


def _result(
    elpd_i: np.ndarray,
    pareto_k: np.ndarray,
    lppd_i: np.ndarray,
    n_samples: int,
    name: str,
    dims: list[str],
    coords: dict[str, Any],
    pointwise: bool | None,
    scale_value: int,
    generation: int,
) -> Any:
    """ArviZ's LOO result, filled as the installed ArviZ's `loo` fills it."""
    import xarray

    pointwise = _pointwise_default(generation) if pointwise is None else bool(pointwise)
    elpd, se, p_loo = summary(elpd_i, lppd_i, generation, scale_value)
    n_data_points = np.prod(elpd_i.shape) if generation == 0 else int(elpd_i.size)
    good_k = min(1 - 1 / np.log10(n_samples), 0.7) if n_samples > 1 else 0.7
    warning = bool(np.any(pareto_k > good_k))
    if warning:
        warnings.warn(_HIGH_K.format(good_k=good_k), UserWarning, stacklevel=3)
    loo_i = scale_value * elpd_i
    if pointwise and np.equal(elpd, loo_i).all():
        warnings.warn(_SAME_POINTWISE, UserWarning, stacklevel=3)

    def array(values: np.ndarray, label: str) -> Any:
        return xarray.DataArray(values, dims=dims, coords=coords, name=label)

    if generation == 0:
        from arviz import ELPDData

        data: list[Any] = [elpd, se, p_loo, n_samples, n_data_points, warning]
        index = ["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning"]
        if pointwise:
            data += [array(loo_i, "loo_i"), array(pareto_k, "pareto_shape")]
            index += ["loo_i", "pareto_k"]
        result = ELPDData(
            data=[*data, _scale_name(scale_value), good_k], index=index + ["scale", "good_k"]
        )
        result.attrs["log_weights"] = _LOG_WEIGHTS_NOTE
        return result
    # arviz-stats' result type, imported by name (ArviZ 0.x has no arviz_stats).
    ELPDDataLOO = importlib.import_module("arviz_stats.utils").ELPDDataLOO  # noqa: N806
    result = ELPDDataLOO(
        elpd=elpd,
        se=se,
        p=p_loo,
        n_samples=n_samples,
        n_data_points=n_data_points,
        scale="log",
        warning=warning,
        good_k=good_k,
        elpd_i=array(elpd_i, name) if pointwise else None,
        pareto_k=array(pareto_k, name) if pointwise else None,
        approx_posterior=False,
        log_weights=None,
    )
    result.log_weights_note = _LOG_WEIGHTS_NOTE
    return result


def _scale_name(scale_value: int) -> str:
    return {value: key for key, value in _SCALES.items()}[scale_value]


# --- numpyro ------------------------------------------------------------------------------


def numpyro_loo(
    model: Callable,
    posterior_samples: dict[str, Any],
    *args: Any,
    batch_ndims: int = 1,
    var_name: str | None = None,
    pointwise: bool | None = None,
    reff: float | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    **kwargs: Any,
) -> Any:
    """PSIS-LOO-CV of a NumPyro model, as ArviZ's `loo` on `numpyro.infer.log_likelihood`.

    Each block's program computes the site's whole log-density at a draw and keeps the
    block's observations (NumPyro's data are the model's arguments, which cannot be sliced
    for it): memory is one block, work grows with the number of blocks. A budget that holds
    the whole log-likelihood takes one block.

    Args:
        model: the numpyro model.
        posterior_samples: site name to draws of shape `batch_shape + site shape`.
        *args: the model's arguments.
        batch_ndims: 1 (`(num_samples, ...)`, one chain) or 2 (`(chains, draws, ...)`).
        var_name: the observed site; needed where the model has several.
        pointwise: as for `loo`.
        reff: as for `loo`; default ArviZ's from the posterior draws.
        postprocessing_vectorize: as for `loo`.
        memory_budget: as for `loo`.
        block_size: as for `loo`.
        progressbar: as for `loo`.
        **kwargs: the model's keyword arguments.

    Returns:
        ArviZ's LOO result, as `loo` returns it (log scale).

    Raises:
        ValueError: bad arguments (no draws, an unknown or missing `var_name`), before the
            log-likelihood is computed.
    """
    import jax
    import xarray

    from ._numpyro import _as_chains_draws, _batch_shape, _check_callable, _log_likelihood_draw

    generation = arviz_generation()
    options = Options(None, postprocessing_vectorize, False, {"memory_budget": memory_budget})
    options.check()
    _check_block_size(block_size)
    _check_callable(model, "model")
    if batch_ndims not in (1, 2):
        raise ValueError(
            f"`batch_ndims` must be 1 or 2 for LOO, got {batch_ndims!r}: LOO needs draws, "
            "of shape (num_samples, ...) or (chains, draws, ...)."
        )
    batch_shape = _batch_shape(posterior_samples, batch_ndims)
    if batch_shape is None or math.prod(batch_shape) < 2:
        raise ValueError("`posterior_samples` has no draws: LOO needs posterior draws.")
    leaves, tree = jax.tree_util.tree_flatten(posterior_samples)
    draws = [_as_chains_draws(x, batch_shape) for x in leaves]
    one = jax.tree_util.tree_unflatten(tree, [np.asarray(d)[0, 0] for d in draws])
    sites = _log_likelihood_draw(model, one, args, kwargs)
    names = list(sites)
    if not names:
        raise ValueError("The model has no observed sites: LOO needs a likelihood.")
    if var_name is None and len(names) > 1:
        raise ValueError(
            f"The model has several observed sites ({names}): pass `var_name`, one of them."
        )
    name = names[0] if var_name is None else var_name
    if name not in names:
        raise ValueError(f"`var_name={var_name!r}` is not an observed site; pass one of {names}.")
    shape = tuple(np.shape(sites[name]))
    chains, n_draws = draws[0].shape[:2]
    n_samples = chains * n_draws
    if reff is None:
        dataset = xarray.Dataset(
            {
                k: (("chain", "draw", *(f"{k}_dim_{i}" for i in range(np.ndim(v) - 2))), v)
                for k, v in (
                    (k, np.asarray(v).reshape((chains, n_draws, *np.shape(v)[batch_ndims:])))
                    for k, v in posterior_samples.items()
                )
            }
        )
        reff = _reff(dataset, n_samples, generation)
    budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
    size = _block_size(shape, n_samples, budget, block_size)

    def block(start: int) -> np.ndarray:
        def per_draw(*values: Any) -> Any:
            samples = jax.tree_util.tree_unflatten(tree, values)
            site = _log_likelihood_draw(model, samples, args, kwargs)[name]
            # The engine maps a function of a list of outputs.
            return [site if not shape or size == shape[0] else site[start : start + size]]

        label = f"Log-likelihood of {name!r} [{start}:{start + size}]"
        values, _ = evaluate(per_draw, draws, options, label)
        return np.asarray(values[0])

    bar = _bar_label(name, progressbar)
    elpd_i, pareto_k, lppd_i = _blocked(block, shape, size, n_samples, reff, bar)
    # As ArviZ names numpyro's log-likelihood (`from_numpyro`, `from_dict`).
    if generation == 0:
        from arviz import dict_to_dataset
    else:
        dict_to_dataset = functools.partial(
            importlib.import_module("arviz_base").dict_to_dataset, sample_dims=list(SAMPLE_DIMS)
        )
    dims, coords = _pointwise_dims(name, (chains, n_draws, *shape), dict_to_dataset)
    return _result(
        elpd_i, pareto_k, lppd_i, n_samples, name, dims, coords, pointwise, 1, generation
    )
