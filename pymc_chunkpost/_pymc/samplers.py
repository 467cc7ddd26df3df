"""JAX samplers for pytensor's and pymc's random variables, for our graphs only.

One table, `SAMPLERS`: the exact `RandomVariable` class (not its subclasses: pymc's `WaldRV`
takes three parameters where pytensor's takes two) -> a sampler. A sampler is called as
`sample(key, batch_shape, dtype, *params)`: `key` a typed JAX key, `batch_shape` the static
batch shape of the draw, `params` the distribution's parameters as pytensor gives them to
`rng_fn` (broadcastable to the batch shape, with their support dimensions last). It returns
an array of shape `batch_shape + support shape`.

Each one draws from the law that the class's own `rng_fn` draws from (the same parameters,
the same support), checked against it by two-sample tests in `tests/test_samplers.py`.
The table is ours: pytensor's global JAX dispatch is never changed, so other users of
pytensor keep its samplers (including its Categorical, which draws from
`softmax(logit(p))` instead of `p` up to pytensor 3.3.8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr, ndtri

from .._support.compat import unrolled_threefry

__all__ = ["SAMPLERS", "sampler_for"]

Sampler = Callable[..., jax.Array]


def _broadcast(batch_shape: tuple[int, ...], *params: Any) -> list[jax.Array]:
    return [jnp.broadcast_to(p, batch_shape) for p in params]


#: Wichura's AS 241 (PPND16, Applied Statistics 37, 1988), the inverse normal CDF to about
#: 1e-16 (R's `qnorm`): numerator and denominator coefficients, lowest power first, of the
#: central region (|p - 0.5| <= 0.425), the near tail (r <= 5) and the far tail.
# fmt: off
_AS241 = (
    ((3.387132872796366608, 133.14166789178437745, 1971.5909503065514427,
      13731.693765509461125, 45921.953931549871457, 67265.770927008700853,
      33430.575583588128105, 2509.0809287301226727),
     (1.0, 42.313330701600911252, 687.1870074920579083, 5394.1960214247511077,
      21213.794301586595867, 39307.89580009271061, 28729.085735721942674,
      5226.495278852545925)),
    ((1.42343711074968357734, 4.6303378461565452959, 5.7694972214606914055,
      3.64784832476320460504, 1.27045825245236838258, 0.24178072517745061177,
      0.0227238449892691845833, 7.7454501427834140764e-4),
     (1.0, 2.05319162663775882187, 1.6763848301838038494, 0.68976733498510000455,
      0.14810397642748007459, 0.0151986665636164571966, 5.475938084995344946e-4,
      1.05075007164441684324e-9)),
    ((6.6579046435011037772, 5.4637849111641143699, 1.7848265399172913358,
      0.29656057182850489123, 0.026532189526576123093, 0.0012426609473880784386,
      2.71155556874348757815e-5, 2.01033439929228813265e-7),
     (1.0, 0.59983220655588793769, 0.13692988092273580531, 0.0148753612908506148525,
      7.868691311456132591e-4, 1.8463183175100546818e-5, 1.4215117583164458887e-7,
      2.04426310338993978564e-15)),
)
# fmt: on


def _polynomial(coefficients, x):
    y = jnp.full_like(x, coefficients[-1])
    for c in coefficients[-2::-1]:
        y = y * x + c
    return y


def _ndtri64(p):
    """The inverse normal CDF of `p` in (0, 1), float64, by AS 241 (`_AS241`).

    Every region is computed for every element (XLA's CPU code does not branch per
    element), and the region's numerator and denominator are selected before one division;
    the tails' logarithm is most of the cost.
    """
    (central_num, central_den), (near_num, near_den), (far_num, far_den) = _AS241
    q = p - 0.5
    r = 0.180625 - q * q
    t = jnp.sqrt(-jnp.log(jnp.minimum(p, 1 - p)))
    near = t <= 5.0
    s = jnp.where(near, t - 1.6, t - 5.0)
    tail_num = jnp.where(near, _polynomial(near_num, s), _polynomial(far_num, s))
    tail_den = jnp.where(near, _polynomial(near_den, s), _polynomial(far_den, s))
    central = jnp.abs(q) <= 0.425
    num = jnp.where(central, q * _polynomial(central_num, r), jnp.copysign(tail_num, q))
    return num / jnp.where(central, _polynomial(central_den, r), tail_den)


def _open_uniform64(bits):
    """Uniforms in the open interval (0, 1) from 64-bit words: the midpoints of 2**52 equal
    cells, `(k + 0.5) / 2**52` for the top 52 bits `k`.

    Invariant: every value and its complement are exact in float64 (`k + 0.5` needs 53
    bits), so the extremes are `2**-53` and `1 - 2**-53`, mirror images; with 53 bits,
    `k + 0.5` rounds to `2**53` at the top and the uniform to 1.
    """
    return ((bits >> 12).astype(jnp.float64) + 0.5) * 2.0**-52


def _standard_normal(key, shape, dtype):
    """Standard normal draws: in float64 by AS 241 on open uniforms (`_open_uniform64`), one
    64-bit word each as `jax.random.normal` takes, whose float64 `erfinv` ran 1.3-1.7x
    slower on a CPU (docs/predictive.md, "Random numbers"). Other dtypes by
    `jax.random.normal`, and so is float64 where JAX runs without 64-bit types (as it
    draws float32 then: 64-bit words would be 32-bit)."""
    if jax.dtypes.canonicalize_dtype(dtype) != jnp.float64:
        return jax.random.normal(key, shape, dtype)
    return _ndtri64(_open_uniform64(jax.random.bits(key, shape, jnp.uint64)))


#: Marsaglia-Tsang rounds over the whole array, outside any loop, before the compaction.
_GAMMA_STRAIGHT_ROUNDS = 1
#: The draws still pending after them that the compacted rounds take: `n // 8 + 64`.
_GAMMA_COMPACT_DIVISOR, _GAMMA_COMPACT_EXTRA = 8, 64


def _log_gamma(key, alpha, shape, dtype):
    """`log` of standard gamma draws (shape `alpha`, scale 1), vectorised.

    Marsaglia and Tsang (2000): each round draws a candidate for every pending element and
    accepts 95-99% of them; `alpha < 1` is boosted to `alpha + 1` and scaled by
    `U^(1/alpha)`, in log space, so that small shapes underflow neither here nor in the
    ratios built on it (beta, Dirichlet). The first `_GAMMA_STRAIGHT_ROUNDS` rounds run on
    the whole array outside any loop; the few elements left are gathered into a small array
    whose rounds loop until all are accepted; a last loop over the whole array takes any
    that did not fit (it runs no round unless more than `n // 8 + 64` were left). XLA's
    CPU runtime runs a loop's elementwise work on one thread, and a loop over the whole
    array made a StudentT predictive 8x slower than pymc's numba (docs/decisions.md).
    JAX's own gamma runs a loop per element on the CPU, slower to run and to compile.
    """
    alpha = jnp.broadcast_to(jnp.asarray(alpha, dtype), shape)
    n = int(np.prod(shape, dtype=np.int64))
    boost = alpha < 1
    d = (jnp.where(boost, alpha + 1, alpha) - 1.0 / 3.0).reshape(n)
    c = 1.0 / jnp.sqrt(9.0 * d)

    def round_(i, d, c, log_value, done):
        key_z, key_u = jax.random.split(jax.random.fold_in(key, i))
        z = _standard_normal(key_z, d.shape, dtype)
        u = jax.random.uniform(key_u, d.shape, dtype)
        v = (1 + c * z) ** 3
        log_v = jnp.log(jnp.where(v > 0, v, 1))
        accept = (v > 0) & (jnp.log(u) < 0.5 * z * z + d - d * v + d * log_v)
        log_value = jnp.where(done | ~accept, log_value, jnp.log(d) + log_v)
        return log_value, done | accept

    state = (jnp.zeros(n, dtype), jnp.zeros(n, bool))
    for i in range(1, _GAMMA_STRAIGHT_ROUNDS + 1):
        state = round_(jnp.uint32(i), d, c, *state)
    log_value, done = state
    # The pending elements, gathered (indices past the last pending one are `n`: dropped).
    size = min(n, n // _GAMMA_COMPACT_DIVISOR + _GAMMA_COMPACT_EXTRA)
    (at,) = jnp.nonzero(~done, size=size, fill_value=n)
    valid = at < n
    d_few, c_few = (
        d.at[at].get(mode="fill", fill_value=1.0),
        c.at[at].get(mode="fill", fill_value=1.0),
    )

    def until_accepted(d, c, i, log_value, done):
        def body(state):
            i, log_value, done = state
            return (i + 1, *round_(i, d, c, log_value, done))

        return jax.lax.while_loop(lambda s: ~jnp.all(s[2]), body, (i, log_value, done))

    first = jnp.uint32(_GAMMA_STRAIGHT_ROUNDS + 1)
    i, log_few, _ = until_accepted(d_few, c_few, first, jnp.zeros(size, dtype), ~valid)
    log_value = log_value.at[at].set(log_few, mode="drop")
    done = done.at[at].set(True, mode="drop")
    _, log_value, _ = until_accepted(d, c, i, log_value, done)
    log_value = log_value.reshape(shape)
    u = jax.random.uniform(jax.random.fold_in(key, 0), shape, dtype)
    return jnp.where(boost, log_value + jnp.log(u) / alpha, log_value)


# --- continuous ---------------------------------------------------------------------------


def _normal(key, shape, dtype, loc, scale):
    return loc + scale * _standard_normal(key, shape, dtype)


def _halfnormal(key, shape, dtype, loc, scale):
    return loc + scale * jnp.abs(_standard_normal(key, shape, dtype))


def _lognormal(key, shape, dtype, mean, sigma):
    return jnp.exp(mean + sigma * _standard_normal(key, shape, dtype))


def _cauchy(key, shape, dtype, loc, scale):
    return loc + scale * jax.random.cauchy(key, shape, dtype)


def _halfcauchy(key, shape, dtype, loc, scale):
    return loc + scale * jnp.abs(jax.random.cauchy(key, shape, dtype))


def _laplace(key, shape, dtype, loc, scale):
    return loc + scale * jax.random.laplace(key, shape, dtype)


def _logistic(key, shape, dtype, loc, scale):
    return loc + scale * jax.random.logistic(key, shape, dtype)


def _gumbel(key, shape, dtype, loc, scale):
    return loc + scale * jax.random.gumbel(key, shape, dtype)


def _studentt(key, shape, dtype, df, loc, scale):
    """A normal over the root of a chi-square with `df` degrees of freedom, over `df`."""
    key_z, key_g = jax.random.split(key)
    log_chi2_over_df = np.log(2.0) + _log_gamma(key_g, df / 2, shape, dtype) - jnp.log(df)
    return loc + scale * _standard_normal(key_z, shape, dtype) * jnp.exp(-0.5 * log_chi2_over_df)


def _exponential(key, shape, dtype, scale):
    return scale * jax.random.exponential(key, shape, dtype)


def _gamma(key, shape, dtype, alpha, scale):
    return scale * jnp.exp(_log_gamma(key, alpha, shape, dtype))


def _invgamma(key, shape, dtype, alpha, scale):
    return scale * jnp.exp(-_log_gamma(key, alpha, shape, dtype))


def _beta(key, shape, dtype, a, b):
    """`Ga / (Ga + Gb)` of two gamma draws, from their logs (small shapes do not underflow)."""
    key_a, key_b = jax.random.split(key)
    return jax.nn.sigmoid(_log_gamma(key_a, a, shape, dtype) - _log_gamma(key_b, b, shape, dtype))


def _beta_clipped(key, shape, dtype, a, b):
    """pymc's Beta: open support, 0 and 1 moved to their neighbours (`clipped_beta_rvs`)."""
    x = _beta(key, shape, dtype, a, b)
    zero, one = np.zeros((), dtype), np.ones((), dtype)
    return jnp.clip(x, np.nextafter(zero, one), np.nextafter(one, zero))


