"""`_compat`: each version workaround, on the path that this CI stack runs.

CI runs jax/jaxlib 0.10.2 (Python 3.11) and 0.12 (Python 3.12). Each test asserts what the
workaround assumes of the installed jax, so that a jax that fixes or changes it fails here
instead of leaving a stale workaround behind.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pymc_chunkpost._engine.call import draws as _draws
from pymc_chunkpost._engine.execute import executable_store as _executable_store
from pymc_chunkpost._engine.kernels.jaxpr_eval import draw_major_fun
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._support import compat as _compat

ROOT = Path(__file__).resolve().parent.parent


def test_the_floor_is_the_oldest_jax_ci_tests():
    """pyproject.toml's `jax>=` is `_compat.JAX_FLOOR`, and this jax is at least that."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (jax_requirement,) = [d for d in dependencies["dependencies"] if re.match(r"jax\b", d)]
    floor = tuple(int(p) for p in jax_requirement.split(">=")[1].split("."))
    assert floor == _compat.JAX_FLOOR
    assert _compat._release(jax.__version__) >= _compat.JAX_FLOOR
    assert _compat._release("0.12.0.1") == (0, 12) and _compat._release("0.10.2") == (0, 10)


def test_lapack_shards_run_one_after_another_only_on_a_jaxlib_that_deadlocks(monkeypatch):
    """jaxlib 0.10 (Python 3.11's): a Cholesky per draw, split over 4 of 4 CPU devices, runs
    shard by shard; jaxlib 0.11 and later run the shards together."""
    assert _compat.lapack_may_deadlock() is (_compat.jaxlib_version() < (0, 11))
    monkeypatch.setattr(_resources, "_cpu_device_count", lambda: 4)

    def per_draw(a):
        return [jnp.linalg.cholesky(a @ a.T + 3.0 * jnp.eye(3))]

    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("chain",))
    draws = jax.device_put(np.ones((4, 2, 3, 3)), NamedSharding(mesh, PartitionSpec("chain")))
    problem, _ = _draws.validate(per_draw, [draws], None)
    reason = _resources.shard_by_shard(problem)
    assert (reason is not None) is _compat.lapack_may_deadlock(), reason


def test_a_sort_serializes_only_before_it_runs_where_compat_says_so():
    """XLA's CPU sort: serializable once compiled, not once it has run (jaxlib 0.10.2 and 0.12).
    A jaxlib that fixes it fails here: set `SORT_SERIALIZES_AFTER_RUN_IN`."""
    assert _compat.unserializable_after_run("gpu") == frozenset()
    compiled = jax.jit(jnp.sort).lower(jnp.ones(5)).compile()
    assert _executable_store.portable(compiled) is not None  # before its first run
    compiled(jnp.arange(5.0)[::-1])
    after = _executable_store.portable(compiled)
    assert (after is None) is ("sort" in _compat.unserializable_after_run("cpu"))


def _row_slopes_loop():
    """A chunk loop over a row-indexed sum of 3 slopes per row: XLA's CPU compiler gives the
    sum to its kernel library (jaxlib 0.10.2 and 0.12)."""
    rows = jnp.asarray(np.random.default_rng(0).integers(0, 20, 500), jnp.int32)
    x = jnp.ones((500, 3))

    def loop(slopes):
        return lax.map(lambda b: (b[rows] * x).sum(-1), slopes, batch_size=8)

    return jax.jit(loop).lower(jnp.ones((64, 20, 3)))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU compiler")
def test_library_fusions_are_read_from_the_hlo_and_turned_off_by_the_option():
    lowered = _row_slopes_loop()
    text = lowered.compile().as_text()
    assert _compat.LIBRARY_FUSION_MARK in text
    assert _compat.library_reductions(text) == [3]
    without = lowered.compile(compiler_options=_compat.NO_LIBRARY_FUSIONS).as_text()
    assert _compat.LIBRARY_FUSION_MARK not in without
    assert _compat.library_reductions(without) == []


def test_batching_rules_are_found_and_their_absence_maps_with_vmap(monkeypatch):
    """jax 0.10 and 0.12 keep the elementwise batching rules where `_compat` reads them; a jax
    without them maps every equation with `jax.vmap`, to the same values."""
    from pymc_chunkpost._engine.kernels import jaxpr_eval as _jaxpr_eval

    vectorized, broadcast, rules = _compat.elementwise_batchers()
    assert vectorized is not None and broadcast is not None and rules

    def scalars(*xs):
        return [jnp.exp(x) + 1.0 for x in xs] + [sum(xs)]

    specs = [jax.ShapeDtypeStruct((), np.float64)] * 8
    closed = jax.make_jaxpr(scalars)(*specs)
    draws = [jnp.linspace(0.0, 1.0, 6).reshape(2, 3) + k for k in range(8)]
    scheduled = draw_major_fun(closed)
    assert scheduled.schedule.elementwise > 0 and not scheduled.schedule.tail
    expected = jax.jit(scheduled.over_draws(2))(*draws)
    monkeypatch.setattr(_jaxpr_eval, "_RULES", {})
    plain = draw_major_fun(closed)
    assert plain.schedule.elementwise == 0 and plain.schedule.tail
    for got, want in zip(jax.jit(plain.over_draws(2))(*draws), expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-15)


