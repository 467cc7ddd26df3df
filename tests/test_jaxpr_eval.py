"""`_jaxpr_eval.draw_major_fun`: the same values as the jaxpr, and draw-major products."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import assert_same, compile_for, reference
from jax.extend.core import jaxpr_as_fun

from pymc_chunkpost._engine.execute.program import flattens_vmap
from pymc_chunkpost._engine.kernels.jaxpr_eval import draw_major_fun
from pymc_chunkpost._support.config import current

RNG = np.random.default_rng(0)
X = RNG.normal(size=(300, 4))  # data: the per-draw function's constants
W = RNG.normal(size=(5, 3, 4))


@jax.jit
def nested_dot(a, b):  # a jitted helper, as `jnp` functions are: inlined by the evaluator
    return jnp.tensordot(a, b, axes=([2], [0]))


def per_draw(beta, m, v):
    return [
        X @ beta,  # data times a vector: no free dimension of the draw's
        X @ m,  # data times a matrix: free dimensions on both sides
        jnp.einsum("ijk,kl->ijl", W, m),  # several free dimensions of the data's
        nested_dot(W, m),  # inside a nested jit
        m.T @ X.T,  # the draw first already: left as it is
        jnp.outer(beta, beta) @ v,  # both depend on the draw: left as it is
        jnp.sum(X, axis=0) @ beta,  # a contraction to a scalar
    ]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_same_values_as_the_jaxpr(dtype):
    args = [
        RNG.normal(size=(2, 7, 4)).astype(dtype),
        RNG.normal(size=(2, 7, 4, 2)).astype(dtype),
        RNG.normal(size=(2, 7, 4)).astype(dtype),
    ]
    specs = [jax.ShapeDtypeStruct(a.shape[2:], a.dtype) for a in args]
    closed = jax.make_jaxpr(per_draw)(*specs)
    want = jax.vmap(jax.vmap(jaxpr_as_fun(closed)))(*args)
    got = jax.jit(jax.vmap(jax.vmap(draw_major_fun(closed))))(*args)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol)


def test_a_regression_mean_needs_no_temporary_as_large_as_the_outputs(built):
    """`mu = data @ beta` over every draw: XLA's temporaries stay far below the outputs.

    Plain `jax.vmap` computes it data-major, `[rows, draws]`, and transposes it into the
    outputs through a temporary as large as them."""
    model, jax_fn = built("data_regression")
    raw = models.raw_draws(model, 4, 500)
    exe = compile_for(jax_fn, raw, "vmap")
    assert exe.temp_bytes < exe.problem.output_bytes / 10, exe.temp_bytes
    specs = [jax.ShapeDtypeStruct(x.shape[2:], x.dtype) for x in raw]
    plain = jax.jit(jax.vmap(jax.vmap(jaxpr_as_fun(jax.make_jaxpr(jax_fn)(*specs)))))
    temps = plain.lower(*raw).compile().memory_analysis().temp_size_in_bytes
    assert temps > exe.problem.output_bytes / 2, "plain vmap no longer transposes: drop this"
    outputs, _ = _run(jax_fn, raw)
    assert_same(outputs, reference(jax_fn, raw), rtol=1e-12)


def _run(jax_fn, raw):
    from pymc_chunkpost._engine.call import postprocess as _postprocess

    return _postprocess.run(jax_fn, [jnp.asarray(x) for x in raw], None, "vmap")


def _gathered(fn, *shapes):
    from pymc_chunkpost._engine.data.problem import _gathered_bytes

    closed = jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(s, np.float64) for s in shapes])
    return _gathered_bytes(closed.jaxpr, [True] * len(shapes))


def test_gathered_bytes_are_read_from_the_jaxpr():
    idx = np.array([0, 2, 2, 1])
    assert _gathered(lambda a: a[idx], (3,)) == 4 * 8
    assert _gathered(lambda a: jax.jit(lambda b: b[idx] + 1.0)(a), (3,)) == 4 * 8  # nested
    assert _gathered(lambda a: jnp.zeros(3).at[idx].add(a), (4,)) == 3 * 8  # a scatter
    assert _gathered(lambda a: (a[idx], a[idx[:2]]), (3,)) == 6 * 8  # every gather counts
    assert _gathered(lambda a: X[idx] * a, (4,)) == 0  # from the data only
    assert _gathered(lambda a: X @ a, (4,)) == 0


def test_only_large_gathers_flatten_the_vmap():
    """A row-indexed mean over every draw flattens the chain x draw axis; an ordered
    transform's 3-element scatter (the mixture) keeps pymc's vmap of a vmap."""
    from pymc_chunkpost.profiling import fixtures

    mixture = fixtures.mixture()
    jax_fn = models.jax_fn(mixture)
    raw = models.raw_draws(mixture, 4, 250)
    problem = compile_for(jax_fn, raw, "vmap").problem
    threshold = current().flatten_min_gathered_bytes
    assert 0 < problem.n_local * problem.gathered_bytes < threshold
    assert not flattens_vmap(problem)
    outputs, _ = _run(jax_fn, raw)
    assert_same(outputs, reference(jax_fn, raw), rtol=1e-12)
    problem = dataclasses.replace(problem, gathered_bytes=threshold)
    assert flattens_vmap(problem)


def test_a_row_indexed_mean_is_written_in_place():
    """`intercept[unit] + slope[unit] * x` over every draw: one batch dimension (the flattened
    chain x draw axis) lets XLA write it straight into the outputs; pymc's vmap of a vmap
    lays it out transposed and copies it through a temporary as large as them."""
    import pymc as pm

    rng = np.random.default_rng(3)
    unit, x = rng.integers(0, 50, 3000), rng.normal(size=3000)
    with pm.Model() as model:
        intercept = pm.Normal("intercept", shape=50)
        slope = pm.Normal("slope", shape=(2, 50))
        pm.Deterministic("mu", intercept[unit] + slope[1, unit] * x)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 250)
    exe = compile_for(jax_fn, raw, "vmap")
    assert flattens_vmap(exe.problem)
    assert exe.temp_bytes < exe.problem.output_bytes / 10, exe.temp_bytes
    nested = jax.jit(jax.vmap(jax.vmap(jax_fn))).lower(*raw).compile()
    temps = nested.memory_analysis().temp_size_in_bytes
    assert temps > exe.problem.output_bytes / 2, "nested vmap no longer copies: drop this"
    outputs, _ = _run(jax_fn, raw)
    assert_same(outputs, reference(jax_fn, raw), rtol=1e-12)


def _dots_of(fun, *args):
    """(operand shapes, precision) of each `dot_general` that vmapped `fun` traces to."""
    closed = jax.make_jaxpr(jax.vmap(fun))(*args)
    return [
        ([tuple(v.aval.shape) for v in eqn.invars], eqn.params.get("precision"))
        for eqn in closed.jaxpr.eqns
        if eqn.primitive.name == "dot_general"
    ]


def test_the_draw_comes_first_with_its_settings():
    """Per operand settings swap with the operands; the equation's context is kept; a call's
    outputs that do not read the draw stay data."""
    from jax.experimental.xla_metadata import set_xla_metadata

    beta = jnp.ones((7, 4))
    high = (jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT)
    closed = jax.make_jaxpr(lambda b: [jax.lax.dot(X, b, precision=high)])(beta[0])
    ((shapes, precision),) = _dots_of(draw_major_fun(closed), beta)
    assert shapes == [(7, 4), (300, 4)] and precision == high[::-1]

    def tagged(b):
        with set_xla_metadata(my_tag="kept"):
            return [X @ b]

    closed = jax.make_jaxpr(tagged)(beta[0])
    text = jax.jit(jax.vmap(draw_major_fun(closed))).lower(beta).as_text()
    assert "my_tag" in text

    helper = jax.jit(lambda b: (jnp.asarray(X) * 2.0, b + 1.0))

    def via_call(b):
        data, b1 = helper(b)
        return [data @ b1]

    closed = jax.make_jaxpr(via_call)(beta[0])
    ((shapes, _),) = _dots_of(draw_major_fun(closed), beta)
    assert shapes == [(7, 4), (300, 4)]


def test_gathers_inside_control_flow_and_other_scatters_count():
    idx = np.array([0, 2, 2, 1])
    both = _gathered(lambda a: jax.lax.cond(a[0] > 0, lambda x: x[idx], lambda x: -x[idx], a), (3,))
    assert both == 2 * 4 * 8  # each branch's gather, as either may run
    assert _gathered(lambda a: jnp.ones(3).at[idx].multiply(a), (4,)) == 3 * 8
    assert _gathered(lambda a: jax.lax.cond(a[0] > 0, lambda x: x * 2, lambda x: x, a), (3,)) == 0


# --------------------------------------------------------------------------------------------
# `DrawFunction.over_draws`: elementwise equations bound on the draws' arrays directly.


@jax.jit
def _scaled_exp(a, s):  # a jitted helper: inlined, its elementwise equations bound directly
    return jnp.exp(a) * s


def mixed(a, b, k):
    """Every case of `_broadcastable` and `_schedule`: data, literals, batched scalars among
    arrays, a nested call, equations for the tail (a cumulative sum, a select, a data
    product) and elementwise ones that read it, outputs that are literals, data or an
    input."""
    c = jnp.cumsum(a)
    return [
        a,  # an input, passed through
        1.0,  # a literal
        jnp.asarray(X[0]) * 2.0,  # data only: broadcast over the draws
        jnp.exp(a) + X[0, :3],  # an array of data
        b * a + 3.0,  # a batched scalar among arrays, and a literal
        c * jnp.log1p(b),  # after a run
        jnp.where(a > 0, c, -c),  # a select: a run that reads the elementwise results
        _scaled_exp(a, b),
        (X[:, :3] @ a) - b,  # the draw-major product, in a run
        a.astype(np.int32) + k,  # integers
        jnp.maximum(k, 2),  # integers: a batched scalar and a literal
    ]


def _mixed_args(dtype, n):
    lead = (2, 5)[-n:] if n == 1 else (2, 5)
    return [
        RNG.normal(size=lead + (3,)).astype(dtype),
        RNG.normal(size=lead).astype(dtype),
        RNG.integers(-3, 3, size=lead).astype(np.int32),
    ]


@pytest.fixture
def every_equation_scheduled(configure):
    """`over_draws` takes its schedule on every jaxpr, whether it pays or not."""
    configure(eqns_per_run=0)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_over_draws_is_vmap_bit_for_bit(n, dtype, every_equation_scheduled):
    from pymc_chunkpost._engine.kernels.jaxpr_eval import vmap_draws

    args = _mixed_args(dtype, n)
    specs = [jax.ShapeDtypeStruct(a.shape[n:], a.dtype) for a in args]
    closed = jax.make_jaxpr(mixed)(*specs)
    fun = draw_major_fun(closed)
    kinds = {step.kind for step in fun.schedule.steps}
    assert kinds == {"data", "elementwise", "call"} and fun.schedule.tail, fun.schedule
    want = jax.jit(vmap_draws(fun.__call__, n))(*args)  # plain nested vmaps, per draw
    got = jax.jit(fun.over_draws(n))(*args)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, i
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"output {i}")
    values = jax.vmap(jax.vmap(jaxpr_as_fun(closed))) if n == 2 else jax.vmap(jaxpr_as_fun(closed))
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for g, w in zip(got, values(*args), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol)


def test_many_scalars_bind_directly_and_mixed_models_keep_vmap():
    """The schedule is taken where the equations bound directly pay for the tail
    (`eqns_per_run`): hundreds of scalars, each transformed, bind directly; a model whose
    elementwise equations come after slices and reductions keeps `jax.vmap`."""

    def scalars(*xs):
        return [jnp.exp(x) + 1.0 for x in xs] + [sum(xs)]

    closed = jax.make_jaxpr(scalars)(*[jax.ShapeDtypeStruct((), np.float64)] * 50)
    schedule = draw_major_fun(closed).schedule
    assert not schedule.tail and schedule.elementwise == 150, schedule  # exp, add, sum
    assert schedule.pays

    def logsumexps(a):
        outs = []
        for k in range(4):
            m = jnp.max(a[k])
            outs.append(m + jnp.log(jnp.sum(jnp.exp(a[k] - m))))
        return outs

    closed = jax.make_jaxpr(logsumexps)(jax.ShapeDtypeStruct((4, 6), np.float64))
    fun = draw_major_fun(closed)
    assert fun.schedule.tail and fun.schedule.elementwise < current().eqns_per_run, fun.schedule
    assert not fun.schedule.pays
    a = RNG.normal(size=(3, 4, 6))
    np.testing.assert_array_equal(
        np.asarray(jax.jit(fun.over_draws(1))(a)[0]), np.asarray(jax.vmap(fun)(a)[0])
    )


def test_what_reads_the_tail_joins_it():
    """Elementwise equations that do not read the tail bind directly, wherever they stand;
    one that reads it is computed in it."""

    def fun(a):
        e = jnp.exp(a)
        c1, c2 = jax.lax.cumsum(a), jax.lax.cumsum(e)
        return [jnp.log1p(a), c1 * c2]

    closed = jax.make_jaxpr(fun)(jax.ShapeDtypeStruct((5,), np.float64))
    schedule = draw_major_fun(closed).schedule
    assert [s.eqn.primitive.name for s in schedule.steps] == ["exp", "log1p"]
    assert [e.primitive.name for e in schedule.tail] == ["cumsum", "cumsum", "mul"]
    assert schedule.tail_outputs == (closed.jaxpr.outvars[1],)


def _after_scan(x):
    """A scan's outputs, which `jax.vmap` leaves with the draw axis second, then elementwise
    equations and a sum over the long axis: bound outside the scan's `jax.vmap`, they would
    sum in another order."""
    _, ys = jax.lax.scan(lambda c, t: (c * 0.9 + t, c), 0.0, x)
    z = ys * 0.5
    return [jnp.sum(-0.5 * z * z - jnp.log1p(jnp.exp(-z)) + 0.25)]


W3 = RNG.normal(size=(16, 64, 8)).astype(np.float32)


def _after_batched_dot(m):
    """A product with batch dimensions (not swapped), then elementwise equations and a sum."""
    y = jnp.einsum("bij,bj->bi", W3, m)
    return [jnp.sum(jnp.tanh(y) + 0.1, axis=1)]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(
    "fun, shape, pays",
    [
        (_after_scan, (512,), False),
        (_after_batched_dot, (16, 8), False),
        (
            lambda x: [jnp.sum(jnp.exp(x * 2.0) + 1.0 - jnp.log1p(x * x))] + _after_scan(x),
            (512,),
            True,
        ),
    ],
)
def test_what_vmap_lays_out_otherwise_stays_in_the_tail(fun, shape, pays, n):
    """Bit for bit with nested `jax.vmap`, float32, at the default threshold: nothing that
    reads a scan's or a batched product's results is bound outside the tail."""
    args = [RNG.normal(size=(4, 50)[-n:] + shape).astype(np.float32)]
    closed = jax.make_jaxpr(fun)(jax.ShapeDtypeStruct(shape, np.float32))
    draws = draw_major_fun(closed)
    assert draws.schedule.pays == pays, draws.schedule
    got = jax.jit(draws.over_draws(n))(*args)
    want = jax.jit(_nested(draws, n))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _nested(draws, n):
    from pymc_chunkpost._engine.kernels.jaxpr_eval import _nested_vmap

    return _nested_vmap(draws.__call__, n)


def test_a_jaxpr_with_effects_keeps_vmap():
    def fun(a):
        jax.debug.callback(lambda v: None, a, ordered=True)
        return [jnp.exp(a) + 1.0 for _ in range(10)]

    closed = jax.make_jaxpr(fun)(jax.ShapeDtypeStruct((3,), np.float64))
    schedule = draw_major_fun(closed).schedule
    assert schedule.effects and schedule.elementwise >= 20
    assert not schedule.pays


def test_draw_axes_that_differ_are_an_error(every_equation_scheduled):
    closed = jax.make_jaxpr(lambda x, y: [x * y + 1.0])(
        jax.ShapeDtypeStruct((3,), np.float32), jax.ShapeDtypeStruct((), np.float32)
    )
    mapped = draw_major_fun(closed).over_draws(1)
    with pytest.raises(ValueError, match="leading axes differ"):
        mapped(np.ones((1, 3), np.float32), np.arange(4, dtype=np.float32))


# --- small float32 products at "highest" precision, as multiplies and adds ----------------


def _primitives(fun, *args) -> set[str]:
    """The primitives of `fun`'s jaxpr, nested ones included."""
    names: set[str] = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fun)(*args).jaxpr)
    return names


