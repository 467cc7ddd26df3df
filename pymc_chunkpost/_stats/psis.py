"""PSIS-LOO of a block of observations, vectorised over the block: ArviZ's numbers.

ArviZ smooths one observation at a time in a Python loop (`arviz.stats.psislw` on 0.x,
`arviz_stats`' `_psislw` on 1.x): 18.7 s of the 21.6 s of `loo` at 20,000 observations x
4,000 draws. Here the same algorithm runs on a whole block, `(observations, draws)`, with
numpy, in passes of a few rows into small buffers reused pass after pass (`_passes`): each
row is read once, from the engine's layout as it is, partitioned in place at its cutoff
(O(draws), instead of a full sort), and only its tail, sorted, its maximum and cutoff, and
two sums are kept. The generalized Pareto fit and the smoothing then run on every row's tail
at once, each step the installed ArviZ's, operation for operation. ArviZ's sums over every
draw are rewritten where the block allows: `lppd_i` is reduced from the negated row, the
normaliser of the weights from the partitioned row's values at or below the cutoff and the
smoothed tail, and `elpd_i` from the tail alone (off the tail, weight plus log-likelihood is
the row's shift). A row with an infinite value or a nan, or one ArviZ's vectorised form
cannot take, goes to ArviZ's own per-observation function, which reads it again.
The results equal ArviZ's to rounding; `tests/test_loo.py` checks elpd_i within 1e-8 and k
within 1e-6.

The two ArviZ generations differ; `psis_loo_block` picks the installed one's:
- 0.x: a tail of `ceil(min(S / 5, 3 sqrt(S / reff)))` draws strictly above the cutoff (at
  least `log(tiny)`), GPD fit without a first-quartile check, smoothed tail truncated at 0,
  `k = inf` where the tail has 4 draws or fewer, `se` from the variance with `ddof=0`.
- 1.x (arviz-stats): a tail of `floor(3 sqrt(S / reff))` draws (`floor(S / 5)` where
  `S reff <= 225`) by rank, `k = nan` where the fit's first quartile is its minimum,
  smoothed tail capped at the largest raw weight, `se` with `ddof=1`.

An observation that is no regular block row (fewer draws above its cutoff than the tail's
length: ties at the cutoff, or on 0.x the floor `log(tiny)`; a nan or an infinite value;
on 0.x a tail of 4 draws or fewer) is smoothed by the installed ArviZ's own
per-observation function. Ties inside a tail are regular rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["BlockResult", "Workspace", "arviz_generation", "psis_loo_block", "summary"]

_PRIOR_BS = 3  # ArviZ's GPD fit: the grid's scale from the first quartile
_PRIOR_K = 10  # ArviZ's GPD fit: weight of the prior at k = 0.5
_TINY = float(np.finfo(float).tiny)
_EPS = float(np.finfo(float).eps)
_CHUNK_ROWS = 16  # the fewest rows a step of the fit takes (a row: 64 KiB at 4,000 draws)


@dataclasses.dataclass
class BlockResult:
    """Per-observation results of one block: what LOO keeps, O(observations)."""

    elpd_i: np.ndarray  # leave-one-out log predictive density of each observation
    pareto_k: np.ndarray  # the fitted tail shape of each observation's weights
    lppd_i: np.ndarray  # log of each observation's mean likelihood over the draws


def arviz_generation() -> int:
    """The installed ArviZ's major version: 0 (`az.loo`) or 1 (`arviz_stats.loo`)."""
    import arviz

    return 0 if arviz.__version__.startswith("0.") else 1


class Workspace:
    """Host buffers of one pass of PSIS: `rows` (at least 1) observations x all draws,
    float64, reused by every pass of a part of a block, and by one call at a time. A pass
    reads that many rows of a block at once: its buffers (a few MiB) are read again at each
    step of the pass, where a pass over a whole part streams tens of MiB through memory at
    each step; and a fresh array of a block costs its page faults every time (the allocator
    maps and unmaps arrays this large), measured at as long as the arithmetic on it."""

    def __init__(self, rows: int, n_samples: int):
        if rows < 1:
            raise ValueError(f"A PSIS workspace needs at least 1 row, got {rows}.")
        self.weights = np.empty((rows, n_samples))  # -log_likelihood, then partitioned
        self.scratch = np.empty((rows, n_samples))  # exponentials


