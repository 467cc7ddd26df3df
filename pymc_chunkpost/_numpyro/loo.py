"""`numpyro_loo` (`pymc_chunkpost.numpyro.loo`): PSIS-LOO-CV of a NumPyro model without the
draws x observations matrix.

The observed site's log-likelihood is computed by the engine in blocks of observations x all
draws, through NumPyro's own `log_likelihood` at each draw; `_stats.loo` smooths each block
and fills ArviZ's result, as for pymc's `loo`. NumPyro's data are the model's arguments,
which cannot be sliced for a block: each block's program computes the site's whole
log-density and keeps the block's observations.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._engine.plan.resources import loo_backend
from .._frontend.seam import Options, evaluate
from .._stats.loo import (
    DEFAULT_BUDGET,
    SAMPLE_DIMS,
    bar_label,
    blocked,
    check_block_size,
    choose_block_size,
    default_reff,
    pointwise_dims,
    result,
)
from .._stats.psis import arviz_generation
from .arguments import check_callable
from .draws import as_chains_draws, batch_shape_of
from .trace import log_likelihood_draw

__all__ = ["numpyro_loo"]


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

    generation = arviz_generation()
    options = Options(None, postprocessing_vectorize, False, {"memory_budget": memory_budget})
    options.check()
    check_block_size(block_size)
    check_callable(model, "model")
    if batch_ndims not in (1, 2):
        raise ValueError(
            f"`batch_ndims` must be 1 or 2 for LOO, got {batch_ndims!r}: LOO needs draws, "
            "of shape (num_samples, ...) or (chains, draws, ...)."
        )
    batch_shape = batch_shape_of(posterior_samples, batch_ndims)
    if batch_shape is None or math.prod(batch_shape) < 2:
        raise ValueError("`posterior_samples` has no draws: LOO needs posterior draws.")
    leaves, tree = jax.tree_util.tree_flatten(posterior_samples)
    draws = [as_chains_draws(x, batch_shape) for x in leaves]
    one = jax.tree_util.tree_unflatten(tree, [np.asarray(d)[0, 0] for d in draws])
    sites = log_likelihood_draw(model, one, args, kwargs)
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
        reff = default_reff(dataset, n_samples, generation)
    budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
    size = choose_block_size(shape, n_samples, budget, block_size)
    # Where every block runs, decided once (as pymc's `loo`): no block moves on its own size.
    backend, _ = loo_backend(None, n_samples * math.prod(shape))
    options = dataclasses.replace(options, backend=backend).with_engine(small_on_host=False)

    def block(start: int) -> np.ndarray:
        def per_draw(*values: Any) -> Any:
            samples = jax.tree_util.tree_unflatten(tree, values)
            site = log_likelihood_draw(model, samples, args, kwargs)[name]
            # The engine maps a function of a list of outputs.
            return [site if not shape or size == shape[0] else site[start : start + size]]

        label = f"Log-likelihood of {name!r} [{start}:{start + size}]"
        values, _ = evaluate(per_draw, draws, options, label)
        return np.asarray(values[0])

    bar = bar_label(name, progressbar)
    elpd_i, pareto_k, lppd_i = blocked(block, shape, size, n_samples, reff, bar)
    # As ArviZ names numpyro's log-likelihood (`from_numpyro`, `from_dict`).
    if generation == 0:
        from arviz import dict_to_dataset
    else:
        dict_to_dataset = functools.partial(
            importlib.import_module("arviz_base").dict_to_dataset, sample_dims=list(SAMPLE_DIMS)
        )
    dims, coords = pointwise_dims(name, (chains, n_draws, *shape), dict_to_dataset)
    return result(elpd_i, pareto_k, lppd_i, n_samples, name, dims, coords, pointwise, 1, generation)
