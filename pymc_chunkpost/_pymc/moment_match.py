"""`loo_moment_match`: arviz-stats' moment matching for the observations whose Pareto k is over
the threshold, from a `loo` result, without the draws x observations matrices.

arviz-stats' `loo_moment_match(data, loo_orig, model=...)` (Paananen et al. 2021) reads the whole
log-likelihood group and the whole `log_weights`, and its functions built from the model
(`mm_from_pymc`) compute every observation's log-likelihood to return one. Only the observations
over the threshold are moment matched, each on its own. So here arviz-stats' own algorithm runs
on those observations alone: their log-likelihood columns and PSIS weights, draws x bad
observations, and two functions of the unconstrained draws compiled by the engine: the model's
log density, and the log-likelihood of chosen observations (the observations are an argument,
so one program serves them all). The results are merged back into the full result as
arviz-stats' own merge does (`elpd`, `se`, `p`, the pointwise values).

ArviZ 1.x only (arviz-stats); ArviZ 0.x's `loo_moment_match` takes a `SamplingWrapper`.
"""

from __future__ import annotations

import copy
import importlib
import math
import warnings
from typing import Any

import numpy as np

from .._frontend.seam import Options, evaluate
from .._stats.loo import SAMPLE_DIMS, pointwise_default
from .._stats.psis import arviz_generation
from .bambi import as_pymc

__all__ = ["loo_moment_match"]


def loo_moment_match(
    idata: Any,
    loo_orig: Any,
    *,
    model: Any = None,
    var_name: str | None = None,
    reff: float | None = None,
    max_iters: int = 30,
    k_threshold: float | None = None,
    split: bool = True,
    cov: bool = True,
    pointwise: bool | None = None,
    postprocessing_backend: str | None = None,
) -> Any:
    """arviz-stats' `loo_moment_match` for a PyMC model, from `pymc_chunkpost.loo`'s result.

    The numbers of `arviz_stats.loo_moment_match(idata_with_log_likelihood, loo_orig,
    model=model)`, without the log-likelihood group or the smoothed `log_weights`: only the
    observations whose Pareto k is over `k_threshold` are computed, each with the model's
    log density and its own log-likelihood, compiled once by the engine.

    Args:
        idata: an `xarray.DataTree` (or `arviz.InferenceData`) whose `posterior` holds every
            free variable; a `log_likelihood` group is not needed (nor read).
        loo_orig: the `ELPDDataLOO` of `pymc_chunkpost.loo(..., pointwise=True)` for the
            same draws (it keeps `p_loo_i`, which arviz-stats' `loo` does not).
        model: the PyMC model, or a Bambi model (as in `loo`); default the one on the
            context stack.
        var_name: the observed variable; needed where the model has several.
        reff, max_iters, k_threshold, split, cov, pointwise: arviz-stats' arguments.
        postprocessing_backend: the device the functions run on (None: the default).

    Returns:
        arviz-stats' `ELPDDataLOO` with `method="loo_moment_match"`: `elpd_i`, `pareto_k`
        (after matching), `influence_pareto_k` (before), `p_loo_i` and `n_eff_i` (the
        latter for the matched observations, NaN elsewhere) where `pointwise`.
        `log_weights` is None (see `log_weights_note`).

    Raises:
        NotImplementedError: on ArviZ 0.x; for models with discrete variables or potentials
            (as arviz-stats).
        ValueError: before any work: a result without pointwise values or `p_loo_i`, or
            one whose observations are not the model's, several observed variables without
            `var_name`.
    """
    idata, model = as_pymc(idata, model, "loo_moment_match")
    import pymc

    if arviz_generation() == 0:
        raise NotImplementedError(
            "`loo_moment_match` runs arviz-stats' algorithm (ArviZ 1.x). On ArviZ 0.x use "
            "`arviz.loo_moment_match` with a `SamplingWrapper`."
        )
    from arviz_stats.loo.loo_moment_match_helper import _get_upars_da, _validate_model
    from arviz_stats.utils import ELPDDataLOO

    from .loo import _observed_name
    from .posthoc import _posterior

    if not isinstance(loo_orig, ELPDDataLOO):
        raise TypeError(f"`loo_orig` must be an ELPDDataLOO, got {type(loo_orig).__name__}.")
    if loo_orig.pareto_k is None or loo_orig.elpd_i is None:
        raise ValueError(
            "Moment matching needs the pointwise LOO results: compute `loo_orig` with "
            "`pointwise=True`."
        )
    if loo_orig.p_loo_i is None:  # arviz-stats' `loo` keeps none: it reads the matrix
        raise ValueError(
            "`loo_orig` has no `p_loo_i` (lppd_i - elpd_i), which moment matching reports "
            "for every observation: pass `pymc_chunkpost.loo(..., pointwise=True)`'s result "
            "(it keeps them), or use `arviz_stats.loo_moment_match` on the full "
            "log-likelihood."
        )
    model = pymc.modelcontext(model)
    _validate_model(model)
    name = _observed_name(model, var_name)
    obs_rv = model[name]
    n_obs = math.prod(loo_orig.pareto_k.shape)
    # The log-likelihood's values: the variable's, less its support's axes (an MvNormal's).
    support = int(getattr(obs_rv.owner.op, "ndim_supp", 0) or 0)
    shape = tuple(int(s) for s in obs_rv.shape.eval())
    model_obs = math.prod(shape[: len(shape) - support])
    if n_obs != model_obs:
        raise ValueError(
            f"`loo_orig` has {n_obs} observations, the model's {name!r} has {model_obs}: pass "
            "the result of `loo` for this model and these draws."
        )
    posterior = _posterior(idata)
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    n_samples = dataset.sizes["chain"] * dataset.sizes["draw"]
    if k_threshold is None:
        k_threshold = min(1 - 1 / np.log10(n_samples), 0.7) if n_samples > 1 else 0.7
    pointwise = pointwise_default(1) if pointwise is None else bool(pointwise)
    ks = np.asarray(loo_orig.pareto_k.values, dtype=float).ravel()
    bad = np.flatnonzero(ks > k_threshold)
    if bad.size == 0:
        warnings.warn(
            "No Pareto k values exceed the threshold. Returning original LOO data.", stacklevel=2
        )
        result: Any = copy.deepcopy(loo_orig)
        result.method = "loo_moment_match"  # as arviz-stats marks its result
        result.influence_pareto_k = loo_orig.pareto_k.copy()
        return result if pointwise else _without_pointwise(result)
    tree = _as_tree(dataset)
    upars, _ = _get_upars_da(tree, model, dict(model.initial_point()), list(model.value_vars))
    functions = _Functions(model, obs_rv, postprocessing_backend)
    sub_tree, sub_orig = _restricted(tree, loo_orig, functions, upars, bad, name, reff)
    matched = importlib.import_module("arviz_stats").loo_moment_match(
        sub_tree,
        sub_orig,
        log_prob_upars_fn=functions.log_prob,
        log_lik_i_upars_fn=lambda u, j: functions.log_lik(u, bad[[int(j)]]),
        upars=upars,
        var_name=name,
        reff=reff,
        max_iters=max_iters,
        k_threshold=k_threshold,
        split=split,
        cov=cov,
        pointwise=True,
    )
    return _merged(loo_orig, matched, bad, pointwise)