def _uniform(key, shape, dtype, low, high):
    return jax.random.uniform(key, shape, dtype, minval=low, maxval=high)


def _pareto(key, shape, dtype, b, scale):
    (b,) = _broadcast(shape, b)
    return scale * jax.random.pareto(key, b, shape, dtype)


def _weibull(key, shape, dtype, k):
    """numpy's `weibull(k)`: scale 1, `(-log U)^(1/k)`."""
    return jnp.power(jax.random.exponential(key, shape, dtype), 1.0 / k)


def _triangular(key, shape, dtype, left, mode, right):
    """Inverse CDF of the triangular law on [left, right] with its peak at `mode`."""
    u = jax.random.uniform(key, shape, dtype)
    width = right - left
    cut = (mode - left) / width
    low = left + jnp.sqrt(u * width * (mode - left))
    high = right - jnp.sqrt((1 - u) * width * (right - mode))
    return jnp.where(u < cut, low, high)


def _wald_standard(key, shape, dtype, mean, scale):
    """numpy's `wald(mean, scale)`: Michael, Schucany and Haas (1976)."""
    key_normal, key_uniform = jax.random.split(key)
    y = _standard_normal(key_normal, shape, dtype) ** 2
    mean_y = mean * y
    x = mean + mean * mean_y / (2 * scale)
    x = x - mean / (2 * scale) * jnp.sqrt(4 * scale * mean_y + mean_y * mean_y)
    u = jax.random.uniform(key_uniform, shape, dtype)
    return jnp.where(u <= mean / (mean + x), x, mean * mean / x)


