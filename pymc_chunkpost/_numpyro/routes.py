"""The numpyro routes: `Predictive` and `log_likelihood`, each one draw's function mapped.

numpyro's `Predictive` runs, for each draw, `trace(seed(substitute(mask(model), draw), key))`
and maps that over the draws with `soft_vmap`: with `parallel=True` one eager `jax.vmap` of
every draw at once (its temporaries grow with the draws), with `parallel=False` (the default)
a `lax.map`, one draw at a time. Here the same per-draw function, fed the key numpyro gives
each draw (`random.split(rng_key, num_samples)`), is traced once and mapped by
the engine through the seam every route shares (`seam.run`): compiled, chunked, within a
memory budget.

What makes the numbers numpyro's (`parallel=False`'s, bit for bit; docs/numpyro.md has
what was compared, and why `parallel=True` cannot be matched as well):
- the per-draw function applies numpyro's own handlers in numpyro's order
  (`trace.predict_draw`, `trace.log_likelihood_draw`), and draw `i` gets numpyro's key `i`;
- each draw is computed by the program of one draw, as in numpyro's loop
  (`trace._one_draw_at_a_time`): in a program of many draws, XLA rewrites arithmetic with
  loop-invariant operands otherwise (`(a * b) * broadcast(c)` is reassociated), so that a
  chunk of draws computed together rounds a last bit apart from numpyro on common models
  (eight schools: a third of the predictions). So the chunk size never changes a number;
  `exact=False` computes a chunk's draws together, vectorised, for speed;
- the model's data enter the program behind `lax.optimization_barrier`. In numpyro's
  `lax.map` they are operands of the loop, computed on at run time by XLA's compiled kernels;
  as constants of our program XLA would fold the data-only operations (`log1p(x ** 2)`) at
  compile time, with other math, a bit apart;
- a guide's draws are computed first and stored, as numpyro's first map does
  (`Predictive._guide_draws`).

What cannot be honoured runs numpyro's own function, with a one-line note through `logging`
(`_fallback`, the seam's `fall_back`, as pymc's routes say theirs): `infer_discrete=True`
(numpyro enumerates discrete sites with funsor, after a prototype trace), a guide with batched
`params` (numpyro vmaps over them), a single draw (numpyro computes it op by op, as its
`parallel=True` computes every draw) and `log_likelihood` without posterior draws. Those hold
their outputs in memory, so `output_memory="disk"` refuses them before any work.

With `output_memory="disk"` (or "auto" with an output path) the outputs go into a Zarr store
(`_zarr_store`) whose arrays have numpyro's shapes, `batch_shape + site shape`, and are
returned as numpyro's dict of them (`store.store_layout`).

This module holds the two routes and their map (`_map`); below it, `arguments` checks what
they are given, `draws` lays the draws out for the engine and the outputs back, `trace`
makes one draw's function for the engine, and `store` the outputs' Zarr layout.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro import handlers
from numpyro.infer.util import Predictive as _NumpyroPredictive
from numpyro.infer.util import log_likelihood as _numpyro_log_likelihood

from .._engine.data.types import Plan
from .._frontend import seam as _route
from .._frontend.seam import Fallback, fall_back
from .._support.compat import splits_key_at
from .._support.messages import warn
from .arguments import (
    Options,
    check_batch_ndims,
    check_callable,
    check_key,
    condition_deterministic_of,
    is_key,
)
from .draws import (
    as_chains_draws,
    batch_shape_of,
    chains_draws,
    place_like,
    predictive_batch,
    split_keys,
    unbatch,
)
from .store import store_layout
from .trace import log_likelihood_draw, predict_draw, trace

__all__ = ["Predictive", "log_likelihood"]


# numpyro maps nothing over a single draw: it calls the per-draw function as it is, op by op
# (`soft_vmap` with one chunk), whose unfused rounding a compiled program cannot reproduce.
_ONE_DRAW = "one draw, which numpyro computes op by op, not compiled"


class Predictive:
    """numpyro's `Predictive`, computed by one compiled, chunked map within a memory budget.

    The constructor and the call are `numpyro.infer.Predictive`'s; the results are the same
    dict of arrays, equal bit for bit to numpyro's with `parallel=False` (its default),
    whatever the strategy and chunk size. numpyro's `parallel=True` computes op by op,
    unfused, and differs from its own `parallel=False` in the last bit on most models
    (docs/numpyro.md).

    Args:
        model: the numpyro model.
        posterior_samples: dict of site name to draws, each of shape `batch_shape + site
            shape` (`mcmc.get_samples()`: `(num_samples, ...)`; with
            `group_by_chain=True` and `batch_ndims=2`: `(chains, draws, ...)`, which may be
            split over devices and stays so).
        guide: a guide whose draws stand in for `posterior_samples`.
        params: values of `param` sites of the model and guide (`svi_result.params`).
        num_samples: draws to predict, when there are no `posterior_samples`.
        return_sites: sites to return; default the sample sites not in `posterior_samples`
            and the deterministic sites.
        infer_discrete: sample discrete sites from the posterior: runs numpyro's own
            `Predictive` (it needs funsor).
        parallel: numpyro's choice between vmap and `lax.map`; the engine's plan replaces
            it. Only numpyro's own function, where it runs (see `infer_discrete`), reads it.
        batch_ndims: leading batch axes of `posterior_samples` (default 1; 0 with a guide).
        condition_deterministic: substitute deterministic sites from `posterior_samples`
            instead of recomputing them.
        exclude_deterministic: numpyro's deprecated `not condition_deterministic`.
        postprocessing_vectorize: the engine's strategy, one of `pymc_chunkpost.STRATEGIES`;
            default "auto", the fastest plan within `memory_budget`. "vmap" maps every draw
            at once (temporaries grow with the draws); "chunked" maps `chunk_size` draws at
            a time in one XLA loop.
        chunk_size: draws per chunk for "chunked"/"auto": smaller uses less memory and
            takes longer. The numbers do not depend on it.
        memory_budget: bytes the outputs and temporaries may take; default the free memory.
            The outputs themselves are the floor.
        output_memory: "device", "host" (outputs streamed to host memory chunk by chunk, as
            numpy arrays: for outputs larger than an accelerator), "disk" or "auto" (on the
            device where the outputs fit, else host memory on an accelerator, else disk
            where an output path is set). "disk": each chunk lands in host memory and a
            writer thread writes it into a Zarr store at `output_path` while the device
            computes the next (host memory holds a few chunks of at most 64 MiB, never the
            outputs; costs the disk's write time, overlapped); the sites are returned as
            read-only `zarr.Array`s of numpyro's shapes, read slice by slice. Needs zarr
            (`pip install "pymc-chunkpost[disk]"`).
        output_path: the store's folder for "disk" (and "auto"), empty or absent unless
            `resume`; default `configure_memory(output_path=...)`'s, read when the
            `Predictive` is made. Its group `posterior_predictive` (`prior_predictive`
            without posterior draws or guide) holds one array per site (a site holding a
            pytree: one per leaf, named `site['key']`), with dims `("draw", ...)` for
            `batch_ndims=1`, `("chain", "draw", ...)` for 2;
            `pymc_chunkpost.open_outputs(path)` and `xarray.open_datatree(path,
            engine="zarr")` reopen it.
        resume: continue the store at `output_path` that a call with the same arguments and
            key did not finish: the chunks written whole are kept, the others computed, the
            same values as a call never interrupted. A complete store is returned as it is.
        progressbar: a tqdm bar over chunks (one host round trip per chunk).
        exact: True (default): each draw is computed by a program of one draw, as numpyro's
            loop computes it: numpyro's numbers bit for bit. A step costs about 2 us per
            draw on a CPU, which shows only where each draw's work is small. False: a
            chunk's draws are computed together, vectorised: up to about 2x faster where
            each draw's work is large, and the last bit of some numbers may differ from
            numpyro's (as numpyro's `parallel=True` does).

    Attributes:
        plan: the engine's `Plan` of the last call (None before one, or after numpyro's own
            ran).

    Raises:
        ValueError: bad arguments, before any work: among them "disk" asked of a call that
            runs numpyro's own function (`infer_discrete`, a guide with batched `params`,
            one draw).
    """

    def __init__(
        self,
        model: Callable,
        posterior_samples: dict[str, Any] | None = None,
        *,
        guide: Callable | None = None,
        params: dict[str, Any] | None = None,
        num_samples: int | None = None,
        return_sites: Sequence[str] | None = None,
        infer_discrete: bool = False,
        parallel: bool = False,
        batch_ndims: int | None = None,
        condition_deterministic: bool | None = None,
        exclude_deterministic: bool | None = None,
        postprocessing_vectorize: str = "auto",
        chunk_size: int | None = None,
        memory_budget: int | float | None = None,
        output_memory: str = "auto",
        progressbar: bool = False,
        exact: bool = True,
        output_path: str | os.PathLike | None = None,
        resume: bool = False,
    ) -> None:
        self.options = Options.of(locals())
        check_callable(model, "model")
        if guide is not None:
            check_callable(guide, "guide")
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"`params` must be a dict or None, got {type(params).__name__}.")
        if return_sites is not None and (
            not isinstance(return_sites, list | tuple | set)
            or not all(isinstance(s, str) for s in return_sites)
        ):
            raise ValueError(
                f"`return_sites` must be a list, tuple or set of site names, got "
                f"{return_sites!r}. Pass None for numpyro's default sites."
            )
        if posterior_samples is None and num_samples is None:
            raise ValueError("Either posterior_samples or num_samples must be specified.")
        if posterior_samples is not None and guide is not None:
            raise ValueError("Only one of guide or posterior_samples can be provided, not both.")
        if num_samples is not None and (
            isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
        ):
            raise ValueError(f"`num_samples` must be a positive int or None, got {num_samples!r}.")
        batch_ndims = batch_ndims if batch_ndims is not None else 1 if guide is None else 0
        check_batch_ndims(batch_ndims)
        self.condition_deterministic = condition_deterministic_of(
            condition_deterministic, exclude_deterministic
        )
        self.posterior_samples = {} if posterior_samples is None else posterior_samples
        self._batch_shape, self.num_samples = predictive_batch(
            self.posterior_samples, batch_ndims, num_samples
        )
        self.model = model
        self.guide = guide
        self.params = {} if params is None else params
        self.infer_discrete = infer_discrete
        self.return_sites = return_sites
        self.parallel = parallel
        self.batch_ndims = batch_ndims
        self.plan: Plan | None = None
        _refuse_disk(self.options, self._fallback_reason())

    @property
    def exclude_deterministic(self) -> bool:
        """numpyro's deprecated alias of `not condition_deterministic`."""
        warn(
            "`exclude_deterministic` is deprecated, use `condition_deterministic` instead.",
            FutureWarning,
        )
        return not self.condition_deterministic

    def __call__(self, rng_key: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Draws of the predictive distribution: numpyro's `Predictive.__call__`.

        Args:
            rng_key: a PRNG key (`jax.random.key(0)` or `jax.random.PRNGKey(0)`).
            *args: the model's arguments.
            **kwargs: the model's keyword arguments.

        Returns:
            Site name to draws of shape `batch_shape + site shape` (`jax.Array`s, numpy
            arrays with the outputs in host memory, or read-only `zarr.Array`s backed by the
            store on disk).

        Raises:
            ValueError: a bad `rng_key`, or a store at `output_path` that cannot take the
                outputs (not empty unless `resume`, read-only, too little room), before any
                work.
        """
        check_key(rng_key)
        self.plan = None
        reason = self._fallback_reason()
        if reason is not None:
            return _fallback(
                "Predictive", reason, lambda: self._numpyro()(rng_key, *args, **kwargs)
            )
        posterior = self.posterior_samples
        if self.guide is not None:
            rng_key, guide_key = random.split(rng_key)  # numpyro's order
            posterior = self._guide_draws(guide_key, args, kwargs)
        model = handlers.substitute(self.model, self.params)
        result, self.plan = _predict(
            model,
            rng_key,
            posterior,
            self._batch_shape,
            self.return_sites,
            self.condition_deterministic,
            args,
            kwargs,
            self.options,
            owner=self.model,
            group="posterior_predictive" if posterior else "prior_predictive",
        )
        return result

    def _fallback_reason(self) -> str | None:
        if self.infer_discrete:
            return "infer_discrete=True: numpyro enumerates discrete sites with funsor"
        if self.guide is not None and self.params and self.batch_ndims != 0:
            return f"a guide with params batched over batch_ndims={self.batch_ndims}"
        if math.prod(self._batch_shape) == 1:
            return _ONE_DRAW
        return None

    def _numpyro(self) -> Any:
        """numpyro's own `Predictive` for the same arguments."""
        extra = {"condition_deterministic": True} if self.condition_deterministic else {}
        return _NumpyroPredictive(
            self.model,
            self.posterior_samples or None,
            guide=self.guide,
            params=self.params,
            num_samples=self.num_samples,
            return_sites=self.return_sites,
            infer_discrete=self.infer_discrete,
            parallel=self.parallel,
            batch_ndims=self.batch_ndims,
            **extra,
        )

    def _guide_draws(self, guide_key: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Every site of the guide but plates, at each draw: numpyro's first map, stored
        before the model reads them, as numpyro stores them between its two maps (in one
        program, XLA could simplify across the two: `log(exp(z))`)."""
        assert self.guide is not None
        guide = handlers.substitute(self.guide, self.params)
        drawn, _ = _predict(
            guide,
            guide_key,
            {},
            self._batch_shape,
            "",  # every site but plates, as numpyro asks of the guide
            self.condition_deterministic,
            args,
            kwargs,
            self.options,
            owner=self.guide,
        )
        return drawn


def log_likelihood(
    model: Callable,
    posterior_samples: dict[str, Any],
    *args: Any,
    parallel: bool = False,
    batch_ndims: int = 1,
    postprocessing_vectorize: str = "auto",
    chunk_size: int | None = None,
    memory_budget: int | float | None = None,
    output_memory: str = "auto",
    progressbar: bool = False,
    exact: bool = True,
    output_path: str | os.PathLike | None = None,
    resume: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """numpyro's `log_likelihood`: the log density of every observed site at every draw.

    `numpyro.infer.util.log_likelihood`'s arguments and results (equal bit for bit to its
    default `parallel=False`, as `Predictive`'s are), computed by one compiled, chunked map.
    Our options are keyword-only and so are not passed to the model: a model keyword of the
    same name cannot be passed through here (as `parallel` and `batch_ndims` cannot through
    numpyro's).

    Args:
        model: the numpyro model.
        posterior_samples: dict of site name to draws of shape `batch_shape + site shape`.
        *args: the model's arguments.
        parallel: numpyro's choice between vmap and `lax.map`; the engine's plan replaces it
            (numpyro's own function reads it where it runs: no posterior draws).
        batch_ndims: leading batch axes of `posterior_samples`: 0 (one draw), 1
            (`(num_samples, ...)`), 2 (`(chains, draws, ...)`), ...
        postprocessing_vectorize: as for `Predictive`.
        chunk_size: as for `Predictive`.
        memory_budget: as for `Predictive`.
        output_memory: as for `Predictive`.
        progressbar: as for `Predictive`.
        exact: as for `Predictive`.
        output_path: as for `Predictive`; the store's group is `log_likelihood`.
        resume: as for `Predictive`.
        **kwargs: the model's keyword arguments.

    Returns:
        Observed site name to log densities of shape `batch_shape + site shape`.

    Raises:
        ValueError: bad arguments, before any work.
    """
    options = Options.of(locals())
    check_callable(model, "model")
    check_batch_ndims(batch_ndims)
    batch_shape = batch_shape_of(posterior_samples, batch_ndims)
    if batch_shape is None or math.prod(batch_shape) == 1:
        reason = "no posterior draws" if batch_shape is None else _ONE_DRAW
        _refuse_disk(options, reason)
        return _fallback(
            "log_likelihood",
            reason,
            lambda: _numpyro_log_likelihood(
                model,
                posterior_samples,
                *args,
                parallel=parallel,
                batch_ndims=batch_ndims,
                **kwargs,
            ),
        )
    leaves, tree = jax.tree_util.tree_flatten(posterior_samples)
    draws = [as_chains_draws(x, batch_shape) for x in leaves]

    def per_draw(*values: Any) -> dict[str, Any]:
        samples = jax.tree_util.tree_unflatten(tree, values)
        return log_likelihood_draw(model, samples, args, kwargs)

    return _map(
        model, per_draw, draws, batch_shape, options, "Log-likelihood", group="log_likelihood"
    )[0]


def _predict(
    model: Callable,
    rng_key: Any,
    posterior: dict[str, Any],
    batch_shape: tuple[int, ...],
    return_sites: Sequence[str] | str | None,
    condition_deterministic: bool,
    args: tuple,
    kwargs: dict,
    options: Options,
    *,
    owner: Callable,
    group: str | None = None,
) -> tuple[dict[str, Any], Plan | None]:
    """numpyro's `_predictive`: `posterior` (or no draws: the prior) through `model`, each
    draw with numpyro's key for it, over `batch_shape`. `owner` keys the cache; `group`:
    the store's group where the outputs may go to disk (None: never on disk)."""
    leaves, tree = jax.tree_util.tree_flatten(posterior)
    draws = [as_chains_draws(x, batch_shape) for x in leaves]
    key_data = jnp.asarray(jax.random.key_data(rng_key) if is_key(rng_key) else rng_key)
    # Each draw's key from the draw's index, in the draw's own program (no split program to
    # compile); where this jax splits otherwise, numpyro's split into a key per draw.
    per_draw_key = splits_key_at()
    lead = chains_draws(batch_shape)
    if per_draw_key:
        keys = np.arange(math.prod(lead), dtype=np.uint32).reshape(lead)
    else:
        keys = split_keys(key_data, lead)
    keys = place_like(keys, draws[0] if draws else None)

    def per_draw(*values: Any) -> dict[str, Any]:
        *draw, key = values
        samples = jax.tree_util.tree_unflatten(tree, draw)
        return predict_draw(
            model, key, samples, return_sites, condition_deterministic, args, kwargs
        )

    seed = key_data if per_draw_key else None
    return _map(owner, per_draw, [*draws, keys], batch_shape, options, "Predictive", seed, group)


def _refuse_disk(options: Options, reason: str | None) -> None:
    """Raise `ValueError` where "disk" is asked of a call that runs numpyro's own function
    (`reason`), which holds its outputs in memory."""
    if reason is not None and options.output_memory == "disk":
        raise ValueError(
            f"`output_memory='disk'` cannot be honoured here: {reason}, so numpyro's own "
            "function runs, with its outputs in memory. Pass another `output_memory`. "
            "Nothing was run."
        )


def _fallback(what: str, reason: str, call: Callable[[], Any]) -> Any:
    """numpyro's own function, for what the engine cannot honour, said at INFO (the seam's
    `fall_back`, as on every route)."""
    return fall_back(what, Fallback(reason, logging.INFO, "numpyro"), call)


# --- the map ---------------------------------------------------------------------------------


def _map(
    owner: Callable,
    per_draw: Callable,
    inputs: list[Any],
    batch_shape: tuple[int, ...],
    options: Options,
    label: str,
    seed: jax.Array | None = None,
    group: str | None = None,
) -> tuple[dict[str, Any], Plan | None]:
    """`per_draw` (one draw's inputs to a dict of outputs) over `inputs`, each of shape
    `(chains, draws, ...)`; the outputs shaped `batch_shape + ...`; `label` names the
    progress bar. With a `seed` (a threefry key's data), the last input is each draw's index
    and `per_draw` takes the draw's key there: key `index` of the seed's split. `group`: the
    store's group, where the options put the outputs on disk (None: never on disk; they are
    then the store's arrays, already of numpyro's shapes)."""
    specs = [
        jax.ShapeDtypeStruct(tuple(x.shape[2:]), jax.dtypes.canonicalize_dtype(x.dtype))
        for x in inputs
    ]
    if seed is not None:
        specs[-1] = jax.ShapeDtypeStruct(seed.shape, seed.dtype)
    traced, small = trace(owner, per_draw, specs, options.exact, seed is not None)
    if not traced.forwarded:  # no output leaves (numpyro's empty dict): nothing to run
        return jax.tree_util.tree_unflatten(traced.out_tree, []), None
    lead = tuple(inputs[0].shape[:2])
    # Each small constant (and the seed the keys derive from) as a value per draw: draws x
    # its bytes (`trace.SMALL_CONSTANT_BYTES`).
    constants = [*small, seed] if traced.key_at is not None else small
    per_draw_small = [
        place_like(np.broadcast_to(np.asarray(c), lead + np.shape(c)), inputs[0]) for c in constants
    ]
    output_memory, store = store_layout(traced, batch_shape, options, group)
    outputs, plan = _route.run(
        traced.jax_fn,
        [inputs[i] for i in traced.used] + per_draw_small,
        options.engine(),
        label,
        output_memory=output_memory,
        output_path=None if store is None else options.output_path,
        store=store,
        one_draw_programs=options.exact,
    )
    if plan.output_memory == "disk":  # the store's arrays, of numpyro's shapes
        leaves = list(outputs)
    else:
        leaves = [unbatch(y, batch_shape, f) for y, f in zip(outputs, traced.forwarded)]
    return jax.tree_util.tree_unflatten(traced.out_tree, leaves), plan
