"""The graph layer (`_graph`): every node of a converted graph keeps pytensor's dtype.

pytensor's JAX conversion turns 0-d constants into Python scalars, which JAX types weakly, so
a float64 node can be computed in float32 (LKJCholeskyCov's `sd_dist` log-density: a
`Switch` between a float64 value and a float32 `-inf`). The walk below evaluates a converted
graph node by node and compares each output's JAX dtype with pytensor's declared one.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import models  # noqa: E402

from pymc_chunkpost._pymc import graph as _graph  # noqa: E402


def lkj_log_prior_graph():
    """The log-prior graph of a model with an LKJCholeskyCov, and a point to evaluate it at."""
    from pymc.model.transform.conditioning import remove_value_transforms

    model = remove_value_transforms(models.structured())
    graph = model.logp(vars=model.free_RVs, sum=False)
    point = model.initial_point()
    fgraph = _graph.jax_graph(model.value_vars, graph)
    return fgraph, [point[v.name] for v in model.value_vars]


def walk(fgraph, values, convert, typify):
    """Evaluate `fgraph` node by node; the outputs whose JAX dtype is not pytensor's, or weak."""
    from pytensor.graph.basic import Constant

    env = {v: jax.numpy.asarray(x) for v, x in zip(fgraph.inputs, values)}
    wrong = []
    for node in fgraph.toposort():
        args = [
            typify(v.data, variable=v) if isinstance(v, Constant) else env[v] for v in node.inputs
        ]
        results = convert(node.op, node=node)(*args)
        results = [results] if len(node.outputs) == 1 else results
        for variable, value in zip(node.outputs, results):
            env[variable] = value
            declared = getattr(variable.type, "dtype", None)
            got = jax.numpy.asarray(value)
            weak = isinstance(value, bool | int | float) or getattr(value, "weak_type", False)
            if declared is not None and (str(got.dtype) != declared or weak):
                wrong.append((str(node.op), declared, str(got.dtype), weak))
    return wrong


def test_every_node_keeps_its_declared_dtype():
    fgraph, values = lkj_log_prior_graph()
    assert len(fgraph.apply_nodes) > 10
    assert walk(fgraph, values, _graph._strict_conversion, _graph._typify) == []


def test_the_walk_finds_pytensors_float32_leak():
    """The same walk over pytensor's own conversion finds the float32 node (the walk's
    negative control: it would pass vacuously if it could not see a wrong dtype)."""
    from pytensor.link.jax.dispatch import jax_funcify, jax_typify

    fgraph, values = lkj_log_prior_graph()
    wrong = walk(fgraph, values, jax_funcify, lambda data, **_: jax_typify(data))
    if not wrong:
        pytest.skip("pytensor's JAX conversion keeps every dtype here (fixed upstream?)")
    assert ("float64", "float32") in [(declared, got) for _, declared, got, _ in wrong]


def test_converted_log_prior_equals_pytensors_default_backend():
    """Evaluated as a whole, the strict conversion equals pymc's default backend to 1e-14
    relative (pytensor's own JAX conversion is ~1e-6 off on the LKJ term)."""
    fgraph, values = lkj_log_prior_graph()
    ours = jax.jit(_graph.funcify(fgraph))(*values)
    import pytensor

    reference = pytensor.function(fgraph.inputs, fgraph.outputs, mode="FAST_RUN")(*values)
    for got, want in zip(ours, reference):
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("shape", [(3, 4), (0, 4), (5, 0)])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_logical_reductions_are_counts_with_numpy_s_values(shape, axis):
    """pytensor's `all` and `any` of booleans convert to counts (no logical reduction for XLA
    to fold value by value, docs/decisions.md), with numpy's values, empty reductions
    included; an and-reduction of integers keeps pytensor's bitwise conversion."""
    import pytensor.tensor as pt
    from pytensor.scalar import and_
    from pytensor.tensor.elemwise import CAReduce

    x = pt.tensor("x", dtype="float64", shape=(None, None))
    outputs = [pt.all(x > 0, axis=axis), pt.any(x > 0, axis=axis)]
    jax_fn = _graph.jaxify([x], outputs)
    value = np.random.default_rng(0).normal(size=shape)
    every, some = jax_fn(value)
    np.testing.assert_array_equal(every, np.all(value > 0, axis=axis))
    np.testing.assert_array_equal(some, np.any(value > 0, axis=axis))
    assert every.dtype == some.dtype == np.bool_
    primitives = {e.primitive.name for e in jax.make_jaxpr(jax_fn)(value).jaxpr.eqns}
    assert not primitives & {"reduce_and", "reduce_or"}, primitives
    n = pt.tensor("n", dtype="int8", shape=(2,))
    bitwise = _graph.jaxify([n], [CAReduce(and_)(n)])
    assert int(bitwise(np.array([3, 2], np.int8))[0]) == 2