def _wald_pymc(key, shape, dtype, mu, lam, alpha):
    """pymc's `WaldRV`: `wald(mu, lam) + alpha`."""
    return _wald_standard(key, shape, dtype, mu, lam) + alpha


def _truncated_normal(key, shape, dtype, mu, sigma, lower, upper):
    """Inverse CDF on the standardised bounds, flipped so that it works in the lower tail.

    The CDF is evaluated where it is small (and so precise): bounds above the mean are
    mirrored below it. Accurate while the bounds' CDF values are representable (|z| < ~37
    in float64); scipy's `truncnorm` switches to other algorithms further out.
    """
    a = (lower - mu) / sigma
    b = (upper - mu) / sigma
    flip = a > 0
    low, high = jnp.where(flip, -b, a), jnp.where(flip, -a, b)
    u = jax.random.uniform(key, shape, dtype)
    p_low, p_high = ndtr(low), ndtr(high)
    z = jnp.clip(ndtri(p_low + u * (p_high - p_low)), low, high)
    return mu + sigma * jnp.where(flip, -z, z)


def _skewnormal(key, shape, dtype, mu, sigma, alpha):
    """scipy's `skewnorm(alpha, mu, sigma)`: |u0| folds the skewed normal (Azzalini)."""
    key_0, key_1 = jax.random.split(key)
    delta = alpha / jnp.sqrt(1 + alpha * alpha)
    u0 = _standard_normal(key_0, shape, dtype)
    v = _standard_normal(key_1, shape, dtype)
    u1 = delta * u0 + jnp.sqrt(1 - delta * delta) * v
    return mu + sigma * jnp.where(u0 >= 0, u1, -u1)