def test_a_jitted_call_is_named_as_compat_says():
    closed = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x))(1.0)
    assert closed.jaxpr.eqns[0].primitive.name in _compat.CALLS


@pytest.mark.parametrize("shape", [(), (3,), (7, 13), (1001,)])
def test_unrolled_threefry_gives_jaxs_threefry_bits(shape):
    """The unrolled hash is found on this stack and gives jax's threefry bits, splits and
    folds for every width, compiled or not; jax's own CPU lowering of the hash is still the
    rolled loop it works around (a jax that unrolls it fails here: drop the workaround)."""
    impl = _compat.unrolled_threefry()
    assert impl is not None
    data = jax.random.key_data(jax.random.key(11))
    ours, theirs = jax.random.wrap_key_data(data, impl=impl), jax.random.wrap_key_data(data)
    assert str(jax.random.key_impl(ours)) == _compat.UNROLLED_THREEFRY
    for dtype in (jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64):
        want = np.asarray(jax.random.bits(theirs, shape, dtype))
        assert want.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(jax.random.bits(ours, shape, dtype), want)
        compiled = jax.jit(
            lambda d, dtype=dtype: jax.random.bits(
                jax.random.wrap_key_data(d, impl=impl), shape, dtype
            )
        )
        np.testing.assert_array_equal(compiled(data), want)
    for derive in (jax.random.split, lambda k: jax.random.fold_in(k, 5)):
        np.testing.assert_array_equal(
            jax.random.key_data(derive(ours)), jax.random.key_data(derive(theirs))
        )
    np.testing.assert_array_equal(
        jax.random.normal(ours, shape, jnp.float64), jax.random.normal(theirs, shape, jnp.float64)
    )

    def hlo(key_impl):
        def draw(d):
            return jax.random.bits(jax.random.wrap_key_data(d, impl=key_impl), (1000,))

        return jax.jit(draw).lower(data).compile().as_text()

    assert " while(" in hlo("threefry2x32") and " while(" not in hlo(impl)


def test_split_key_at_gives_jaxs_split_keys():
    """Key `i` of `jax.random.split(key, n)` from `i` alone, compiled or not, for raw and typed
    keys' data, on this stack (partitionable threefry, jax's default on both)."""
    assert _compat.splits_key_at()
    for key in (jax.random.key(3), jax.random.PRNGKey(4)):
        data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        want = np.asarray(jax.random.key_data(jax.random.split(key, 37)))
        indices = np.arange(37, dtype=np.uint32)
        got = jax.jit(jax.vmap(lambda i, d=data: _compat.split_key_at(d, i)))(indices)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(_compat.split_key_at(data, np.uint32(36)), want[36])


def _closing_over(data):
    """A jitted function that closes over `data` (over jax's 1 KiB for embedding)."""
    return jax.jit(lambda v: v + jnp.asarray(data).sum())


@pytest.mark.parametrize("simplified", [False, True])
def test_constants_stay_in_the_program_and_one_held_apart_is_never_stored(simplified):
    """Within `constants_in_program`, the constants are in the lowered text, and the compiled
    program holds none apart, whichever way jax is set; outside it, where jax holds them apart
    (jax 0.12.1, whose default the flag is), `portable` refuses the program."""
    from jax._src import config

    data = np.linspace(0.0, 1.0, 512)  # 4 KiB
    x = jnp.ones(3)
    with config.use_simplified_jaxpr_constants(simplified):
        with _compat.constants_in_program():
            lowered = _closing_over(data).lower(x)
        held = _closing_over(data).lower(x).compile()
    inside = lowered.compile()
    assert _compat.const_args(inside) == [] and "dense<" in lowered.as_text()
    assert _executable_store.portable(inside) is not None
    held_apart = bool(_compat.const_args(held))
    assert (_executable_store.portable(held) is None) is held_apart
    if simplified and jax.config.values["jax_use_simplified_jaxpr_constants"]:
        assert held_apart
    expected = 1.0 + data.sum()
    np.testing.assert_allclose(np.asarray(inside(x)), expected)
    np.testing.assert_allclose(np.asarray(held(x)), expected)


