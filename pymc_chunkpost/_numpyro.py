"""The numpyro routes: `Predictive` and `log_likelihood`, each one draw's function mapped.

numpyro's `Predictive` runs, for each draw, `trace(seed(substitute(mask(model), draw), key))`
and maps that over the draws with `soft_vmap`: with `parallel=True` one eager `jax.vmap` of
every draw at once (its temporaries grow with the draws), with `parallel=False` (the default)
a `lax.map`, one draw at a time. Here the same per-draw function, fed the key numpyro gives
each draw (`random.split(rng_key, num_samples)`), is traced once and mapped by
`_postprocess.run`: compiled, chunked, within a memory budget.

What makes the numbers numpyro's (`parallel=False`'s, bit for bit; docs/numpyro.md has
what was compared, and why `parallel=True` cannot be matched as well):
- the per-draw function applies numpyro's own handlers in numpyro's order (`_predict_draw`,
  `_log_likelihood_draw`), and draw `i` gets numpyro's key `i`;
- each draw is computed by the program of one draw, as in numpyro's loop
  (`_one_draw_at_a_time`): in a program of many draws, XLA rewrites arithmetic with
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
(`_fallback`): `infer_discrete=True` (numpyro enumerates discrete sites with funsor, after a
prototype trace), a guide with batched `params` (numpyro vmaps over them), a single draw
(numpyro computes it op by op, as its `parallel=True` computes every draw) and
`log_likelihood` without posterior draws. Those hold their outputs in memory, so
`output_memory="disk"` refuses them before any work.

With `output_memory="disk"` (or "auto" with an output path) the outputs go into a Zarr store
(`_disk_output`) whose arrays have numpyro's shapes, `batch_shape + site shape`, and are
returned as numpyro's dict of them (`_store_layout`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.extend.core import Literal
from jax.sharding import NamedSharding, PartitionSpec
from numpyro import handlers
from numpyro.infer.util import Predictive as _NumpyroPredictive
from numpyro.infer.util import log_likelihood as _numpyro_log_likelihood

from . import _postprocess, _route
from ._cache import FunctionCache
from ._compat import split_key_at, splits_key_at
from ._disk_output import sample_dims
from ._messages import warn
from ._options import check_options
from ._problem import host_copy
from ._types import Plan

__all__ = ["Predictive", "log_likelihood"]

logger = logging.getLogger(__name__)

# numpyro maps nothing over a single draw: it calls the per-draw function as it is, op by op
# (`soft_vmap` with one chunk), whose unfused rounding a compiled program cannot reproduce.
_ONE_DRAW = "one draw, which numpyro computes op by op, not compiled"

# Per model (weakly keyed: a model that is gone takes its entries, and their compiled
# executables, with it), the engine's function for each traced per-draw program and data.
_FUNCTIONS = FunctionCache(per_function=8)
# Content digests of the jax arrays among a program's constants, by identity while the array
# lives (jax arrays are immutable), so that a warm call does not hash the model's data again.
_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}


@dataclasses.dataclass(frozen=True)
class _Options:
    """Our options, in place of numpyro's `parallel`; checked when made."""

    postprocessing_vectorize: str = "auto"
    chunk_size: int | None = None
    memory_budget: int | float | None = None
    output_memory: str = "auto"
    progressbar: bool = False
    exact: bool = True
    output_path: str | os.PathLike | None = None
    resume: bool = False

    @classmethod
    def of(cls, arguments: dict[str, Any]) -> _Options:
        """The options among a call's `arguments` (its `locals()`), checked."""
        return cls(**{field.name: arguments[field.name] for field in dataclasses.fields(cls)})

    def __post_init__(self) -> None:
        # `configure_memory`'s default path where none is given, resolved once, here, as
        # every route resolves it.
        object.__setattr__(self, "output_path", _route.output_path(self.output_path))
        check_options(
            self.postprocessing_vectorize,
            self.chunk_size,
            None,
            self.memory_budget,
            self.output_memory,
            output_path=self.output_path,
            resume=self.resume,
        )
        if not isinstance(self.progressbar, bool):
            raise ValueError(f"`progressbar` must be True or False, got {self.progressbar!r}.")
        if not isinstance(self.exact, bool):
            raise ValueError(
                f"`exact` must be True or False, got {self.exact!r}. Pass False to compute a "
                "chunk's draws together, vectorised (faster, last bits may differ)."
            )


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
        self.options = _Options.of(locals())
        _check_callable(model, "model")
        if guide is not None:
            _check_callable(guide, "guide")
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
        _check_batch_ndims(batch_ndims)
        self.condition_deterministic = _condition_deterministic(
            condition_deterministic, exclude_deterministic
        )
        self.posterior_samples = {} if posterior_samples is None else posterior_samples
        self._batch_shape, self.num_samples = _predictive_batch(
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
        _check_key(rng_key)
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
    options = _Options.of(locals())
    _check_callable(model, "model")
    _check_batch_ndims(batch_ndims)
    batch_shape = _batch_shape(posterior_samples, batch_ndims)
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
    draws = [_as_chains_draws(x, batch_shape) for x in leaves]

    def per_draw(*values: Any) -> dict[str, Any]:
        samples = jax.tree_util.tree_unflatten(tree, values)
        return _log_likelihood_draw(model, samples, args, kwargs)

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
    options: _Options,
    *,
    owner: Callable,
    group: str | None = None,
) -> tuple[dict[str, Any], Plan | None]:
    """numpyro's `_predictive`: `posterior` (or no draws: the prior) through `model`, each
    draw with numpyro's key for it, over `batch_shape`. `owner` keys the cache; `group`:
    the store's group where the outputs may go to disk (None: never on disk)."""
    leaves, tree = jax.tree_util.tree_flatten(posterior)
    draws = [_as_chains_draws(x, batch_shape) for x in leaves]
    key_data = jnp.asarray(jax.random.key_data(rng_key) if _is_key(rng_key) else rng_key)
    # Each draw's key from the draw's index, in the draw's own program (no split program to
    # compile); where this jax splits otherwise, numpyro's split into a key per draw.
    per_draw_key = splits_key_at()
    lead = _chains_draws(batch_shape)
    if per_draw_key:
        keys = np.arange(math.prod(lead), dtype=np.uint32).reshape(lead)
    else:
        keys = _split_keys(key_data, lead)
    keys = _place_like(keys, draws[0] if draws else None)

    def per_draw(*values: Any) -> dict[str, Any]:
        *draw, key = values
        samples = jax.tree_util.tree_unflatten(tree, draw)
        return _predict_draw(
            model, key, samples, return_sites, condition_deterministic, args, kwargs
        )

    seed = key_data if per_draw_key else None
    return _map(owner, per_draw, [*draws, keys], batch_shape, options, "Predictive", seed, group)