def _moyal(key, shape, dtype, mu, sigma):
    """scipy's `moyal(mu, sigma)`: `-log` of a chi-square with one degree of freedom."""
    log_chi2 = np.log(2.0) + _log_gamma(key, 0.5, shape, dtype)
    return mu - sigma * log_chi2


def _rice(key, shape, dtype, b, sigma):
    """scipy's `rice(b, scale=sigma)`: the length of a normal vector centred at (b, 0)."""
    key_x, key_y = jax.random.split(key)
    x = _standard_normal(key_x, shape, dtype) + b
    y = _standard_normal(key_y, shape, dtype)
    return sigma * jnp.sqrt(x * x + y * y)


# --- discrete -----------------------------------------------------------------------------


def _bernoulli(key, shape, dtype, p):
    return jax.random.bernoulli(key, p, shape).astype(dtype)


def _binomial(key, shape, dtype, n, p):
    n, p = _broadcast(shape, n, p)
    float_type = jnp.result_type(p.dtype, jnp.float32)
    draw = jax.random.binomial(key, n.astype(float_type), p.astype(float_type), shape)
    return draw.astype(dtype)


#: Poisson rates below this are drawn by inversion, the others by transformed rejection.
POISSON_INVERSION_BELOW = 10.0
#: Inversion stops at this count: below a rate of 10, P(k >= 64) < 1e-30.
_POISSON_INVERSION_MAX = 64
#: Inversion steps taken in straight-line code before its loop, and per round of the loop.
_POISSON_STRAIGHT_STEPS, _POISSON_STEPS_PER_ROUND = 16, 8


