"""Our JAX samplers (`_samplers`) against each random variable's own `rng_fn` (numpy/scipy).

Per case, 20,000 draws of ours and of the class's `rng_fn`, compared per element by a
two-sample test (KS for continuous values, chi-square for integers); all cases' p-values
are Holm-corrected together. Parameters include the hard corners: shapes below 1 for the
gamma family, truncation far in a tail, batched multivariate parameters.
"""

from __future__ import annotations

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
stats = pytest.importorskip("scipy.stats")

import jax  # noqa: E402
import pytensor.tensor.random.basic as ptr  # noqa: E402
from pymc.distributions import continuous, discrete  # noqa: E402
from two_sample import holm_rejects, two_sample_p_values  # noqa: E402

from pymc_chunkpost._pymc import samplers as _samplers  # noqa: E402

N = 20_000
CASES = {
    "normal": (ptr.NormalRV(), (1.0, 2.0)),
    "halfnormal": (ptr.HalfNormalRV(), (0.5, 2.0)),
    "lognormal": (ptr.LogNormalRV(), (0.3, 0.8)),
    "cauchy": (ptr.CauchyRV(), (1.0, 0.5)),
    "halfcauchy": (ptr.HalfCauchyRV(), (0.0, 2.0)),
    "laplace": (ptr.LaplaceRV(), (1.0, 2.0)),
    "logistic": (ptr.LogisticRV(), (1.0, 2.0)),
    "gumbel": (ptr.GumbelRV(), (1.0, 2.0)),
    "studentt": (ptr.StudentTRV(), (2.5, 1.0, 2.0)),
    "exponential": (ptr.ExponentialRV(), (2.0,)),
    "gamma": (ptr.GammaRV(), (2.5, 2.0)),
    "gamma_small_shape": (ptr.GammaRV(), (0.2, 1.0)),
    "invgamma": (ptr.InvGammaRV(), (3.0, 2.0)),
    "beta": (ptr.BetaRV(), (0.5, 2.0)),
    "beta_small": (ptr.BetaRV(), (0.05, 0.1)),
    "beta_clipped": (continuous.BetaClippedRV(), (2.0, 3.0)),
    "uniform": (ptr.UniformRV(), (-1.0, 3.0)),
    "pareto": (ptr.ParetoRV(), (3.0, 2.0)),
    "weibull": (ptr.WeibullRV(), (1.7,)),
    "triangular": (ptr.TriangularRV(), (-1.0, 0.3, 2.0)),
    "wald": (ptr.WaldRV(), (1.5, 2.0)),
    "wald_pymc": (continuous.WaldRV(), (1.5, 2.0, 0.5)),
    "truncated_normal": (continuous.TruncatedNormalRV(), (0.0, 1.0, -0.5, 2.0)),
    "truncated_normal_tail": (continuous.TruncatedNormalRV(), (0.0, 1.0, 6.0, np.inf)),
    "truncated_normal_lower_tail": (continuous.TruncatedNormalRV(), (1.0, 2.0, -np.inf, -9.0)),
    "skewnormal": (continuous.SkewNormalRV(), (0.5, 2.0, -4.0)),
    "moyal": (continuous.MoyalRV(), (0.5, 2.0)),
    "rice": (continuous.RiceRV(), (1.5, 0.7)),
    "bernoulli": (ptr.BernoulliRV(), (0.3,)),
    "binomial": (ptr.BinomialRV(), (12, 0.3)),
    "poisson": (ptr.PoissonRV(), (3.5,)),
    "poisson_large": (ptr.PoissonRV(), (40.0,)),
    "negative_binomial": (ptr.NegBinomialRV(), (3.0, 0.4)),
    "geometric": (ptr.GeometricRV(), (0.3,)),
    "beta_binomial": (ptr.BetaBinomialRV(), (10, 2.0, 0.5)),
    "categorical": (ptr.CategoricalRV(), (np.array([0.05, 0.1, 0.6, 0.25]),)),
    "integers": (ptr.IntegersRV(), (-3, 4)),
    "discrete_uniform": (discrete.DiscreteUniformRV(), (-2, 3)),
    "hypergeometric": (ptr.HyperGeometricRV(), (7, 13, 9)),
    "dirichlet": (ptr.DirichletRV(), (np.array([0.3, 1.0, 5.0]),)),
    "multinomial": (ptr.MultinomialRV(), (10, np.array([0.2, 0.3, 0.5]))),
    "mvnormal": (
        ptr.MvNormalRV(method="cholesky"),
        (np.array([1.0, -1.0]), np.array([[2.0, 0.8], [0.8, 1.0]])),
    ),
}


