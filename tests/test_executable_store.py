"""Executables kept on disk beside the tuning cache (`_executable_store`).

A second `auto` run of the same problem, with the in-memory caches emptied (as in a new
process), loads what the first compiled instead of compiling it, and gives pymc's outputs.
Anything else (other data of the same shapes, a damaged file, a full folder, the cache
turned off) compiles anew and gives pymc's outputs too.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import jax
import jax.numpy as jnp
import models
import numpy as np
import pymc as pm
import pytest
from helpers import assert_same, count_compiles, problem_of, reference
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pymc_chunkpost import Loop, clear_caches
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.execute import executable_store as _executable_store
from pymc_chunkpost._support import disk as _disk
from pymc_chunkpost.profiling import fixtures


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder for this test; nothing left in memory from other tests."""
    monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(tmp_path))
    clear_caches()
    yield tmp_path
    _disk.wait()
    clear_caches()


def _run(jax_fn, raw, **options):
    """One `auto` run as a new process would make it: nothing compiled in memory."""
    clear_caches()
    outputs, plan = _postprocess.run(
        jax_fn, [jnp.asarray(x) for x in raw], None, "auto", True, **options
    )
    _disk.wait()
    return outputs, plan


def _as_in_a_new_process(monkeypatch):
    """The store's process-wide flags as a new process has them, for this test only."""
    monkeypatch.setattr(_executable_store, "_LOADER_BROKEN", False)
    monkeypatch.setattr(_executable_store, "_LOADING_STOPPED", False)


def _stored(cache):
    return sorted((cache / _executable_store.SUBFOLDER).glob("*.bin"))


def _loop(configure, loop):
    """Make `auto` plan `loop`: no loop-free vmap but for `Loop.NONE`, a host loop for any
    number of buffers for `Loop.HOST`."""
    if loop is not Loop.NONE:
        configure(vmap_temp_bytes=0)  # always a loop
    if loop is Loop.HOST:
        configure(host_loop_many_buffers=0)


@pytest.mark.parametrize("progress", [False, True], ids=["quiet", "progress"])
@pytest.mark.parametrize("loop", [Loop.NONE, Loop.XLA, Loop.HOST])
def test_a_second_run_loads_the_executable(cache, monkeypatch, loop, progress, configure):
    _loop(configure, loop)
    model = models.data_regression(n_obs=500)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 100)
    first, plan = _run(jax_fn, raw, progressbar=progress)
    assert plan.loop is loop
    assert plan.source == "rule" and _stored(cache)
    stored = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in _stored(cache)}
    again, cached = _run(jax_fn, raw, progressbar=progress)
    assert cached.source == "cache" and "loaded from disk" in cached.reason
    assert (cached.strategy, cached.chunk_size) == (plan.strategy, plan.chunk_size)
    assert cached.peak_bytes == plan.peak_bytes  # XLA's memory analysis survives the load
    now = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in _stored(cache)}
    assert now.keys() == stored.keys()  # nothing compiled, nothing new stored
    assert all(now[p][1] == stored[p][1] for p in now)
    expected = reference(jax_fn, raw)
    assert_same(first, expected)
    assert_same(again, expected)


@pytest.mark.parametrize("loop", [Loop.NONE, Loop.XLA, Loop.HOST])
def test_a_program_that_sorts_is_stored_and_loaded(cache, monkeypatch, loop, configure):
    """XLA's CPU sort cannot be serialized once it has run (`_compat.unserializable_after_run`):
    such a step is serialized before its run, so that the next run loads it too (with the host
    loop's compiled fill, which does not sort, stored after the run)."""
    _loop(configure, loop)
    if loop is Loop.HOST:
        configure(host_zeros_max_bytes=0)
    model = fixtures.integer_dets(n_groups=30)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    first, plan = _run(jax_fn, raw)
    assert plan.loop is loop
    assert len(_stored(cache)) == (2 if loop is Loop.HOST else 1)  # the step, and the fill
    again, cached = _run(jax_fn, raw)
    assert "loaded from disk" in cached.reason
    expected = reference(jax_fn, raw)
    assert_same(first, expected)
    assert_same(again, expected)