class _Functions:
    """The model's log density and chosen observations' log-likelihood, over unconstrained
    draws `(chain, draw, parameter)` laid out as arviz-stats' `upars` (the value variables in
    order, each raveled), as arviz-stats calls them: DataArrays `(chain, draw[, obs])`."""

    def __init__(self, model: Any, obs_rv: Any, backend: str | None):
        import jax.numpy as jnp

        from .graph import jaxify

        values = list(model.value_vars)
        point = model.initial_point()
        self.shapes = [tuple(point[v.name].shape) for v in values]
        logp = jaxify(values, [model.logp(jacobian=True, sum=True)])
        pointwise = jaxify(values, model.logp(vars=[obs_rv], sum=False))
        self._log_prob = lambda *vs: [logp(*vs)[0]]
        self._log_lik = lambda *vs: [jnp.ravel(pointwise(*vs[:-1])[0])[vs[-1]]]
        self.options = Options(backend, "auto", False, {"matmul_precision": "highest"})
        self.options.check()

    def _arrays(self, upars: Any) -> list[np.ndarray]:
        upars = upars.transpose(*SAMPLE_DIMS, ...)
        flat = np.asarray(upars.values, dtype=float)
        lead, arrays, start = flat.shape[:2], [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            arrays.append(flat[..., start : start + size].reshape(*lead, *shape))
            start += size
        return arrays

    def log_prob(self, upars: Any) -> Any:
        (values,), _ = evaluate(self._log_prob, self._arrays(upars), self.options, "Log density")
        return _sample_array(values, upars)

    def log_lik(self, upars: Any, observations: np.ndarray) -> Any:
        arrays = self._arrays(upars)
        lead = arrays[0].shape[:2]
        # The same observations at every draw (zero-strided): an argument, not a constant.
        chosen = np.broadcast_to(observations.astype(np.int32), (*lead, observations.size))
        (values,), _ = evaluate(self._log_lik, [*arrays, chosen], self.options, "Log-likelihood")
        return _sample_array(values[..., 0] if observations.size == 1 else values, upars)


def _sample_array(values: np.ndarray, upars: Any) -> Any:
    import xarray as xr

    dims = list(SAMPLE_DIMS) + [f"__obs_{i}__" for i in range(values.ndim - 2)]
    coords = {d: upars[d] for d in SAMPLE_DIMS}
    return xr.DataArray(values, dims=dims, coords=coords)


def _restricted(
    tree: Any,
    loo_orig: Any,
    functions: _Functions,
    upars: Any,
    bad: np.ndarray,
    name: str,
    reff: float | None,
) -> tuple[Any, Any]:
    """The posterior with the log-likelihood of the `bad` observations alone (one dim, their
    flat indices as coordinates), and `loo_orig` restricted to them, with their smoothed log
    weights (arviz-stats' `psislw`, column by column as its `loo` smooths them)."""
    import xarray as xr
    from arviz_stats.loo.loo_helper import _get_r_eff

    obs = "__bad_observation__"
    log_lik = functions.log_lik(upars, bad).rename({"__obs_0__": obs}).assign_coords({obs: bad})
    sub_tree = xr.DataTree.from_dict(
        {"posterior": tree["posterior"].to_dataset(), "log_likelihood": xr.Dataset({name: log_lik})}
    )
    n_samples = log_lik.sizes["chain"] * log_lik.sizes["draw"]
    r_eff = _get_r_eff(sub_tree, n_samples) if reff is None else reff
    log_weights, _ = log_lik.azstats.psislw(r_eff=r_eff, dim=list(SAMPLE_DIMS))

    def column(values: Any) -> Any:
        flat = np.asarray(values.values).ravel()[bad]
        return xr.DataArray(flat, dims=[obs], coords={obs: bad}, name=name)

    sub = copy.copy(loo_orig)
    sub.elpd_i = column(loo_orig.elpd_i)
    sub.pareto_k = column(loo_orig.pareto_k)
    sub.p_loo_i = None if loo_orig.p_loo_i is None else column(loo_orig.p_loo_i)
    sub.n_data_points = int(bad.size)
    sub.log_weights = log_weights
    return sub_tree, sub


def _merged(loo_orig: Any, matched: Any, bad: np.ndarray, pointwise: bool) -> Any:
    """`loo_orig` with the matched observations' values, summarised as arviz-stats does."""
    from arviz_stats.loo.loo_helper import _warn_pareto_k

    result = copy.deepcopy(loo_orig)
    result.method = "loo_moment_match"
    result.influence_pareto_k = loo_orig.pareto_k.copy()
    shape = loo_orig.elpd_i.shape

    def put(target: Any, values: Any) -> Any:
        flat = np.array(target.values, dtype=float).ravel()
        flat[bad] = np.asarray(values.values).ravel()
        return target.copy(data=flat.reshape(shape))

    nan = loo_orig.elpd_i.copy(data=np.full(shape, np.nan))
    result.elpd_i = put(loo_orig.elpd_i, matched.elpd_i)
    result.pareto_k = put(loo_orig.pareto_k, matched.pareto_k)
    result.p_loo_i = put(loo_orig.p_loo_i, matched.p_loo_i)
    result.n_eff_i = put(nan, matched.n_eff_i) if matched.n_eff_i is not None else None
    elpd_i = result.elpd_i.values
    elpd_raw = loo_orig.elpd + loo_orig.p  # the sum of lppd_i, which matching leaves
    result.elpd = float(np.nansum(elpd_i))
    result.se = float(np.sqrt(result.n_data_points * np.nanvar(elpd_i, ddof=1)))
    ks = result.pareto_k.values
    result.warning, result.good_k = _warn_pareto_k(
        ks[~np.isnan(ks)], result.n_samples, suppress=True
    )
    result.p = elpd_raw - result.elpd
    result.log_weights = None
    result.log_weights_note = (
        "pymc_chunkpost.loo_moment_match leaves out the smoothed log_weights (draws x "
        "observations)."
    )
    return result if pointwise else _without_pointwise(result)


def _without_pointwise(result: Any) -> Any:
    for field in ("elpd_i", "pareto_k", "influence_pareto_k", "p_loo_i", "n_eff_i"):
        setattr(result, field, None)
    return result


def _as_tree(dataset: Any) -> Any:
    import xarray as xr

    return xr.DataTree.from_dict({"posterior": dataset})
