"""Real PyMC models with seeded raw draws of realistic shapes, for profiling post-processing.

Each `Fixture` builds a `pm.Model` and names its default (chains, draws). `raw_draws` gives
seeded normal draws in the unconstrained space, one array of shape
`(chains, draws) + initial_point[name].shape` per value variable, in `model.value_vars`
order: exactly what a NUTS sampler hands to `pymc.sampling.jax._postprocess_samples`.
`jax_fn` builds the per-draw function the way `pymc.sampling.jax.sample_jax_nuts` does.

User models load through `load_model` ("FILE.py:builder" or a cloudpickled `pm.Model`) and
their draws through `load_draws` (an `.npz` keyed by value-variable name, or `arr_0, arr_1,
...` in `model.value_vars` order, as `np.savez(path, *raw_mcmc_samples)` writes them).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pymc as pm

__all__ = [
    "FIXTURES",
    "ZOO",
    "Fixture",
    "jax_fn",
    "load_draws",
    "load_model",
    "on_device",
    "output_names",
    "output_vars",
    "raw_draws",
]


@dataclasses.dataclass(frozen=True)
class Fixture:
    """A named model builder with default draw counts.

    Attributes:
        name: the registry key.
        description: one line for `--list` and reports.
        build: builds a fresh `pm.Model` (deterministic: data come from a fixed seed).
        chains: default number of chains.
        draws: default draws per chain.
    """

    name: str
    description: str
    build: Callable[[], pm.Model]
    chains: int = 4
    draws: int = 1000

    def raw_draws(
        self, model: pm.Model, chains: int | None = None, draws: int | None = None, seed: int = 0
    ) -> list[np.ndarray]:
        """`raw_draws(model, chains, draws, seed)` with this fixture's defaults."""
        return raw_draws(
            model,
            self.chains if chains is None else chains,
            self.draws if draws is None else draws,
            seed,
        )


def raw_draws(model: pm.Model, chains: int, draws: int, seed: int) -> list[np.ndarray]:
    """Seeded draws in the unconstrained space, as a NUTS sampler would return them.

    Each value variable gets `initial_point + N(0, 1)` noise, so transformed variables
    (log, interval, Cholesky) sit around their usual values.

    Args:
        model: the model whose `value_vars` are drawn.
        chains: number of chains, positive.
        draws: draws per chain, positive.
        seed: seed of `np.random.default_rng`.

    Returns:
        One float array per value variable, of shape `(chains, draws) + shape`.

    Raises:
        ValueError: `chains` or `draws` not a positive int.
    """
    for name, value in (("chains", chains), ("draws", draws)):
        if not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    rng = np.random.default_rng(seed)
    point = model.initial_point()
    out = []
    for var in model.value_vars:
        init = np.asarray(point[var.name])
        x = rng.standard_normal((chains, draws) + init.shape).astype(init.dtype, copy=False)
        x += init  # in place: no second sample-sized array
        out.append(x)
    return out


def on_device(
    name: str, chains: int | None = None, draws: int | None = None, seed: int = 0
) -> tuple[pm.Model, Callable, list]:
    """A fixture's model, its `jax_fn`, and its seeded raw draws on JAX's default device.

    The draws are jax arrays, already transferred (`block_until_ready`): what a sampler
    leaves on the device. `chains`/`draws` default to the fixture's.
    """
    import jax
    import jax.numpy as jnp

    spec = FIXTURES[name]
    model = spec.build()
    raw = [jnp.asarray(x) for x in spec.raw_draws(model, chains, draws, seed)]
    jax.block_until_ready(raw)
    return model, jax_fn(model), raw


def output_names(model: pm.Model) -> list[str]:
    """Names of the post-processed outputs, in `jax_fn(model)` order."""
    return [v.name for v in output_vars(model)]


def output_vars(model: pm.Model) -> list:
    """The post-processed variables, as `sample_jax_nuts` picks them (all, untransformed)."""
    # Mirrors `sample_jax_nuts` with `var_names=None, keep_untransformed=False`.
    from pymc.util import get_default_varnames

    return list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))