def test_a_program_that_sorts_moves_to_another_device(compiles):
    model = fixtures.integer_dets(n_groups=30)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    first, second = jax.devices()[:2]
    clear_caches()
    _postprocess.run(jax_fn, _on(first, raw), None, "auto")
    assert compiles[0] == 1
    outputs, _ = _postprocess.run(jax_fn, _on(second, raw), None, "auto")
    assert compiles[0] == 1  # moved, not compiled again
    assert_same(outputs, reference(jax_fn, raw))


def test_other_data_of_the_same_shapes_loads_the_program_and_reads_the_new_data(cache):
    """The data are the program's arguments, not its constants: a model with new `pm.Data`
    values (same shapes) loads the stored program, and computes with the new values."""
    model = models.data_regression(n_obs=500)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 100)
    _run(jax_fn, raw)
    with model:
        pm.set_data({"x": np.random.default_rng(9).normal(size=(500, 3))})
    other_fn = models.jax_fn(model)
    outputs, plan = _run(other_fn, raw)
    assert plan.source == "cache" and "loaded from disk" in plan.reason
    assert len(_stored(cache)) == 1
    assert_same(outputs, reference(other_fn, raw))
    assert not np.allclose(np.asarray(outputs[-1]), np.asarray(reference(jax_fn, raw)[-1]))
    outputs, plan = _run(jax_fn, raw)  # and back: the same file, the old data
    assert "loaded from disk" in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_a_damaged_file_is_a_miss(cache):
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    _run(jax_fn, raw)
    for path in _stored(cache):
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF  # one flipped bit in the payload: the checksum fails
        path.write_bytes(bytes(data))
    outputs, plan = _run(jax_fn, raw)
    assert plan.source == "cache" and "loaded from disk" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))
    for path in _stored(cache):
        path.write_bytes(b"not an executable")
    outputs, plan = _run(jax_fn, raw)
    assert "loaded from disk" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_the_folder_stays_within_its_bound(cache, monkeypatch, configure):
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    _run(jax_fn, models.raw_draws(model, 2, 50))
    (one,) = _stored(cache)
    size = one.stat().st_size
    bound = configure(store_max_bytes=int(2.5 * size)).store_max_bytes
    for draws in (51, 52, 53, 54):  # other shapes: other executables of about that size
        _run(jax_fn, models.raw_draws(model, 2, draws))
    total = sum(p.stat().st_size for p in _stored(cache))
    assert 0 < total <= bound
    assert one not in _stored(cache)  # the least recently used went first


