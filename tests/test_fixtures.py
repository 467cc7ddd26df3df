"""The profiling fixtures: shapes, seeding, `jax_fn` against PyTensor, user-model loading."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from pymc.sampling.jax import _postprocess_samples

from pymc_chunkpost.profiling.fixtures import (
    FIXTURES,
    ZOO,
    jax_fn,
    load_draws,
    load_model,
    output_names,
    output_vars,
    raw_draws,
)


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def built(request):
    return request.param, FIXTURES[request.param].build()


def test_registry_has_the_required_fixtures():
    required = {"eight_schools", "wide", "hierarchical", "gp", "big_det", "many_scalars"}
    assert required <= set(FIXTURES)


def test_the_zoo_holds_every_kind():
    # Issue 12's kinds; the zoo benchmark runs exactly these.
    kinds = {
        "row-indexed hierarchical": "radon_slopes",
        "varying intercepts and slopes per row": "varying_slopes",
        "dense basis": "basis",
        "Cholesky GP": "gp",
        "cumsum time series": "random_walk",
        "softmax over classes": "softmax",
        "LKJ/MvNormal": "lkj",
        "mixture": "mixture",
        "ZeroSum and simplex": "zerosum_simplex",
        "many scalars": "many_scalars",
        "large pm.Data": "big_data",
        "integer deterministics": "integer_dets",
        "eight schools": "eight_schools",
    }
    assert set(kinds.values()) <= set(ZOO) <= set(FIXTURES)
    assert len(set(ZOO)) == len(ZOO) >= 12


def test_zoo_transforms_and_dtypes():
    # The kinds that a transform or a dtype defines really have it.
    def transforms(name):
        model = FIXTURES[name].build()
        return {type(t).__name__ for t in model.rvs_to_transforms.values() if t is not None}

    assert "ZeroSumTransform" in transforms("zerosum_simplex")
    assert "SimplexTransform" in transforms("zerosum_simplex")
    assert {"SimplexTransform", "Ordered"} <= transforms("mixture")
    model = FIXTURES["integer_dets"].build()
    dtypes = {v.name: v.dtype for v in output_vars(model)}
    assert dtypes["rank"] == dtypes["best"] == dtypes["n_positive"] == "int64"


@pytest.mark.slow  # builds every fixture model
def test_raw_draws_shapes_and_seeding(built):
    _, model = built
    point = model.initial_point()
    draws = raw_draws(model, 2, 3, seed=1)
    assert [x.shape for x in draws] == [(2, 3) + point[v.name].shape for v in model.value_vars]
    assert [x.dtype for x in draws] == [point[v.name].dtype for v in model.value_vars]
    again, other = raw_draws(model, 2, 3, seed=1), raw_draws(model, 2, 3, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(draws, again))
    assert not any(np.array_equal(a, b) for a, b in zip(draws, other))


@pytest.mark.slow  # pytensor compiles every fixture model (many_scalars: minutes)
def test_jax_fn_matches_pytensor(built):
    # The per-draw function against PyTensor's own (C/Python) evaluation of the same outputs.
    # Different backends and LAPACK routines: the GP's jittered 100 x 100 Cholesky is
    # ill-conditioned and differs by ~6e-10, hence the looser tolerance.
    name, model = built
    draws = raw_draws(model, 1, 2, seed=0)
    outputs = _postprocess_samples(jax_fn(model), draws, None, "vmap")
    names = output_names(model)
    assert len(outputs) == len(names)
    reference = model.compile_fn(
        output_vars(model), inputs=model.value_vars, point_fn=False, on_unused_input="ignore"
    )
    for d in range(2):
        expected = reference(*[x[0, d] for x in draws])
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(np.asarray(got)[0, d], want, rtol=1e-7, atol=1e-8)


@pytest.mark.slow  # real sampling
def test_output_names_match_what_pymc_samples():
    model = FIXTURES["eight_schools"].build()
    with model:
        idata = pm.sample(
            draws=5,
            tune=5,
            chains=1,
            nuts_sampler="numpyro",
            progressbar=False,
            random_seed=0,
            compute_convergence_checks=False,
        )
    assert sorted(output_names(model)) == sorted(idata.posterior.data_vars)


def test_load_model_from_builder_file_and_pickle(tmp_path):
    source = tmp_path / "user_model.py"
    source.write_text(
        "import pymc as pm\n"
        "def build():\n"
        "    with pm.Model() as m:\n"
        "        pm.HalfNormal('s', 1.0, shape=3)\n"
        "    return m\n"
    )
    model = load_model(f"{source}:build")
    assert [v.name for v in model.value_vars] == ["s_log__"]
    pickled = tmp_path / "model_pm.p"
    pickled.write_bytes(cloudpickle.dumps(model))
    assert [v.name for v in load_model(str(pickled)).value_vars] == ["s_log__"]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_such_fixture", "Cannot load a model"),
        ("missing.py:build", "does not exist"),
        ("missing.p", "does not exist"),
    ],
)
def test_load_model_rejects_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        load_model(spec)


def test_load_model_rejects_missing_builder(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("x = 1\n")
    with pytest.raises(ValueError, match="no callable 'build'"):
        load_model(f"{source}:build")


def test_load_draws_by_name_and_by_position(tmp_path):
    model = FIXTURES["eight_schools"].build()
    draws = raw_draws(model, 2, 4, seed=0)
    names = [v.name for v in model.value_vars]
    np.savez(tmp_path / "named.npz", **dict(zip(names, draws)))
    np.savez(tmp_path / "positional.npz", *draws)
    for path in ("named.npz", "positional.npz"):
        loaded = load_draws(model, tmp_path / path)
        assert all(np.array_equal(a, b) for a, b in zip(loaded, draws))


def test_load_draws_rejects_wrong_shapes(tmp_path):
    model = FIXTURES["eight_schools"].build()
    draws = raw_draws(model, 2, 4, seed=0)
    draws[-1] = draws[-1][..., :7]
    np.savez(tmp_path / "bad.npz", *draws)
    with pytest.raises(ValueError, match="expected"):
        load_draws(model, tmp_path / "bad.npz")


@pytest.mark.parametrize("chains, draws", [(0, 5), (2, 0), (2.5, 5)])
def test_raw_draws_rejects_bad_counts(chains, draws):
    model = FIXTURES["eight_schools"].build()
    with pytest.raises(ValueError, match="positive int"):
        raw_draws(model, chains, draws, seed=0)


def test_demo_fixture_shows_the_problem():
    # The demo's claim, from XLA's own memory analysis at the demo's size (no 1 GB run):
    # pymc's default holds several times the outputs' bytes; `auto` stays near them.
    import jax

    import pymc_chunkpost as pc

    fixture = FIXTURES["demo_basis_grid"]
    model = fixture.build()
    fn = jax_fn(model)
    raw = [jax.numpy.asarray(x) for x in fixture.raw_draws(model)]

    def pymc_default(samples):
        return _postprocess_samples(fn, samples, None, "vmap")

    floor = sum(y.size * y.dtype.itemsize for y in jax.eval_shape(pymc_default, raw))
    analysis = jax.jit(pymc_default).lower(raw).compile().memory_analysis()
    assert analysis.temp_size_in_bytes > 8 * floor
    plan = pc.plan(fn, raw)
    assert plan.strategy != "vmap"
    assert floor <= plan.peak_bytes < 1.2 * floor