def test_serialized_parts_reads_what_this_jax_serializes():
    """The tuple that this jax's `serialize_executable` pickles is one `serialized_parts`
    reads (3 items on jax 0.10.2 and 0.12.0, version 3 with 5 on 0.12.1); others raise."""
    import io
    import pickle

    from jax.experimental import serialize_executable

    compiled = jax.jit(lambda v: v * 2.0).lower(jnp.ones(3)).compile()
    payload, _, _ = serialize_executable.serialize(compiled)
    (device,) = compiled.runtime_executable().local_devices()

    class Reader(pickle.Unpickler):
        def persistent_load(self, pid):
            return {"exec": pid, "device": device, "client": device.client}[pid[0]]

    unloaded, args_info, no_kwargs, constants = _compat.serialized_parts(
        Reader(io.BytesIO(payload)).load()
    )
    assert constants == [] and isinstance(no_kwargs, bool) and len(args_info) == 1
    assert unloaded is not None
    with pytest.raises(ValueError, match="layout"):
        _compat.serialized_parts((99, unloaded, args_info, no_kwargs, []))


def test_the_vector_width_option_is_known_or_compiled_without():
    """This XLA knows `PREFER_VECTOR_WIDTH` (jaxlib 0.10.2 and 0.12.1). One that rejects it
    compiles the step without it; any other error, or that one where the option was not
    asked, is raised."""
    from pymc_chunkpost._engine.execute.executor import _compile_step

    lowered = jax.jit(lambda v: v * 2.0).lower(jnp.ones(3))
    compiled = lowered.compile(compiler_options={_compat.PREFER_VECTOR_WIDTH: 512})
    np.testing.assert_array_equal(np.asarray(compiled(jnp.ones(3))), 2.0)
    asked = []

    class Rejecting:
        def compile(self, compiler_options):
            asked.append(dict(compiler_options))
            if _compat.PREFER_VECTOR_WIDTH in compiler_options or not asked[1:]:
                raise RuntimeError(f"No such compile option: '{_compat.PREFER_VECTOR_WIDTH}'")
            return "compiled"

    options = {_compat.PREFER_VECTOR_WIDTH: 512, "other": ""}
    assert _compile_step(Rejecting(), options) == "compiled"
    assert asked == [options, {"other": ""}]
    asked.clear()
    with pytest.raises(RuntimeError, match="No such"):
        _compile_step(Rejecting(), {"other": ""})

    class Failing:
        def compile(self, compiler_options):
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        _compile_step(Failing(), options)


def test_special_functions_convert_on_this_pytensor_and_its_dispatch_is_left_as_it_was():
    """pytensor 2.38 (Python 3.11's) without tensorflow-probability cannot convert erfcx and
    erfcinv to JAX: `special_conversions` gives pytensor 3's, used only while our graphs
    convert and only where pytensor's own fails; pytensor 3 converts them itself (nothing to
    give). Either way a graph of both equals scipy's, and pytensor's dispatch holds its own
    conversions after."""
    pt = pytest.importorskip("pytensor.tensor")
    scipy_special = pytest.importorskip("scipy.special")
    import pytensor
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify
    from pytensor.scalar import math as scalar_math

    from pymc_chunkpost._pymc.graph import funcify

    def converts_itself(op) -> bool:
        try:
            jax_funcify(op)
        except NotImplementedError:
            return False
        return True

    ops = (scalar_math.erfcx, scalar_math.erfcinv)
    given = set(_compat.special_conversions())
    if _compat._release(pytensor.__version__) >= (3, 0):
        assert given == set() and all(converts_itself(op) for op in ops)
    else:
        assert given == {scalar_math.Erfcx, scalar_math.Erfcinv}
    missing = {type(op) for op in ops if not converts_itself(op)}
    assert missing <= given  # what pytensor cannot convert, we give
    own = {type(op): jax_funcify.dispatch(type(op)) for op in ops}
    x = pt.vector("x")
    graph = FunctionGraph([x], [pt.erfcx(x), pt.erfcinv(x / 3)], clone=True)
    values = np.array([0.1, 0.5, 1.2, 2.9, 25.0])
    erfcx, erfcinv = funcify(graph)(values)
    rtol = 1e-10 if jax.config.jax_enable_x64 else 1e-5
    np.testing.assert_allclose(erfcx, scipy_special.erfcx(values), rtol=rtol)
    np.testing.assert_allclose(erfcinv, scipy_special.erfcinv(values / 3), rtol=rtol)
    assert {op: jax_funcify.dispatch(op) for op in own} == own
    assert {type(op) for op in ops if not converts_itself(op)} == missing