def psis_loo_block(
    log_likelihood: np.ndarray, reff: float, workspace: Workspace | None = None
) -> BlockResult:
    """PSIS-LOO of a block, as the installed ArviZ's `loo` computes each observation.

    Args:
        log_likelihood: `(observations, draws)`, draws in ArviZ's order (chain-major); any
            strides (the engine's `(draws, observations)` block, transposed, is read as it
            is) and any float dtype (computed in float64, as ArviZ on a float64 matrix).
            Left unchanged.
        reff: relative efficiency, as ArviZ's `loo` takes it.
        workspace: buffers to compute in, of any number of rows (the block is read that
            many rows at a time: the same numbers), not in use by another call; default a
            pass over the whole block.

    Returns:
        elpd_i, Pareto k and lppd_i, each of shape `(observations,)`.
    """
    log_likelihood = np.asarray(log_likelihood)
    n_obs, n_samples = log_likelihood.shape
    if workspace is None or workspace.weights.shape[1] != n_samples:
        workspace = Workspace(max(n_obs, 1), n_samples)
    return _GENERATIONS[arviz_generation()](log_likelihood, float(reff), workspace)


@dataclasses.dataclass
class _Rows:
    """What a pass keeps of each row: O(tail) values, the draws themselves left behind."""

    top: np.ndarray  # max(-log_likelihood): ArviZ's shift
    lppd: np.ndarray  # logsumexp(log_likelihood) - log(draws)
    finite: np.ndarray  # no nan and no infinity in the row
    cutoff: np.ndarray  # the shifted `tail + 1`-th largest value
    tail: np.ndarray  # the shifted values above the partition, ascending: (rows, tail)
    rest: np.ndarray  # logsumexp of the shifted values at or below the cutoff


def _passes(log_likelihood: np.ndarray, tail_len: int, work: Workspace) -> _Rows:
    """Each row's `_Rows`, in passes of `work`'s rows.

    The row is ArviZ's `-log_likelihood` shifted by its maximum, `top`. `lppd` is reduced
    from `-log_likelihood` in draw order before the shift (so `low - x` is
    `log_likelihood - max(log_likelihood)` to one rounding, as ArviZ's). Then the row is
    partitioned in place at its `tail + 1`-th largest value: the tail is the values above
    it, sorted and shifted (as ArviZ's shifted values, sorted); `rest` sums the values at or
    below it, shifted by it (its largest term is 1: the sum is at least 1, never lost to
    underflow). With the tail smoothed, `logaddexp(rest, logsumexp(tail))` is ArviZ's
    normaliser of the log weights, to a few ulps (its terms summed in another order): no
    pass over the row after the smoothing, and no index of the tail's draws.
    """
    n_obs, n_samples = log_likelihood.shape
    kth = n_samples - tail_len - 1
    rows = _Rows(
        top=np.empty(n_obs),
        lppd=np.empty(n_obs),
        finite=np.empty(n_obs, dtype=bool),
        cutoff=np.empty(n_obs),
        tail=np.empty((n_obs, tail_len)),
        rest=np.empty(n_obs),
    )
    size = len(work.weights)
    # Non-finite rows (an infinity, a nan) compute nan and infinities here: ArviZ's own
    # function smooths them (they are no regular rows), warning as it does.
    with np.errstate(invalid="ignore", divide="ignore"):
        for start in range(0, n_obs, size):
            where = slice(start, min(start + size, n_obs))
            n = where.stop - where.start
            x, scratch = work.weights[:n], work.scratch[:n]
            np.negative(log_likelihood[where], out=x)
            low = x.min(axis=1)
            np.subtract(low[:, None], x, out=scratch)
            np.exp(scratch, out=scratch)
            rows.lppd[where] = np.log(scratch.sum(axis=1)) - low + np.log(1 / n_samples)
            x.partition(kth, axis=1)  # in place: the draws' order is no longer needed
            tail = np.sort(x[:, kth + 1 :], axis=1)
            top = tail[:, -1]
            rows.top[where] = top
            rows.finite[where] = np.isfinite(top) & np.isfinite(low)
            rows.tail[where] = tail - top[:, None]
            below = x[:, kth]  # the largest value at or below the cutoff
            rows.cutoff[where] = below - top
            rest = np.subtract(x[:, : kth + 1], below[:, None], out=scratch[:, : kth + 1])
            np.exp(rest, out=rest)
            rows.rest[where] = np.log(rest.sum(axis=1)) + rows.cutoff[where]
    return rows


