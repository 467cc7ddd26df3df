"""`chunked_vmap` on a mapped axis split over 4 CPU devices: checks run in a fresh process.

Run as `python chunked_vmap_sharded_checks.py`; `tests/test_chunked_vmap.py` does, because the
device count must be set before JAX starts. Each check compares with `jax.vmap` (values,
gradients, jvps, via the references of `test_chunked_vmap`), or reads where the outputs live,
or reads XLA's per-device `memory_analysis()`. Prints one JSON line: check name -> "ok" or
what failed.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from pathlib import Path

import jax

DEVICES = 4
jax.config.update("jax_num_cpu_devices", DEVICES)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_chunked_vmap as base  # noqa: E402

from pymc_chunkpost import chunked_vmap  # noqa: E402
from pymc_chunkpost._engine.kernels import chunked as _chunked  # noqa: E402

N = 12  # 3 items per device: chunks of 2 overlap at the end of each shard, chunks of 3 do not.
CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _mesh(axis_type=None) -> Mesh:
    if axis_type is None:
        return Mesh(np.array(jax.devices()), ("x",))
    return jax.make_mesh((DEVICES,), ("x",), axis_types=(axis_type,))


def _sharded_problem(mesh, dtype=jnp.float64):
    """`test_chunked_vmap`'s problem with every mapped argument split over the devices."""
    a, b, w, field, idx = base._problem(dtype, N)

    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))

    P = PartitionSpec
    return put(a, P("x")), put(b, P(None, "x")), w, field, put(idx, P("x"))


def _assert_split(out, mesh):
    """`dot` split on its axis 0 and `vec` on its axis 1, as the mapped inputs are."""
    expected = {"dot": PartitionSpec("x"), "vec": PartitionSpec(None, "x")}
    for name, spec in expected.items():
        sharding = out[name].sharding
        assert sharding.is_equivalent_to(NamedSharding(mesh, spec), out[name].ndim), (
            name,
            sharding,
        )


def _derivatives_match(mapper, mesh, second_order=False):
    args = _sharded_problem(mesh)
    actual = base._transforms(mapper, second_order)(*args)
    expected = base._REFERENCE[second_order](*args)
    base._assert_tree_close(actual, expected, jnp.float64)
    _assert_split(actual["value"], mesh)


@check
def explicit_axis_name_and_mesh():
    mesh = _mesh()
    for chunk in (2, 3):
        mapper = chunked_vmap(
            base._item, base.IN_AXES, base.OUT_AXES, chunk_size=chunk, axis_name="x", mesh=mesh
        )
        _derivatives_match(mapper, mesh)


@check
def second_derivatives():
    mesh = _mesh()
    mapper = chunked_vmap(
        base._item, base.IN_AXES, base.OUT_AXES, chunk_size=2, axis_name="x", mesh=mesh
    )
    _derivatives_match(mapper, mesh, second_order=True)


@check
def context_mesh():
    mesh = _mesh()
    with jax.set_mesh(mesh):
        mapper = chunked_vmap(base._item, base.IN_AXES, base.OUT_AXES, n_chunks=2, axis_name="x")
        _derivatives_match(mapper, mesh)


@check
def detected_outside_jit():
    mesh = _mesh()
    args = _sharded_problem(mesh)
    mapper = chunked_vmap(base._item, base.IN_AXES, base.OUT_AXES, chunk_size=2)
    with _count_splits() as splits:
        actual = mapper({"a": args[0], "b": args[1]}, *args[2:])
        expected = jax.vmap(base._item, base.IN_AXES, base.OUT_AXES)(
            {"a": args[0], "b": args[1]}, *args[2:]
        )
        base._assert_tree_close(actual, expected, jnp.float64)
        _assert_split(actual, mesh)
        assert splits == [1], splits
        # The control: the same arrays on one device run as one loop.
        plain = [jnp.asarray(np.asarray(x)) for x in args]
        mapper({"a": plain[0], "b": plain[1]}, *plain[2:])
        assert splits == [1], splits