@pytest.mark.parametrize("off", [True, False], ids=["off", "default folder"])
def test_turned_off(monkeypatch, tmp_path, off):
    """`PYMC_CHUNKPOST_CACHE_DIR=""` stores nothing in the default folder, which is used
    otherwise (the control)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if off:
        monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", "")
    else:
        monkeypatch.delenv("PYMC_CHUNKPOST_CACHE_DIR")
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    _run(jax_fn, raw)
    again, plan = _run(jax_fn, raw)
    assert (plan.source == "rule") is off
    assert_same(again, reference(jax_fn, raw))
    stored = list((tmp_path / "pymc_chunkpost" / _executable_store.SUBFOLDER).glob("*.bin"))
    assert bool(stored) is not off
    clear_caches()


def test_a_loader_failure_deletes_the_file_and_stops_the_store(cache, monkeypatch):
    from jax.experimental import serialize_executable

    _as_in_a_new_process(monkeypatch)
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    _run(jax_fn, raw)
    assert _stored(cache)

    def refuse(*args, **kwargs):
        raise ValueError("this jaxlib cannot load it")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", refuse)
    outputs, plan = _run(jax_fn, raw)
    assert "loaded from disk" not in plan.reason and not _stored(cache)
    assert_same(outputs, reference(jax_fn, raw))
    _run(jax_fn, raw)
    assert not _stored(cache)  # nothing stored again in this process


def test_fixed_strategies_store_nothing(cache):
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    clear_caches()
    _postprocess.run(jax_fn, [jnp.asarray(x) for x in raw], None, "chunked", chunk_size=10)
    _disk.wait()
    assert not _stored(cache)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("loop", [Loop.NONE, Loop.XLA])
@pytest.mark.parametrize("spec", [PartitionSpec("d"), PartitionSpec(None, "d")], ids=str)
def test_sharded_draws_load_on_their_devices(cache, monkeypatch, loop, spec, configure):
    _loop(configure, loop)
    model = models.structured()
    jax_fn = models.jax_fn(model)
    host = models.raw_draws(model, 4, 40)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), spec)

    def run():
        clear_caches()
        raw = [jax.device_put(jnp.asarray(x), sharding) for x in host]
        outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")
        _disk.wait()
        return outputs, plan

    run()
    outputs, plan = run()
    assert plan.source == "cache" and "loaded from disk" in plan.reason
    assert plan.loop is loop and plan.n_devices == 4
    assert_same(outputs, reference(jax_fn, host))
    for out in outputs:
        assert out.sharding.is_equivalent_to(sharding, out.ndim)
    # The same devices in another order: another device assignment, never the stored one.
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:4][::-1]), ("d",)), spec)
    outputs, plan = run()
    assert "loaded from disk" not in plan.reason
    assert plan.loop is loop and plan.n_devices == 4
    assert_same(outputs, reference(jax_fn, host))
    for out in outputs:
        assert out.sharding.is_equivalent_to(sharding, out.ndim)


@pytest.mark.parametrize("n_devices", [2, 4])
def test_a_program_with_nothing_to_compute_loads_on_its_own_device(cache, n_devices):
    """Every output passed through: XLA compiles the program for one device, whatever
    devices the draws are on, and it is loaded onto that device (`Portable.devices`)."""
    with pm.Model() as model:
        pm.Normal("x", 0.0, 1.0, shape=3)
    jax_fn = models.jax_fn(model)
    host = models.raw_draws(model, n_devices, 20)
    mesh = Mesh(np.array(jax.devices()[:n_devices]), ("d",))
    sharding = NamedSharding(mesh, PartitionSpec("d"))

    def run():
        clear_caches()
        raw = [jax.device_put(jnp.asarray(x), sharding) for x in host]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")
        _disk.wait()
        return outputs, plan

    _, first = run()
    assert "loaded from disk" not in first.reason and _stored(cache)
    outputs, plan = run()
    assert plan.source == "cache" and "loaded from disk" in plan.reason
    assert_same(outputs, reference(jax_fn, host))


def test_programs_hold_no_data(cache):
    """A stored program holds none of the model's data: its file is far smaller than the
    data (`_program`'s invariant), and the lowered text names no data value."""
    model = models.data_regression(n_obs=20_000)  # 480 kB of `x`
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 20)
    _run(jax_fn, raw)
    data_bytes = problem_of(jax_fn, raw).shared_bytes
    assert data_bytes >= 20_000 * 3 * 8
    assert all(path.stat().st_size < data_bytes / 4 for path in _stored(cache))


# A one-device executable moves to another device of its kind instead of compiling again
# (`_executable_store.relocate`): what makes a shard-by-shard run compile once in all.


@pytest.fixture
def compiles(monkeypatch):
    """The XLA compiles made while the test runs, counted."""
    return count_compiles(monkeypatch)


def _on(device, raw):
    return [jax.device_put(jnp.asarray(x), device) for x in raw]


@pytest.mark.parametrize(
    "loop, progress, compiled_fill",
    [
        (Loop.NONE, False, False),
        (Loop.XLA, False, False),
        (Loop.XLA, True, False),  # segments the host dispatches
        (Loop.HOST, False, True),  # two programs: the step and the compiled fill
    ],
)
def test_a_plan_compiled_for_one_device_moves_to_another(
    compiles, monkeypatch, loop, progress, compiled_fill, configure
):
    _loop(configure, loop)
    if compiled_fill:
        configure(host_zeros_max_bytes=0)
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    expected = reference(jax_fn, raw)
    first, second = jax.devices()[:2]
    clear_caches()
    _, compiled = _postprocess.run(jax_fn, _on(first, raw), None, "auto", progressbar=progress)
    assert compiles[0] == (2 if compiled_fill else 1)
    compiles[0] = 0
    outputs, plan = _postprocess.run(jax_fn, _on(second, raw), None, "auto", progressbar=progress)
    assert compiles[0] == 0 and plan.loop is loop
    assert plan.peak_bytes == compiled.peak_bytes  # XLA's memory analysis survives the move
    assert_same(outputs, expected)
    assert all(out.devices() == {second} for out in outputs)