def _regular(
    found: _Rows, rows: np.ndarray, tail: np.ndarray, delta: np.ndarray, n_samples: int
) -> tuple[np.ndarray, np.ndarray]:
    """elpd_i and lppd_i of the regular `rows`, whose tails `tail` were smoothed by `delta`
    (0 where not fitted): the weights' normaliser is their sum at or below the cutoff and
    the smoothed tail's."""
    lse = np.logaddexp(found.rest[rows], _logsumexp_rows(tail + delta))
    return _elpd(found.top[rows], lse, delta, n_samples), found.lppd[rows]


def _elpd(top: np.ndarray, lse: np.ndarray, delta: np.ndarray, n_samples: int) -> np.ndarray:
    """Each row's `logsumexp(log_weights + log_likelihood)`, the log weights being the
    shifted `x` smoothed and normalised by `lse = logsumexp(x)`.

    Off the tail, `x + log_likelihood` is `-top` at every draw; on it, `-top + delta`, where
    `delta` is the smoothed value less the raw one (0 where a row was not smoothed). So the
    sum has `draws - tail` equal terms and the tail's: no pass over the block."""
    n_tail = delta.shape[1]
    tail = _logsumexp_rows(delta)
    rest = np.log(n_samples - n_tail) if n_samples > n_tail else -np.inf
    return np.logaddexp(rest, tail) - top - lse


def summary(
    elpd_i: np.ndarray, lppd_i: np.ndarray, generation: int, scale_value: int = 1
) -> tuple[float, float, float]:
    """elpd, se and p_loo from the pointwise values, as ArviZ sums them.

    `elpd_i` is on the log scale; 0.x scales it by `scale_value` before summing and takes
    `se` with `ddof=0`, 1.x with `ddof=1` on the log scale."""
    if generation == 0:
        loo_i = scale_value * elpd_i
        elpd = loo_i.sum()
        se = (loo_i.size * np.var(loo_i)) ** 0.5
        p_loo = np.sum(lppd_i) - elpd / scale_value
        return float(elpd), float(se), float(p_loo)
    values = np.asarray(elpd_i).ravel()
    n = len(values)
    elpd = np.sum(values)
    se = np.sqrt(n * np.var(values, ddof=1)) if n > 1 else 0.0
    p_loo = np.sum(np.asarray(lppd_i - elpd_i).ravel())
    return float(elpd), float(se), float(p_loo)


# --- ArviZ 0.x ------------------------------------------------------------------------------