@contextlib.contextmanager
def _count_splits():
    """Counts the `shard_map`s that `chunked_vmap` builds."""
    count = [0]
    original = _chunked.shard_map_unchecked

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    _chunked.shard_map_unchecked = counting
    try:
        yield count
    finally:
        _chunked.shard_map_unchecked = original


@check
def detected_inside_jit_with_explicit_axes():
    mesh = _mesh(jax.sharding.AxisType.Explicit)
    mapper = chunked_vmap(base._item, base.IN_AXES, base.OUT_AXES, chunk_size=2)
    args = _sharded_problem(mesh)
    with _count_splits() as splits, jax.set_mesh(mesh):
        actual = base._transforms(mapper, False)(*args)
    assert splits[0] >= 1, splits  # traced once per transformation
    # The reference on the same values, unsplit (`jax.vmap`'s gather of a broadcast array by
    # split indices does not type-check with `Explicit` axes).
    expected = base._REFERENCE[False](*[jnp.asarray(np.asarray(x)) for x in args])
    base._assert_tree_close(actual, expected, jnp.float64)
    _assert_split(actual["value"], mesh)


@check
def unmapped_outputs_and_keywords():
    mesh = _mesh()

    def f(x, *, scale):
        return x * scale, jnp.arange(3.0)

    x = jax.device_put(jnp.arange(float(N)), NamedSharding(mesh, PartitionSpec("x")))
    scale = jnp.linspace(1.0, 2.0, N)
    actual = jax.jit(chunked_vmap(f, out_axes=(0, None), chunk_size=2, axis_name="x", mesh=mesh))(
        x, scale=scale
    )
    base._assert_tree_close(actual, jax.vmap(f, out_axes=(0, None))(x, scale=scale), jnp.float64)


@check
def errors():
    mesh = _mesh()
    x = jnp.arange(10.0)  # 10 items over 4 devices
    try:
        chunked_vmap(jnp.sin, chunk_size=2, axis_name="x", mesh=mesh)(x)
    except ValueError as error:
        assert "multiple of the 4 pieces" in str(error), error
    else:
        raise AssertionError("an indivisible length did not raise")
    try:
        chunked_vmap(jnp.sin, chunk_size=2, axis_name="x")(jnp.arange(12.0))
    except ValueError as error:
        assert "needs a mesh" in str(error), error
    else:
        raise AssertionError("no mesh did not raise")


M = 4096  # Floats per item: each item is 16 KiB, the mapped axis of N_MEMORY items 8 MiB.
N_MEMORY = 512


def _temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@check
def no_device_holds_the_whole_mapped_axis():
    """Per device, the split loop's temporaries (values, and gradients w.r.t. a mapped and a
    broadcast argument) are those of one device running its own part alone; the control,
    the same loop without the split, holds at least the whole mapped axis."""
    mesh = _mesh()
    w = jax.ShapeDtypeStruct((M,), jnp.float32)
    whole = N_MEMORY * M * 4  # one full-size array of the mapped axis

    def item(x, w):
        return jnp.tanh(x * w) * jnp.cos(x)

    def value(split):
        options = {"axis_name": "x", "mesh": mesh} if split else {}
        return chunked_vmap(item, (0, None), chunk_size=16, **options)

    def grad(split):
        return jax.grad(lambda x, w: jnp.sum(value(split)(x, w) ** 2), argnums=(0, 1))

    sharding = NamedSharding(mesh, PartitionSpec("x"))
    x = jax.ShapeDtypeStruct((N_MEMORY, M), jnp.float32, sharding=sharding)
    x_part = jax.ShapeDtypeStruct((N_MEMORY // DEVICES, M), jnp.float32)
    for name, make in (("value", value), ("grad", grad)):
        split = _temp_bytes(make(True), x, w)
        alone = _temp_bytes(make(False), x_part, w)
        control = _temp_bytes(make(False), x, w)
        assert split <= 1.05 * alone + 2**16, (name, split, alone)
        assert split < whole, (name, split, whole)
        assert control >= whole, (name, control, whole)  # the check can fail


def main() -> None:
    results = {}
    for name, fn in CHECKS.items():
        try:
            with jax.enable_x64(True):
                fn()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the test, which fails on it
            results[name] = traceback.format_exc()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