# --- one draw, as numpyro computes it ------------------------------------------------------


def _predict_draw(
    model: Callable,
    key: jax.Array,
    samples: dict[str, Any],
    return_sites: Sequence[str] | str | None,
    condition_deterministic: bool,
    args: tuple,
    kwargs: dict,
) -> dict[str, Any]:
    """One draw of numpyro's `_predictive` (its `single_prediction`, without enumeration):
    the model masked, given the draw's `samples`, seeded with the draw's `key`."""
    masked = handlers.mask(model, mask=False)  # numpyro's mask(model, mask=infer_discrete)
    if condition_deterministic:
        substituted = handlers.substitute(masked, samples)
    else:

        def without_deterministic(msg: dict) -> Any:
            return samples.get(msg["name"]) if msg["type"] != "deterministic" else None

        substituted = handlers.substitute(masked, substitute_fn=without_deterministic)
    model_trace = handlers.trace(handlers.seed(substituted, key)).get_trace(*args, **kwargs)
    if return_sites is None:
        sites = {
            name
            for name, site in model_trace.items()
            if (site["type"] == "sample" and name not in samples) or site["type"] == "deterministic"
        }
    elif return_sites == "":
        sites = {name for name, site in model_trace.items() if site["type"] != "plate"}
    else:
        sites = set(return_sites)
    return {name: site["value"] for name, site in model_trace.items() if name in sites}