def _poisson(key, shape, dtype, mu):
    (mu,) = _broadcast(shape, mu)
    return _poisson_draws(key, mu, shape).astype(dtype)


def _poisson_draws(key, rate, shape):
    """Poisson draws of `rate` (float), vectorised over the whole array.

    Rates below `POISSON_INVERSION_BELOW` invert the CDF from one uniform each; the first
    `_POISSON_STRAIGHT_STEPS` steps of the search run outside any loop (XLA's CPU runtime
    runs a loop's elementwise work on one thread), and a loop takes the few draws left,
    `_POISSON_STEPS_PER_ROUND` steps a round. Larger rates use Hörmann's transformed
    rejection (PTRS, as numpy and JAX do), round after round until all are accepted; without
    any, its loop runs no round. JAX's own sampler splits a key per element in every round
    of Knuth's method: on a 10,000-row Poisson regression it took 37 s warm where pymc's
    numba took 2.7 s (docs/decisions.md).
    """
    float_type = jnp.result_type(rate.dtype, jnp.float32)
    rate = rate.astype(float_type)
    small = rate < POISSON_INVERSION_BELOW
    key_inverse, key_reject = jax.random.split(key)
    u = jax.random.uniform(key_inverse, shape, float_type)
    rate_small = jnp.where(small, rate, 0)
    mass = jnp.exp(-rate_small)
    # Invariant: after `step` steps, `count` is the least k with CDF(k) >= u where `cdf` >= u;
    # elsewhere the search goes on, and `count` equals `step` (`cdf` is 2 where the rate is
    # not small: nothing to search). So each step multiplies by one scalar, 1 / (step + 1).
    state = (jnp.int32(0), jnp.zeros(shape, float_type), mass, jnp.where(small, mass, 2))

    def searching(state):
        step, _, _, cdf = state
        return (u > cdf) & (step < _POISSON_INVERSION_MAX)

    def steps(state):
        for _ in range(_POISSON_STEPS_PER_ROUND):
            step, count, mass, cdf = state
            on = searching(state)
            mass = mass * (rate_small * (1 / (step + 1).astype(float_type)))
            state = (
                step + 1,
                jnp.where(on, count + 1, count),
                mass,
                jnp.where(on, cdf + mass, cdf),
            )
        return state

    for _ in range(_POISSON_STRAIGHT_STEPS // _POISSON_STEPS_PER_ROUND):
        state = steps(state)
    count = jax.lax.while_loop(lambda s: jnp.any(searching(s)), steps, state)[1]
    return jnp.where(small, count, _poisson_ptrs(key_reject, jnp.where(small, 10, rate), ~small))


def _poisson_ptrs(key, rate, pending):
    """Hörmann's PTRS (1993) for rates >= 10 where `pending`; 0 elsewhere."""
    log_rate = jnp.log(rate)
    b = 0.931 + 2.53 * jnp.sqrt(rate)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)

    def round_(state):
        i, count, pending = state
        key_u, key_v = jax.random.split(jax.random.fold_in(key, i))
        u = jax.random.uniform(key_u, rate.shape, rate.dtype) - 0.5
        v = jax.random.uniform(key_v, rate.shape, rate.dtype)
        us = 0.5 - jnp.abs(u)
        k = jnp.floor((2 * a / us + b) * u + rate + 0.43)
        log_ratio = jnp.log(v * inv_alpha / (a / (us * us) + b))
        log_target = -rate + k * log_rate - jax.lax.lgamma(k + 1)
        squeeze = (us >= 0.07) & (v <= v_r)
        accept = squeeze | ((k >= 0) & ((us >= 0.013) | (v <= us)) & (log_ratio <= log_target))
        count = jnp.where(pending & accept, k, count)
        return i + 1, count, pending & ~accept

    start = (jnp.uint32(0), jnp.zeros(rate.shape, rate.dtype), pending)
    return jax.lax.while_loop(lambda s: jnp.any(s[2]), round_, start)[1]


