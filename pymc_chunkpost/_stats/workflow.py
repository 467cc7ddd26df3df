"""LOO-PIT, LOO expectations and LOO scores in blocks of observations: ArviZ's own numbers.

ArviZ's `loo_pit`, `loo_expectations` and `loo_score` take the pointwise log-likelihood,
draws x observations, and smooth it whole. Each observation's result needs only its own
column of draws: its log-likelihood, its PSIS log-weights, and its posterior-predictive
draws. So a route (pymc's `loo_pit`, ...) hands the engine's blocks of log-likelihood
(`LogLikelihoodBlocks`, as `loo` computes them), and here each block is smoothed by
ArviZ's own PSIS (`psislw`, with loo's `reff`) and reduced, with the predictive draws of
the same observations (read a block at a time: a lazy, Zarr-backed group is never read
whole), by ArviZ's own per-observation function given those log-weights. Memory is one
block plus the O(observations) results; the numbers are ArviZ's on the full matrices.

What is not per observation is done once, as ArviZ does it, on O(observations) vectors:
the random numbers of the randomised PIT (one generator, drawn observation after
observation, in ArviZ's order), ArviZ 0.x's spline through the observations of integer
data, the Pareto k warning, and the aggregates of `loo_metrics`, `loo_score`, `loo_r2`.

Nothing here knows the library that computed the log-likelihood.
"""

from __future__ import annotations

import importlib
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import numpy as np

from .loo import SAMPLE_DIMS, LogLikelihoodBlocks, each_block

__all__ = [
    "PIT_SEED",
    "check_same_observations",
    "expectation_blocks",
    "metrics",
    "pit_blocks",
    "pit_blocks_v0",
    "r2",
    "score_blocks",
]

#: arviz-stats' seed of the PIT's tie-breaking where `random_state` is None.
PIT_SEED = 214
#: Bytes a draw of one predictive value takes in a block, beside loo's: the draws, and
#: ArviZ's per-block temporaries (weights broadcast and normalised, masks, products).
PREDICTIVE_BYTES = 56
_SAMPLE = list(SAMPLE_DIMS)


# --- checks -------------------------------------------------------------------------------


def check_same_observations(recorded: np.ndarray, model: np.ndarray, name: str) -> None:
    """Raise where `observed_data`'s `name` (`recorded`, what ArviZ reads) is not the
    observations the log-likelihood is computed at (`model`): its shape, or its values."""
    fix = (
        "The log-likelihood is computed at the model's data: set it to the data the draws "
        "were fit to (`pm.set_data`), or rebuild the inference data's `observed_data` from "
        "the model (ArviZ reads the observations there)."
    )
    if recorded.shape != model.shape:
        raise ValueError(
            f"`idata.observed_data[{name!r}]` has shape {recorded.shape}, the model's "
            f"observations of {name!r} {model.shape}. {fix}"
        )
    same = np.array_equal(recorded, model, equal_nan=_can_be_nan(recorded, model))
    if not same:
        differ = int(np.sum(recorded != model))
        raise ValueError(
            f"`idata.observed_data[{name!r}]` differs from the model's observations of "
            f"{name!r} at {differ} of {model.size} values. {fix}"
        )


def _can_be_nan(*arrays: np.ndarray) -> bool:
    return all(a.dtype.kind in "fc" for a in arrays)


# --- the block loop -------------------------------------------------------------------------


def _pieces(
    blocks: LogLikelihoodBlocks, bar: str | None, visit: Callable[[slice, np.ndarray], Any]
) -> list:
    """`visit(rows, values)` for each block, in order, over the observations (along the
    first axis) that no block before has visited, and their log-likelihood `values`,
    `(chains, draws, rows, ...)`: each observation is visited once, in order (the last
    block overlaps the one before; ArviZ's random numbers are drawn observation after
    observation). The visits' results, in order."""
    pieces: list = []
    done = 0

    def visited(start: int, values: np.ndarray) -> None:
        nonlocal done
        rows = slice(max(start, done), start + blocks.size)
        pieces.append(visit(rows, values[:, :, rows.start - start :]))
        done = rows.stop

    # One block at a time: ArviZ's functions enter `warnings.catch_warnings` (`each_block`).
    each_block(blocks.block, blocks.shape, blocks.size, visited, bar, ahead=False)
    return pieces


def _log_likelihood(blocks: LogLikelihoodBlocks, rows: slice, values: np.ndarray, like: Any) -> Any:
    """The block's log-likelihood as a DataArray, as ArviZ reads the matrix: the sample dims,
    then the variable's; coords from `like` (the predictive draws of the same observations)
    where it has them, else the variable's own."""
    import xarray

    dims = [*_SAMPLE, *blocks.dims]
    coords = {}
    for i, dim in enumerate(dims):
        if dim in like.dims and dim in like.coords:
            coords[dim] = like.coords[dim].values
        elif dim in blocks.coords:
            coords[dim] = blocks.coords[dim][rows] if i == len(_SAMPLE) else blocks.coords[dim]
    return xarray.DataArray(values, dims=dims, coords=coords, name=blocks.name)