def _log_likelihood_draw(
    model: Callable, samples: dict[str, Any], args: tuple, kwargs: dict
) -> dict[str, Any]:
    """One draw of numpyro's `log_likelihood` (its `single_loglik`)."""
    model_trace = handlers.trace(handlers.substitute(model, samples)).get_trace(*args, **kwargs)
    return {
        name: site["fn"].log_prob(site["value"])
        for name, site in model_trace.items()
        if site["type"] == "sample" and site["is_observed"]
    }


# --- the draws: layout, keys, checks -------------------------------------------------------


@functools.partial(jax.jit, static_argnums=1)
def _split_keys(key_data: jax.Array, lead: tuple[int, int]) -> jax.Array:
    """Each draw's key data in the engine's `(chains, draws, 2)` layout, exactly as numpyro's
    `_predictive` derives them: one split into a key per draw, in the draws' order."""
    keys = random.split(key_data, math.prod(lead))
    return keys.reshape(lead + keys.shape[1:])


def _chains_draws(batch_shape: tuple[int, ...]) -> tuple[int, int]:
    """The engine's `(chains, draws)` for a batch shape: its last axis is the draws."""
    if not batch_shape:
        return 1, 1
    return math.prod(batch_shape[:-1]), batch_shape[-1]


def _as_chains_draws(x: Any, batch_shape: tuple[int, ...]) -> Any:
    """`x` with its batch axes as the engine's `(chains, draws)`.

    Two batch axes: `x` itself (a sharded array stays where it is). Otherwise a reshaped
    view: free for numpy arrays and for arrays on one CPU device (a numpy view of the same
    memory, which the engine places without a copy); elsewhere a reshaped copy of this input.
    """
    shape = _chains_draws(batch_shape) + tuple(x.shape[len(batch_shape) :])
    if tuple(x.shape) == shape:
        return x
    if isinstance(x, jax.Array) and (_is_key(x) or _device_of(x) is None):
        return jnp.reshape(x, shape)
    return np.reshape(np.asarray(x), shape)


def _device_of(x: jax.Array) -> Any:
    """The one CPU device that holds `x`, or None."""
    devices = x.devices()
    device = next(iter(devices))
    return device if len(devices) == 1 and device.platform == "cpu" else None


def _place_like(x: Any, reference: Any) -> Any:
    """`x`, of shape `(chains, draws, ...)`, where the `reference` draws are: on the mesh that
    splits them on their chain/draw axes, or on their device (the engine then runs there
    without moving anything). Beside numpy draws, `x` stays as it is."""
    if not isinstance(reference, jax.Array):
        return x
    sharding = reference.sharding
    if isinstance(sharding, NamedSharding) and len(sharding.device_set) > 1:
        spec = (tuple(sharding.spec) + (None, None))[:2]
        return jax.device_put(x, NamedSharding(sharding.mesh, PartitionSpec(*spec)))
    if len(sharding.device_set) == 1:
        return jax.device_put(x, next(iter(sharding.device_set)))
    return x


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def _check_key(rng_key: Any) -> None:
    try:
        if jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
            if rng_key.shape == ():
                return
        elif tuple(rng_key.shape) == (2,) and rng_key.dtype == np.uint32:
            return
    except AttributeError:
        pass
    raise ValueError(
        f"`rng_key` must be one PRNG key, such as `jax.random.key(0)` or "
        f"`jax.random.PRNGKey(0)`, got {_describe(rng_key)}."
    )


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"a {type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    return repr(x)


def _check_callable(fn: Any, name: str) -> None:
    if not callable(fn):
        raise ValueError(f"`{name}` must be a callable numpyro model, got {type(fn).__name__}.")