def _negative_binomial(key, shape, dtype, n, p):
    """scipy's `nbinom(n, p)` (failures before `n` successes) as a gamma-Poisson mixture."""
    key_gamma, key_poisson = jax.random.split(key)
    n, p = _broadcast(shape, n, p)
    float_type = jnp.result_type(p.dtype, jnp.float32)
    rate = jnp.exp(_log_gamma(key_gamma, n, shape, float_type)) * (1 - p) / p
    return _poisson_draws(key_poisson, rate, shape).astype(dtype)


def _geometric(key, shape, dtype, p):
    """numpy's `geometric(p)`: trials up to the first success, support 1, 2, ..."""
    u = jax.random.uniform(key, shape, jnp.result_type(p, jnp.float32), minval=0.0, maxval=1.0)
    trials = jnp.ceil(jnp.log1p(-u) / jnp.log1p(-p))
    return jnp.maximum(trials, 1).astype(dtype)


def _beta_binomial(key, shape, dtype, n, a, b):
    key_beta, key_binomial = jax.random.split(key)
    float_type = jnp.result_type(a, b, jnp.float32)
    p = _beta(key_beta, shape, float_type, a, b)
    return _binomial(key_binomial, shape, dtype, n, p)


def _categorical(key, shape, dtype, p):
    """Draws from `p` itself (the Gumbel-max trick on `log p`), over its last axis."""
    p = jnp.broadcast_to(p, tuple(shape) + p.shape[-1:])
    return jax.random.categorical(key, jnp.log(p), axis=-1, shape=shape).astype(dtype)


def _integers(key, shape, dtype, low, high):
    return jax.random.randint(key, shape, low, high, dtype)


def _discrete_uniform(key, shape, dtype, lower, upper):
    """pymc's `DiscreteUniform`: lower, ..., upper, both included."""
    return jax.random.randint(key, shape, lower, upper + 1, dtype)


def _hypergeometric(key, shape, dtype, good, bad, n_sample):
    """numpy's `hypergeometric(good, bad, n_sample)`: the good items among `n_sample` drawn
    without replacement, one draw at a time (the loop runs `max(n_sample)` steps)."""
    good, bad, n_sample = _broadcast(shape, good, bad, n_sample)
    float_type = jnp.result_type(jnp.float32, jnp.float64)  # float64 where x64 is on

    def body(k, state):
        found, keys = state
        keys, step = jax.random.split(keys)
        chance = (good - found) / jnp.maximum(good + bad - k, 1)
        pick = (jax.random.uniform(step, shape, float_type) < chance) & (k < n_sample)
        return found + pick.astype(found.dtype), keys

    start = (jnp.zeros(shape, good.dtype), key)
    found, _ = jax.lax.fori_loop(0, jnp.max(n_sample, initial=0), body, start)
    return found.astype(dtype)


# --- multivariate -------------------------------------------------------------------------


def _dirichlet(key, shape, dtype, alpha):
    """Normalised gamma draws, as a softmax of their logs."""
    full = tuple(shape) + alpha.shape[-1:]
    return jax.nn.softmax(_log_gamma(key, jnp.broadcast_to(alpha, full), full, dtype), axis=-1)


def _mvnormal(method: str) -> Sampler:
    def sample(key, shape, dtype, mean, cov):
        return jax.random.multivariate_normal(key, mean, cov, shape, dtype, method)

    return sample


def _multinomial(key, shape, dtype, n, p):
    p = jnp.broadcast_to(p, tuple(shape) + p.shape[-1:])
    n = jnp.broadcast_to(n, shape)
    float_type = jnp.result_type(p.dtype, jnp.float32)
    draw = jax.random.multinomial(key, n.astype(float_type), p.astype(float_type))  # p.shape
    return draw.astype(dtype)


def _always(sampler: Sampler) -> Callable[[Any], Sampler]:
    """`sampler` whatever the op's properties."""

    def make(op: Any) -> Sampler:
        return sampler

    return make