def _loo_v0(log_likelihood: np.ndarray, reff: float, work: Workspace) -> BlockResult:
    from arviz.stats.stats_utils import logsumexp

    n_obs, n_samples = log_likelihood.shape
    # ArviZ's `psislw(-log_likelihood, reff)`: the tail is the draws above the (M+1)-th
    # largest, where M is this, and above log(tiny).
    tail_len = int(np.ceil(min(n_samples / 5.0, 3 * (n_samples / reff) ** 0.5)))
    cutoffmin = np.log(_TINY)
    k = np.full(n_obs, np.inf)
    elpd_i, lppd_i = np.full(n_obs, np.nan), np.full(n_obs, np.nan)
    regular = np.zeros(n_obs, dtype=bool)
    if 4 < tail_len < n_samples:  # otherwise ArviZ's function smooths every row
        found = _passes(log_likelihood, tail_len, work)
        cutoff = np.maximum(found.cutoff, cutoffmin)
        regular = found.finite & (found.tail[:, 0] > cutoff)
        rows = np.flatnonzero(regular)
        tail, delta = found.tail[rows], np.zeros((rows.size, tail_len))
        if rows.size:
            exp_cutoff = np.exp(cutoff[rows])
            k_rows, sigma = _gpdfit_v0(np.exp(tail) - exp_cutoff[:, None], work.scratch)
            k[rows] = k_rows
            smoothed = _gpinv_v0(np.arange(0.5, tail_len) / tail_len, k_rows, sigma)
            smoothed = np.log(smoothed + exp_cutoff[:, None])
            fitted = np.isfinite(k_rows)
            # Truncated at the largest raw weight, 0, as ArviZ's; the rest of a row is at
            # most its cutoff, itself at most 0.
            smoothed = np.minimum(smoothed[fitted], 0)
            delta[fitted] = smoothed - tail[fitted]
        elpd_i[rows], lppd_i[rows] = _regular(found, rows, tail, delta, n_samples)
    irregular = np.flatnonzero(~regular)
    if irregular.size:
        from arviz.stats.stats import _psislw

        for row in irregular:  # ArviZ's own functions, one observation at a time
            values = np.asarray(log_likelihood[row], dtype=np.float64)
            log_weights, k[row] = _psislw(-values, -tail_len - 1, cutoffmin, normalize=True)
            elpd_i[row] = logsumexp(log_weights + values)
            lppd_i[row] = logsumexp(values, b_inv=n_samples)
    return BlockResult(elpd_i, k, lppd_i)