def _check_batch_ndims(batch_ndims: Any) -> None:
    if isinstance(batch_ndims, bool) or not isinstance(batch_ndims, int) or batch_ndims < 0:
        raise ValueError(
            f"`batch_ndims` must be a non-negative int, got {batch_ndims!r}. Pass 1 for draws "
            "of shape (num_samples, ...), 2 for (chains, draws, ...)."
        )


def _condition_deterministic(condition: bool | None, exclude: bool | None) -> bool:
    """numpyro's reading of `condition_deterministic` and its deprecated inverse."""
    if exclude is None:
        return bool(condition)
    if condition is not None:
        raise ValueError(
            "Only one of `condition_deterministic` or the deprecated `exclude_deterministic` "
            "can be provided, not both."
        )
    warn(
        "`exclude_deterministic` is deprecated, use `condition_deterministic` instead "
        "(`exclude_deterministic=True` corresponds to `condition_deterministic=False`).",
        FutureWarning,
    )
    return not exclude


def _batch_shape(posterior_samples: Any, batch_ndims: int) -> tuple[int, ...] | None:
    """The draws' common batch shape, None without draws. Checks every draw array: each
    site's value is a pytree (a `param` site holding a dict, a flow guide's `$params`), and
    each of its leaves has the batch axes.

    Raises:
        ValueError: not a dict of pytrees of arrays, too few axes, batch shapes that differ,
            no draws.
    """
    if not isinstance(posterior_samples, dict):
        raise ValueError(
            "`posterior_samples` must be a dict of site name to draws, got "
            f"{type(posterior_samples).__name__}."
        )
    shape: tuple[int, ...] | None = None
    first = None
    leaves = (
        (name, f"`posterior_samples[{name!r}]{jax.tree_util.keystr(path)}`", value)
        for name, site in posterior_samples.items()
        for path, value in jax.tree_util.tree_flatten_with_path(site)[0]
    )
    for name, where, value in leaves:
        if not isinstance(name, str):
            raise ValueError(f"{where}: site names must be strings.")
        if isinstance(value, jax.Array) and value.is_deleted():
            raise ValueError(f"{where} has been deleted (donated before?).")
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ValueError(f"{where} must be an array, got {type(value).__name__}.")
        if len(value.shape) < batch_ndims:
            raise ValueError(
                f"{where} has shape {tuple(value.shape)}: fewer axes than "
                f"batch_ndims={batch_ndims}."
            )
        batch = tuple(value.shape[:batch_ndims])
        if shape is not None and batch != shape:
            raise ValueError(
                f"Batch shapes at {where} and {first} should be the same, but got "
                f"{batch} and {shape} (`posterior_samples` with batch_ndims={batch_ndims})."
            )
        shape, first = batch, where
    if shape is not None and 0 in shape:
        raise ValueError(f"`posterior_samples` has no draws: batch shape {shape}.")
    return shape


def _predictive_batch(
    posterior_samples: dict[str, Any], batch_ndims: int, num_samples: int | None
) -> tuple[tuple[int, ...], int]:
    """numpyro's `Predictive` batch shape and `num_samples` (its constructor's rule)."""
    shape = _batch_shape(posterior_samples, batch_ndims)
    if shape is not None:
        size = int(np.prod(shape))
        if num_samples is not None and num_samples != size:
            warn(
                f"Sample's batch dimension size {size} is different from the provided "
                f"{num_samples} num_samples argument. Defaulting to {size}.",
                UserWarning,
            )
        return shape, size
    if num_samples is None:
        raise ValueError("No sample sites in posterior samples to infer `num_samples`.")
    return (1,) * (batch_ndims - 1) + (num_samples,), num_samples


def _refuse_disk(options: _Options, reason: str | None) -> None:
    """Raise `ValueError` where "disk" is asked of a call that runs numpyro's own function
    (`reason`), which holds its outputs in memory."""
    if reason is not None and options.output_memory == "disk":
        raise ValueError(
            f"`output_memory='disk'` cannot be honoured here: {reason}, so numpyro's own "
            "function runs, with its outputs in memory. Pass another `output_memory`. "
            "Nothing was run."
        )