def test_an_executable_loaded_from_disk_moves_from_its_bytes(cache, compiles):
    """Moved from the stored bytes, never from the loaded executable: jaxlib 0.10's CPU
    client serializes a loaded executable without its functions (its first call fails; later
    jaxlib pass either way)."""
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    first, second = jax.devices()[:2]
    _run(jax_fn, raw)  # compiled and stored (the draws donated, as here)
    clear_caches()
    _, loaded = _postprocess.run(jax_fn, _on(first, raw), None, "auto", True)
    assert "loaded from disk" in loaded.reason
    compiles[0] = 0
    outputs, moved = _postprocess.run(jax_fn, _on(second, raw), None, "auto", True)
    assert compiles[0] == 0 and "moved from another device" in moved.reason
    assert_same(outputs, reference(jax_fn, raw))


@pytest.mark.parametrize("refused", ["relocate_fails", "loading_stopped"])
def test_an_executable_that_cannot_move_is_compiled(compiles, monkeypatch, refused):
    _as_in_a_new_process(monkeypatch)
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    first, second = jax.devices()[:2]
    clear_caches()
    _postprocess.run(jax_fn, _on(first, raw), None, "auto")
    compiles[0] = 0
    if refused == "relocate_fails":
        monkeypatch.setattr(_executable_store, "relocate", lambda code, device: None)
    else:  # after a loaded or moved executable failed to run (`stop_loading`)
        _executable_store.stop_loading()
    outputs, plan = _postprocess.run(jax_fn, _on(second, raw), None, "auto")
    assert compiles[0] > 0 and "moved" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))
    assert all(out.devices() == {second} for out in outputs)


def test_a_program_that_cannot_move_is_not_tried_again(compiles, monkeypatch):
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    clear_caches()
    _postprocess.run(jax_fn, _on(jax.devices()[0], raw), None, "auto")
    tries = []
    monkeypatch.setattr(_executable_store, "relocate", lambda code, device: tries.append(1))
    for device in jax.devices()[1:3]:
        outputs, _ = _postprocess.run(jax_fn, _on(device, raw), None, "auto")
        assert_same(outputs, reference(jax_fn, raw))
    assert len(tries) == 1


def test_programs_with_much_data_move_too(compiles):
    """The data are arguments: a program over much data moves to another device like any."""
    model = models.data_regression(n_obs=20_000)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 100)
    clear_caches()
    _postprocess.run(jax_fn, _on(jax.devices()[0], raw), None, "auto")
    compiles[0] = 0
    outputs, _ = _postprocess.run(jax_fn, _on(jax.devices()[1], raw), None, "auto")
    assert compiles[0] == 0
    assert_same(outputs, reference(jax_fn, raw))


def test_relocate_refuses_what_it_cannot_load():
    code = _executable_store.Portable(b"not an executable", None, None, (0,))
    assert _executable_store.relocate(code, jax.devices()[0]) is None


LOAD = _executable_store.load
NOT_FOUND = "INTERNAL: Function iota_compare_fusion not found"


