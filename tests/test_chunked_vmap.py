"""`chunked_vmap` against `jax.vmap`: values, derivatives, transformations and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import pymc_chunkpost
from pymc_chunkpost import chunked_vmap

N = 10  # Mapped length of the reference problem.
# Chunkings of N: chunk of 1, not dividing N, dividing N, larger than N, by count (4 chunks
# of 3 with a remainder of 1), more chunks than items.
CHUNKINGS = [
    {"chunk_size": 1},
    {"chunk_size": 3},
    {"chunk_size": 5},
    {"chunk_size": 16},
    {"n_chunks": 4},
    {"n_chunks": 20},
]
DTYPES = [jnp.float32, jnp.float64]


def _item(xs, w, field, idx):
    """One item: a pytree in, a pytree out, a gather from a broadcast array."""
    a, b = xs["a"], xs["b"]  # (3,), (4,)
    h = jnp.exp(-a * w) * jnp.sin(b[:3] + w) / (1.0 + w**2)
    return {"dot": jnp.dot(h, field[idx]), "vec": h * jnp.cos(b[3])}


# Mapped: `a` on axis 0, `b` on its last axis (negative), `idx` on axis 0. Broadcast: `w`, `field`.
IN_AXES = ({"a": 0, "b": -1}, None, None, 0)
OUT_AXES = {"dot": 0, "vec": 1}


def _problem(dtype, n=N):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(n, 3)), dtype)
    b = jnp.asarray(rng.normal(size=(4, n)), dtype)
    w = jnp.asarray(rng.normal(size=3), dtype)
    field = jnp.asarray(rng.normal(size=(7, 3)), dtype)
    idx = jnp.asarray(rng.integers(0, 7, size=n))
    return a, b, w, field, idx


def _loss_fn(mapper):
    """A scalar of all four differentiable inputs, with unequal weights on the outputs."""

    def loss(a, b, w, field, idx):
        out = mapper({"a": a, "b": b}, w, field, idx)
        n = out["dot"].shape[0]
        weights = jnp.linspace(0.5, 1.5, n, dtype=out["dot"].dtype)
        return jnp.sum(weights * out["dot"]) + jnp.sum(jnp.tanh(out["vec"]) * weights)

    return loss


def _assert_tree_close(actual, expected, dtype):
    rtol = 2e-5 if dtype == jnp.float32 else 1e-12
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for x, y in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=rtol)


def _transforms(mapper, second_order):
    """Values, reverse and forward mode (and second derivatives) of `mapper`, jitted as one.

    Reverse mode is taken w.r.t. mapped (`a`, `b`) and broadcast (`w`, `field`) arguments.
    """
    loss = _loss_fn(mapper)

    def all_of_them(a, b, w, field, idx):
        args = (a, b, w, field, idx)
        tangents = jax.tree.map(lambda x: jnp.full_like(x, 0.3) + 0.1 * x, args[:4])
        results = {
            "value": mapper({"a": a, "b": b}, w, field, idx),
            "grad": jax.grad(loss, argnums=(0, 1, 2, 3))(*args),
            "jvp": jax.jvp(lambda *p: loss(*p, idx), args[:4], tangents),
        }
        if second_order:
            results["grad_of_grad"] = jax.grad(
                lambda *p: jnp.sum(jax.grad(loss, argnums=2)(*p) ** 2), argnums=(0, 2, 3)
            )(*args)
            results["jvp_of_grad"] = jax.jvp(
                lambda *p: jax.grad(loss, argnums=(0, 2))(*p, idx), args[:4], tangents
            )
        return results

    return jax.jit(all_of_them)


_REFERENCE = {order: _transforms(jax.vmap(_item, IN_AXES, OUT_AXES), order) for order in (0, 1)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "chunking,remat",
    [(c, True) for c in CHUNKINGS] + [({"chunk_size": 3}, False)],
    ids=[*("-".join(f"{k}={v}" for k, v in c.items()) for c in CHUNKINGS), "no_remat"],
)
def test_values_and_derivatives_match_vmap(chunking, remat, dtype):
    with jax.enable_x64(dtype == jnp.float64):
        args = _problem(dtype)
        chunked = chunked_vmap(_item, IN_AXES, OUT_AXES, **chunking, remat=remat)
        _assert_tree_close(_transforms(chunked, False)(*args), _REFERENCE[False](*args), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_second_derivatives_match_vmap(dtype):
    with jax.enable_x64(dtype == jnp.float64):
        args = _problem(dtype)
        chunked = chunked_vmap(_item, IN_AXES, OUT_AXES, chunk_size=3)
        _assert_tree_close(_transforms(chunked, True)(*args), _REFERENCE[True](*args), dtype)


def test_eager_call_matches_vmap():
    x = jnp.linspace(-1.0, 1.0, 10).reshape(2, 5)
    actual = chunked_vmap(jnp.sin, in_axes=1, out_axes=-1, chunk_size=3)(x)
    np.testing.assert_allclose(actual, jax.vmap(jnp.sin, 1, -1)(x), rtol=1e-6)


@pytest.mark.parametrize("batched", ["mapped", "broadcast"])
def test_under_outer_vmap(batched):
    a, b, w, field, idx = _problem(jnp.float32)
    k = 2
    if batched == "mapped":  # The outer vmap batches a mapped argument.
        a = jnp.stack([a, 2.0 * a])
        outer_axes = ({"a": 0, "b": None}, None, None, None)
    else:  # The outer vmap batches a broadcast argument.
        w = jnp.stack([w, -w])
        outer_axes = (None, 0, None, None)
    chunked = chunked_vmap(_item, IN_AXES, OUT_AXES, chunk_size=4)
    plain = jax.vmap(_item, IN_AXES, OUT_AXES)
    actual = jax.jit(jax.vmap(chunked, outer_axes))({"a": a, "b": b}, w, field, idx)
    expected = jax.jit(jax.vmap(plain, outer_axes))({"a": a, "b": b}, w, field, idx)
    assert actual["dot"].shape == (k, N)
    _assert_tree_close(actual, expected, jnp.float32)


@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("chunking", [{"chunk_size": 1}, {"chunk_size": 4}, {"n_chunks": 3}])
def test_short_axes(n, chunking):
    a, b, w, field, idx = _problem(jnp.float32, n)
    chunked = chunked_vmap(_item, IN_AXES, OUT_AXES, **chunking)
    _assert_tree_close(
        _transforms(chunked, False)(a, b, w, field, idx),
        _REFERENCE[False](a, b, w, field, idx),
        jnp.float32,
    )


def test_keyword_arguments_and_unmapped_outputs():
    # As in `jax.vmap`: keyword arguments are mapped over axis 0; `out_axes=None` marks an
    # output that does not depend on the mapped axis.
    def f(x, *, scale):
        return x * scale, jnp.arange(3.0)

    x, scale = jnp.arange(7.0), jnp.linspace(1.0, 2.0, 7)
    actual = chunked_vmap(f, out_axes=(0, None), chunk_size=3)(x, scale=scale)
    expected = jax.vmap(f, out_axes=(0, None))(x, scale=scale)
    _assert_tree_close(actual, expected, jnp.float32)
    with pytest.raises(ValueError, match="out_axes"):
        chunked_vmap(lambda x: (x, x), out_axes=(0, None), chunk_size=3)(x)


def test_one_loop_and_none_is_plain_vmap():
    a, b, w, field, idx = _problem(jnp.float32)
    args = ({"a": a, "b": b}, w, field, idx)
    chunked = str(jax.make_jaxpr(chunked_vmap(_item, IN_AXES, OUT_AXES, chunk_size=3))(*args))
    # Four chunks of 3 (the last overlapping the third) in one loop.
    assert chunked.count("scan[") + chunked.count("while[") == 1
    plain = str(jax.make_jaxpr(chunked_vmap(_item, IN_AXES, OUT_AXES))(*args))
    assert "while[" not in plain and "scan[" not in plain
    assert plain == str(jax.make_jaxpr(jax.vmap(_item, IN_AXES, OUT_AXES))(*args))


def test_jit_does_not_retrace():
    traces = []

    def f(x):
        traces.append(None)  # Runs once per trace of the jitted function below.
        return chunked_vmap(jnp.sin, chunk_size=3)(x)

    jitted = jax.jit(f)
    x = jnp.arange(10.0)
    np.testing.assert_allclose(jitted(x), jnp.sin(x), rtol=1e-6)
    np.testing.assert_allclose(jitted(x + 1.0), jnp.sin(x + 1.0), rtol=1e-6)
    assert len(traces) == 1
    jitted(jnp.arange(11.0))  # A new shape does retrace: the counter can fail.
    assert len(traces) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_size": 0},
        {"chunk_size": -2},
        {"chunk_size": 2.5},
        {"chunk_size": True},
        {"chunk_size": "4"},
        {"chunk_size": np.float64(2.0)},
        {"n_chunks": 0},
        {"n_chunks": -1},
        {"n_chunks": False},
        {"n_chunks": 1.0},
        {"chunk_size": 2, "n_chunks": 2},
    ],
)
def test_bad_chunking_raises_before_tracing(kwargs):
    def f(x):
        raise AssertionError("traced")

    with pytest.raises((ValueError, TypeError), match="chunk"):
        chunked_vmap(f, **kwargs)


@pytest.mark.parametrize(
    "axes", [{"in_axes": 1.5}, {"in_axes": {"a": 0}}, {"in_axes": (0, "1")}, {"out_axes": 0.0}]
)
def test_bad_axes_raise_before_tracing(axes):
    with pytest.raises(TypeError, match="_axes"):
        chunked_vmap(jnp.sin, **axes, chunk_size=2)


def test_mismatched_mapped_sizes_raise():
    with pytest.raises(ValueError, match="disagree"):
        chunked_vmap(jnp.add, chunk_size=2)(jnp.ones(3), jnp.ones(4))


# --- Compiled memory: a line-of-sight integral. -----------------------------------------------
M = 128  # Samples per line of sight.
PIXELS = 1024  # Rows of the broadcast field.


def _line_of_sight(t, pixel, field):
    """One line of sight: a weight vector from non-linear functions of constants, dotted with
    a gathered row of a large broadcast array."""
    s = jnp.linspace(0.0, 1.0, M)
    weights = jnp.exp(-t * s) * jnp.sin(3.0 * s + t) / (1.0 + t * s**2)
    return jnp.dot(weights, field[pixel])


def _grad_temp_bytes(n, **chunking):
    """Temporary bytes of the compiled gradient w.r.t. the mapped `t` and broadcast `field`."""
    mapper = chunked_vmap(_line_of_sight, (0, 0, None), **chunking)

    def loss(t, pixel, field):
        return jnp.sum(mapper(t, pixel, field))

    t = jax.ShapeDtypeStruct((n,), jnp.float32)
    pixel = jax.ShapeDtypeStruct((n,), jnp.int32)
    field = jax.ShapeDtypeStruct((PIXELS, M), jnp.float32)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 2))).lower(t, pixel, field).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_remat_backward_keeps_one_chunk_of_residuals():
    n, chunk = 2048, 128
    plain = _grad_temp_bytes(n)
    one = _grad_temp_bytes(n, chunk_size=chunk)
    double_n = _grad_temp_bytes(2 * n, chunk_size=chunk)
    double_chunk = _grad_temp_bytes(n, chunk_size=2 * chunk)
    # Plain vmap holds every line of sight's residuals: at least n * M floats.
    assert plain > n * M * 4
    assert one < 0.1 * plain
    # Grows with the chunk, not with the number of lines of sight.
    assert double_n < 1.1 * one
    assert double_chunk > 1.6 * one
    # Control: without remat the forward pass stores every chunk's residuals.
    no_remat = _grad_temp_bytes(n, chunk_size=chunk, remat=False)
    assert _grad_temp_bytes(2 * n, chunk_size=chunk, remat=False) > 1.6 * no_remat


def test_remainder_costs_no_output_copy():
    def f(t):
        return jnp.sin(t * jnp.linspace(0.0, 1.0, M))

    def temp_bytes(n):
        x = jax.ShapeDtypeStruct((n,), jnp.float32)
        compiled = jax.jit(chunked_vmap(f, chunk_size=128)).lower(x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    n = 4096
    output_bytes = (n + 100) * M * 4
    # A pad or a concatenate would hold at least one more full output.
    assert temp_bytes(n + 100) < 0.25 * output_bytes
    assert temp_bytes(n + 100) < 2 * temp_bytes(n) + 128 * M * 4


def test_backward_holds_no_full_size_cotangent_per_chunk():
    # The cotangents of a mapped input and of a gathered broadcast input are accumulated over
    # the chunks. Materialising a full-size `dynamic_update_slice(zeros, ...)` or
    # `scatter_add(zeros, ...)` per chunk would show as one more full-size temporary.
    n, chunk = 4096, 128
    x = jax.ShapeDtypeStruct((n, M), jnp.float32)  # A mapped input of 2 MiB.
    pixel = jax.ShapeDtypeStruct((n,), jnp.int32)
    field = jax.ShapeDtypeStruct((4 * PIXELS, M), jnp.float32)  # A broadcast input of 2 MiB.

    def item(x, pixel, field):
        return jnp.sum(jnp.tanh(x) * field[pixel])

    def loss(x, pixel, field):
        return jnp.sum(chunked_vmap(item, (0, 0, None), chunk_size=chunk)(x, pixel, field))

    for argnum, full_bytes in ((0, n * M * 4), (2, 4 * PIXELS * M * 4)):
        compiled = jax.jit(jax.grad(loss, argnums=argnum)).lower(x, pixel, field).compile()
        assert compiled.memory_analysis().temp_size_in_bytes < 0.25 * full_bytes


# --- A mapped axis split over devices. ---------------------------------------------------------


@pytest.fixture(scope="module")
def split_results():
    """What `chunked_vmap_sharded_checks.py` found, in a fresh process with 4 CPU devices."""
    script = Path(__file__).parent / "chunked_vmap_sharded_checks.py"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    root = str(Path(pymc_chunkpost.__file__).parent.parent)  # the package under test
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh process with 4 CPU devices
class TestSplitMappedAxis:
    """The mapped axis split over 4 CPU devices stays split: values, gradients and jvps equal
    `jax.vmap`'s, outputs are split as the inputs, and no device's temporaries hold the whole
    mapped axis. The checks run in a fresh process (`chunked_vmap_sharded_checks.py`): the
    device count must be set before JAX starts."""

    CHECKS = (
        "explicit_axis_name_and_mesh",
        "second_derivatives",
        "context_mesh",
        "detected_outside_jit",
        "detected_inside_jit_with_explicit_axes",
        "unmapped_outputs_and_keywords",
        "errors",
        "no_device_holds_the_whole_mapped_axis",
    )

    def test_every_check_ran(self, split_results):
        assert sorted(split_results) == sorted(self.CHECKS)

    @pytest.mark.parametrize("name", CHECKS)
    def test_check(self, split_results, name):
        assert split_results[name] == "ok", split_results[name]

    @pytest.mark.parametrize(
        "kwargs,match",
        [
            ({"axis_name": 3}, "axis_name"),
            ({"axis_name": ()}, "axis_name"),
            ({"axis_name": "y", "mesh": "mesh"}, "does not have"),
            ({"mesh": "mesh"}, "without `axis_name`"),
            ({"axis_name": "x", "mesh": "not a mesh"}, "jax.sharding.Mesh"),
        ],
    )
    def test_bad_split_raises_before_tracing(self, kwargs, match):
        def f(x):
            raise AssertionError("traced")

        mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
        kwargs = {k: mesh if v == "mesh" else v for k, v in kwargs.items()}
        with pytest.raises(ValueError, match=match):
            chunked_vmap(f, chunk_size=2, **kwargs)