def _fallback(what: str, reason: str, call: Callable[[], Any]) -> Any:
    """numpyro's own function, for what the engine cannot honour, with a one-line note."""
    logger.info("pymc_chunkpost: %s runs numpyro's own (%s).", what, reason)
    return call()


# --- the map ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Traced:
    """One draw's program, ready for the engine.

    Attributes:
        jax_fn: the engine's per-draw function, of the inputs at `used`.
        out_tree: the structure of one draw's dict of results; `jax_fn`'s outputs are its
            leaves, in jax's order (a site's value may be a pytree: a `param` site holding
            a dict, a flow guide's `$params`).
        used: indices of the inputs the program reads (at least one: the engine maps inputs).
        forwarded: per output leaf, whether it is an input passed through.
        out_specs: per output leaf, one draw's shape and dtype.
        key_at: where `jax_fn` takes each draw's index, from which it derives the draw's key
            (its last input is then the seed's key data); None: no key to derive.
    """

    jax_fn: Callable
    out_tree: Any
    used: tuple[int, ...]
    forwarded: tuple[bool, ...]
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    key_at: int | None = None


def _map(
    owner: Callable,
    per_draw: Callable,
    inputs: list[Any],
    batch_shape: tuple[int, ...],
    options: _Options,
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
    traced, small = _trace(owner, per_draw, specs, options.exact, seed is not None)
    if not traced.forwarded:  # no output leaves (numpyro's empty dict): nothing to run
        return jax.tree_util.tree_unflatten(traced.out_tree, []), None
    lead = tuple(inputs[0].shape[:2])
    # Each small constant (and the seed the keys derive from) as a value per draw: draws x
    # its bytes (`SMALL_CONSTANT_BYTES`).
    constants = [*small, seed] if traced.key_at is not None else small
    per_draw_small = [
        _place_like(np.broadcast_to(np.asarray(c), lead + np.shape(c)), inputs[0])
        for c in constants
    ]
    output_memory, store = _store_layout(traced, batch_shape, options, group)
    outputs, plan = _postprocess.run(
        traced.jax_fn,
        [inputs[i] for i in traced.used] + per_draw_small,
        None,
        options.postprocessing_vectorize,
        False,
        chunk_size=options.chunk_size,
        memory_budget=options.memory_budget,
        progressbar=options.progressbar,
        output_memory=output_memory,
        output_path=None if store is None else options.output_path,
        resume=options.resume,
        store=store,
        progress_label=label,
        one_draw_programs=options.exact,
    )
    if plan.output_memory == "disk":  # the store's arrays, of numpyro's shapes
        leaves = list(outputs)
    else:
        leaves = [_unbatch(y, batch_shape, f) for y, f in zip(outputs, traced.forwarded)]
    return jax.tree_util.tree_unflatten(traced.out_tree, leaves), plan


def _store_layout(
    traced: _Traced, batch_shape: tuple[int, ...], options: _Options, group: str | None
) -> tuple[str, _postprocess.StoreLayout | None]:
    """The engine's `output_memory`, and the store's layout where the outputs may go to disk
    ("disk", or "auto" with an output path, of a call with a `group`): in `group`, each site
    an array of numpyro's shape `batch_shape + site shape`, named as the site (a leaf of a
    site's pytree: `site['key']`, `jax.tree_util.keystr`'s path), its sample dims named by
    `_disk_output.sample_dims` (`draw`; `chain`, `draw`; ...).

    Raises:
        ValueError: "disk" asked of outputs that a store cannot hold (PRNG keys, a name
            that Zarr reads as a path or that is a sample dim's), before any work.
    """
    where = options.output_memory
    if group is None or options.output_path is None or where not in ("auto", "disk"):
        return ("auto" if where == "disk" else where), None  # a guide's draws: in memory
    leaves = jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(traced.out_tree, range(traced.out_tree.num_leaves))
    )[0]
    names = [_site_name(path) for path, _ in leaves]
    reason = next(
        (
            why
            for name, spec in zip(names, traced.out_specs)
            if (why := _unstorable(name, spec, len(batch_shape))) is not None
        ),
        None,
    )
    if reason is None:
        return where, _postprocess.StoreLayout(names, group, sample_shape=batch_shape)
    if where == "auto":  # "auto" keeps what a store cannot hold in memory
        return where, None
    raise ValueError(
        f"`output_memory='disk'` cannot store these sites: {reason}. Leave them out of "
        "`return_sites`, or pass another `output_memory`. Nothing was run."
    )