def draws(op, params) -> tuple[np.ndarray, np.ndarray]:
    """N draws of ours and N of the class's own `rng_fn`, as (N, elements)."""
    sample = _samplers.sampler_for(op)
    dtype = np.dtype("float64" if op.dtype == "floatX" else op.dtype)
    params = [np.asarray(p) for p in params]
    ours = jax.jit(lambda key, *p: sample(key, (N,), dtype, *p))(jax.random.key(5), *params)
    theirs = op.rng_fn(np.random.default_rng(6), *params, (N,))
    ours, theirs = np.asarray(ours), np.asarray(theirs).astype(dtype)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    return ours.reshape(N, -1), theirs.reshape(N, -1)


def test_every_sampler_is_in_the_table():
    assert all(_samplers.sampler_for(op) is not None for op, _ in CASES.values())


def test_pymc_subclasses_are_not_taken_for_their_parents():
    """A subclass with other parameters (pymc's 3-parameter Wald) has its own entry; one
    without any (a user's) has none, and falls back."""

    class Shifted(ptr.NormalRV):
        pass

    assert _samplers.sampler_for(Shifted()) is None


@pytest.mark.slow
def test_samplers_draw_from_the_law_of_rng_fn():
    p_values, names = [], []
    for name, (op, params) in CASES.items():
        ours, theirs = draws(op, params)
        assert np.isfinite(ours).all(), name
        found = two_sample_p_values(ours, theirs)
        p_values += found
        names += [name] * len(found)
    assert [names[i] for i in holm_rejects(p_values, alpha=1e-3)] == []


def _symbolic_cases() -> dict:
    """pymc distributions built from several random variables (inlined by `_graph`)."""
    return {
        "halfstudentt": lambda: pm.HalfStudentT.dist(nu=3.0, sigma=2.0),
        "weibull": lambda: pm.Weibull.dist(alpha=1.5, beta=2.0),
        "zero_inflated_poisson": lambda: pm.ZeroInflatedPoisson.dist(psi=0.7, mu=3.0),
        "zero_inflated_negative_binomial": lambda: pm.ZeroInflatedNegativeBinomial.dist(
            psi=0.7, mu=3.0, alpha=2.0
        ),
        "hurdle_gamma": lambda: pm.HurdleGamma.dist(psi=0.7, alpha=2.0, beta=1.0),
        "censored_poisson": lambda: pm.Censored.dist(pm.Poisson.dist(3.0), lower=1, upper=6),
        "truncated_normal": lambda: pm.Truncated.dist(pm.Normal.dist(0, 1), lower=0.5),
        "mixture": lambda: pm.Mixture.dist(
            w=np.array([0.3, 0.7]), comp_dists=[pm.Gamma.dist(2, 1), pm.Exponential.dist(1)]
        ),
        "mvstudentt": lambda: pm.MvStudentT.dist(nu=4, mu=np.zeros(2), scale=np.eye(2) + 0.5),
        "lkjcorr": lambda: pm.LKJCorr.dist(n=3, eta=2.0),
        "lkjcholeskycov": lambda: pm.LKJCholeskyCov.dist(
            n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=False
        ),
        "dirichlet_multinomial": lambda: pm.DirichletMultinomial.dist(n=5, a=np.ones(3)),
        "zerosumnormal": lambda: pm.ZeroSumNormal.dist(sigma=1.0, shape=4),
        "asymmetric_laplace": lambda: pm.AsymmetricLaplace.dist(b=1.0, kappa=0.5, mu=0.0),
        "exgaussian": lambda: pm.ExGaussian.dist(mu=0.0, sigma=1.0, nu=2.0),
        "kumaraswamy": lambda: pm.Kumaraswamy.dist(2.0, 3.0),
        "logitnormal": lambda: pm.LogitNormal.dist(0.0, 1.0),
        "discrete_weibull": lambda: pm.DiscreteWeibull.dist(0.5, 1.5),
        "kronecker_normal": lambda: pm.KroneckerNormal.dist(
            mu=np.zeros(4), covs=[np.eye(2) + 0.3, np.eye(2)]
        ),
        "ordered_logistic": lambda: pm.OrderedLogistic.dist(
            eta=0.3, cutpoints=np.array([-1.0, 1.0])
        ),
        "garch11": lambda: pm.GARCH11.dist(
            omega=0.1, alpha_1=0.2, beta_1=0.5, initial_vol=1.0, steps=5
        ),
        "ar": lambda: pm.AR.dist(
            rho=[0.5, -0.2], sigma=1.0, init_dist=pm.Normal.dist(0, 1, shape=2), steps=6
        ),
        "mv_gaussian_random_walk": lambda: pm.MvGaussianRandomWalk.dist(
            mu=np.zeros(2),
            cov=np.eye(2),
            init_dist=pm.MvNormal.dist(np.zeros(2), np.eye(2)),
            steps=3,
        ),
        "chisquared": lambda: pm.ChiSquared.dist(3.0),
    }


