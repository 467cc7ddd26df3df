"""`pymc_chunkpost.numpyro.patch`: numpyro's public names routed to the engine.

The routed calls are compared bit for bit with numpyro's own, unpatched, on the same
arguments: ArviZ's `from_numpyro` (its log-likelihood) after a short NUTS run, and
`numpyro.infer.Predictive` called by that name. numpyro's objects must be back, the very
ones, after `unpatch` and after a `with patched()` block, even one that raised.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("numpyro")

import numpyro.infer.util  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro_models import MODELS  # noqa: E402

from pymc_chunkpost import numpyro as ours  # noqa: E402
from pymc_chunkpost._numpyro import routes as _numpyro  # noqa: E402
from pymc_chunkpost._numpyro.patch import TARGETS  # noqa: E402

OWN = {name: getattr(numpyro.infer.util, name) for name in ("Predictive", "log_likelihood")}


def _current() -> dict:
    import importlib

    return {(m, n): getattr(importlib.import_module(m), n) for m, n in TARGETS}


@pytest.fixture(autouse=True)
def _unpatched():
    """Every test starts and ends with numpyro's own objects in place."""
    ours.unpatch()
    assert _current() == {(m, n): OWN[n] for m, n in TARGETS}
    yield
    ours.unpatch()


@pytest.fixture
def engine_calls(monkeypatch):
    """How many maps the engine ran (each routed call runs at least one)."""
    calls = []
    original = _numpyro._map

    def counted(*args, **kwargs):
        calls.append(kwargs.get("label", args[5] if len(args) > 5 else None))
        return original(*args, **kwargs)

    monkeypatch.setattr(_numpyro, "_map", counted)
    return calls


def _prior(name: str, draws: int = 24) -> tuple:
    model, args = MODELS[name]
    prior = OWN["Predictive"](model, num_samples=draws)(jax.random.PRNGKey(1), *args)
    latent = {k: v for k, v in prior.items() if k != "y"}
    return model, args, latent, prior["y"][0]


def test_patch_replaces_every_target_and_unpatch_puts_numpyros_own_back():
    ours.patch()
    assert ours.is_patched()
    replaced = _current()
    assert all(replaced[(m, n)] is not OWN[n] for m, n in TARGETS)
    assert issubclass(numpyro.infer.Predictive, ours.Predictive)
    # One routed object per name, whichever module spells it.
    assert numpyro.infer.Predictive is numpyro.infer.util.Predictive
    ours.unpatch()
    assert not ours.is_patched()
    assert _current() == {(m, n): OWN[n] for m, n in TARGETS}
    ours.unpatch()  # a second unpatch does nothing
    assert _current() == {(m, n): OWN[n] for m, n in TARGETS}


def test_patched_block_restores_numpyro_even_when_the_body_raises():
    with pytest.raises(RuntimeError, match="in the body"):
        with ours.patched(chunk_size=5):
            assert numpyro.infer.log_likelihood is not OWN["log_likelihood"]
            raise RuntimeError("in the body")
    assert not ours.is_patched()
    assert _current() == {(m, n): OWN[n] for m, n in TARGETS}


def test_nested_patched_block_restores_the_outer_options():
    model, args, draws, _ = _prior("eight_schools")
    key = jax.random.PRNGKey(3)
    with ours.patched(chunk_size=5):
        with ours.patched(chunk_size=7):
            inner = numpyro.infer.Predictive(model, draws)
            inner(key, *args)
        outer = numpyro.infer.Predictive(model, draws)
        outer(key, *args)
        assert ours.is_patched()
    assert (inner.plan.chunk_size, outer.plan.chunk_size) == (7, 5)
    assert not ours.is_patched()


def test_routed_predictive_equals_numpyros_and_takes_the_patchs_options(engine_calls):
    model, args, draws, _ = _prior("hierarchical")
    key = jax.random.PRNGKey(5)
    reference = OWN["Predictive"](model, draws)(key, *args)
    with ours.patched(chunk_size=5, output_memory="host"):
        predictive = numpyro.infer.Predictive(model, draws)
        result = predictive(key, *args)
        # A caller's own option overrides the patch's.
        overridden = numpyro.infer.Predictive(model, draws, chunk_size=7)
        again = overridden(key, *args)
    assert engine_calls
    assert predictive.plan.chunk_size == 5 and overridden.plan.chunk_size == 7
    assert isinstance(result["y"], np.ndarray)  # output_memory="host": numpy arrays
    for out in (result, again):
        assert set(out) == set(reference)
        for k in reference:
            np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(reference[k]))


def test_routed_log_likelihood_passes_model_keywords_through(engine_calls):
    model, args, draws, y = _prior("logistic")
    reference = OWN["log_likelihood"](model, draws, *args, y=y)
    with ours.patched(chunk_size=5):
        result = numpyro.infer.util.log_likelihood(model, draws, *args, y=y)
    assert engine_calls == ["Log-likelihood"]
    np.testing.assert_array_equal(np.asarray(result["y"]), np.asarray(reference["y"]))


