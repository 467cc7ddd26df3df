"""`loo_pit`, `loo_expectations`, `loo_metrics`, `loo_score`, `loo_r2` of a PyMC model,
without the draws x observations log-likelihood.

ArviZ's functions of these names read the `log_likelihood` group. Here, as in `loo`, the
observed variable's log-likelihood is computed by the engine in blocks of observations x
all draws (`log_likelihood_blocks`), and `_stats.workflow` reduces each block with the
posterior-predictive draws of the same observations, read a block at a time: memory is
one block plus O(observations) results. Time is mostly ArviZ's own per-observation loops
(its PSIS and its functions, for its exact numbers): more than `loo`'s vectorised PSIS.
The posterior predictive must exist (drawing it block by block is not done here); the
observations ArviZ reads, `observed_data`, must be the model's (checked before any work).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._stats.loo import SAMPLE_DIMS, LogLikelihoodBlocks
from .._stats.psis import arviz_generation
from .._stats.workflow import (
    PREDICTIVE_BYTES,
    expectation_blocks,
    metrics,
    pit_blocks,
    pit_blocks_v0,
    r2,
    score_blocks,
)
from .bambi import as_pymc
from .loo import _observed_name, log_likelihood_blocks, model_observations

__all__ = ["loo_expectations", "loo_metrics", "loo_pit", "loo_r2", "loo_score"]

_KINDS = (
    "mean",
    "median",
    "var",
    "sd",
    "quantile",
    "circular_mean",
    "circular_var",
    "circular_sd",
)
_GROUPS = ("posterior_predictive", "posterior")


def _engine(
    postprocessing_backend: str | None,
    postprocessing_vectorize: str,
    memory_budget: int | float | None,
    block_size: int | None,
    matmul_precision: str | None,
) -> dict[str, Any]:
    return {
        "postprocessing_backend": postprocessing_backend,
        "postprocessing_vectorize": postprocessing_vectorize,
        "memory_budget": memory_budget,
        "block_size": block_size,
        "matmul_precision": matmul_precision,
    }


def loo_pit(
    idata: Any,
    model: Any = None,
    *,
    var_name: str | None = None,
    random_state: Any = None,
    pareto_pit: bool = False,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> Any:
    """LOO-PIT of an observed variable, as the installed ArviZ's, without the log-likelihood.

    ArviZ 1.x: `arviz_stats.loo_pit(idata_with_log_likelihood, var_names=var_name, ...)`,
    the same Dataset; ArviZ 0.x: `arviz.loo_pit(idata_with_log_likelihood, y=var_name,
    y_hat=var_name)`, the same array. The log-likelihood is computed in blocks, as `loo`
    computes it, each block smoothed by ArviZ's own `psislw`.

    Args:
        idata: an `xarray.DataTree` (pymc 6) or `arviz.InferenceData` (pymc 5) with
            `posterior` and `posterior_predictive` groups (and, where ArviZ reads the
            observations, `observed_data`), no `log_likelihood` needed.
        model: the model the draws came from, a PyMC model or a Bambi model (its PyMC
            model, at the draws as Bambi's `_re_center_intercept` gives them back); default
            the one on the context stack.
        var_name: the observed variable; needed where the model has several.
        random_state: ArviZ 1.x: seed or `numpy.random.Generator` of the tie-breaking of
            discrete data, as arviz-stats' (None: its seed, 214); drawn from in the same
            order, so the same values. ArviZ 0.x has none: must be None.
        pareto_pit: ArviZ 1.x: Pareto-smoothed PIT values, as arviz-stats'.
        postprocessing_backend, postprocessing_vectorize, matmul_precision: as in `loo`.
        memory_budget: bytes for one block, as in `loo`, with the block's predictive draws
            and ArviZ's arrays of them besides (about 7 x 8 bytes a draw of each predictive
            value): blocks are smaller than `loo`'s. Default 1 GiB.
        block_size: observations (along the variable's first axis) per block, instead of
            sizing it from `memory_budget`.
        progressbar: a bar over the observations, moved as each block is done.

    Returns:
        ArviZ 1.x: a Dataset of `var_name`'s PIT values, with `observed_data`'s coords;
        ArviZ 0.x: an array of the observations' shape.

    Raises:
        ValueError: before any work: no `posterior_predictive` draws of `var_name`,
            `observed_data` that differs from the model's observations, and as `loo`.
    """
    import xarray

    generation = arviz_generation()
    if generation == 0 and (random_state is not None or pareto_pit):
        raise ValueError(
            "`random_state` and `pareto_pit` are arviz-stats' (ArviZ 1.x) options: ArviZ "
            f"0.x's loo_pit has neither. Got {random_state=}, {pareto_pit=}."
        )
    engine = _engine(
        postprocessing_backend,
        postprocessing_vectorize,
        memory_budget,
        block_size,
        matmul_precision,
    )
    idata, model, blocks, predictive = _prepared(
        "loo_pit", idata, model, var_name, "posterior_predictive", engine
    )
    observed = _observed(idata, model, blocks.name, predictive)
    bar = _bar("LOO-PIT", blocks.name, progressbar)
    if generation == 0:
        return pit_blocks_v0(blocks, predictive, np.asarray(observed.values), bar)
    pit = pit_blocks(blocks, predictive, observed, random_state, pareto_pit, bar)
    result = xarray.Dataset(coords=_observed_coords(idata, observed))
    result[blocks.name] = pit
    return result


def loo_expectations(
    idata: Any,
    model: Any = None,
    *,
    var_name: str | None = None,
    group: str = "posterior_predictive",
    log_likelihood_var_name: str | None = None,
    kind: str = "mean",
    probs: float | list[float] | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> tuple[Any, Any]:
    """`arviz_stats.loo_expectations`, without the log-likelihood (ArviZ 1.x only).

    The LOO-weighted expectation of each observation's predictive draws (or of a
    posterior variable), and the function's Pareto k, as arviz-stats computes them on the
    full log-likelihood; in blocks, each smoothed by arviz-stats' own `psislw`.

    Args:
        idata, model: as in `loo_pit`.
        var_name: `group="posterior_predictive"`: the observed variable (needed where the
            model has several). `group="posterior"`: the posterior variable.
        group: "posterior_predictive" (default) or "posterior", as arviz-stats'.
        log_likelihood_var_name: the observed variable where `group="posterior"` (needed
            where the model has several).
        kind: "mean", "median", "var", "sd", "quantile", "circular_mean", "circular_var" or
            "circular_sd", as arviz-stats'.
        probs: the quantile(s) where `kind="quantile"`.
        postprocessing_backend, postprocessing_vectorize, matmul_precision: as in `loo`.
        memory_budget: bytes for one block, as in `loo`, with the block's predictive draws
            and ArviZ's arrays of them besides (about 7 x 8 bytes a draw of each predictive
            value): blocks are smaller than `loo`'s. Default 1 GiB.
        block_size: observations (along the variable's first axis) per block, instead of
            sizing it from `memory_budget`.
        progressbar: a bar over the observations, moved as each block is done.

    Returns:
        arviz-stats' `(loo_expec, khat)`: DataArrays over the observations.

    Raises:
        ImportError: ArviZ 0.x (no arviz-stats).
        ValueError: before any work: a bad `kind`, `group` or `probs`; no draws of the
            variable; `observed_data` that differs from the model's; and as `loo`.
    """
    _need_arviz_stats("loo_expectations")
    if group not in _GROUPS:
        raise ValueError(f"`group` must be one of {_GROUPS}, got {group!r}.")
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be one of {_KINDS}, got {kind!r}.")
    if kind == "quantile" and probs is None:
        raise ValueError("`probs` must be given where `kind='quantile'`, got None.")
    engine = _engine(
        postprocessing_backend,
        postprocessing_vectorize,
        memory_budget,
        block_size,
        matmul_precision,
    )
    if group == "posterior":
        if var_name is None:
            raise ValueError(
                "`var_name`, the posterior variable, is needed with `group='posterior'`."
            )
        observed_name, drawn = log_likelihood_var_name, var_name
    else:
        observed_name, drawn = var_name, None
    idata, model, blocks, draws = _prepared(
        "loo_expectations", idata, model, observed_name, group, engine, drawn
    )
    bar = _bar("LOO expectations", blocks.name, progressbar)
    return expectation_blocks(blocks, draws, kind, probs, bar)


def loo_metrics(
    idata: Any,
    model: Any = None,
    *,
    kind: str = "rmse",
    var_name: str | None = None,
    round_to: int | str | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> Any:
    """`arviz_stats.loo_metrics` (ArviZ 1.x only): "mae", "mse", "rmse", "acc" or
    "acc_balanced" of the observations against their LOO means (`loo_expectations`,
    blockwise), aggregated by arviz-stats over the O(N) vectors. Options as in
    `loo_expectations`; returns arviz-stats' namedtuple `(mean, se)`."""
    _need_arviz_stats("loo_metrics")
    kinds = ("mae", "rmse", "mse", "acc", "acc_balanced")
    if kind not in kinds:
        raise ValueError(f"`kind` must be one of {kinds}, got {kind!r}.")
    engine = _engine(
        postprocessing_backend,
        postprocessing_vectorize,
        memory_budget,
        block_size,
        matmul_precision,
    )
    idata, model, blocks, draws = _prepared(
        "loo_metrics", idata, model, var_name, "posterior_predictive", engine
    )
    bar = _bar("LOO metrics", blocks.name, progressbar)
    predicted, _ = expectation_blocks(blocks, draws, "mean", None, bar)
    return metrics(_observed(idata, model, blocks.name, draws), predicted, kind, round_to)


def loo_r2(
    idata: Any,
    model: Any = None,
    *,
    var_name: str | None = None,
    n_simulations: int = 4000,
    summary: bool = True,
    point_estimate: str | None = None,
    ci_kind: str | None = None,
    ci_prob: float | None = None,
    circular: bool = False,
    round_to: int | str | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> Any:
    """`arviz_stats.loo_r2` (ArviZ 1.x only): LOO-adjusted R^2 from the LOO means (or
    circular means) of `loo_expectations`, blockwise, and arviz-stats' bootstrap over the
    O(N) vectors (its seed, 42). Options as in `loo_expectations` and arviz-stats';
    returns its namedtuple summary, or the R^2 samples where `summary=False`."""
    _need_arviz_stats("loo_r2")
    engine = _engine(
        postprocessing_backend,
        postprocessing_vectorize,
        memory_budget,
        block_size,
        matmul_precision,
    )
    idata, model, blocks, draws = _prepared(
        "loo_r2", idata, model, var_name, "posterior_predictive", engine
    )
    bar = _bar("LOO R2", blocks.name, progressbar)
    kind = "circular_mean" if circular else "mean"
    predicted, _ = expectation_blocks(blocks, draws, kind, None, bar)
    observed = _observed(idata, model, blocks.name, draws)
    options = (point_estimate, ci_kind, ci_prob, round_to)
    return r2(observed, predicted, n_simulations, summary, circular, options)


def loo_score(
    idata: Any,
    model: Any = None,
    *,
    var_name: str | None = None,
    kind: str = "crps",
    pointwise: bool = False,
    round_to: int | str | None = None,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    memory_budget: int | float | None = None,
    block_size: int | None = None,
    progressbar: bool = False,
    matmul_precision: str | None = "highest",
) -> Any:
    """`arviz_stats.loo_score` (ArviZ 1.x only): the LOO CRPS or SCRPS ("crps", "scrps")
    of each observation, blockwise, and their mean and standard error. Options as in
    `loo_expectations`; returns arviz-stats' namedtuple `(mean, se)`, with `pointwise`
    and `pareto_k` where `pointwise=True`."""
    _need_arviz_stats("loo_score")
    if kind not in ("crps", "scrps"):
        raise ValueError(f"`kind` must be 'crps' or 'scrps', got {kind!r}.")
    engine = _engine(
        postprocessing_backend,
        postprocessing_vectorize,
        memory_budget,
        block_size,
        matmul_precision,
    )
    idata, model, blocks, draws = _prepared(
        "loo_score", idata, model, var_name, "posterior_predictive", engine
    )
    observed = _observed(idata, model, blocks.name, draws)
    bar = _bar("LOO score", blocks.name, progressbar)
    return score_blocks(blocks, draws, observed, kind, pointwise, round_to, bar)


# --- inputs ---------------------------------------------------------------------------------


def _prepared(
    route: str,
    idata: Any,
    model: Any,
    var_name: str | None,
    group: str,
    engine: dict[str, Any],
    drawn: str | None = None,
) -> tuple[Any, Any, LogLikelihoodBlocks, Any]:
    """`route`'s idata and PyMC model (`bambi.as_pymc`), the log-likelihood's blocks and the
    draws (lazy) of `drawn` in `group` (default the observed variable), checked before any
    block is computed. ArviZ's default `reff` is the caller's draws' (`reff_draws`)."""
    import pymc

    given = idata
    idata, model = as_pymc(idata, model, route)
    model = pymc.modelcontext(model)
    name = _observed_name(model, var_name)
    # A posterior variable's draws as the caller has them (what ArviZ reads), not as a Bambi
    # model's PyMC model reads them.
    draws = _draws_of(given if group == "posterior" else idata, group, drawn or name)
    # The values a draw of one observation along the first axis gives: its predictive
    # values; a posterior variable's, broadcast to each observation.
    values = math.prod(draws.shape[3:] if group == "posterior_predictive" else draws.shape[2:])
    blocks = log_likelihood_blocks(
        idata,
        model,
        name,
        reff=None,
        reff_draws=given,
        generation=arviz_generation(),
        bytes_per_row=PREDICTIVE_BYTES * values,
        **engine,
    )
    _check_draws(draws, blocks, group, drawn or name)
    return idata, model, blocks, draws


def _draws_of(idata: Any, group: str, name: str) -> Any:
    """`idata[group][name]`, not read; a clear error where it is missing."""
    from .posthoc import _groups

    groups = _groups(idata)
    if groups is not None and group in groups:
        found = idata[group]
        if name in getattr(found, "data_vars", found):
            return found[name]
    if group == "posterior":
        raise ValueError(f"`idata.posterior` has no variable {name!r}.")
    raise ValueError(
        f"`idata` has no posterior predictive draws of {name!r} (its groups: {groups}): "
        "these functions weigh them. Draw them first, with "
        "`pm.sample_posterior_predictive(idata, model=model, extend_inferencedata=True)` "
        "or `pymc_chunkpost.sample_posterior_predictive(...)`."
    )


def _check_draws(draws: Any, blocks: LogLikelihoodBlocks, group: str, name: str) -> None:
    """The draws' dims are the log-likelihood's, as pymc names both: `(chain, draw)` of the
    posterior's sizes, then (the posterior predictive) the observed variable's."""
    sample = tuple(draws.dims[:2])
    expected = (*SAMPLE_DIMS, *blocks.dims) if group == "posterior_predictive" else SAMPLE_DIMS
    shape = (*blocks.sample_shape, *blocks.shape)[: len(expected)]
    if (
        sample != SAMPLE_DIMS
        or tuple(draws.dims[: len(expected)]) != expected
        or tuple(draws.shape[: len(expected)]) != shape
    ):
        raise ValueError(
            f"`idata.{group}[{name!r}]` has dims {dict(draws.sizes)}; its first must be "
            f"{dict(zip(expected, shape))}, as the log-likelihood of {blocks.name!r} "
            "(its sample dims, then the observed variable's, as pymc names them)."
        )
    if not blocks.dims:
        raise ValueError(f"{blocks.name!r} is a scalar: LOO needs observations.")


def _observed(idata: Any, model: Any, name: str, predictive: Any) -> Any:
    """The observations ArviZ reads, `observed_data[name]`; where there are none, the
    model's (the same, `log_likelihood_blocks` checked), with the predictive draws' dims."""
    import pymc
    import xarray

    from .posthoc import _groups

    if "observed_data" in (_groups(idata) or []) and name in _data_vars(idata["observed_data"]):
        return idata["observed_data"][name]
    values = model_observations(pymc.modelcontext(model), name)
    dims = list(predictive.dims[2:])
    coords = {d: predictive.coords[d].values for d in dims if d in predictive.coords}
    return xarray.DataArray(values, dims=dims, coords=coords, name=name)


def _observed_coords(idata: Any, observed: Any) -> Any:
    """The coords of arviz-stats' `loo_pit`: `observed_data`'s, of the variable's dims."""
    from .posthoc import _groups

    if "observed_data" in (_groups(idata) or []):
        group = idata["observed_data"]
        dataset = group.to_dataset() if hasattr(group, "to_dataset") else group
        return dataset[[observed.name]].coords
    return observed.coords


def _data_vars(group: Any) -> Any:
    return getattr(group, "data_vars", group)


def _bar(what: str, name: str, progressbar: bool) -> str | None:
    return f"{what} of {name!r}" if progressbar else None


def _need_arviz_stats(function: str) -> None:
    if arviz_generation() == 0:
        raise ImportError(
            f"pymc_chunkpost.{function} is arviz-stats' (ArviZ 1.x); ArviZ 0.x has none. "
            "Install ArviZ 1.x (`pip install 'arviz>=1'`), or use `loo` and `loo_pit`."
        )