def _site_name(path: tuple) -> str:
    """A site's name in the store: its own, and a pytree leaf's path after it."""
    first, *rest = path
    return str(getattr(first, "key", first)) + jax.tree_util.keystr(tuple(rest))


def _unstorable(name: str, spec: Any, n_sample_dims: int) -> str | None:
    """Why the store cannot hold the output `name` of one draw's `spec`, or None."""
    if _is_key(spec):
        return f"{name!r} holds PRNG keys, which a Zarr array cannot hold"
    if "/" in name or name.startswith("__") or name in (".", ".."):
        return f"Zarr would read the name {name!r} as a path (or reserve it)"
    if name in sample_dims(n_sample_dims):
        return f"{name!r} is the name of a sample dim's coordinate in the store"
    return None


def _trace(
    owner: Callable,
    per_draw: Callable,
    specs: list[jax.ShapeDtypeStruct],
    exact: bool,
    keyed: bool = False,
) -> tuple[_Traced, list[Any]]:
    """Trace one draw of `per_draw`: the engine's function for it (the one made for the same
    program and data before, so that the engine's compiled executables are reused), and the
    program's small constants, which that function takes as per-draw inputs. `keyed`: the
    last input is a draw's key, which the engine's function derives from the draw's index
    (`_keys_from_indices`).

    In numpyro's `lax.map` the model's data are operands of the loop: parameters of the
    compiled program. Here a constant of up to `SMALL_CONSTANT_BYTES` (a distribution's
    scale, eight schools' `sigma`, a guide's scalar params) is a per-draw input, a parameter
    too; a larger one (a design matrix) stays a constant of the engine's function, behind
    an optimization barrier (`_engine_function`), and in the cache key by content. The
    engine passes it to its programs as an argument (`_program`); the exact loop takes it as
    an input of the loop (`_exact_engine_function`), as numpyro's does. Folded as a
    constant, XLA would sink what reads only it into the loop, where its rewrites of
    `(a * b) * broadcast(c)` round apart from numpyro's (docs/numpyro.md).
    """
    closed, out_shape = jax.make_jaxpr(per_draw, return_shape=True)(*specs)
    out_tree = jax.tree_util.tree_structure(out_shape)
    jaxpr = closed.jaxpr
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, Literal)}
    read |= {id(v) for v in jaxpr.outvars if not isinstance(v, Literal)}
    used = tuple(i for i, v in enumerate(jaxpr.invars) if id(v) in read) or (0,)
    inputs = {id(v) for v in jaxpr.invars}
    forwarded = tuple(not isinstance(v, Literal) and id(v) in inputs for v in jaxpr.outvars)
    consts = list(closed.consts)
    small = tuple(i for i, c in enumerate(consts) if _is_small(c))
    data = tuple(_fingerprint(c) for i, c in enumerate(consts) if i not in small)
    key_at = used.index(len(specs) - 1) if keyed and len(specs) - 1 in used else None
    key = (str(jaxpr), out_tree, used, small, data, exact, key_at)
    owner = getattr(owner, "__func__", owner)  # a bound method: its function lives on
    traced = _FUNCTIONS.get(owner, key)
    if traced is None:
        if exact:
            jax_fn = _exact_engine_function(closed, used, small)
        else:
            jax_fn = _engine_function(closed, used, small)
        if key_at is not None:
            jax_fn = _keys_from_indices(jax_fn, key_at)
        out_specs = tuple(jax.tree_util.tree_leaves(out_shape))
        traced = _Traced(jax_fn, out_tree, used, forwarded, out_specs, key_at)
        _FUNCTIONS.put(owner, key, traced)
    return traced, [consts[i] for i in small]