def _smoothed(log_likelihood: Any, reff: float) -> tuple[Any, Any]:
    """ArviZ 1.x's PSIS of a block, as its `loo_pit`, `loo_expectations` and `loo_score`
    call it: log-weights and Pareto k of each observation."""
    importlib.import_module("arviz_stats")  # registers the `azstats` accessor
    return log_likelihood.azstats.psislw(r_eff=reff, dim=_SAMPLE)


def _joined(pieces: list, dim: str) -> Any:
    import xarray

    return pieces[0] if len(pieces) == 1 else xarray.concat(pieces, dim=dim)


# --- LOO-PIT --------------------------------------------------------------------------------


def pit_blocks(
    blocks: LogLikelihoodBlocks,
    predictive: Any,
    observed: Any,
    random_state: Any,
    pareto_pit: bool,
    bar: str | None,
) -> Any:
    """arviz-stats' LOO-PIT of each observation, a DataArray: `predictive` is the variable's
    draws `(chain, draw, *dims, ...)`, `observed` its observations, both read a block at a
    time. The tie-breaking numbers come from one generator, as arviz-stats' (seed
    `PIT_SEED` where `random_state` is None), drawn block after block in its order. Where
    the predictive draws have more values than the log-likelihood (a multivariate
    likelihood), each row's log-weights are given to each of its values."""
    first = blocks.dims[0]
    rng = np.random.default_rng(PIT_SEED if random_state is None else random_state)

    def visit(rows: slice, values: np.ndarray) -> Any:
        draws = predictive.isel({first: rows})
        smoothed = _smoothed(_log_likelihood(blocks, rows, values, draws), blocks.reff)
        # Each observation's weights to each of its values (a multivariate likelihood's
        # row), as arviz-stats' `loo_expectations` broadcasts them (its `loo_pit` fails).
        log_weights, pareto_k = (v.broadcast_like(draws, exclude=_SAMPLE) for v in smoothed)
        pit, _ = draws.azstats.loo_pit(
            y_obs=observed.isel({first: rows}),
            log_weights=log_weights,
            pareto_k=pareto_k,
            r_eff=blocks.reff,
            sample_dims=_SAMPLE,
            random_state=rng,
            pareto_pit=pareto_pit,
        )
        return pit

    return _joined(_pieces(blocks, bar, visit), first)


def pit_blocks_v0(
    blocks: LogLikelihoodBlocks, predictive: Any, observed: np.ndarray, bar: str | None
) -> np.ndarray:
    """ArviZ 0.x's `loo_pit(idata, y=name, y_hat=name)`, an array of the observations'
    shape. Integer data: ArviZ's spline through the observations (`smooth_data`, along the
    first axis) is drawn once, over all of them; its spline through each observation's
    draws, block by block (the same, row by row). Where the predictive draws have more
    values than the log-likelihood (a multivariate likelihood), each row's log-weights are
    given to each of its values (ArviZ 0.x refuses the shapes)."""
    from arviz import loo_pit, psislw
    from arviz.stats.stats_utils import smooth_data

    first = blocks.dims[0]
    smooth = observed.dtype.kind == "i" or predictive.dtype.kind == "i"
    y = smooth_data(observed, np.zeros((1, 2)))[0] if smooth else observed
    pit = np.empty(y.shape)

    def visit(rows: slice, values: np.ndarray) -> None:
        # ArviZ's order: the observations' dims, then the draws stacked chain by chain.
        y_hat = predictive.isel({first: rows}).stack(__sample__=SAMPLE_DIMS).values
        if smooth:
            y_hat = smooth_data(np.zeros(2), y_hat)[1]
        n_rows = rows.stop - rows.start
        log_likelihood = np.moveaxis(values.reshape(blocks.n_samples, n_rows, -1), 0, -1)
        log_weights = psislw(-log_likelihood, reff=blocks.reff)[0]
        log_weights = log_weights.reshape(n_rows, *blocks.shape[1:], blocks.n_samples)
        extra = y_hat.ndim - log_weights.ndim
        log_weights = log_weights.reshape(*log_weights.shape[:-1], *([1] * extra), -1)
        pit[rows] = loo_pit(
            y=y[rows], y_hat=y_hat, log_weights=np.broadcast_to(log_weights, y_hat.shape)
        )

    _pieces(blocks, bar, visit)
    return pit


# --- expectations ---------------------------------------------------------------------------