class _FailsToRun:
    """A loaded executable as a broken loader would give it: it loads, then fails at its first
    call (as one re-serialized from a loaded executable does on jaxlib 0.10)."""

    def __init__(self, compiled, message: str = NOT_FOUND):
        self._compiled, self._message = compiled, message

    def __call__(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError(self._message)

    def __getattr__(self, name):
        return getattr(self._compiled, name)


def _stored_then_loaded_broken(monkeypatch, message: str = NOT_FOUND):
    """A first run compiles and stores; from then on, what the store loads fails at its first
    call with `message`. Returns the function, the draws and the first run's plan."""
    _as_in_a_new_process(monkeypatch)
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    _, first = _run(jax_fn, raw)
    load = _executable_store.load

    def broken(slot, lowered):
        found = load(slot, lowered)
        return None if found is None else (_FailsToRun(found[0], message), found[1])

    monkeypatch.setattr(_executable_store, "load", broken)
    return jax_fn, raw, first


@pytest.mark.parametrize("loop", [Loop.NONE, Loop.XLA, Loop.HOST])
def test_a_loaded_executable_that_fails_to_run_is_compiled_here(
    cache, monkeypatch, loop, configure
):
    """The draws are not lost to the store: the plan is compiled here and runs, and is stored
    in place of the entry that failed; nothing more is loaded in this process, and the next
    process loads the replacement."""
    _loop(configure, loop)
    jax_fn, raw, first = _stored_then_loaded_broken(monkeypatch)
    assert first.loop is loop and _stored(cache)
    saved = []
    save = _executable_store._save
    monkeypatch.setattr(_executable_store, "_save", lambda *a: saved.append(a[0].path) or save(*a))
    message = "loaded from disk failed to run.*compiled it here and stored it in place"
    with pytest.warns(RuntimeWarning, match=message + ".*draws are intact"):
        outputs, plan = _run(jax_fn, raw)
    assert saved and set(saved) <= set(_stored(cache))  # the entries that failed, rewritten
    assert plan.source == "retry" and "compiled here" in plan.reason
    assert (plan.strategy, plan.chunk_size, plan.loop) == (first.strategy, first.chunk_size, loop)
    assert_same(outputs, reference(jax_fn, raw))
    compiles = count_compiles(monkeypatch)
    same, plan = _postprocess.run(jax_fn, [jnp.asarray(x) for x in raw], None, "auto", True)
    assert compiles[0] == 0 and plan.source == "cache"  # what was compiled here, kept
    again, plan = _run(jax_fn, raw)  # the file is still there, and no longer loaded
    assert compiles[0] > 0 and "loaded from disk" not in plan.reason
    assert_same(same, reference(jax_fn, raw))
    assert_same(again, reference(jax_fn, raw))
    monkeypatch.setattr(_executable_store, "load", LOAD)  # a new process: a loader that works
    _as_in_a_new_process(monkeypatch)
    replaced, plan = _run(jax_fn, raw)
    assert plan.source == "cache" and "loaded from disk" in plan.reason
    assert_same(replaced, reference(jax_fn, raw))


def test_an_executable_from_a_loaded_one_fails_to_run_and_is_compiled_here(
    cache, compiles, monkeypatch, configure
):
    """The real failure behind `Portable`'s invariant, broken on purpose: moved from the bytes
    of a loaded executable, serialized again, jaxlib 0.10's CPU executable loads, then fails
    at its first call. The shard is compiled on its own device instead."""
    from pymc_chunkpost._support.compat import jaxlib_version

    if jaxlib_version() > (0, 10):
        pytest.skip("later jaxlib serialize a loaded executable whole: nothing fails")
    _as_in_a_new_process(monkeypatch)
    configure(vmap_temp_bytes=0)  # an XLA loop: its copy fails
    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 40)
    first, second = jax.devices()[:2]
    _run(jax_fn, raw)  # compiled and stored (the draws donated, as here)
    load = _executable_store.load

    def reserialized(slot, lowered):
        found = load(slot, lowered)
        return None if found is None else (found[0], _executable_store.portable(found[0]))

    monkeypatch.setattr(_executable_store, "load", reserialized)
    clear_caches()
    _, loaded = _postprocess.run(jax_fn, _on(first, raw), None, "auto", True)
    assert "loaded from disk" in loaded.reason
    compiles[0] = 0
    with pytest.warns(RuntimeWarning, match="moved from another device failed to run"):
        outputs, plan = _postprocess.run(jax_fn, _on(second, raw), None, "auto", True)
    assert plan.source == "retry" and compiles[0] == 1
    assert_same(outputs, reference(jax_fn, raw))
    assert all(out.devices() == {second} for out in outputs)