#: Constants of at most this many bytes enter as per-draw inputs (`_trace`): each costs
#: draws x its bytes (4,000 draws x 256 B = 1 MiB at most), a small share of any output.
SMALL_CONSTANT_BYTES = 256


def _is_small(value: Any) -> bool:
    return not _is_key(value) and math.prod(np.shape(value)) * value.dtype.itemsize <= (
        SMALL_CONSTANT_BYTES
    )


def _barred(closed: Any, small: tuple[int, ...]) -> list[int]:
    """The program's constants that are the model's data: neither small nor keys."""
    return [i for i, c in enumerate(closed.consts) if i not in small and not _is_key(c)]


def _engine_function(
    closed: Any, used: tuple[int, ...], small: tuple[int, ...], data_inputs: bool = False
) -> Callable:
    """The traced program as the engine's per-draw function of the inputs at `used`, then
    of one per-draw input for each constant at `small`; with `data_inputs`, then of the
    model's data (`_barred`), as inputs too.

    Invariant: the program's other constants (the model's data) reach XLA behind an
    optimization barrier, so that no operation that reads only them is folded at compile
    time, with other math than the compiled kernels' (the module docstring). Unused inputs
    are zeros that XLA removes. The function holds no small constant: they come each call.
    """
    jaxpr = closed.jaxpr
    held = [None if i in small else c for i, c in enumerate(closed.consts)]
    barred = _barred(closed, small)
    avals = [v.aval for v in jaxpr.invars]

    def jax_fn(*inputs: Any) -> list[Any]:
        consts = list(held)
        data = [held[i] for i in barred]
        if data_inputs:
            inputs, data = (
                inputs[: len(inputs) - len(barred)],
                list(inputs[len(inputs) - len(barred) :]),
            )
        if barred:
            for i, c in zip(barred, lax.optimization_barrier(data)):
                consts[i] = c
        for i, x in zip(small, inputs[len(used) :]):
            consts[i] = x
        args: list[Any] = [jnp.zeros(a.shape, a.dtype) for a in avals]
        for i, x in zip(used, inputs):
            args[i] = x
        return jax.core.eval_jaxpr(jaxpr, consts, *args)

    return jax_fn


def _exact_engine_function(closed: Any, used: tuple[int, ...], small: tuple[int, ...]) -> Callable:
    """`_engine_function`, each draw computed by the program of one draw
    (`_one_draw_at_a_time`).

    Invariant: the model's data are inputs of the one-draw loop, the same at every draw, and
    constants of the function returned alone, which the engine passes to its programs as
    arguments: a batching rule that closed over them would keep them in the compiled loop,
    data-sized constants of a program that other data could not share.
    """
    barred = _barred(closed, small)
    data = [closed.consts[i] for i in barred]
    loop = _one_draw_at_a_time(
        _engine_function(closed, used, small, data_inputs=True), len(small) + len(barred)
    )

    def jax_fn(*inputs: Any) -> list[Any]:
        return loop(*inputs, *data)

    return jax_fn


