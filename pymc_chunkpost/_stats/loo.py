"""PSIS-LOO-CV in blocks of observations, whatever library computes the log-likelihood.

ArviZ's `loo` takes the pointwise log-likelihood, draws x observations (at 4,000 draws and
2.6 million observations, 83 GB in float64). PSIS needs only one observation's column of
draws at a time, so a route (pymc's `loo`, NumPyro's) computes the log-likelihood on the
engine in blocks of observations x all draws, and `blocked` smooths each block at once
(`psis_loo_block`, ArviZ's algorithm vectorised) and reduces it to per-observation results
(elpd_i, Pareto k, lppd_i): memory is one block, sized from the budget
(`choose_block_size`), plus O(observations) results.

What every route shares besides: the checks of its options and ArviZ's defaults (`reff`,
`scale`, `pointwise`), and ArviZ's own result (`result`), filled as the installed ArviZ's
`loo` fills it. Nothing here knows the library that computed the log-likelihood.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import math
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._engine.data.problem import cpu_cores
from .._support.config import current
from .._support.progress import counter
from .psis import Workspace, psis_loo_block, summary, tail_rows_bytes

__all__ = [
    "DEFAULT_BUDGET",
    "SAMPLE_DIMS",
    "LogLikelihoodBlocks",
    "bar_label",
    "block_starts",
    "blocked",
    "check_block_size",
    "choose_block_size",
    "default_reff",
    "each_block",
    "pointwise_default",
    "pointwise_dims",
    "result",
    "scale_value_of",
]

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

# --- blocks -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LogLikelihoodBlocks:
    """The observed variable's log-likelihood, computed by the engine a block at a time."""

    name: str  # the observed variable
    shape: tuple[int, ...]  # of its log-likelihood at one draw
    size: int  # observations per block, along the first axis of `shape`
    sample_shape: tuple[int, int]  # (chains, draws)
    reff: float
    block: Callable[[int], np.ndarray]  # (chains, draws, size, *shape[1:]) from a start
    dims: list[str]  # of the log-likelihood after its sample dims, as pymc names them
    coords: dict[str, Any]

    @property
    def n_samples(self) -> int:
        return self.sample_shape[0] * self.sample_shape[1]