def expectation_blocks(
    blocks: LogLikelihoodBlocks, draws: Any, kind: str, probs: Any, bar: str | None
) -> tuple[Any, Any]:
    """arviz-stats' `loo_expectations` of `draws` (`(chain, draw, ...)`: the predictive
    draws, with the variable's dims, read a block at a time; or a posterior variable's,
    without them, broadcast to each block's observations): the expectation and the
    function's Pareto k (from the raw log-ratios, as arviz-stats), each a DataArray.
    Warns, once, as arviz-stats does of high k."""
    from arviz_stats.loo.loo_expectations import _get_function_khat
    from arviz_stats.loo.loo_helper import _warn_pareto_k
    from xarray import apply_ufunc

    first = blocks.dims[0]

    def visit(rows: slice, values: np.ndarray) -> tuple[Any, Any]:
        h = draws.isel({first: rows}) if first in draws.dims else draws
        log_likelihood = _log_likelihood(blocks, rows, values, h)
        h = h.broadcast_like(log_likelihood, exclude=_SAMPLE)
        log_weights, pareto_k = (
            v.broadcast_like(h, exclude=_SAMPLE) for v in _smoothed(log_likelihood, blocks.reff)
        )
        given = {"log_weights": log_weights, "pareto_k": pareto_k, "r_eff": blocks.reff}
        if kind == "quantile":
            expectation, _ = h.azstats.loo_quantile(**given, probs=probs, sample_dims=_SAMPLE)
        else:
            expectation, _ = h.azstats.loo_expectation(**given, kind=kind, sample_dims=_SAMPLE)
        khat = apply_ufunc(
            _get_function_khat,
            h,
            (-log_likelihood).broadcast_like(h, exclude=_SAMPLE),
            input_core_dims=[_SAMPLE, _SAMPLE],
            output_core_dims=[[]],
            exclude_dims=set(_SAMPLE),
            kwargs={"kind": kind},
            vectorize=True,
            dask="parallelized",
            output_dtypes=[float],
        )
        return expectation, khat

    pieces = _pieces(blocks, bar, visit)
    expectation = _joined([p[0] for p in pieces], first)
    khat = _joined([p[1] for p in pieces], first)
    _warn_pareto_k(khat.values, blocks.n_samples)
    return expectation, khat


def metrics(observed: Any, predicted: Any, kind: str, round_to: Any) -> Any:
    """arviz-stats' `loo_metrics` from the observations and their LOO means (O(N))."""
    from arviz_stats.metrics import _metrics

    return _metrics(observed, predicted, kind, round_to)


def r2(
    observed: Any,
    predicted: Any,
    n_simulations: int,
    summary: bool,
    circular: bool,
    summary_options: tuple[Any, Any, Any, Any],
) -> Any:
    """arviz-stats' `loo_r2` from the observations and their LOO means (O(N)): its
    bootstrap (seed 42, as arviz-stats'), summarised with `summary_options`
    (point_estimate, ci_kind, ci_prob, round_to; None: arviz-stats' rcParams)."""
    from arviz_base import rcParams
    from arviz_stats.metrics import _summary_r2

    importlib.import_module("arviz_stats")  # registers the `azstats` accessor
    samples = observed.azstats.loo_r2(
        ypred_loo=predicted, n_simulations=n_simulations, circular=circular, random_state=42
    )
    if not summary:
        return samples
    keys = ("stats.point_estimate", "stats.ci_kind", "stats.ci_prob", "stats.round_to")
    options = [rcParams[k] if v is None else v for k, v in zip(keys, summary_options)]
    return _summary_r2("loo", samples, *options)


# --- scores ---------------------------------------------------------------------------------


def score_blocks(
    blocks: LogLikelihoodBlocks,
    predictive: Any,
    observed: Any,
    kind: str,
    pointwise: bool,
    round_to: Any,
    bar: str | None,
) -> Any:
    """arviz-stats' `loo_score` (CRPS or SCRPS): each observation's score from its block,
    checked block by block as arviz-stats checks the whole; the mean and its standard
    error over the O(N) scores, as arviz-stats aggregates them."""
    from arviz_stats.base.stats_utils import round_num
    from arviz_stats.loo.loo_helper import _validate_crps_input, _warn_pareto_k

    first = blocks.dims[0]

    def visit(rows: slice, values: np.ndarray) -> tuple[Any, Any]:
        draws, y = predictive.isel({first: rows}), observed.isel({first: rows})
        log_likelihood = _log_likelihood(blocks, rows, values, draws)
        _validate_crps_input(
            draws, y, log_likelihood, sample_dims=_SAMPLE, obs_dims=list(blocks.dims)
        )
        log_weights, pareto_k = _smoothed(log_likelihood, blocks.reff)
        return draws.azstats.loo_score(
            y_obs=y, log_weights=log_weights, pareto_k=pareto_k, kind=kind, sample_dims=_SAMPLE
        )

    pieces = _pieces(blocks, bar, visit)
    scores = _joined([p[0] for p in pieces], first)
    pareto_k = _joined([p[1] for p in pieces], first)
    _warn_pareto_k(pareto_k, blocks.n_samples)
    n_points = int(np.prod([scores.sizes[d] for d in scores.dims]))
    mean = scores.mean().values.item()
    se = (scores.std(ddof=0).values / (n_points**0.5)).item()
    # arviz-stats' result: a namedtuple of the score's name.
    fields = ["mean", "se", "pointwise", "pareto_k"] if pointwise else ["mean", "se"]
    score: Any = namedtuple("SCRPS", fields) if kind == "scrps" else namedtuple("CRPS", fields)
    values = (round_num(mean, round_to), round_num(se, round_to), scores, pareto_k)
    return score(*values[: len(fields)])