def _table() -> dict[type, Callable[[Any], Sampler]]:
    """Exact RV class -> (op -> sampler). Built once, on first use."""
    import pytensor.tensor.random.basic as ptr
    from pymc.distributions import continuous, discrete

    same: dict[type, Sampler] = {
        ptr.NormalRV: _normal,
        ptr.HalfNormalRV: _halfnormal,
        ptr.LogNormalRV: _lognormal,
        ptr.CauchyRV: _cauchy,
        ptr.HalfCauchyRV: _halfcauchy,
        ptr.LaplaceRV: _laplace,
        ptr.LogisticRV: _logistic,
        ptr.GumbelRV: _gumbel,
        ptr.StudentTRV: _studentt,
        ptr.ExponentialRV: _exponential,
        ptr.GammaRV: _gamma,
        ptr.InvGammaRV: _invgamma,
        ptr.BetaRV: _beta,
        continuous.BetaClippedRV: _beta_clipped,
        ptr.UniformRV: _uniform,
        ptr.ParetoRV: _pareto,
        ptr.WeibullRV: _weibull,
        ptr.TriangularRV: _triangular,
        ptr.WaldRV: _wald_standard,
        continuous.WaldRV: _wald_pymc,
        continuous.TruncatedNormalRV: _truncated_normal,
        continuous.SkewNormalRV: _skewnormal,
        continuous.MoyalRV: _moyal,
        continuous.RiceRV: _rice,
        ptr.BernoulliRV: _bernoulli,
        ptr.BinomialRV: _binomial,
        ptr.PoissonRV: _poisson,
        ptr.NegBinomialRV: _negative_binomial,
        ptr.GeometricRV: _geometric,
        ptr.BetaBinomialRV: _beta_binomial,
        ptr.CategoricalRV: _categorical,
        ptr.IntegersRV: _integers,
        discrete.DiscreteUniformRV: _discrete_uniform,
        ptr.HyperGeometricRV: _hypergeometric,
        ptr.DirichletRV: _dirichlet,
        ptr.MultinomialRV: _multinomial,
    }
    table: dict[type, Callable[[Any], Sampler]] = {cls: _always(fn) for cls, fn in same.items()}
    table[ptr.MvNormalRV] = lambda op: _mvnormal(getattr(op, "method", "cholesky"))
    return table


SAMPLERS: dict[type, Callable[[Any], Sampler]] = {}


def sampler_for(op: Any) -> Sampler | None:
    """Our sampler for the random variable `op`, or None where there is none.

    A threefry key reaches the sampler as the same key of `_compat.unrolled_threefry`: the
    same bits, hashed unrolled on a CPU (faster to run there, and to compile on jaxlib 0.10).
    """
    if not SAMPLERS:
        SAMPLERS.update(_table())
    make = SAMPLERS.get(type(op))
    if make is None:
        return None
    sample = make(op)

    def unrolled(key: jax.Array, shape: tuple[int, ...], dtype: Any, *params: Any) -> jax.Array:
        key = _rekeyed(key, "threefry2x32", unrolled_threefry())
        return _apart(sample(key, shape, dtype, *_apart(params)))

    return unrolled


def _apart(values: Any) -> Any:
    """`values`, which XLA may not fuse with what made or uses them, off a CPU.

    Invariant: off a CPU a draw's random bits are computed in fusions of their own. On a TPU
    v5e, XLA fused a 20,000-row `X @ b` with the threefry hash of the normal drawn around it
    and took 24 s to compile it, against 3.5 s with the two apart (docs/decisions.md). On a
    CPU the fusion compiles fast and saves a pass over memory.
    """
    leaves, tree = jax.tree.flatten(values)
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    if not arrays:
        return values

    def barrier(*xs):
        return jax.lax.optimization_barrier(xs)

    kept = jax.lax.platform_dependent(
        *[leaves[i] for i in arrays], cpu=lambda *xs: xs, default=barrier
    )
    for i, leaf in zip(arrays, kept):
        leaves[i] = leaf
    return jax.tree.unflatten(tree, leaves)


def _rekeyed(key: jax.Array, old: str, new: Any) -> jax.Array:
    """`key`'s data as a key of implementation `new` where its implementation is `old`."""
    if new is None or str(jax.random.key_impl(key)) != old:
        return key
    return jax.random.wrap_key_data(jax.random.key_data(key), impl=new)