def _one_draw_at_a_time(fn: Callable, n_invariant: int = 0) -> Callable:
    """`fn`, which `jax.vmap` maps as `lax.map`: one draw per step, however many are mapped.
    Its last `n_invariant` inputs are the same at every draw (the small constants, mapped
    as per-draw inputs, and the model's data): the loop takes draw 0's as an operand of its
    own.

    Invariant: every draw is computed by the program of one draw, as in numpyro's loop, so
    that XLA's shape-dependent rewrites (in a batch, a loop-invariant operand is a
    broadcast, and XLA reassociates `(a * b) * broadcast(c)`) and its fused multiply-adds
    are those of numpyro's program: the numbers do not depend on how many draws a chunk
    maps (docs/numpyro.md). Under nested maps each level is a loop. The small constants
    reach the loop as numpyro's reach its loop: operands of the loop, not sliced per step
    (sliced, XLA compiled the 5,000-row `deterministic_sites` loop 2.5x slower).
    """

    @jax.custom_batching.custom_vmap
    def per_draw(*inputs: Any) -> list[Any]:
        return fn(*inputs)

    @per_draw.def_vmap
    def rule(axis_size: int, in_batched: list[bool], *inputs: Any) -> tuple[list, list]:
        invariant = range(len(inputs) - n_invariant, len(inputs))
        inputs = tuple(
            x[0] if i in invariant and in_batched[i] else x for i, x in enumerate(inputs)
        )
        in_batched = [b and i not in invariant for i, b in enumerate(in_batched)]
        mapped = tuple(x for x, batched in zip(inputs, in_batched) if batched)

        def one(values: tuple) -> list[Any]:
            it = iter(values)
            return per_draw(*[next(it) if b else x for x, b in zip(inputs, in_batched)])

        if not mapped:  # nothing varies over the draws: one draw's outputs, broadcast
            outputs = per_draw(*inputs)
            outputs = [jnp.broadcast_to(y, (axis_size, *jnp.shape(y))) for y in outputs]
        elif axis_size == 1:  # one draw (one chain of many draws): no loop to compile
            outputs = [y[None] for y in one(tuple(x[0] for x in mapped))]
        else:
            outputs = lax.map(one, mapped)
        return outputs, [True] * len(outputs)

    return per_draw


def _keys_from_indices(fn: Callable, at: int) -> Callable:
    """`fn`, whose input `at` is a draw's key data, as a function of the draw's index there
    and of the seed's key data as one more, last input: the draw's key is key `index` of the
    seed's split (`split_key_at`).

    Invariant: the keys are hashed outside `fn`, so that under the engine's map a chunk's keys
    hash together, vectorised, before `fn`'s loop of one-draw programs takes them, as
    numpyro's loop takes the keys of its split. Integer arithmetic: the same bits in a batch.
    """

    def keyed(*inputs: Any) -> list[Any]:
        *inputs_, seed = inputs
        inputs_[at] = split_key_at(seed, inputs_[at])
        return fn(*inputs_)

    return keyed


def _fingerprint(value: Any) -> tuple:
    """Shape, dtype and content digest of a constant: equal for equal data."""
    shape, dtype = tuple(np.shape(value)), str(value.dtype)
    if not isinstance(value, jax.Array):  # numpy data may change in place: hashed each time
        return shape, dtype, _digest(value)
    memo = _DIGESTS.get(id(value))
    if memo is not None and memo[0]() is value:
        return shape, dtype, memo[1]
    digest = _digest(value)
    key = id(value)
    _DIGESTS[key] = (weakref.ref(value, lambda _: _DIGESTS.pop(key, None)), digest)
    return shape, dtype, digest


def _digest(value: Any) -> str:
    data = np.ascontiguousarray(host_copy(value))  # a random key's data; no copy kept on it
    return hashlib.blake2b(data.reshape(-1).view(np.uint8).data, digest_size=16).hexdigest()


@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
def _reshape_donated(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return x.reshape(shape)


def _unbatch(y: Any, batch_shape: tuple[int, ...], forwarded: bool) -> Any:
    """An output of shape `(chains, draws, ...)` as `batch_shape + ...`, without a copy: a
    numpy view; on one CPU device, an array placed from a numpy view of the same memory (no
    program to compile); elsewhere a reshape into the donated output's own buffer. A
    passed-through input is not ours to donate: it is reshaped into a new array."""
    shape = tuple(batch_shape) + tuple(y.shape[2:])
    if tuple(y.shape) == shape:
        return y
    if isinstance(y, np.ndarray):
        return y.reshape(shape)
    device = None if _is_key(y) else _device_of(y)
    if device is not None:
        return jax.device_put(np.asarray(y).reshape(shape), device)
    if forwarded:
        return jnp.reshape(y, shape)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return _reshape_donated(y, shape)