def jax_fn(model: pm.Model) -> Callable:
    """The per-draw function that `pymc.sampling.jax.sample_jax_nuts` post-processes."""
    from pymc.sampling.jax import get_jaxified_graph

    return get_jaxified_graph(inputs=model.value_vars, outputs=output_vars(model))


# --------------------------------------------------------------------------------------------
# Model builders. Data come from a fixed seed so that `build()` is reproducible.


def eight_schools() -> pm.Model:
    """Non-centred eight schools: 10 parameters, `theta` deterministic."""
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_tilde = pm.Normal("theta_tilde", 0.0, 1.0, shape=8)
        theta = pm.Deterministic("theta", mu + tau * theta_tilde)
        pm.Normal("obs", theta, sigma, observed=y)
    return model


def wide(n_obs: int = 5000) -> pm.Model:
    """The shapes of pymc PR #7116: (468,), (7, 468), (2, 9, 468), with an obs-level `mu`."""
    rng = np.random.default_rng(7116)
    n_units, n_days, n_a, n_b = 468, 7, 2, 9
    unit = rng.integers(0, n_units, n_obs)
    day = rng.integers(0, n_days, n_obs)
    a = rng.integers(0, n_a, n_obs)
    b = rng.integers(0, n_b, n_obs)
    x = rng.standard_normal(n_obs)
    y = rng.standard_normal(n_obs)
    with pm.Model() as model:
        intercept = pm.Normal("intercept", 0.0, 1.0, shape=n_units)
        unit_sigma = pm.HalfNormal("unit_sigma", 1.0, shape=n_units)
        day_effect = pm.Normal("day_effect", 0.0, 1.0, shape=(n_days, n_units))
        slope = pm.Normal("slope", 0.0, 1.0, shape=(n_a, n_b, n_units))
        mu = pm.Deterministic("mu", intercept[unit] + day_effect[day, unit] + slope[a, b, unit] * x)
        pm.Normal("y", mu, unit_sigma[unit], observed=y)
    return model