@pytest.mark.parametrize(
    "lhs_shape, rhs_shape, numbers",
    [
        ((6, 3), (3,), (((1,), (0,)), ((), ()))),  # data times a vector
        ((6, 3), (3, 5), (((1,), (0,)), ((), ()))),  # free dimensions on both sides
        ((2, 3, 6), (6, 4, 3), (((1, 2), (2, 0)), ((), ()))),  # two contracted dimensions
        ((4, 6, 3), (4, 3, 5), (((2,), (1,)), ((0,), (0,)))),  # a batch dimension
    ],
)
def test_exact_product_is_the_product(lhs_shape, rhs_shape, numbers):
    """Multiplies and adds give `dot_general`'s result, in its layout: in float64 to
    rounding, in float32 within a float32 product's error of the float64 one."""
    from jax import lax

    from pymc_chunkpost._engine.kernels.jaxpr_eval import _exact_product

    lhs, rhs = RNG.normal(size=lhs_shape), RNG.normal(size=rhs_shape)
    want = lax.dot_general(lhs, rhs, numbers)
    got = _exact_product(lhs, rhs, {"dimension_numbers": numbers})
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-13, atol=1e-13)
    got32 = _exact_product(
        lhs.astype(np.float32), rhs.astype(np.float32), {"dimension_numbers": numbers}
    )
    assert got32.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got32), np.asarray(want), rtol=0, atol=1e-5)