def blocked(
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
    n_leading = shape[0] if shape else 1
    rest = math.prod(shape[1:]) if shape else 1
    total = n_leading * rest
    elpd_i, pareto_k, lppd_i = (np.empty(total) for _ in range(3))
    # Each observation is smoothed on its own: the block's rows in one part per core (up to
    # `psis_parts`), each smoothed by a thread of its own (numpy releases the GIL) in passes
    # of `psis_rows_per_pass` rows, in the part's own workspace: the same numbers.
    config = current()
    n_parts = max(1, min(cpu_cores(), config.psis_parts, size * rest))
    bounds = np.linspace(0, size * rest, n_parts + 1).astype(int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    rows = max(1, min(config.psis_rows_per_pass, bounds[1] - bounds[0]))
    workspaces = [Workspace(rows, n_samples) for _ in parts]
    with ThreadPoolExecutor(max_workers=n_parts, thread_name_prefix="loo-psis") as smoothing:

        def smoothed(start: int, values: np.ndarray) -> None:
            offset = start * rest
            smooth = _smoothed(values.reshape(n_samples, size * rest), reff)
            for part, result in zip(parts, smoothing.map(smooth, parts, workspaces)):
                where = slice(offset + part.start, offset + part.stop)
                elpd_i[where] = result.elpd_i
                pareto_k[where] = result.pareto_k
                lppd_i[where] = result.lppd_i

        each_block(block, shape, size, smoothed, bar)
    return elpd_i.reshape(shape), pareto_k.reshape(shape), lppd_i.reshape(shape)


def bar_label(name: str, progressbar: bool) -> str | None:
    return f"PSIS-LOO of {name!r}" if progressbar else None


def block_starts(shape: tuple[int, ...], size: int) -> list[int]:
    """The blocks' starts along the first axis of `shape`: every block has `size`
    observations, the last one starting at `shape[0] - size` (overlapping the one before)."""
    n_leading = shape[0] if shape else 1
    return list(range(0, n_leading - size, size)) + [n_leading - size]


def each_block(
    block: Callable[[int], np.ndarray],
    shape: tuple[int, ...],
    size: int,
    visit: Callable[[int, np.ndarray], None],
    bar: str | None,
    ahead: bool = True,
) -> None:
    """`visit(start, block(start))` for every block's start (`block_starts`), in order, with
    a progress bar over the observations labelled `bar` (None: no bar), moved as each block
    is visited.

    The engine computes each block in a thread. With `ahead`, the next one while this one is
    visited (numpy and XLA release the GIL): at most two blocks are alive at once, `visit`
    keeping none. Without, after the visit: for a visitor that enters
    `warnings.catch_warnings` (ArviZ's functions do), which is not thread-safe: interleaved
    with the engine's, each thread restores what the other set, and the caller's filters
    can be lost (a warning it should see, hidden)."""
    # What exists now is not the blocks' garbage: frozen, the collection before each block
    # scans only what was made since (0.5-0.7 s a collection with pymc and JAX loaded,
    # milliseconds frozen). Unfrozen after, for Python's own collections.
    gc.freeze()
    try:
        rest = math.prod(shape[1:]) if shape else 1
        total = (shape[0] if shape else 1) * rest
        starts = block_starts(shape, size)
        with (
            counter(total, bar or "", "obs", bar is not None) as progress,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="loo-block") as pool,
        ):

            def submit(i: int) -> Any:
                return pool.submit(_collected, block, starts[i]) if i < len(starts) else None

            pending = submit(0)
            for i, start in enumerate(starts):
                values = pending.result()
                if ahead:
                    pending = submit(i + 1)
                visit(start, values)
                del values
                if not ahead:
                    pending = submit(i + 1)
                progress((start + size) * rest)
    finally:
        gc.unfreeze()


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


def choose_block_size(
    shape: tuple[int, ...],
    n_samples: int,
    budget: int,
    block_size: int | None,
    bytes_per_row: int = 0,
) -> int:
    """Observations per block along the first axis of `shape`: `block_size` where given,
    else as many as the budget holds, each one's draws taking loo's bytes (the block and its
    smoothing) plus `bytes_per_row` a draw (a caller's own arrays of the block)."""
    n_leading = shape[0] if shape else 1
    if block_size is not None:
        return min(block_size, n_leading)
    rest = math.prod(shape[1:]) if shape else 1
    per_leading = rest * (8 * n_samples + tail_rows_bytes(n_samples)) + bytes_per_row * n_samples
    if per_leading > budget:
        raise MemoryError(
            f"One observation along the first axis ({rest} values x {n_samples} draws) "
            f"needs about {per_leading / 2**20:.1f} MiB, over `memory_budget` of "
            f"{budget / 2**20:.1f} MiB. Pass a larger `memory_budget`."
        )
    return max(1, min(n_leading, budget // per_leading))


# --- checks and ArviZ's defaults --------------------------------------------------------------


def check_block_size(block_size: Any) -> None:
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(
            f"`block_size` must be a positive int, got {block_size!r}. Pass "
            "`block_size=None` to size blocks from `memory_budget`."
        )


def scale_value_of(scale: str | None, generation: int) -> int:
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


def default_reff(posterior: Any, n_samples: int, generation: int) -> float:
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


def pointwise_default(generation: int) -> bool:
    """ArviZ's default `pointwise` (its `stats.ic_pointwise` rcParam) of `generation`."""
    rc_params = importlib.import_module("arviz" if generation == 0 else "arviz_base").rcParams
    return bool(rc_params["stats.ic_pointwise"])


# --- ArviZ's result -------------------------------------------------------------------------


def pointwise_dims(
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


def result(
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

    pointwise = pointwise_default(generation) if pointwise is None else bool(pointwise)
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
        # Beyond arviz-stats' `loo`: what its `loo_moment_match` computes from the whole
        # log-likelihood (lppd_i - elpd_i), kept so that matching needs none of it.
        p_loo_i=array(lppd_i - elpd_i, name) if pointwise else None,
    )
    result.log_weights_note = _LOG_WEIGHTS_NOTE
    return result


def _scale_name(scale_value: int) -> str:
    return {value: key for key, value in _SCALES.items()}[scale_value]