def hierarchical(n_obs: int = 50_000, n_groups: int = 85) -> pm.Model:
    """Radon-style varying intercepts over a large `pm.Data`, with an R^2 deterministic.

    The R^2 needs the fitted values of every observation, so the large data enter the
    post-processing graph as constants.
    """
    rng = np.random.default_rng(85)
    group = rng.integers(0, n_groups, n_obs)
    x = rng.standard_normal(n_obs)
    y = 1.0 + 0.5 * x + rng.standard_normal(n_obs)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        group_data = pm.Data("group", group)
        y_data = pm.Data("y_data", y)
        mu_a = pm.Normal("mu_a", 0.0, 10.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        a_offset = pm.Normal("a_offset", 0.0, 1.0, shape=n_groups)
        a = pm.Deterministic("a", mu_a + sigma_a * a_offset)
        b = pm.Normal("b", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        fitted = a[group_data] + b * x_data
        pm.Deterministic("r2", 1.0 - (y_data - fitted).var() / y_data.var())
        pm.Normal("y", fitted, sigma, observed=y_data)
    return model


def gp(n_points: int = 100) -> pm.Model:
    """A latent GP prior: an `n_points` x `n_points` Cholesky per draw, `f` deterministic."""
    rng = np.random.default_rng(100)
    X = np.linspace(0.0, 10.0, n_points)[:, None]
    y = np.sin(X[:, 0]) + 0.3 * rng.standard_normal(n_points)
    with pm.Model() as model:
        ls = pm.Gamma("ls", 2.0, 1.0)
        eta = pm.HalfNormal("eta", 1.0)
        cov = eta**2 * pm.gp.cov.ExpQuad(1, ls)
        f = pm.gp.Latent(cov_func=cov).prior("f", X=X)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", f, sigma, observed=y)
    return model


def lkj(n_dims: int = 20, n_obs: int = 500) -> pm.Model:
    """`LKJCholeskyCov` + `MvNormal`: per-draw Cholesky algebra, correlation deterministics."""
    rng = np.random.default_rng(20)
    data = rng.standard_normal((n_obs, n_dims))
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol_cov", n=n_dims, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=n_dims)
        )
        mu = pm.Normal("mu", 0.0, 1.0, shape=n_dims)
        pm.MvNormal("obs", mu, chol=chol, observed=data)
    return model


def demo_basis_grid(n_obs: int = 200, n_grid: int = 4000, n_centers: int = 16) -> pm.Model:
    """A smooth fit from Gaussian bumps of sampled width, evaluated on a fine grid.

    `f_grid` is what one plots: the fit at `n_grid` points. Each draw computes it through an
    `n_grid` x `n_centers` basis that depends on the sampled width `ls`, so the basis cannot
    be folded into a constant: pymc's "vmap" holds every draw's basis at once, about
    `n_centers` times the outputs' bytes, while a chunked map holds one chunk's. The
    likelihood reads only the `n_obs` observations, so sampling stays fast; the width's prior
    keeps neighbouring bumps apart (about half their spacing), so NUTS needs short trees.
    """
    rng = np.random.default_rng(16)
    x = np.sort(rng.uniform(0.0, 10.0, n_obs))
    y = np.sin(x) + 0.3 * rng.standard_normal(n_obs)
    centers = np.linspace(0.0, 10.0, n_centers)
    grid = np.linspace(0.0, 10.0, n_grid)
    spacing = centers[1] - centers[0]
    with pm.Model() as model:
        ls = pm.Gamma("ls", alpha=400.0, beta=400.0 / (0.5 * spacing))
        w = pm.Normal("w", 0.0, 1.0, shape=n_centers)
        sigma = pm.HalfNormal("sigma", 1.0)

        def fit(at: np.ndarray):
            basis = pm.math.exp(-0.5 * ((at[:, None] - centers[None, :]) / ls) ** 2)
            return pm.math.dot(basis, w)

        pm.Normal("y", fit(x), sigma, observed=y)
        pm.Deterministic("f_grid", fit(grid))
    return model


def big_det(n_obs: int = 20_000, n_features: int = 10) -> pm.Model:
    """A regression with a 20k-point deterministic `mu = X @ beta` (640 MB at 4 x 1000)."""
    rng = np.random.default_rng(20_000)
    X = rng.standard_normal((n_obs, n_features))
    y = X @ rng.standard_normal(n_features) + rng.standard_normal(n_obs)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=n_features)
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.Deterministic("mu", pm.math.dot(X, beta))
        pm.Normal("y", mu, sigma, observed=y)
    return model


def many_scalars(n: int = 200) -> pm.Model:
    """`n` scalar `HalfNormal`s and one deterministic summing them: many tiny outputs."""
    with pm.Model() as model:
        scalars = [pm.HalfNormal(f"s_{i:03d}", 1.0) for i in range(n)]
        pm.Deterministic("total", pm.math.sum(pm.math.stack(scalars)))
    return model


# The zoo: the kinds of model that users post-process, at sizes they meet (issue 12). Each
# takes about 0.1 s to a few seconds of post-processing on 2 cores at 4 x 1000 draws.