def test_a_failure_of_a_compiled_executable_is_raised(cache, monkeypatch):
    """Only what this process did not compile is compiled again: any other failure is the
    caller's to see, and the draws are untouched."""
    from pymc_chunkpost._engine.execute import executor as _executor

    model = models.structured()
    jax_fn = models.jax_fn(model)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 4, 40)]
    obtain = _executor.obtain

    def fails(*args, **kwargs):
        exe = obtain(*args, **kwargs)
        return dataclasses.replace(exe, compiled=_FailsToRun(exe.compiled))

    monkeypatch.setattr(_executor, "obtain", fails)
    clear_caches()
    with pytest.raises(jax.errors.JaxRuntimeError, match="iota_compare_fusion"):
        _postprocess.run(jax_fn, raw, None, "auto")
    assert not any(x.is_deleted() for x in raw)


def test_a_loaded_executable_out_of_memory_is_the_memory_policys(cache, monkeypatch, configure):
    """Running out of memory says nothing against the store: smaller chunks, as for any
    executable, and the store stays in use."""
    configure(vmap_temp_bytes=0)
    oom = "RESOURCE_EXHAUSTED: Out of memory allocating"
    jax_fn, raw, first = _stored_then_loaded_broken(monkeypatch, oom)
    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        outputs, plan = _run(jax_fn, raw)
    assert plan.source == "retry" and plan.chunk_size < first.chunk_size
    assert not _executable_store.loading_stopped()
    assert_same(outputs, reference(jax_fn, raw))


def test_a_tuner_step_not_compiled_here_is_retried():
    """A tuner's candidate may be loaded from the store while the plan's own executable was
    compiled: its failure is retried as the plan's would be."""
    import types

    from pymc_chunkpost._engine.data.types import Origin
    from pymc_chunkpost._engine.plan.attempt import Attempt
    from pymc_chunkpost._engine.plan.planner import retries

    exe = types.SimpleNamespace(origin=Origin.COMPILED)
    loaded = types.SimpleNamespace(origin=Origin.LOADED)
    failure = jax.errors.JaxRuntimeError(NOT_FOUND)
    tuned = types.SimpleNamespace(ran=[exe, loaded])  # a size, or a library trial's step
    assert retries(Attempt(None, exe, tuned), failure)  # type: ignore[arg-type]
    assert not retries(Attempt(None, exe, None), failure)  # type: ignore[arg-type]
    assert not retries(Attempt(None, loaded, None), ValueError("not XLA's"))  # type: ignore[arg-type]


# The folder is a trust boundary (`_disk.trusted`): an executable in it is code.


def test_the_folder_and_its_files_are_private(cache):
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    _run(jax_fn, models.raw_draws(model, 2, 50))
    folder = cache / _executable_store.SUBFOLDER
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert _stored(cache) and all((f.stat().st_mode & 0o777) == 0o600 for f in _stored(cache))


def _chown_to_someone_else(path):
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    os.chown(path, 4321, -1)


def _files(cache, change):
    for f in _stored(cache):
        change(f)


@pytest.mark.parametrize(
    "make_untrusted, why, replaced",
    [
        (lambda cache: cache.chmod(0o777), "can be written by others", False),
        (lambda cache: (cache / "executables").chmod(0o770), "written by others", False),
        (_chown_to_someone_else, "is not owned by you", False),
        (lambda cache: _files(cache, _chown_to_someone_else), "not owned by you", True),
        (lambda cache: _files(cache, lambda f: f.chmod(0o666)), "written by others", True),
    ],
    ids=["folder", "subfolder-group", "folder-owner", "file-owner", "file"],
)
def test_a_folder_or_file_others_can_write_is_refused(
    cache, monkeypatch, make_untrusted, why, replaced
):
    """Nothing is loaded from it: one warning names it and the fix, and the run compiles and
    gives pymc's outputs. A refused file is replaced by what is compiled in its place (the
    folder is ours, and the file, written anew, too); a refused folder is never read again
    in this process."""
    monkeypatch.setattr(_disk, "_REFUSED", set())
    model = models.transforms()
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 50)
    _run(jax_fn, raw)
    assert _stored(cache)
    make_untrusted(cache)
    with pytest.warns(RuntimeWarning, match=f"{why}.*chmod go-w.*PYMC_CHUNKPOST_CACHE_DIR"):
        outputs, plan = _run(jax_fn, raw)
    assert "loaded from disk" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        again, plan = _run(jax_fn, raw)
    assert ("loaded from disk" in plan.reason) is replaced
    assert_same(again, reference(jax_fn, raw))