def test_bad_options_raise_before_anything_is_patched():
    with pytest.raises(ValueError, match="Unknown option.*'parallel'.*chunk_size"):
        ours.patch(parallel=True)
    with pytest.raises(ValueError, match="chunk_size"):
        ours.patch(chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        with ours.patched(chunk_size=-1):
            pytest.fail("the body must not run")
    assert not ours.is_patched()
    assert _current() == {(m, n): OWN[n] for m, n in TARGETS}


def test_someone_elses_replacement_is_left_alone(monkeypatch):
    def theirs(*args, **kwargs):
        raise AssertionError("not ours to call")

    monkeypatch.setattr(numpyro.infer, "log_likelihood", theirs)
    ours.patch()
    assert numpyro.infer.log_likelihood is theirs
    assert numpyro.infer.util.log_likelihood is not OWN["log_likelihood"]
    ours.unpatch()
    assert numpyro.infer.log_likelihood is theirs
    assert numpyro.infer.util.log_likelihood is OWN["log_likelihood"]
    # Replaced after ours: unpatch leaves it, and a second patch does not overwrite it.
    # (monkeypatch records numpyro's own here, to put back at teardown.)
    monkeypatch.setattr(numpyro.infer.util, "log_likelihood", OWN["log_likelihood"])
    ours.patch()
    numpyro.infer.util.log_likelihood = theirs
    ours.patch(chunk_size=5)
    assert numpyro.infer.util.log_likelihood is theirs
    ours.unpatch()
    assert numpyro.infer.util.log_likelihood is theirs
    assert numpyro.infer.util.Predictive is OWN["Predictive"]


def test_a_routed_object_left_behind_is_recognised_as_ours():
    """A routed object put back after `unpatch` (a monkeypatch teardown, a module that bound
    the name while patched and hands it on) is replaced by `patch` and removed by
    `unpatch`, as the patch's own."""
    ours.patch(chunk_size=5)
    stale = numpyro.infer.log_likelihood
    ours.unpatch()
    numpyro.infer.log_likelihood = stale
    try:
        assert not ours.is_patched()
        ours.unpatch()  # not patched, yet a routed object stands: numpyro's goes back
        assert numpyro.infer.log_likelihood is OWN["log_likelihood"]
        numpyro.infer.log_likelihood = stale
        ours.patch(chunk_size=7)
        assert numpyro.infer.log_likelihood is numpyro.infer.util.log_likelihood
        assert numpyro.infer.log_likelihood is not stale
    finally:
        ours.unpatch()
    assert numpyro.infer.log_likelihood is OWN["log_likelihood"]


def _log_likelihood_group(idata) -> dict:
    """The log-likelihood group of ArviZ 0.x's InferenceData or ArviZ 1's DataTree."""
    group = idata["log_likelihood"]
    dataset = group.to_dataset() if hasattr(group, "to_dataset") else group
    return {k: np.asarray(v.values) for k, v in dataset.data_vars.items()}


def test_arviz_from_numpyro_log_likelihood_runs_on_the_engine(engine_calls):
    az = pytest.importorskip("arviz")
    model, (sigma,) = MODELS["eight_schools"]
    y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
    mcmc = MCMC(
        NUTS(model),
        num_warmup=30,
        num_samples=40,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), sigma, y=y)
    reference = _log_likelihood_group(az.from_numpyro(mcmc, log_likelihood=True))
    assert not engine_calls
    with ours.patched(chunk_size=16):
        routed = _log_likelihood_group(az.from_numpyro(mcmc, log_likelihood=True))
    assert engine_calls == ["Log-likelihood"]
    assert set(routed) == set(reference) == {"y"}
    assert routed["y"].shape == reference["y"].shape == (2, 40, 8)
    np.testing.assert_array_equal(routed["y"], reference["y"])


@pytest.mark.parametrize("routed", [False, True])
def test_numpyros_warnings_point_at_the_callers_line(routed):
    """The deprecation and batch-size warnings name this file, the caller's, whether the
    class is ours directly or routed through numpyro's name (one more frame of ours)."""
    model, _, draws, _ = _prior("hierarchical")
    if routed:
        ours.patch()
    predictive = numpyro.infer.Predictive if routed else ours.Predictive
    with pytest.warns(FutureWarning, match="exclude_deterministic") as record:
        predictive(model, draws, exclude_deterministic=True)
    with pytest.warns(UserWarning, match="num_samples") as more:
        p = predictive(model, draws, num_samples=3)
    with pytest.warns(FutureWarning, match="exclude_deterministic") as read:
        p.exclude_deterministic  # noqa: B018
    for warning in [*record, *more, *read]:
        assert warning.filename == __file__, warning.filename