def radon_slopes(n_obs: int = 20_000, n_groups: int = 468, n_features: int = 3) -> pm.Model:
    """Row-indexed hierarchical regression: varying intercepts and slopes, gathered per row.

    `mu = a[idx] + (X * slopes[:, idx].T).sum(-1)` over `n_obs` rows, the most common PyMC
    shape (radon-style); `mu` is a deterministic of `n_obs` values per draw.
    """
    rng = np.random.default_rng(468)
    idx = rng.integers(0, n_groups, n_obs)
    X = rng.standard_normal((n_obs, n_features))
    y = 1.0 + X @ np.array([0.5, -0.3, 0.2][:n_features]) + rng.standard_normal(n_obs)
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        mu_b = pm.Normal("mu_b", 0.0, 1.0, shape=n_features)
        sigma_b = pm.HalfNormal("sigma_b", 1.0, shape=n_features)
        a_z = pm.Normal("a_z", 0.0, 1.0, shape=n_groups)
        b_z = pm.Normal("b_z", 0.0, 1.0, shape=(n_features, n_groups))
        a = pm.Deterministic("a", mu_a + sigma_a * a_z)
        slopes = pm.Deterministic("slopes", mu_b[:, None] + sigma_b[:, None] * b_z)
        mu = pm.Deterministic("mu", a[idx] + (X * slopes[:, idx].T).sum(-1))
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", mu, sigma, observed=y)
    return model


def varying_slopes(n_obs: int = 30_000, n_groups: int = 85) -> pm.Model:
    """Varying intercepts and slopes indexed per row: `mu = a[group] + b[group] * x`.

    The most common PyMC shape (radon's 85 counties), one predictor: two gathers and a
    multiply per row; `mu` is a deterministic of `n_obs` values per draw (240 KB in float64).
    """
    rng = np.random.default_rng(85)
    group = rng.integers(0, n_groups, n_obs)
    x = rng.standard_normal(n_obs)
    y = 1.0 + 0.5 * x + rng.standard_normal(n_obs)
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        mu_b = pm.Normal("mu_b", 0.0, 1.0)
        sigma_b = pm.HalfNormal("sigma_b", 1.0)
        a_z = pm.Normal("a_z", 0.0, 1.0, shape=n_groups)
        b_z = pm.Normal("b_z", 0.0, 1.0, shape=n_groups)
        a = pm.Deterministic("a", mu_a + sigma_a * a_z)
        b = pm.Deterministic("b", mu_b + sigma_b * b_z)
        mu = pm.Deterministic("mu", a[group] + b[group] * x)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", mu, sigma, observed=y)
    return model


def basis(n_obs: int = 4000, n_basis: int = 60) -> pm.Model:
    """A dense basis expansion: Gaussian bumps, `mu = B @ beta` with `B` of `n_obs` x `n_basis`.

    The coefficients get a random-walk (P-spline-like) prior; `mu` is the deterministic.
    """
    rng = np.random.default_rng(60)
    x = np.linspace(0.0, 1.0, n_obs)
    centres = np.linspace(0.0, 1.0, n_basis)
    B = np.exp(-0.5 * ((x[:, None] - centres[None, :]) * n_basis) ** 2)
    y = np.sin(6.0 * x) + 0.2 * rng.standard_normal(n_obs)
    with pm.Model() as model:
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=n_basis)
        beta = pm.Deterministic("beta", tau * pm.math.cumsum(z))
        mu = pm.Deterministic("mu", pm.math.dot(B, beta))
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", mu, sigma, observed=y)
    return model


def random_walk(n_steps: int = 4000) -> pm.Model:
    """A latent random walk by `cumsum` over `n_steps` steps, a softplus rate, Poisson counts."""
    rng = np.random.default_rng(4000)
    counts = rng.poisson(np.log1p(np.exp(np.cumsum(0.05 * rng.standard_normal(n_steps)))))
    with pm.Model() as model:
        level = pm.Normal("level", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 0.1)
        innovations = pm.Normal("innovations", 0.0, 1.0, shape=n_steps)
        walk = pm.Deterministic("walk", level + pm.math.cumsum(sigma * innovations))
        rate = pm.Deterministic("rate", pm.math.log1pexp(walk))
        pm.Poisson("counts", rate, observed=counts)
    return model