def _gpdfit_v0(ary: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ArviZ 0.x's `_gpdfit` of every row of `ary` (sorted rows of one length), computing
    in `scratch` (C-contiguous float64, its values discarded)."""
    n_rows, n = ary.shape
    m_est = 30 + int(n**0.5)
    grid = 1 - np.sqrt(m_est / (np.arange(1, m_est + 1, dtype=float) - 0.5))
    b_ary = grid[None, :] / (_PRIOR_BS * ary[:, int(n / 4 + 0.5) - 1])[:, None]
    b_ary += (1 / ary[:, -1])[:, None]
    k_ary = _log1p_means(b_ary, ary, scratch)
    len_scale = n * (np.log(-(b_ary / k_ary)) - k_ary - 1)
    weights = np.empty_like(b_ary)
    # ArviZ's `1 / exp(len_scale - len_scale[:, None]).sum(axis=1)` of each row.
    for rows, diff in _chunks(n_rows, (m_est, m_est), scratch):
        np.subtract(len_scale[rows, None, :], len_scale[rows, :, None], out=diff)
        np.exp(diff, out=diff)
        np.divide(1, diff.sum(axis=2), out=weights[rows])
    b_post = _posterior_b(b_ary, weights)
    k_post = np.log1p(-b_post[:, None] * ary).mean(axis=1)
    sigma = -k_post / b_post
    k_post = (n * k_post + _PRIOR_K * 0.5) / (n + _PRIOR_K)
    return k_post, sigma


def _log1p_means(b_ary: np.ndarray, ary: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """`mean(log1p(-b * ary))` over each row's tail `ary` at each of its grid points `b`,
    `(rows, grid)`: ArviZ's `(grid, tail)` array of a row, reduced along the tail, for rows
    at a time in `scratch` (both generations)."""
    n_rows, m_est = b_ary.shape
    k_ary = np.empty_like(b_ary)
    for rows, x in _chunks(n_rows, (m_est, ary.shape[1]), scratch):
        np.multiply(-b_ary[rows, :, None], ary[rows, None, :], out=x)
        np.log1p(x, out=x)
        np.mean(x, axis=2, out=k_ary[rows])
    return k_ary


def _chunks(
    n_rows: int, shape: tuple[int, ...], scratch: np.ndarray
) -> Iterator[tuple[slice, np.ndarray]]:
    """Slices of `n_rows` rows, each with a buffer `(rows, *shape)`: in `scratch` (C-contiguous
    float64) as many rows as it holds, or at least `_CHUNK_ROWS` rows in one fresh buffer.
    Each numpy call on a large array lets the GIL go and takes it back, waiting up to
    Python's switch interval (5 ms) while another thread runs Python (the next block's
    graph, in `loo`): a call for many rows at a time, where ArviZ's loops over rows, and
    over grid points, would wait as many times."""
    per_row = math.prod(shape)
    step = max(1, min(n_rows, max(scratch.size // per_row, _CHUNK_ROWS)))
    size = step * per_row
    buffer = scratch.reshape(-1) if size <= scratch.size else np.empty(size)
    for start in range(0, n_rows, step):
        stop = min(start + step, n_rows)
        yield slice(start, stop), buffer[: (stop - start) * per_row].reshape(stop - start, *shape)


def _posterior_b(b_ary: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ArviZ's posterior mean of each row's `b` (both generations): the grid's points whose
    weight is below `10 eps`, or nan, dropped, the others' weights normalised; 0 where no
    point is left (ArviZ's sum over none)."""
    keep = weights >= 10 * _EPS
    weights = np.where(keep, weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    np.divide(weights, total, out=weights, where=total > 0)
    return np.sum(np.where(keep, b_ary, 0.0) * weights, axis=1)


def _gpinv_v0(probs: np.ndarray, kappa: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """ArviZ 0.x's `_gpinv` for each row's (kappa, sigma); probs all in (0, 1)."""
    small = np.abs(kappa) < _EPS
    safe = np.where(small, 1.0, kappa)[:, None]
    x = np.where(
        small[:, None],
        -np.log1p(-probs)[None, :],
        np.expm1(-safe * np.log1p(-probs)[None, :]) / safe,
    )
    x *= sigma[:, None]
    x[sigma <= 0] = np.nan
    return x


# --- ArviZ 1.x (arviz-stats) ----------------------------------------------------------------


def _loo_v1(log_likelihood: np.ndarray, reff: float, work: Workspace) -> BlockResult:
    n_obs, n_samples = log_likelihood.shape
    if n_samples * reff > 225:
        tail_len = int(np.floor(3 * (n_samples / reff) ** 0.5))
    else:
        tail_len = int(np.floor(n_samples / 5))
    if tail_len < 5:
        raise ValueError("n_draws_tail must be at least 5")  # arviz-stats' own error
    found = _passes(log_likelihood, tail_len, work)
    regular = found.finite & (found.tail[:, 0] > found.cutoff)
    rows = np.flatnonzero(regular)
    tail, cutoff = found.tail[rows], found.cutoff[rows]
    max_tail, min_tail = tail[:, -1], tail[:, 0]
    if np.any(np.abs(max_tail - min_tail) < _TINY):
        raise ValueError("All tail values are the same")  # arviz-stats' own error
    exp_cutoff = np.exp(cutoff)
    k, elpd_i, lppd_i = np.full(n_obs, np.nan), np.full(n_obs, np.nan), np.full(n_obs, np.nan)
    k_rows, sigma = _gpdfit_v1(np.exp(tail) - exp_cutoff[:, None], work.scratch)
    k[rows] = k_rows
    fitted = np.flatnonzero(np.isfinite(k_rows))
    delta = np.zeros((rows.size, tail_len))
    if fitted.size:
        probs = np.arange(0.5, tail_len) / tail_len
        smoothed = np.log(_gpinv_v1(probs, k_rows[fitted], sigma[fitted], exp_cutoff[fitted]))
        cap = max_tail[fitted][:, None]
        smoothed = np.where(smoothed > cap, cap, smoothed)
        delta[fitted] = smoothed - tail[fitted]
    elpd_i[rows], lppd_i[rows] = _regular(found, rows, tail, delta, n_samples)
    irregular = np.flatnonzero(~regular)
    if irregular.size:
        import importlib

        # arviz-stats' own per-observation function (imported by name: ArviZ 0.x has none).
        array_stats = importlib.import_module("arviz_stats.base").array_stats
        for row in irregular:  # ties at the cutoff, infinities: arviz-stats' own function
            values = np.asarray(log_likelihood[row], dtype=np.float64)
            log_weights, k[row] = array_stats._psislw(values, reff)
            elpd_i[row] = _logsumexp_rows((log_weights + values)[None])[0]
            lppd_i[row] = _logsumexp_rows(values[None])[0] + np.log(1 / n_samples)
    return BlockResult(elpd_i, k, lppd_i)


def _fit_rows(fit: Callable, ary: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`fit` (a pair of per-row results) of `ary`'s rows where `rows`, nan elsewhere: the
    others are never computed (nor warn of what arviz-stats never computes)."""
    if rows.all():
        return fit(ary)
    kappa, sigma = np.full(len(ary), np.nan), np.full(len(ary), np.nan)
    if rows.any():
        kappa[rows], sigma[rows] = fit(ary[rows])
    return kappa, sigma


def _gpdfit_v1(ary: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """arviz-stats' `_gpdfit` (unweighted) of every row of `ary` (sorted rows); (nan, nan)
    for a row far from a GPD (its first quartile not above its minimum), fitting nothing
    there, as arviz-stats. Computes in `scratch` (C-contiguous float64, values discarded)."""
    far = _first_quartile(ary) <= ary[:, 0]
    return _fit_rows(lambda rows: _fit_v1(rows, scratch), ary, ~far)


def _first_quartile(ary: np.ndarray) -> np.ndarray:
    return ary[:, int((ary.shape[1] / 4 + 0.5) - 1)]


def _fit_v1(ary: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xstar = _first_quartile(ary)
    n = ary.shape[1]
    m_est = 30 + int(n**0.5)
    grid = 1 - np.sqrt(m_est / (np.arange(1, m_est + 1, dtype=float) - 0.5))
    b_ary = grid[None, :] / (_PRIOR_BS * xstar)[:, None]
    b_ary += (1 / ary[:, -1])[:, None]
    k_ary = _log1p_means(b_ary, ary, scratch)
    len_scale = n * (np.log(-b_ary / k_ary) - k_ary - 1)
    w_theta = np.exp(len_scale - _logsumexp_rows(len_scale)[:, None])
    b_post = _posterior_b(b_ary, w_theta)
    kappa = np.mean(np.log1p(-b_post[:, None] * ary), axis=1)
    sigma = -kappa / b_post
    kappa = (n * kappa + _PRIOR_K * 0.5) / (n + _PRIOR_K)
    sigma = np.where(np.isnan(kappa), np.nan, sigma)
    kappa = np.where(np.isnan(kappa), np.inf, kappa)
    return kappa, sigma


def _gpinv_v1(
    probs: np.ndarray, kappa: np.ndarray, sigma: np.ndarray, mu: np.ndarray
) -> np.ndarray:
    """arviz-stats' `_gpinv` for each row's (kappa, sigma, mu)."""
    zero = kappa == 0
    safe = np.where(zero, 1.0, kappa)[:, None]
    log1p = np.log1p(-probs)[None, :]
    q = np.where(
        zero[:, None],
        mu[:, None] - sigma[:, None] * log1p,
        mu[:, None] + sigma[:, None] * np.expm1(-safe * log1p) / safe,
    )
    q[sigma <= 0] = np.nan
    return q


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """`scipy.special.logsumexp(x, axis=1)`, in the plain max-shifted form (scipy 1.15+
    takes 5x longer on a block): equal to it within a few ulps of the result."""
    top = x.max(axis=1)
    shift = np.where(np.isfinite(top), top, 0.0)  # all -inf gives -inf; +inf gives +inf
    scratch = np.subtract(x, shift[:, None])
    np.exp(scratch, out=scratch)
    with np.errstate(divide="ignore"):  # a row of -inf: -inf, as scipy's, without a warning
        return np.log(scratch.sum(axis=1)) + shift


_GENERATIONS: dict[int, Callable[[np.ndarray, float, Workspace], BlockResult]] = {
    0: _loo_v0,
    1: _loo_v1,
}


def tail_rows_bytes(n_samples: int) -> int:
    """Bytes one observation takes beside its log-likelihood row while blocks are computed
    and smoothed: the next block's row and the engine's temporaries while it is computed
    (2 x 8 bytes a draw), the workspaces' two rows (2 x 8, at most: fewer where a block has
    more observations than the workspaces have rows), and the tail's fit."""
    return 4 * 8 * n_samples + 8 * 64 * math.isqrt(max(n_samples, 1))