@pytest.mark.slow
def test_symbolic_distributions_draw_as_pm_draw():
    """Distributions that are graphs of random variables (mixtures, censoring, scans, ...),
    drawn by `_graph.random_function`, against `pm.draw` on pymc's default backend."""
    from pymc_chunkpost._pymc import graph as _graph

    p_values, names = [], []
    for name, make in _symbolic_cases().items():
        rv = make()
        built = _graph.random_function([], [rv], [])
        assert not isinstance(built, str), (name, built)
        keys = jax.random.split(jax.random.key(7), (N, max(built.n_generators, 1)))
        ours = np.asarray(jax.jit(jax.vmap(built.fn))(keys)[0])
        theirs = np.asarray(pm.draw(rv, draws=N, random_seed=8))
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
        found = two_sample_p_values(ours.reshape(N, -1), theirs.reshape(N, -1))
        p_values += found
        names += [name] * len(found)
    assert [names[i] for i in holm_rejects(p_values, alpha=1e-3)] == []


@pytest.mark.parametrize("platform", ["cpu", "tpu", "cuda"])
def test_draws_compute_apart_from_their_parameters_off_a_cpu(platform):
    """Off a CPU a sampler's parameters and its draw pass optimisation barriers, so that XLA
    computes the random bits in fusions of their own (`_samplers._apart`); on a CPU nothing
    stands between them. Lowered for each platform here, on the CPU."""
    import jax.numpy as jnp

    sample = _samplers.sampler_for(ptr.normal)
    x = np.ones((50, 3), np.float32)

    def draw(key_data, b):
        key = jax.random.wrap_key_data(key_data)
        return sample(key, (50,), jnp.float32, x @ b, jnp.float32(1.0))

    specs = (jax.ShapeDtypeStruct((2,), np.uint32), jax.ShapeDtypeStruct((3,), np.float32))
    text = jax.export.export(jax.jit(draw), platforms=[platform])(*specs).mlir_module()
    barriers = text.count("optimization_barrier")
    assert barriers == 0 if platform == "cpu" else barriers >= 2
    key_data = np.array([0, 7], np.uint32)
    b = np.arange(3, dtype=np.float32)
    expected = x @ b + jax.random.normal(jax.random.wrap_key_data(key_data), (50,), jnp.float32)
    np.testing.assert_allclose(jax.jit(draw)(key_data, b), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_poisson_and_gamma_paths_draw_from_their_laws(monkeypatch):
    """Each path of the vectorised Poisson and gamma samplers: rates on both sides of
    `POISSON_INVERSION_BELOW` in one array (inversion, its loop past the straight-line steps,
    and the rejection), and gamma draws whose compacted rounds are too small for what is
    pending (the last loop over the whole array), against scipy's laws."""
    import jax.numpy as jnp
    from scipy import stats

    rates = np.repeat([0.3, 4.0, 9.9, 10.0, 35.0], 40_000)
    key = jax.random.key(5)
    counts = np.asarray(
        jax.jit(_samplers._poisson_draws, static_argnums=2)(key, rates, rates.shape)
    )
    p_values = []
    for rate in np.unique(rates):
        drawn = counts[rates == rate].astype(int)
        support = np.arange(int(stats.poisson.ppf(1e-6, rate)), int(stats.poisson.isf(1e-6, rate)))
        observed = np.array([(drawn == k).sum() for k in support])
        expected = stats.poisson.pmf(support, rate) * drawn.size
        keep = expected > 20
        observed, expected = observed[keep], expected[keep]
        p_values.append(
            stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
        )
    assert np.all(np.asarray(p_values) > 1e-4), p_values
    assert counts[rates == 9.9].max() > _samplers._POISSON_STRAIGHT_STEPS  # the loop ran

    monkeypatch.setattr(_samplers, "_GAMMA_COMPACT_DIVISOR", 10**9)
    monkeypatch.setattr(_samplers, "_GAMMA_COMPACT_EXTRA", 1)
    for alpha in (0.4, 2.5):
        log_draws = _samplers._log_gamma(jax.random.key(6), alpha, (100_000,), jnp.float64)
        draws_ = np.exp(np.asarray(log_draws))
        assert stats.kstest(draws_, stats.gamma(alpha).cdf).pvalue > 1e-4, alpha


def test_float64_normals_invert_the_cdf_to_double_precision():
    """`_ndtri64` (AS 241) against scipy's `ndtri` from the central region to both tails,
    as far as the open uniforms reach; the uniforms' extremes are mirror images, so that no
    word draws an infinite or NaN normal; and float64 normal draws are the CDF's inverse
    of the uniform of their own bits."""
    import jax.numpy as jnp
    from scipy.special import ndtri

    p = np.concatenate(
        [
            np.linspace(1e-6, 1 - 1e-6, 20_001),
            np.logspace(-300, -1, 2_000),
            1 - np.logspace(-15.9, -1, 1_000),
            [2.0**-53, 1 - 2.0**-53, 0.075, 0.925, 0.5],  # the extremes, the regions' edges
        ]
    )
    ours = np.asarray(jax.jit(_samplers._ndtri64)(p))
    np.testing.assert_allclose(ours, ndtri(p), rtol=4e-15, atol=1e-300)

    words = np.array([0, 2**12 - 1, 2**63, 2**64 - 2**12, 2**64 - 1], np.uint64)
    uniforms = np.asarray(_samplers._open_uniform64(jnp.asarray(words)))
    np.testing.assert_array_equal(
        uniforms, [2.0**-53, 2.0**-53, 0.5 + 2.0**-53, 1 - 2.0**-53, 1 - 2.0**-53]
    )
    extremes = np.asarray(_samplers._ndtri64(jnp.asarray(uniforms)))
    assert np.all(np.isfinite(extremes)) and extremes[0] == -extremes[-1]

    key = jax.random.key(3)
    draws = np.asarray(_samplers._standard_normal(key, (5_000,), jnp.float64))
    bits = np.asarray(jax.random.bits(key, (5_000,), jnp.uint64))
    own = ((bits >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52
    np.testing.assert_allclose(draws, ndtri(own), rtol=4e-15, atol=1e-300)
    assert stats.kstest(draws, stats.norm.cdf).pvalue > 1e-4


def test_float64_normals_without_64_bit_types_are_jaxs_float32_normals():
    """Where JAX runs without 64-bit types, a float64 draw is what `jax.random.normal`
    gives (float32): 64-bit words would be 32-bit, and AS 241 on them far in a tail. The
    gamma rounds built on normals still end."""
    import jax.numpy as jnp

    key = jax.random.key(4)
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", False)
    try:
        draws = _samplers._standard_normal(key, (20_000,), jnp.float64)
        expected = jax.random.normal(key, (20_000,), jnp.float64)
        log_gamma = _samplers._log_gamma(jax.random.key(5), 2.0, (2_000,), jnp.float64)
        np.testing.assert_array_equal(np.asarray(draws), np.asarray(expected))
        assert stats.kstest(np.asarray(draws), stats.norm.cdf).pvalue > 1e-4
        assert np.all(np.isfinite(np.asarray(log_gamma)))
    finally:
        jax.config.update("jax_enable_x64", previous)