def softmax_regression(n_obs: int = 1000, n_features: int = 5, n_classes: int = 6) -> pm.Model:
    """Multinomial (categorical) regression: a softmax over classes per row, pivot class 0."""
    import pytensor.tensor as pt

    rng = np.random.default_rng(6)
    X = rng.standard_normal((n_obs, n_features))
    y = rng.integers(0, n_classes, n_obs)
    with pm.Model() as model:
        alpha = pm.Normal("alpha", 0.0, 1.0, shape=n_classes - 1)
        beta = pm.Normal("beta", 0.0, 1.0, shape=(n_features, n_classes - 1))
        eta = pt.concatenate([pt.zeros((n_obs, 1)), alpha + pm.math.dot(X, beta)], axis=1)
        p = pm.Deterministic("p", pm.math.softmax(eta, axis=-1))
        pm.Categorical("y", p=p, observed=y)
    return model


def mixture(n_obs: int = 2000, n_components: int = 3) -> pm.Model:
    """A Gaussian mixture (`NormalMixture`, Dirichlet weights, ordered means) with each
    observation's component responsibilities as a deterministic."""
    rng = np.random.default_rng(3)
    y = np.concatenate(
        [rng.normal(m, 1.0, n_obs // n_components) for m in np.linspace(-4, 4, n_components)]
    )
    with pm.Model() as model:
        w = pm.Dirichlet("w", np.ones(n_components))
        mu = pm.Normal(
            "mu",
            0.0,
            5.0,
            shape=n_components,
            transform=pm.distributions.transforms.ordered,
            initval=np.linspace(-2.0, 2.0, n_components),
        )
        sigma = pm.HalfNormal("sigma", 2.0, shape=n_components)
        pm.NormalMixture("y", w=w, mu=mu, sigma=sigma, observed=y)
        log_joint = pm.math.log(w) + pm.logp(pm.Normal.dist(mu, sigma), y[:, None])
        pm.Deterministic("responsibility", pm.math.softmax(log_joint, axis=-1))
    return model


def zerosum_simplex(n_stores: int = 40, n_products: int = 12) -> pm.Model:
    """ZeroSum (`ZeroSumNormal`, one and two axes) and simplex (`Dirichlet` per row)
    transforms: sales shares of products across stores."""
    rng = np.random.default_rng(40)
    sales = rng.poisson(20.0, (n_stores, n_products))
    with pm.Model() as model:
        base = pm.Normal("base", 3.0, 1.0)
        store = pm.ZeroSumNormal("store", sigma=0.5, shape=n_stores)
        interaction = pm.ZeroSumNormal(
            "interaction", sigma=0.2, shape=(n_stores, n_products), n_zerosum_axes=2
        )
        share = pm.Dirichlet("share", np.ones((n_stores, n_products)))
        total = pm.math.exp(base + store)[:, None]
        rate = pm.Deterministic("rate", total * n_products * share * pm.math.exp(interaction))
        pm.Poisson("sales", rate, observed=sales)
    return model


def big_data(n_obs: int = 20_000, n_features: int = 10) -> pm.Model:
    """Logistic regression over a large `pm.Data` design matrix (1.6 MB) with summary
    deterministics: each draw reads all the data and writes a few numbers."""
    rng = np.random.default_rng(100_000)
    X = rng.standard_normal((n_obs, n_features))
    y = (X @ rng.standard_normal(n_features) + rng.logistic(size=n_obs) > 0).astype(np.int64)
    with pm.Model() as model:
        X_data = pm.Data("X", X)
        y_data = pm.Data("y_data", y)
        beta = pm.Normal("beta", 0.0, 1.0, shape=n_features)
        logit = pm.math.dot(X_data, beta)
        pm.Deterministic("accuracy", pm.math.eq(logit > 0, y_data).mean())
        pm.Deterministic("mean_p", pm.math.sigmoid(logit).mean())
        pm.Bernoulli("y", logit_p=logit, observed=y_data)
    return model


def integer_dets(n_groups: int = 300) -> pm.Model:
    """Group means with integer deterministics: ranks (argsort), the best group (argmax) and a
    count; int64 outputs beside float ones."""
    import pytensor.tensor as pt  # pymc 5's `pm.math` has no argsort

    rng = np.random.default_rng(300)
    y = rng.normal(rng.normal(0.0, 1.0, n_groups)[:, None], 1.0, (n_groups, 10))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
        theta = pm.Deterministic("theta", mu + tau * z)
        pm.Deterministic("rank", pt.argsort(pt.argsort(theta)))
        pm.Deterministic("best", pt.argmax(theta))
        pm.Deterministic("n_positive", (theta > 0).sum())
        pm.Normal("y", theta[:, None], 1.0, observed=y)
    return model


FIXTURES: dict[str, Fixture] = {
    f.name: f
    for f in [
        Fixture("eight_schools", "non-centred eight schools (10 parameters)", eight_schools),
        Fixture("wide", "PR #7116 shapes (468,), (7,468), (2,9,468); 5000-obs `mu`", wide),
        Fixture("hierarchical", "varying intercepts over a 50k-row pm.Data; R^2", hierarchical),
        Fixture(
            "hierarchical_5k",
            "the hierarchical model over 5k rows (fast to sample: the demo's)",
            functools.partial(hierarchical, n_obs=5000),
        ),
        Fixture("gp", "latent GP, 100 points: a 100x100 Cholesky per draw", gp),
        Fixture("lkj", "LKJCholeskyCov(n=20) + MvNormal; correlation deterministics", lkj),
        Fixture("big_det", "regression with a 20k-point deterministic mu = X @ beta", big_det),
        Fixture("many_scalars", "200 scalar HalfNormals + their sum", many_scalars),
        # The zoo's other kinds (issue 12).
        Fixture(
            "radon_slopes",
            "row-indexed hierarchical: 20k rows, 468 groups, a[idx] + slopes[:, idx]",
            radon_slopes,
        ),
        Fixture(
            "varying_slopes",
            "varying intercepts and slopes per row: 30k rows, 85 groups, a[g] + b[g] * x",
            varying_slopes,
        ),
        Fixture("basis", "dense basis expansion mu = B @ beta, 4000 rows x 60 bumps", basis),
        Fixture(
            "random_walk", "cumsum random walk, 4000 steps, softplus Poisson rate", random_walk
        ),
        Fixture(
            "softmax",
            "categorical regression: softmax over 6 classes, 1000 rows",
            softmax_regression,
        ),
        Fixture("mixture", "NormalMixture, 3 components; 2000 responsibilities", mixture),
        Fixture(
            "zerosum_simplex", "ZeroSumNormal (1 and 2 axes) + Dirichlet rows", zerosum_simplex
        ),
        Fixture("big_data", "logistic regression over a 20k x 10 pm.Data; summaries", big_data),
        Fixture("integer_dets", "300 group means; argsort ranks, argmax, a count", integer_dets),
        # The demo's model: last.
        Fixture(
            "demo_basis_grid",
            "radial-basis regression, its fit on a 4000-point grid: pymc's vmap holds a "
            "4000 x 16 basis per draw (the demo's)",
            demo_basis_grid,
            draws=500,
        ),
    ]
}

# The zoo benchmark's models (benchmarks/bench_zoo.py): one of each kind, at a size users
# meet. Variants of a zoo model (a smaller size for a demo) stay out of it.
ZOO: tuple[str, ...] = (
    "eight_schools",
    "wide",
    "hierarchical",
    "gp",
    "lkj",
    "big_det",
    "many_scalars",
    "radon_slopes",
    "varying_slopes",
    "basis",
    "random_walk",
    "softmax",
    "mixture",
    "zerosum_simplex",
    "big_data",
    "integer_dets",
)


# --------------------------------------------------------------------------------------------
# User models.


def load_model(spec: str) -> pm.Model:
    """A model from a fixture name, `FILE.py:builder`, or a cloudpickled `pm.Model` file.

    Args:
        spec: a key of `FIXTURES`; `path/to/file.py:builder`, where `builder()` returns a
            `pm.Model`; or a path to a pickle (`.p`, `.pkl`, `.pickle`) of a `pm.Model`.

    Returns:
        The model.

    Raises:
        ValueError: `spec` names no fixture, file or builder, or gives no `pm.Model`.
    """
    if spec in FIXTURES:
        return FIXTURES[spec].build()
    path, sep, builder = spec.rpartition(":")
    if sep and path.endswith(".py"):
        model = _load_builder(Path(path), builder)()
    elif Path(spec).suffix in (".p", ".pkl", ".pickle"):
        if not Path(spec).is_file():
            raise ValueError(f"Model file {spec!r} does not exist.")
        from .._support.extras import require

        cloudpickle = require("cloudpickle")
        with open(spec, "rb") as f:
            model = cloudpickle.load(f)
    else:
        raise ValueError(
            f"Cannot load a model from {spec!r}. Pass a fixture name ({', '.join(FIXTURES)}), "
            "`FILE.py:builder`, or a cloudpickled pm.Model (`model.p`)."
        )
    if not isinstance(model, pm.Model):
        raise ValueError(f"{spec!r} gave a {type(model).__name__}, not a pm.Model.")
    return model


def _load_builder(path: Path, name: str) -> Callable[[], pm.Model]:
    if not path.is_file():
        raise ValueError(f"Model file {str(path)!r} does not exist.")
    module_spec = importlib.util.spec_from_file_location(f"_user_model_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"Cannot import {str(path)!r} as a Python module.")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    builder = getattr(module, name, None)
    if not callable(builder):
        raise ValueError(f"{str(path)!r} has no callable {name!r}; pass `FILE.py:builder`.")
    return builder


def load_draws(model: pm.Model, path: str | Path) -> list[np.ndarray]:
    """Raw draws from an `.npz`, checked against the model's value variables.

    Args:
        model: the model the draws belong to.
        path: an `.npz` keyed by value-variable name, or holding `arr_0, arr_1, ...` in
            `model.value_vars` order.

    Returns:
        One array per value variable, in `model.value_vars` order.

    Raises:
        ValueError: a missing file or variable, or a shape that does not fit the model.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Draws file {str(path)!r} does not exist.")
    names = [v.name for v in model.value_vars]
    with np.load(path) as data:
        keys = list(data.keys())
        if set(names) <= set(keys):
            draws = [data[name] for name in names]
        elif keys == [f"arr_{i}" for i in range(len(names))]:
            draws = [data[key] for key in keys]
        else:
            raise ValueError(
                f"{str(path)!r} holds {keys}; expected the value variables {names} (or "
                f"arr_0..arr_{len(names) - 1} in that order)."
            )
    point = model.initial_point()
    lead = draws[0].shape[:2]
    for name, x in zip(names, draws):
        want = lead + np.shape(point[name])
        if x.ndim < 2 or x.shape != want:
            raise ValueError(
                f"Draws of {name!r} in {str(path)!r} have shape {x.shape}; expected "
                f"(chains, draws) + {np.shape(point[name])} = {want}."
            )
    return draws


def sample_raw_draws(model: pm.Model, chains: int, draws: int, tune: int, seed: int) -> list:
    """Sample with numpyro the way `pymc.sampling.jax.sample_jax_nuts` does: the raw,
    unconstrained draws, one `(chains, draws, ...)` array per value variable."""
    from pymc.sampling.jax import (
        _get_batched_jittered_initial_points,
        _sample_numpyro_nuts,
        get_jaxified_logp,
    )

    logp_fn = get_jaxified_logp(model, negative_logp=False)
    initial_points = _get_batched_jittered_initial_points(
        model=model, chains=chains, initvals=None, random_seed=seed, logp_fn=logp_fn
    )
    raw, _, _ = _sample_numpyro_nuts(
        model=model,
        target_accept=0.8,
        tune=tune,
        draws=draws,
        chains=chains,
        chain_method="vectorized",
        progressbar=False,
        random_seed=seed,
        initial_points=initial_points,
        nuts_kwargs={},
        logp_fn=logp_fn,
    )
    return list(raw.values()) if isinstance(raw, dict) else list(raw)
