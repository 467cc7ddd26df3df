"""`loo` and `numpyro.loo`: PSIS-LOO in blocks of observations, against ArviZ's own `loo`.

The reference is the installed ArviZ's `loo` (0.x: `arviz.loo`; 1.x: `arviz_stats.loo`) on
the full matrix from `pm.compute_log_likelihood` (or numpyro's `log_likelihood`): elpd, se,
p_loo within 1e-9 relative, elpd_i within 1e-8, Pareto k within 1e-6. Posteriors are seeded
random draws (no sampling), blocks forced small so that every model runs several.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
xr = pytest.importorskip("xarray")
pt = pytest.importorskip("pytensor.tensor")

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._pymc import loo as _loo  # noqa: E402
from pymc_chunkpost._stats import loo as _stats_loo  # noqa: E402
from pymc_chunkpost._stats import psis as _psis  # noqa: E402

GENERATION = _psis.arviz_generation()
CHAINS, DRAWS = 4, 100
SAMPLE = ("chain", "draw")


# --- ArviZ's side -------------------------------------------------------------------------


def _idata(posterior: dict, log_likelihood: dict | None = None, dims=None, coords=None):
    groups = {"posterior": posterior}
    if log_likelihood is not None:
        groups["log_likelihood"] = log_likelihood
    if GENERATION == 0:
        import arviz as az

        return az.from_dict(**groups, dims=dims, coords=coords)
    from arviz_base import from_dict

    return from_dict(groups, dims=dims, coords=coords)


def _arviz_loo(idata, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if GENERATION == 0:
            import arviz as az

            return az.loo(idata, pointwise=True, **kwargs)
        from arviz_stats import loo

        return loo(idata, pointwise=True, **kwargs)


def _numbers(result) -> tuple[float, float, float, np.ndarray, np.ndarray]:
    if GENERATION == 0:
        pointwise = "loo_i" in result.index
        elpd, se, p = result.elpd_loo, result.se, result.p_loo
        elpd_i = result.loo_i if pointwise else None
        return elpd, se, p, elpd_i, result.pareto_k if pointwise else None
    else:
        elpd, se, p, elpd_i = result.elpd, result.se, result.p, result.elpd_i
    return elpd, se, p, elpd_i, result.pareto_k


def _assert_same(ours, reference) -> None:
    elpd, se, p, elpd_i, k = _numbers(ours)
    r_elpd, r_se, r_p, r_elpd_i, r_k = _numbers(reference)
    for mine, theirs in ((elpd_i, r_elpd_i), (k, r_k)):  # ArviZ's dims and coords
        assert mine.dims == theirs.dims
        assert set(mine.coords) == set(theirs.coords)
        for name in theirs.coords:
            np.testing.assert_array_equal(mine.coords[name].values, theirs.coords[name].values)
    elpd_i, k, r_elpd_i, r_k = (np.asarray(a) for a in (elpd_i, k, r_elpd_i, r_k))
    np.testing.assert_allclose([elpd, se, p], [r_elpd, r_se, r_p], rtol=1e-9)
    assert elpd_i.shape == r_elpd_i.shape
    np.testing.assert_allclose(elpd_i, r_elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(k, r_k, rtol=0, atol=1e-6)
    assert ours.n_samples == reference.n_samples
    assert ours.n_data_points == reference.n_data_points
    assert bool(ours.warning) == bool(reference.warning)
    assert ours.good_k == reference.good_k


def _reference(model, posterior: dict, var_name: str | None = None, **kwargs):
    idata = _idata(posterior)
    log_likelihood = pm.compute_log_likelihood(
        idata, model=model, extend_inferencedata=False, progressbar=False
    )
    # The matrix as pymc names it: its dims and coords.
    dims = {k: list(log_likelihood[k].dims[2:]) for k in log_likelihood.data_vars}
    coords = {d: log_likelihood.coords[d].values for d in log_likelihood.dims if d not in SAMPLE}
    values = {k: log_likelihood[k].values for k in log_likelihood.data_vars}
    full = _idata(posterior, values, dims=dims, coords=coords)
    return idata, _arviz_loo(full, var_name=var_name, **kwargs)


# --- models -------------------------------------------------------------------------------


def hierarchical(n: int = 600):
    """A parameter indexed by group, pm.Data in a product, dims on the observations."""
    rng = np.random.default_rng(0)
    x, group = rng.normal(size=(n, 3)), rng.integers(0, 8, n)
    with pm.Model(coords={"obs": range(n)}) as model:
        data, groups = pm.Data("x", x), pm.Data("group", group)
        a = pm.Normal("a", shape=8)
        b = pm.Normal("b", shape=3)
        sigma = pm.HalfNormal("sigma")
        pm.Normal("y", a[groups] + data @ b, sigma, observed=rng.normal(size=n), dims="obs")
    draws = {
        "a": rng.normal(0, 0.1, (CHAINS, DRAWS, 8)),
        "b": rng.normal(0, 0.1, (CHAINS, DRAWS, 3)),
        "sigma": rng.gamma(40, 1 / 40, (CHAINS, DRAWS)),
    }
    return model, draws


def multivariate(n: int = 90):
    """An MvNormal likelihood (one logp per row of 3) with dims on both axes (the matrix
    keeps the first, with its coords), and a Student-t with a matrix value and no dims."""
    rng = np.random.default_rng(1)
    coords = {"row": [f"r{i}" for i in range(n)], "feature": ["a", "b", "c"]}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", shape=3)
        nu = pm.Gamma("nu", 5, 1)
        rows = rng.normal(size=(n, 3))
        pm.MvNormal("rows", mu, np.eye(3), observed=rows, dims=("row", "feature"))
        pm.StudentT("cells", nu=nu, mu=mu, sigma=1.0, observed=rng.standard_t(4, size=(n, 3)))
    draws = {
        "mu": rng.normal(0, 0.2, (CHAINS, DRAWS, 3)),
        "nu": rng.gamma(20, 0.25, (CHAINS, DRAWS)),
    }
    return model, draws


def cumulative(n: int = 60):
    """A mean through a cumulative sum: the slice cannot reach the data."""
    rng = np.random.default_rng(2)
    with pm.Model() as model:
        step = pm.Normal("step", 0, 0.1)
        mu = pt.cumsum(pt.ones(n) * step)
        pm.Normal("y", mu, 1.0, observed=rng.normal(size=n))
    return model, {"step": rng.normal(0, 0.05, (CHAINS, DRAWS))}


def glm(family: str, n: int = 240):
    """A regression whose likelihood's parameters are a vector over the observations, each
    checked by pymc (`check_bounds`): `all(0 <= p <= 1)` and the like read them all."""
    rng = np.random.default_rng(3)
    x, group = rng.normal(size=(n, 2)), rng.integers(0, 6, n)
    draws = {
        "a": rng.normal(0, 0.1, (CHAINS, DRAWS, 6)),
        "b": rng.normal(0, 0.1, (CHAINS, DRAWS, 2)),
        "s": rng.gamma(50, 1 / 25, (CHAINS, DRAWS)),
    }
    with pm.Model() as model:
        a, b = pm.Normal("a", shape=6), pm.Normal("b", shape=2)
        s = pm.Gamma("s", 2, 1)
        eta = a[group] + x @ b
        if family == "logistic":
            pm.Bernoulli("y", logit_p=eta, observed=rng.integers(0, 2, n))
        elif family == "binomial":
            pm.Binomial("y", 10, pm.math.invlogit(eta), observed=rng.integers(0, 11, n))
        elif family == "poisson":
            pm.Poisson("y", pt.exp(eta), observed=rng.poisson(1.0, n))
        elif family == "negative_binomial":
            pm.NegativeBinomial("y", mu=pt.exp(eta), alpha=s, observed=rng.poisson(1.0, n))
        elif family == "gamma":
            pm.Gamma("y", alpha=s, beta=s / pt.exp(eta), observed=rng.gamma(2.0, 0.5, n))
        elif family == "beta":
            mu = pm.math.invlogit(eta)
            pm.Beta("y", alpha=mu * 10 * s, beta=(1 - mu) * 10 * s, observed=rng.beta(2, 2, n))
        elif family == "zero_inflated":
            pm.ZeroInflatedPoisson("y", psi=0.7, mu=pt.exp(eta), observed=rng.poisson(1.0, n))
        elif family == "ordered":
            cutpoints = pt.as_tensor(np.array([-1.0, 0.0, 1.0]))
            pm.OrderedLogistic("y", eta, cutpoints + s - 2, observed=rng.integers(0, 4, n))
        elif family == "mixture":
            means = pt.stack([eta, eta + 1.0], axis=-1)
            pm.NormalMixture("y", w=[0.3, 0.7], mu=means, sigma=s, observed=x[:, 0])
        elif family == "student_by_group":
            pm.StudentT("y", nu=4, mu=eta, sigma=(s * pt.ones(6))[group], observed=x[:, 0])
    return model, draws


# --- PSIS of a block ----------------------------------------------------------------------


@pytest.mark.parametrize("pass_rows", [None, 7])
@pytest.mark.parametrize("reff", [1.0, 0.55])
@pytest.mark.parametrize("seed", [0, 1])
def test_psis_block_equals_arviz(seed, reff, pass_rows):
    """Heavy tails, ties (rounded values) and a constant column, against ArviZ's `loo`; in
    one pass, and in passes of 7 rows (the last one shorter)."""
    rng = np.random.default_rng(seed)
    n = 60
    scales = rng.gamma(1.0, 1.0, n)
    ll = rng.normal(size=(CHAINS, DRAWS, n)) * scales - 3 * rng.exponential(size=(CHAINS, DRAWS, n))
    ll[..., 3] = np.round(ll[..., 3], 1)
    ll[..., 4] = np.round(ll[..., 4])
    reference = _arviz_loo(_idata({"a": rng.normal(size=(CHAINS, DRAWS))}, {"y": ll}), reff=reff)
    block = np.ascontiguousarray(ll.reshape(CHAINS * DRAWS, n).T)
    workspace = None if pass_rows is None else _psis.Workspace(pass_rows, CHAINS * DRAWS)
    result = _psis.psis_loo_block(block, reff, workspace)
    _, _, _, r_elpd_i, r_k = _numbers(reference)
    np.testing.assert_allclose(result.elpd_i, r_elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.pareto_k, r_k, rtol=0, atol=1e-6)
    elpd, se, p = _psis.summary(result.elpd_i, result.lppd_i, GENERATION)
    np.testing.assert_allclose([elpd, se, p], _numbers(reference)[:3], rtol=1e-9)


def _arviz_rows(ll: np.ndarray, reff: float):
    """elpd_i, lppd_i and k of each row of `ll` (observations, draws) by the installed ArviZ's
    own per-observation functions."""
    n = ll.shape[1]
    out = []
    for row in ll:
        if GENERATION == 0:
            from arviz.stats.stats import _psislw
            from arviz.stats.stats_utils import logsumexp

            tail = int(np.ceil(min(n / 5.0, 3 * (n / reff) ** 0.5)))
            tiny = np.log(np.finfo(float).tiny)
            log_weights, k = _psislw(-row.copy(), -tail - 1, tiny, normalize=True)
            out.append((logsumexp(log_weights + row), logsumexp(row, b_inv=n), k))
        else:
            from arviz_stats.base import array_stats
            from scipy.special import logsumexp

            log_weights, k = array_stats._psislw(row.copy(), reff)
            out.append((logsumexp(log_weights + row), logsumexp(row, b=1 / n), k))
    return (np.array(column) for column in zip(*out))


def test_psis_block_extreme_rows_equal_arviz():
    """A draw at +inf, one at -inf, and one far below the rest (where a sum over the
    shifted weights would lose the others' digits): ArviZ's numbers, nan where ArviZ's."""
    rng = np.random.default_rng(4)
    ll = rng.normal(-1, 0.5, size=(5, CHAINS * DRAWS))
    ll[0, 17] = np.inf
    ll[1, 17] = -np.inf
    ll[2, 17] = -1e12
    ll[3, 17] = -1e300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = _psis.psis_loo_block(ll, 1.0)
        elpd_i, lppd_i, k = _arviz_rows(ll, 1.0)
    assert np.isnan(elpd_i[0])  # the case under test: ArviZ's nan
    np.testing.assert_allclose(result.elpd_i, elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.lppd_i, lppd_i, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.pareto_k, k, rtol=0, atol=1e-6)


def test_gpd_fit_drops_nan_grid_points_as_arviz():
    """A tail whose first quartile is subnormal: the grid's `b` overflows, every grid
    point's weight is nan, and ArviZ drops them all (k = 5 / (n + 10), sigma nan): the same
    here, where nan weights were kept (k nan or inf)."""
    ary = np.sort(np.r_[np.zeros(10), np.full(30, 5e-323), np.linspace(1e-300, 1, 60)])
    if GENERATION == 0:
        from arviz.stats.stats import _gpdfit

        ours = _psis._gpdfit_v0
    else:
        from arviz_stats.base import array_stats

        _gpdfit, ours = array_stats._gpdfit, _psis._gpdfit_v1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        k, sigma = _gpdfit(ary)
        k_ours, sigma_ours = ours(ary[None], np.empty(0))  # a buffer fits no row
    assert np.isfinite(k) and np.isnan(sigma)  # the case under test
    np.testing.assert_allclose(k_ours, [k], rtol=0, atol=1e-12)
    assert np.isnan(sigma_ours).all()


def test_psis_block_with_a_subnormal_tail_quartile_equals_arviz():
    """A row whose top draw dominates its tail by about 700 nats (the tail's first quartile
    subnormal): ArviZ's k, and its nan elpd_i (arviz-stats: the grid's weights all dropped
    and sigma nan)."""
    rng = np.random.default_rng(8)
    ll = rng.normal(-1, 0.5, size=(3, CHAINS * DRAWS))
    n_tail = 60  # arviz-stats' tail at 400 draws: 3 sqrt(400)
    ll[1, :n_tail] = -1000 - np.r_[0, np.linspace(-760, -690, n_tail - 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        elpd_i, lppd_i, k = _arviz_rows(ll, 1.0)
        result = _psis.psis_loo_block(ll, 1.0, _psis.Workspace(2, CHAINS * DRAWS))
    if GENERATION == 1:
        assert np.isnan(elpd_i[1])  # the case under test
    np.testing.assert_allclose(result.elpd_i, elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.lppd_i, lppd_i, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.pareto_k, k, rtol=0, atol=1e-6)


def test_psis_block_irregular_rows_warn_of_nothing_arviz_does_not():
    """Rows that go to ArviZ's own per-observation function (ties at the cutoff), and a row
    whose tail's first quartile is its minimum (arviz-stats fits nothing there; half its
    tail tied, it is a block row): ArviZ's numbers, and no warning that ArviZ's `loo` would
    not give (a fit of those rows, whose results were thrown away, warned of an invalid
    `log`)."""
    rng = np.random.default_rng(5)
    ll = rng.normal(-1, 0.5, size=(4, CHAINS * DRAWS))
    ll[1] = np.round(ll[1])  # ties at the cutoff
    ll[2] = np.round(ll[2] * 4) / 4
    n_tail = int(np.ceil(min(ll.shape[1] / 5.0, 3 * ll.shape[1] ** 0.5)))
    low = np.argsort(ll[3])[:n_tail]  # the tail: the lowest log-likelihoods
    ll[3, low[: n_tail // 2]] = -5.0  # half of it tied
    ll[3, low[n_tail // 2 :]] = np.linspace(-7.0, -5.5, n_tail - n_tail // 2)
    elpd_i, lppd_i, k = _arviz_rows(ll, 1.0)
    with warnings.catch_warnings():
        if GENERATION == 1:  # ArviZ 0.x's own functions warn there themselves
            warnings.simplefilter("error", RuntimeWarning)
        result = _psis.psis_loo_block(ll, 1.0)
    np.testing.assert_allclose(result.elpd_i, elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.lppd_i, lppd_i, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.pareto_k, k, rtol=0, atol=1e-6)


def test_psis_block_ties_inside_the_tail_are_smoothed_with_the_block(monkeypatch):
    """Tied draws inside a row's tail (float32's rounding makes them common) are smoothed
    with the block, not by ArviZ's per-observation function (a Python loop that holds the
    GIL, serialising the block's threads): ArviZ's numbers."""
    rng = np.random.default_rng(6)
    ll = rng.normal(-1, 0.5, size=(6, CHAINS * DRAWS))
    n_tail = int(np.ceil(min(ll.shape[1] / 5.0, 3 * ll.shape[1] ** 0.5)))
    for row in range(1, 6):  # the tail is the lowest log-likelihoods
        tail = np.argsort(ll[row])[: n_tail - 1]  # strictly inside: none at the cutoff
        ll[row, tail[1 :: row + 1]] = ll[row, tail[0 :: row + 1]][: len(tail[1 :: row + 1])]
    ll32 = ll.astype(np.float32)
    elpd_i, lppd_i, k = _arviz_rows(ll32.astype(float), 1.0)

    def refused(*args, **kwargs):
        raise AssertionError("a row with ties inside its tail went to ArviZ's own function")

    if GENERATION == 0:
        import arviz.stats.stats

        monkeypatch.setattr(arviz.stats.stats, "_psislw", refused)
    else:
        from arviz_stats.base import array_stats

        monkeypatch.setattr(array_stats, "_psislw", refused)
    result = _psis.psis_loo_block(ll32, 1.0)
    np.testing.assert_allclose(result.elpd_i, elpd_i, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result.lppd_i, lppd_i, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.pareto_k, k, rtol=0, atol=1e-6)


# --- pymc ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [None, 45, 250])
def test_hierarchical_equals_arviz(block_size):
    model, draws = hierarchical()
    idata, reference = _reference(model, draws)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the slice reached the data: no warning
        warnings.filterwarnings("ignore", "Estimated shape parameter")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=block_size)
    _assert_same(ours, reference)
    elpd_i = ours.loo_i if GENERATION == 0 else ours.elpd_i
    assert elpd_i.dims == ("obs",)


def test_on_an_accelerator_small_loo_runs_on_the_host(monkeypatch):
    """The policy (`_resources.loo_backend`): the caller's backend where named; on a CPU the
    default; on an accelerator the host CPU up to `host_values_per_core` a core, the
    device above. `loo` hands the engine what it decides, with ArviZ's numbers."""
    from pymc_chunkpost._engine.plan import resources as _resources

    monkeypatch.setattr(_resources, "cpu_cores", lambda: 4)
    limit = 4 * _resources.current().host_values_per_core
    monkeypatch.setattr(_resources.jax, "default_backend", lambda: "cpu")
    assert _resources.loo_backend(None, 10)[0] is None
    monkeypatch.setattr(_resources.jax, "default_backend", lambda: "tpu")
    assert _resources.loo_backend(None, limit)[0] == "cpu"
    assert _resources.loo_backend(None, limit + 1)[0] is None
    assert _resources.loo_backend("tpu", 10)[0] == "tpu"
    with pymc_chunkpost.configured(host_values_per_core=1):
        assert _resources.loo_backend(None, 5)[0] is None
    with monkeypatch.context() as patch:  # JAX started without its CPU backend

        def no_cpu(backend=None):
            raise RuntimeError(f"Unknown backend {backend}")

        patch.setattr(_resources.jax, "local_devices", no_cpu)
        assert _resources.loo_backend(None, 5) == (None, "no host CPU backend")
    backends = []
    evaluate = _loo.evaluate

    def recorded(jax_fn, inputs, options, label):
        backends.append(options.backend)
        return evaluate(jax_fn, inputs, options, label)

    monkeypatch.setattr(_loo, "evaluate", recorded)
    model, draws = hierarchical()
    idata, reference = _reference(model, draws)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=45)
    assert set(backends) == {"cpu"} and len(backends) >= 2
    _assert_same(ours, reference)


def test_progressbar_is_one_bar_over_the_observations(capsys):
    """`progressbar=True` shows one bar over the observations, at every one at the end
    (the last block overlaps the one before: not counted twice), and no engine bar of a
    block's draws."""
    model, draws = hierarchical()
    idata = _idata(draws)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Estimated shape parameter")
        pymc_chunkpost.loo(idata, model, block_size=250, progressbar=True)
        err = capsys.readouterr().err
        pymc_chunkpost.loo(idata, model, block_size=250, progressbar=False)
    assert "PSIS-LOO of 'y'" in err and "600/600" in err and "obs" in err
    assert "Log-likelihood of" not in err and "draw" not in err
    assert capsys.readouterr().err == ""


def test_psis_parts_are_capped_and_give_the_same_numbers(monkeypatch):
    """A host of many cores smooths in at most `psis_parts` threads, with ArviZ's numbers."""
    from pymc_chunkpost._support.config import configured

    model, draws = hierarchical()
    idata, reference = _reference(model, draws)
    pools, executor = [], _stats_loo.ThreadPoolExecutor

    def recorded(max_workers, thread_name_prefix):
        pools.append((thread_name_prefix, max_workers))
        return executor(max_workers, thread_name_prefix=thread_name_prefix)

    monkeypatch.setattr(_stats_loo, "cpu_cores", lambda: 12)
    monkeypatch.setattr(_stats_loo, "ThreadPoolExecutor", recorded)
    with warnings.catch_warnings(), configured(psis_parts=3):
        warnings.filterwarnings("ignore", "Estimated shape parameter")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True)
    _assert_same(ours, reference)
    assert ("loo-psis", 3) in pools


def test_observed_data_of_unknown_shape_equals_arviz():
    """Observed values in `pm.Data` have no static shape: the log-density's shape is
    computed (pytensor), and the numbers are still ArviZ's."""
    rng = np.random.default_rng(3)
    n = 150
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pm.Data("y_obs", rng.normal(size=n)))
    assert model["y"].type.shape == (None,)  # the case under test
    draws = {"mu": rng.normal(0, 0.1, (CHAINS, DRAWS))}
    idata, reference = _reference(model, draws)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=40)
    _assert_same(ours, reference)


@pytest.mark.parametrize("kind", ["censored", "truncated"])
def test_censored_and_truncated_normal_equal_arviz(kind):
    """A `Censored` normal (values at both bounds) and a `Truncated` one: their log-densities
    use erfcx and erfcinv, which pytensor 2.38 converts to JAX only with
    tensorflow-probability (`_compat.special_conversions`)."""
    rng = np.random.default_rng(16)
    n = 200
    x = rng.normal(size=n)
    with pm.Model() as model:
        a, b, s = pm.Normal("a"), pm.Normal("b"), pm.HalfNormal("s")
        mean = pm.Normal.dist(a + b * x, s)
        if kind == "censored":
            y = np.clip(0.3 + 0.8 * x + rng.normal(0, 0.7, n), -1.0, 1.5)
            assert (y == -1.0).any() and (y == 1.5).any()  # the case under test
            pm.Censored("y", mean, lower=-1.0, upper=1.5, observed=y)
        else:
            pm.Truncated("y", mean, lower=-1.0, observed=np.abs(rng.normal(0.5, 1, n)))
    draws = {
        "a": rng.normal(0.3, 0.05, (CHAINS, DRAWS)),
        "b": rng.normal(0.8, 0.05, (CHAINS, DRAWS)),
        "s": rng.gamma(50, 0.014, (CHAINS, DRAWS)),
    }
    idata, reference = _reference(model, draws)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Estimated shape parameter")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=45)
    _assert_same(ours, reference)


FAMILIES = [
    "logistic",
    "binomial",
    "poisson",
    "negative_binomial",
    "gamma",
    "beta",
    "zero_inflated",
    "ordered",
    "mixture",
    "student_by_group",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_checked_parameters_slice_and_equal_arviz(family):
    """pymc's checks over a vector of parameters go out of the blocks: no warning (each
    block's program computes its own observations alone), ArviZ's numbers."""
    model, draws = glm(family)
    idata, reference = _reference(model, draws)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", "Estimated shape parameter")
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=50)
    _assert_same(ours, reference)


def test_a_failed_check_makes_its_draw_minus_inf_in_every_block():
    """Where a check fails at a draw (a negative Poisson mean at one observation), pymc's
    log-likelihood is -inf at every observation of that draw: each block's is, though the
    block holds none of the failing observations."""
    from pymc_chunkpost._frontend.seam import Options, evaluate

    rng = np.random.default_rng(5)
    n = 120
    x = np.linspace(0.0, 1.0, n)
    with pm.Model() as model:
        a, b = pm.Normal("a"), pm.Normal("b")
        pm.Poisson("y", a + b * x, observed=rng.poisson(2.0, n))
    draws = {"a": rng.uniform(1.0, 3.0, (2, 20)), "b": rng.normal(0, 0.5, (2, 20))}
    draws["b"][0, 3] = draws["a"][0, 3] = -1.0  # mean < 0 at every observation
    draws["b"][1, 7] = -draws["a"][1, 7] - 0.1  # mean < 0 at the last observation alone
    idata = _idata(draws)
    expected = pm.compute_log_likelihood(
        idata, model=model, extend_inferencedata=False, progressbar=False
    )["y"].values
    assert np.isneginf(expected[0, 3]).all() and np.isneginf(expected[1, 7]).all()
    graph = _loo._LogpBlocks(model, "y", [draws[v.name] for v in model.free_RVs])
    options = Options(None, "auto", False, {"memory_budget": None})
    arrays = graph.block_inputs([draws[n] for n in graph.input_names], 40, options)
    assert len(arrays) == len(graph.input_names) + 1  # the check's outcome at each draw
    for start in (0, 40, 80):
        values, _ = evaluate(graph.block_function(start, 40), arrays, options, "block")
        block = expected[..., start : start + 40]
        np.testing.assert_array_equal(np.isneginf(values[0]), np.isneginf(block))
        np.testing.assert_allclose(values[0], block, rtol=1e-12)


@pytest.mark.parametrize("var_name", ["rows", "cells"])
def test_several_observed_and_multivariate(var_name):
    model, draws = multivariate()
    idata, reference = _reference(model, draws, var_name=var_name)
    ours = pymc_chunkpost.loo(idata, model, var_name=var_name, pointwise=True, block_size=16)
    _assert_same(ours, reference)


def test_unsliceable_graph_warns_and_gives_the_same_numbers():
    model, draws = cumulative()
    idata, reference = _reference(model, draws)
    with pytest.warns(UserWarning, match="could not be sliced"):
        ours = pymc_chunkpost.loo(idata, model, pointwise=True, block_size=25)
    _assert_same(ours, reference)


def test_reff_given_and_not_pointwise():
    model, draws = hierarchical(200)
    idata, reference = _reference(model, draws, reff=0.8)
    ours = pymc_chunkpost.loo(idata, model, pointwise=False, reff=0.8, block_size=64)
    np.testing.assert_allclose(_numbers(ours)[:3], _numbers(reference)[:3], rtol=1e-9)
    if GENERATION == 0:
        assert "pareto_k" not in ours.index and "loo_i" not in ours.index
    else:
        assert ours.pareto_k is None and ours.elpd_i is None


def test_log_weights_left_out_and_said():
    model, draws = hierarchical(100)
    ours = pymc_chunkpost.loo(_idata(draws), model, pointwise=True)
    if GENERATION == 0:
        assert "log_weights" not in ours.index
        assert "leaves out" in ours.attrs["log_weights"]
    else:
        assert ours.log_weights is None
        assert "leaves out" in ours.log_weights_note


def test_compare_ranks_and_weighs_as_arviz():
    """Two models of the same observations: `compare` of ours equals `compare` of ArviZ's."""
    model, draws = hierarchical(300)
    rng = np.random.default_rng(5)
    with pm.Model() as plain:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=_observed(model))
    plain_draws = {"mu": rng.normal(0, 0.05, (CHAINS, DRAWS))}
    results, references = {}, {}
    for label, (m, d) in {"hier": (model, draws), "plain": (plain, plain_draws)}.items():
        idata, references[label] = _reference(m, d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results[label] = pymc_chunkpost.loo(idata, m, pointwise=True, block_size=100)
    if GENERATION == 0:
        import arviz as az

        compare = az.compare
    else:
        from arviz_stats import compare
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = compare(results), compare(references)
    assert list(ours.index) == list(theirs.index)
    np.testing.assert_allclose(
        ours["weight"].astype(float), theirs["weight"].astype(float), rtol=1e-9
    )
    assert list(ours["rank"]) == list(theirs["rank"])


def _observed(model) -> np.ndarray:
    return model.rvs_to_values[model["y"]].data


# --- bad input ----------------------------------------------------------------------------


def test_bad_input_raises_before_work():
    model, draws = multivariate()
    with pytest.raises(ValueError, match="no `posterior` group"):
        pymc_chunkpost.loo({"a": 1}, model)
    idata = _idata(draws)
    with pytest.raises(ValueError, match="several observed variables"):
        pymc_chunkpost.loo(idata, model)
    with pytest.raises(ValueError, match="not an observed variable"):
        pymc_chunkpost.loo(idata, model, var_name="mu")
    wrong = _idata({**draws, "mu": draws["mu"][..., :2]})
    with pytest.raises(ValueError, match="has shape"):
        pymc_chunkpost.loo(wrong, model, var_name="rows")
    with pytest.raises(ValueError, match="block_size"):
        pymc_chunkpost.loo(idata, model, var_name="rows", block_size=0)


# --- memory -------------------------------------------------------------------------------


def test_memory_does_not_grow_with_observations(monkeypatch):
    """Under a fixed budget, 4x the observations: every block (what is alive besides the
    O(N) results) has the same size, within the budget, PSIS's buffers are made once a call
    and hold at most a block's rows, and numpy's peak allocations (tracemalloc sees them;
    XLA's own buffers it does not) grow by the O(N) results only."""
    import tracemalloc

    from pymc_chunkpost._support.config import current

    budget = 4 * 2**20
    seen: list[int] = []  # the blocks' starts
    workspaces: list[int] = []  # the rows of each of a call's PSIS buffers
    collected, workspace = _stats_loo._collected, _stats_loo.Workspace

    def block_spy(block, start):
        seen.append(start)
        return collected(block, start)

    def workspace_spy(n_obs, n_samples):
        workspaces.append(n_obs)
        return workspace(n_obs, n_samples)

    monkeypatch.setattr(_stats_loo, "_collected", block_spy)
    monkeypatch.setattr(_stats_loo, "Workspace", workspace_spy)
    peaks, sizes = {}, {}
    for n in (400, 1600):
        model, draws = hierarchical(n)
        idata = _idata(draws)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if n == 400:  # pymc's and pytensor's first-call caches, outside the measure
                pymc_chunkpost.loo(idata, model, memory_budget=budget)
            seen.clear()
            workspaces.clear()
            tracemalloc.start()
            pymc_chunkpost.loo(idata, model, pointwise=True, memory_budget=budget)
            peaks[n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert len(seen) > 1  # several blocks, smoothed in the buffers made once
        size = seen[1] - seen[0]
        assert 1 <= len(workspaces) <= current().psis_parts
        assert max(workspaces) <= current().psis_rows_per_pass and sum(workspaces) <= size
        sizes[n] = size
    expected = _stats_loo.choose_block_size((10**6,), CHAINS * DRAWS, budget, None)
    assert sizes[400] == sizes[1600] == expected
    assert sizes[400] * CHAINS * DRAWS * 8 * 6 <= budget
    per_observation = 64 * 8  # elpd_i, k, lppd_i, their DataArrays and the model's data
    assert peaks[1600] - peaks[400] <= 1200 * per_observation + 2**18, peaks
    assert peaks[400] <= 3 * budget, peaks


# --- numpyro ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_ndims", [1, 2])
def test_numpyro_equals_arviz(batch_ndims, capsys):
    numpyro = pytest.importorskip("numpyro")
    import jax.numpy as jnp
    import numpyro.distributions as dist
    from numpyro.infer import log_likelihood

    import pymc_chunkpost.numpyro as ours_numpyro

    rng = np.random.default_rng(7)
    x, y = rng.normal(size=300), rng.normal(size=300)

    def model(x, y=None):
        b = numpyro.sample("b", dist.Normal(0, 1))
        s = numpyro.sample("s", dist.HalfNormal(1))
        numpyro.sample("y", dist.Normal(b * x, s), obs=y)

    samples = {
        "b": jnp.asarray(rng.normal(0, 0.1, (CHAINS, DRAWS))),
        "s": jnp.asarray(rng.gamma(50, 1 / 50, (CHAINS, DRAWS))),
    }
    if batch_ndims == 1:  # one chain of all draws: ArviZ's reff is 1
        samples = {k: v.reshape(-1) for k, v in samples.items()}
    ll = log_likelihood(model, samples, x, y, batch_ndims=batch_ndims)

    def chains(v):
        v = np.asarray(v)
        return v[None] if batch_ndims == 1 else v

    reference = _arviz_loo(
        _idata({k: chains(v) for k, v in samples.items()}, {"y": chains(ll["y"])})
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = ours_numpyro.loo(
            model,
            samples,
            x,
            y,
            batch_ndims=batch_ndims,
            pointwise=True,
            block_size=70,
            progressbar=True,
        )
    _assert_same(ours, reference)
    err = capsys.readouterr().err
    assert "PSIS-LOO of 'y'" in err and "300/300" in err and "draw" not in err


_FLOAT32_NUMPYRO = """
import json, warnings
import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
from numpyro.infer import log_likelihood
import pymc_chunkpost.numpyro as ours_numpyro
assert not jax.config.jax_enable_x64  # the case under test: numpyro's default
rng = np.random.default_rng(7)
x, y = rng.normal(size=300), rng.normal(size=300)
def model(x, y=None):
    b = numpyro.sample("b", dist.Normal(0, 1))
    s = numpyro.sample("s", dist.HalfNormal(1))
    numpyro.sample("y", dist.Normal(b * x, s), obs=y)
samples = {"b": jnp.asarray(rng.normal(0, 0.1, (4, 100)), jnp.float32),
           "s": jnp.asarray(rng.gamma(50, 1 / 50, (4, 100)), jnp.float32)}
ll = np.asarray(log_likelihood(model, samples, x, y, batch_ndims=2)["y"])
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ours = ours_numpyro.loo(model, samples, x, y, batch_ndims=2, pointwise=True, block_size=70)
k = ours.pareto_k.values
elpd_i = (ours.loo_i if hasattr(ours, "loo_i") else ours.elpd_i).values
draws = {name: np.asarray(v).tolist() for name, v in samples.items()}
out = {"ll": ll.tolist(), "dtype": str(ll.dtype), "k": k.tolist(), "elpd_i": elpd_i.tolist()}
print(json.dumps(out | draws))
"""


@pytest.mark.slow  # a fresh process: x64 off, as numpyro runs by default
def test_numpyro_float32_is_smoothed_in_float64():
    """NumPyro's default float32 log-likelihood: ours smooths it in float64, equal to ArviZ's
    `loo` on the same values cast to float64; ArviZ's on the float32 matrix computes in
    float32, and differs from both at float32's precision."""
    import json
    import subprocess
    import sys

    pytest.importorskip("numpyro")
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    done = subprocess.run(
        [sys.executable, "-c", _FLOAT32_NUMPYRO],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "float32"
    posterior = {"b": np.asarray(out["b"]), "s": np.asarray(out["s"])}
    ll32 = np.asarray(out["ll"], dtype=np.float32)
    in64 = _numbers(_arviz_loo(_idata(posterior, {"y": ll32.astype(np.float64)})))
    in32 = _numbers(_arviz_loo(_idata(posterior, {"y": ll32})))
    np.testing.assert_allclose(out["elpd_i"], np.asarray(in64[3]), rtol=0, atol=1e-8)
    np.testing.assert_allclose(out["k"], np.asarray(in64[4]), rtol=0, atol=1e-6)
    # ArviZ's float32 arithmetic: within float32's precision, not float64's.
    np.testing.assert_allclose(out["elpd_i"], np.asarray(in32[3]), rtol=0, atol=1e-5)
    assert np.abs(np.asarray(out["k"]) - np.asarray(in32[4])).max() < 1e-2


def test_compute_log_likelihood_memory_error_names_loo():
    model, draws = hierarchical(400)
    with pytest.raises(MemoryError, match=r"pymc_chunkpost\.loo"):
        pymc_chunkpost.compute_log_likelihood(
            _idata(draws), model=model, memory_budget=10_000, progressbar=False
        )