def test_small_highest_float32_products_are_multiplies_and_adds():
    """With `exact_terms`, a float32 product of at most that many terms at "highest"
    precision has no `dot_general` left, over draws too; a longer one, one at JAX's default
    precision and a float64 one keep theirs."""
    data = RNG.normal(size=(50, 3)).astype(np.float32)
    long = RNG.normal(size=(50, 20)).astype(np.float32)
    short_draws = RNG.normal(size=(7, 3)).astype(np.float32)
    long_draws = RNG.normal(size=(7, 20)).astype(np.float32)
    short_spec = jax.ShapeDtypeStruct((3,), np.float32)
    long_spec = jax.ShapeDtypeStruct((20,), np.float32)

    def short_product(beta):
        return [data @ beta]

    def long_product(gamma):
        return [long @ gamma]

    with jax.default_matmul_precision("highest"):
        closed = jax.make_jaxpr(short_product)(short_spec)
        exact = draw_major_fun(closed, exact_terms=16)
        assert "dot_general" not in _primitives(exact.over_draws(1), short_draws)
        assert "dot_general" not in _primitives(jax.vmap(exact), short_draws)
        got = jax.jit(exact.over_draws(1))(short_draws)[0]
        longer = draw_major_fun(jax.make_jaxpr(long_product)(long_spec), exact_terms=16)
        assert "dot_general" in _primitives(longer.over_draws(1), long_draws)
    np.testing.assert_allclose(
        np.asarray(got), short_draws.astype(float) @ data.T.astype(float), rtol=0, atol=1e-5
    )
    default = draw_major_fun(jax.make_jaxpr(short_product)(short_spec), exact_terms=16)
    assert "dot_general" in _primitives(default.over_draws(1), short_draws)  # JAX's default
    with jax.default_matmul_precision("highest"):
        spec64 = jax.ShapeDtypeStruct((3,), np.float64)
        float64 = draw_major_fun(jax.make_jaxpr(short_product)(spec64), exact_terms=16)
        assert "dot_general" in _primitives(float64.over_draws(1), short_draws.astype(float))
    assert draw_major_fun(closed).exact_terms == 0  # off unless asked
