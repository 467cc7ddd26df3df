"""Outputs on disk: chunks written into a Zarr v3 store, crash-safe and resumable."""

from __future__ import annotations

import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import (
    ROOT,
    Stop,
    assert_intact,
    assert_same,
    fail_after,
    problem_of,
    read_only,
    reference,
)

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._store import zarr as _zarr_store
from pymc_chunkpost._support.extras import MissingExtraError
from pymc_chunkpost._support.memory import OUTPUT_PATH_ENV

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")


def per_draw(x, y):
    """Three outputs: `x` passed through, one of 40 values per draw, and a scalar."""
    return x, jnp.sin(x)[..., None] * jnp.arange(40.0) + y[..., :1], (y**2).sum()


def draws(chains=3, n_draws=50, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(chains, n_draws)), rng.normal(size=(chains, n_draws, 4))]


def in_memory(raw):
    return [np.asarray(x) for x in pc.postprocess_samples(per_draw, raw, output_memory="device")]


def assert_equal_to(stored, expected):
    assert len(stored) == len(expected)
    for got, want in zip(stored, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got[...], want)


@pytest.mark.parametrize("name", ["transforms", "structured"])
@pytest.mark.parametrize("options", [{}, {"chunk_size": 7}, {"progressbar": True}])
def test_outputs_equal_pymc(built, tmp_path, name, options):
    model, jax_fn = built(name)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 3, 31)]
    copies = [np.asarray(x).copy() for x in raw]
    expected = reference(jax_fn, raw)
    path = tmp_path / "store"
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", output_memory="disk", output_path=path, **options
    )
    assert plan.output_memory == "disk"
    assert all(isinstance(x, zarr.Array) for x in outputs)  # backed by the store
    assert_same([x[...] for x in outputs], expected)
    assert_intact(raw, copies)
    assert pc.open_outputs(path).complete


def test_returns_arrays_that_read_a_slice_alone(tmp_path):
    raw = draws()
    expected = in_memory(raw)
    path = tmp_path / "store"
    outputs = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=str(path), chunk_size=8
    )
    assert_equal_to(outputs, expected)
    np.testing.assert_array_equal(outputs[1][2, 10:13, 5], expected[1][2, 10:13, 5])
    assert outputs[1].read_only  # the store's values are not to be changed through them
    # One chain of draws per Zarr chunk (as few draws as fit `DISK_CHUNK_BYTES`).
    assert outputs[1].chunks[0] == 1


def test_layout_opens_with_xarray_as_a_datatree(tmp_path):
    raw = draws(2, 20)
    expected = in_memory(raw)
    path = tmp_path / "store"
    pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=path, chunk_size=6)
    dataset = xr.open_zarr(path, group="posterior")
    assert dict(dataset.sizes) == {"chain": 2, "draw": 20, "output_1_dim_0": 40}
    assert dataset["output_1"].dims == ("chain", "draw", "output_1_dim_0")
    np.testing.assert_array_equal(dataset["chain"].values, [0, 1])
    np.testing.assert_array_equal(dataset["draw"].values, np.arange(20))
    np.testing.assert_array_equal(dataset["output_1"].values, expected[1])
    if hasattr(xr, "open_datatree"):
        tree = xr.open_datatree(path, engine="zarr")
        assert set(tree.children) == {"posterior"}
        np.testing.assert_array_equal(tree["posterior"]["output_2"].values, expected[2])


def test_open_outputs_reports_a_complete_store(tmp_path):
    raw = draws()
    path = tmp_path / "store"
    pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=path)
    stored = pc.open_outputs(path, require_complete=True)
    assert stored.complete and stored.items_written == stored.n_items == 150
    assert sorted(stored.arrays) == [f"posterior/output_{j}" for j in range(3)]
    assert not (path / _zarr_store.MARKERS).exists()  # a complete store needs no markers
    with pytest.raises(ValueError, match="holds no outputs"):
        pc.open_outputs(tmp_path)


def test_a_failed_run_is_incomplete_and_resume_finishes_it(tmp_path, monkeypatch):
    raw = draws()
    copies = [x.copy() for x in raw]
    expected = in_memory(raw)
    path = tmp_path / "store"
    fail_after(monkeypatch, 2 * 4 + 1)  # four chunks whole, the fifth half written
    with pytest.raises(Stop):
        pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=path, chunk_size=10)
    stored = pc.open_outputs(path)
    assert not stored.complete and stored.items_written == 40
    with pytest.raises(ValueError, match="incomplete.*resume=True"):
        pc.open_outputs(path, require_complete=True)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not empty.*resume=True"):
        pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=path)
    writes = fail_after(monkeypatch, 10**6)
    outputs = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=path, chunk_size=10, resume=True
    )
    # The 11 chunks left, two computed outputs each, then `x`, passed through, in 15 slices.
    assert writes[0] == 2 * 11 + 15
    assert_equal_to(outputs, expected)
    assert pc.open_outputs(path).complete
    for x, y in zip(raw, copies):
        np.testing.assert_array_equal(x, y)
    # Resuming a complete store computes nothing and returns it.
    writes[0] = 0
    again = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=path, resume=True
    )
    assert writes[0] == 0
    assert_equal_to(again, expected)


def test_each_chunk_is_on_the_disk_before_its_marker(tmp_path, monkeypatch):
    """Before a chunk's marker: its chunk files and every folder up to the store, flushed
    (`fsync`); the marker flushed before the next chunk; and before `complete`, every file
    of the store, the root's metadata after it."""
    events = []
    fsync, mark = _zarr_store._fsync, _disk_sink._mark
    monkeypatch.setattr(_zarr_store, "_fsync", lambda p: (events.append(p), fsync(p))[1])
    monkeypatch.setattr(
        _disk_sink, "_mark", lambda f, a, b: (events.append((a, b)), mark(f, a, b))[1]
    )
    path = tmp_path / "store"
    pc.postprocess_samples(per_draw, draws(), output_memory="disk", output_path=path, chunk_size=10)
    marks = [i for i, e in enumerate(events) if isinstance(e, tuple)]
    assert [events[i] for i in marks] == [(a, a + 10) for a in range(0, 150, 10)]
    before = 0
    for i in marks:
        a, _ = events[i]
        chain, c = divmod(a, 50)
        files = [
            path / f"posterior/output_1/c/{chain}/{c // 10}/0",
            path / f"posterior/output_2/c/{chain}/{c // 10}",
        ]
        synced = set(events[before:i])
        for file in files:
            assert file in synced, (a, file)
            assert {p for p in file.parents if path in p.parents or p == path} <= synced
        marker = path / _zarr_store.MARKERS / f"{a}_{a + 10}"
        assert events[i + 1] == marker and path / _zarr_store.MARKERS in events[i + 2 : i + 4]
        before = i + 1
    stored = {f for f in path.rglob("*") if f.is_file()}
    assert stored <= set(events[marks[-1] :])  # every file of the store, before `complete`
    assert events[-2:] == [path / "zarr.json", path]  # the `complete` attribute, flushed


def test_resume_refuses_outputs_of_other_inputs(tmp_path, monkeypatch):
    """Other draws of the same shapes, or other data (a constant of the function), would
    mix two calls' values in one store: refused before any work, the store unchanged."""
    raw = draws()
    path = tmp_path / "store"
    fail_after(monkeypatch, 2 * 4 + 1)
    with pytest.raises(Stop):
        pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=path, chunk_size=10)
    monkeypatch.undo()
    offset = jnp.asarray(np.linspace(0.0, 1.0, 40))

    def other_data(x, y):
        return x, jnp.sin(x)[..., None] * offset + y[..., :1], (y**2).sum()

    writes = fail_after(monkeypatch, 10**6)
    for fn, given in [(per_draw, draws(seed=1)), (other_data, raw)]:
        with pytest.raises(ValueError, match="computed from other inputs.*Nothing was run"):
            pc.postprocess_samples(
                fn, given, output_memory="disk", output_path=path, chunk_size=10, resume=True
            )
    flipped = not jax.config.jax_threefry_partitionable
    with jax.threefry_partitionable(flipped), pytest.raises(ValueError, match="JAX settings"):
        pc.postprocess_samples(
            per_draw, raw, output_memory="disk", output_path=path, chunk_size=10, resume=True
        )
    assert writes[0] == 0 and pc.open_outputs(path).items_written == 40
    outputs = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=path, chunk_size=10, resume=True
    )
    assert_equal_to(outputs, in_memory(raw))


def test_the_inputs_digest_reads_values_as_the_program_does():
    """Equal for the values the program reads, whatever their byte order, memory order or
    place; another value, program or JAX version differs; a device array keeps no host
    copy of its values (jax's own `np.asarray` would keep one on it)."""
    x = np.arange(12.0).reshape(4, 3)
    dtype = np.float64 if jax.config.read("jax_enable_x64") else np.float32
    base = _disk_sink.inputs_digest([x], [dtype], [], "f at 0x7f00")
    devices = jax.devices("cpu")[:2]  # over two devices, jax's `np.asarray` copies and keeps

    def on_devices():
        mesh = jax.sharding.Mesh(np.array(devices), ("c",))
        spec = jax.sharding.PartitionSpec("c" if len(devices) == 2 else None)
        return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))

    on_device = on_devices()
    same = [x.astype(">f8"), np.asfortranarray(x), on_device, x.astype(dtype)]
    for given in same:
        assert _disk_sink.inputs_digest([given], [dtype], [], "f at 0x7f00") == base
    assert getattr(on_device, "_npy_value", None) is None
    data = on_devices()  # numpyro's data, keyed by their digest, keep no copy either
    pytest.importorskip("numpyro")
    from pymc_chunkpost._numpyro import trace as _trace

    assert _trace._digest(data) == _trace._digest(x)
    assert getattr(data, "_npy_value", None) is None
    assert _disk_sink.inputs_digest([x], [dtype], [], "f at 0x7f11") == base  # an address
    assert _disk_sink.inputs_digest([x + 1], [dtype], [], "f at 0x7f00") != base
    assert _disk_sink.inputs_digest([x], [dtype], [x[:1]], "f at 0x7f00") != base
    assert _disk_sink.inputs_digest([x], [dtype], [], "g at 0x7f00") != base


def test_resume_refuses_other_data_of_a_nested_program(tmp_path, monkeypatch):
    """Data held as a nested `jit`'s own constant, which the printed program shows as a type
    only, are inputs too."""

    def with_data(offset):
        @jax.jit
        def scaled(x):
            return jnp.sin(x)[..., None] * jnp.asarray(offset)

        return lambda x, y: (x, scaled(x) + y[..., :1], (y**2).sum())

    raw, path = draws(), tmp_path / "store"
    options = dict(output_memory="disk", output_path=path, chunk_size=10)
    fail_after(monkeypatch, 2 * 4 + 1)
    with pytest.raises(Stop):
        pc.postprocess_samples(with_data(np.arange(40.0)), raw, **options)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="computed from other inputs"):
        pc.postprocess_samples(with_data(np.arange(40.0) + 1), raw, **options, resume=True)
    outputs = pc.postprocess_samples(with_data(np.arange(40.0)), raw, **options, resume=True)
    assert pc.open_outputs(path).complete
    assert_equal_to(outputs, in_memory(raw))  # per_draw's, the same function


KILLED = """
import os, signal, sys
import numpy as np
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)  # as pymc sets it in the test process
import pymc_chunkpost as pc
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink

def per_draw(x, y):
    return x, jnp.sin(x)[..., None] * jnp.arange(40.0) + y[..., :1], (y**2).sum()

rng = np.random.default_rng(0)
raw = [rng.normal(size=(3, 50)), rng.normal(size=(3, 50, 4))]
write, count = _disk_sink._write_items, [0]

def killed(*args):
    count[0] += 1
    if count[0] == 2 * 6 + 2:  # chunks 0-5 whole, chunk 6's first output written
        os.kill(os.getpid(), signal.SIGKILL)
    return write(*args)

_disk_sink._write_items = killed
pc.postprocess_samples(per_draw, raw, output_memory="disk", output_path=sys.argv[1], chunk_size=10)
"""


def test_a_killed_run_never_reads_as_complete_and_resumes(tmp_path):
    import subprocess

    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    path = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script), str(path)], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    stored = pc.open_outputs(path)
    # Chunks 0-5 were written whole; a chunk is marked once flushed, behind the writes: the
    # markers are those of the first chunks, none past them.
    marked = sorted(_zarr_store._read_markers(path / _zarr_store.MARKERS))
    assert not stored.complete and marked == [(a, a + 10) for a in range(0, len(marked) * 10, 10)]
    assert stored.items_written == 10 * len(marked) <= 60
    raw = draws()
    outputs = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=path, chunk_size=10, resume=True
    )
    assert_equal_to(outputs, in_memory(raw))
    assert pc.open_outputs(path).complete


def test_options_are_checked_before_any_work(tmp_path, monkeypatch):
    raw = draws(2, 10)

    def run(**options):
        return pc.postprocess_samples(per_draw, raw, **options)

    with pytest.raises(ValueError, match="output_memory.*'disk'"):
        run(output_memory="disc")
    with pytest.raises(ValueError, match="needs `output_path`"):
        run(output_memory="disk")
    with pytest.raises(ValueError, match="must be a folder path"):
        run(output_memory="disk", output_path=3)
    with pytest.raises(ValueError, match="`resume` must be True or False"):
        run(output_memory="disk", output_path=tmp_path / "a", resume="yes")
    with pytest.raises(ValueError, match="applies to the strategies"):
        pc.postprocess_samples(
            per_draw, raw, None, "vmap", output_memory="disk", output_path=tmp_path / "a"
        )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        run(output_memory="disk", output_path=tmp_path / "other")
    with pytest.raises(ValueError, match="holds other outputs.*not a store of ours"):
        run(output_memory="disk", output_path=tmp_path / "other", resume=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        run(output_memory="disk", output_path=tmp_path / "file")
    # Another call's outputs: other shapes cannot be resumed.
    run(output_memory="disk", output_path=tmp_path / "small")
    with pytest.raises(ValueError, match="other names or shapes"):
        pc.postprocess_samples(
            per_draw,
            draws(2, 11),
            output_memory="disk",
            output_path=tmp_path / "small",
            resume=True,
        )
    monkeypatch.setattr(
        _disk_sink.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})()
    )
    with pytest.raises(ValueError, match=r"need .* MiB on disk, but .* has 0.0 MiB free"):
        run(output_memory="disk", output_path=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_read_only_place_is_refused(tmp_path, monkeypatch):
    with read_only(tmp_path / "locked", monkeypatch) as locked:
        with pytest.raises(ValueError, match="cannot be written.*read-only"):
            pc.postprocess_samples(
                per_draw, draws(2, 10), output_memory="disk", output_path=locked / "store"
            )
    assert not (locked / "store").exists()


def test_auto_picks_disk_only_where_a_path_is_given(wide, tmp_path, monkeypatch):
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 40)
    problem = problem_of(jax_fn, raw)
    small = problem.output_bytes // 4
    with pytest.raises(MemoryError, match="output_memory='disk', output_path="):
        _postprocess.run(jax_fn, raw, None, "auto", memory_budget=small)
    assert _resources.output_memory_for(problem, "auto", small, disk=True)[0] == "disk"
    assert _resources.output_memory_for(problem, "auto", None, disk=True)[0] == "device"
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", memory_budget=small, output_path=tmp_path / "given"
    )
    assert plan.output_memory == "disk" and "exceed" in plan.reason
    expected = reference(jax_fn, raw)
    assert_same([x[...] for x in outputs], expected)
    # `configure_memory`'s default path, which the public entries read.
    monkeypatch.setenv(OUTPUT_PATH_ENV, str(tmp_path / "default"))
    outputs = pc.postprocess_samples(jax_fn, raw, memory_budget=small)
    assert all(isinstance(x, zarr.Array) for x in outputs)
    assert_same([x[...] for x in outputs], expected)
    assert pc.open_outputs(tmp_path / "default").complete
    # A route that passes no path (the patched `pm.sample`) never writes to disk.
    with pytest.raises(MemoryError, match="output_memory='disk'"):
        _postprocess.run(jax_fn, raw, None, "auto", memory_budget=small)


def test_configure_memory_sets_the_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv(OUTPUT_PATH_ENV, "")  # unset (empty), and restored after the test
    settings = pc.configure_memory(output_path=tmp_path / "default")
    assert settings == {OUTPUT_PATH_ENV: str(tmp_path / "default")}
    raw = draws(2, 10)
    outputs = pc.postprocess_samples(per_draw, raw, output_memory="disk")
    assert_equal_to(outputs, in_memory(raw))
    with pytest.raises(ValueError, match="`output_path` must be a folder path"):
        pc.configure_memory(output_path="")


def test_host_outputs_too_large_name_the_disk_tier(wide, monkeypatch):
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 40)
    problem = problem_of(jax_fn, raw)
    monkeypatch.setattr(_resources, "host_free_bytes", lambda: problem.output_bytes // 2)
    with pytest.raises(MemoryError, match="output_memory='disk'"):
        _resources.check_host(problem)


def test_without_zarr_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(MissingExtraError, match=r"pymc-chunkpost\[disk\]"):
        pc.postprocess_samples(
            per_draw, draws(2, 10), output_memory="disk", output_path=tmp_path / "s"
        )


def test_sharded_chains_write_their_own_block(tmp_path):
    devices = jax.devices("cpu")
    if len(devices) < 2:
        pytest.skip("needs two CPU devices")
    raw = draws(4, 12)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices[:2]), ("c",)), jax.sharding.PartitionSpec("c")
    )
    placed = [jax.device_put(x, sharding) for x in raw]
    outputs = pc.postprocess_samples(
        per_draw, placed, output_memory="disk", output_path=tmp_path / "s", chunk_size=5
    )
    assert_equal_to(outputs, in_memory(raw))


# --- the post-hoc routes --------------------------------------------------------------------


def as_dataset(x):
    return x.to_dataset() if hasattr(x, "to_dataset") else x


def assert_like_pymc(ours, theirs):
    """The same variables, dims, dtypes and coords as pymc's, values within 1e-12."""
    ours = ours.to_dataset() if hasattr(ours, "to_dataset") else ours
    theirs = theirs.to_dataset() if hasattr(theirs, "to_dataset") else theirs
    assert list(ours.data_vars) == list(theirs.data_vars)
    for name in theirs.data_vars:
        a, b = ours[name], theirs[name]
        assert a.dims == b.dims and a.dtype == b.dtype, name
        np.testing.assert_allclose(a.values, b.values, rtol=1e-12, atol=1e-12, err_msg=name)
    xr.testing.assert_identical(xr.Dataset(coords=ours.coords), xr.Dataset(coords=theirs.coords))


@pytest.fixture(scope="module")
def posthoc_models():
    import test_posthoc

    built = {name: test_posthoc.MODELS[name]() for name in ("counts", "eight_schools")}
    return {name: (model, test_posthoc.posterior(model)) for name, model in built.items()}


@pytest.mark.parametrize("name", ["counts", "eight_schools"])
@pytest.mark.parametrize("function", ["compute_log_likelihood", "compute_log_prior"])
def test_log_densities_on_disk_equal_pymc(posthoc_models, tmp_path, name, function):
    import test_posthoc

    model, post = posthoc_models[name]
    kwargs = dict(model=model, extend_inferencedata=False, progressbar=False)
    theirs = test_posthoc.PYMC[function](test_posthoc.idata_of(post), **kwargs)
    path = tmp_path / "store"
    ours = getattr(pc, function)(
        test_posthoc.idata_of(post), **kwargs, output_memory="disk", output_path=path, chunk_size=3
    )
    assert_like_pymc(ours, theirs)
    group = "log_likelihood" if function == "compute_log_likelihood" else "log_prior"
    assert ours.encoding.get("source") or pc.open_outputs(path).complete  # read from the store
    assert set(pc.open_outputs(path).arrays) == {f"{group}/{v}" for v in theirs.data_vars}
    extended = getattr(pc, function)(
        test_posthoc.idata_of(post),
        model=model,
        progressbar=False,
        output_memory="disk",
        output_path=path,
        resume=True,  # the store is complete: read, not computed again
    )
    assert_like_pymc(extended[group], theirs)


@pytest.mark.parametrize("given", [True, False])  # the call's path, or the default one
def test_other_sample_dims_stay_in_memory_under_auto(posthoc_models, tmp_path, monkeypatch, given):
    """The store holds (chain, draw): "auto" keeps other sample dims in memory, whichever
    path applies, and "disk" refuses them before any work."""
    import test_posthoc

    model, post = posthoc_models["eight_schools"]
    dataset = post.transpose("draw", "chain", ...)
    kwargs = dict(model=model, sample_dims=("draw", "chain"), progressbar=False)
    theirs = test_posthoc.PYMC["compute_log_likelihood"](test_posthoc.idata_of(dataset), **kwargs)
    path = tmp_path / "store"
    if given:
        kwargs["output_path"] = path
    else:
        monkeypatch.setenv(OUTPUT_PATH_ENV, str(path))
    ours = pc.compute_log_likelihood(test_posthoc.idata_of(dataset), **kwargs)
    assert_like_pymc(ours["log_likelihood"], theirs["log_likelihood"])
    assert not path.exists()
    with pytest.raises(ValueError, match="sample dims"):
        pc.compute_log_likelihood(test_posthoc.idata_of(dataset), **kwargs, output_memory="disk")
    assert not path.exists()


def test_deterministics_on_disk_equal_pymc(posthoc_models, tmp_path):
    import test_posthoc

    model, post = posthoc_models["eight_schools"]
    theirs = test_posthoc.PYMC["compute_deterministics"](post, model=model, progressbar=False)
    ours = pc.compute_deterministics(
        post, model=model, progressbar=False, output_memory="disk", output_path=tmp_path / "s"
    )
    assert_like_pymc(ours, theirs)
    if hasattr(xr, "open_datatree"):
        tree = xr.open_datatree(tmp_path / "s", engine="zarr")
        assert_like_pymc(tree["posterior"], theirs)


@pytest.mark.parametrize("compressors", [None, "auto"])
def test_whole_chunks_are_written_as_their_files_and_read_back_by_zarr(
    tmp_path, monkeypatch, compressors
):
    """Chunks that are whole Zarr chunks of an uncompressed array go straight to their files
    (`_ChunkFiles`); with a codec, zarr writes them; zarr reads the same values either way."""
    monkeypatch.setattr(_disk_sink, "COMPRESSORS", compressors)
    written = []
    write = _disk_sink._ChunkFiles.write

    def spy(self, *args):
        done = write(self, *args)
        written.append(done)
        return done

    monkeypatch.setattr(_disk_sink._ChunkFiles, "write", spy)
    raw = draws(3, 50)
    outputs = pc.postprocess_samples(
        per_draw, raw, output_memory="disk", output_path=tmp_path / "s", chunk_size=10
    )
    assert_equal_to(outputs, in_memory(raw))
    assert outputs[1].chunks == (1, 10, 40)
    assert written == ([True] * 2 * 15 + [True] * 15 if compressors is None else [])


def test_auto_on_an_accelerator_goes_to_disk_past_host_memory(wide, monkeypatch):
    """Device too small, host too small: disk where a path is set, else a `MemoryError`
    that names the disk tier; host memory where it holds the outputs."""
    import dataclasses

    from helpers import FakeAccelerator

    from pymc_chunkpost._engine.data.problem import Placement

    model, jax_fn = wide
    problem = problem_of(jax_fn, models.raw_draws(model, 4, 100))
    gpu = FakeAccelerator(problem.output_bytes // 2)
    on_gpu = dataclasses.replace(problem, placement=Placement(gpu))
    monkeypatch.setattr(_resources, "host_free_bytes", lambda: problem.output_bytes // 2)
    where, why = _resources.output_memory_for(on_gpu, "auto", gpu.free, disk=True)
    assert where == "disk" and "output path" in why
    with pytest.raises(MemoryError, match="output_memory='disk'"):
        _resources.output_memory_for(on_gpu, "auto", gpu.free)
    monkeypatch.setattr(_resources, "host_free_bytes", lambda: 2**40)  # beside the margin
    assert _resources.output_memory_for(on_gpu, "auto", gpu.free, disk=True)[0] == "host"
    assert _resources.output_memory_for(on_gpu, "disk", gpu.free, disk=True)[0] == "disk"


@pytest.mark.parametrize("n_writes", [1, 2 * 5 - 1])  # the first chunk; the last one
def test_donated_draws_survive_a_failed_write(tmp_path, monkeypatch, n_writes):
    raw = [jnp.asarray(x) for x in draws(2, 25)]
    copies = [np.asarray(x).copy() for x in raw]
    fail_after(monkeypatch, n_writes)
    with pytest.raises(Stop):
        pc.postprocess_samples(
            per_draw,
            raw,
            None,
            "auto",
            True,
            output_memory="disk",
            output_path=tmp_path / "s",
            chunk_size=10,
        )
    assert_intact(raw, copies)
    assert not pc.open_outputs(tmp_path / "s").complete


# --- the predictive route -----------------------------------------------------------------


def _one_dim(post):
    """The draws under one sample dim, `sample`, of plain coordinates."""
    n = post.sizes["chain"] * post.sizes["draw"]
    variables = {
        name: (("sample", *da.dims[2:]), da.values.reshape(n, *da.shape[2:]))
        for name, da in post.data_vars.items()
    }
    coords = {k: v for k, v in post.coords.items() if k not in ("chain", "draw")}
    return xr.Dataset(variables, coords={**coords, "sample": np.arange(n) * 10})


@pytest.mark.parametrize(
    "trace, sample_dims",
    [
        (_one_dim, ["sample"]),
        (lambda post: post.stack(sample=("chain", "draw")), ["sample"]),  # a MultiIndex
        (lambda post: post.transpose("draw", "chain", ...), ["draw", "chain"]),
        (lambda post: [{k: post[k].values[0, i] for k in post.data_vars} for i in range(5)], None),
    ],
    ids=["one_dim", "multiindex", "draw_chain", "points"],
)
def test_posterior_predictive_of_other_sample_dims_on_disk(
    posthoc_models, tmp_path, trace, sample_dims
):
    """A trace of other sample dims, or a list of points: the store holds the trace's sample
    dims, and the result has pymc's dims and coordinates, read lazily."""
    model, post = posthoc_models["counts"]
    kwargs = dict(model=model, random_seed=3, progressbar=False)
    if sample_dims is not None:
        kwargs["sample_dims"] = sample_dims
    theirs = pc.sample_posterior_predictive(trace(post), **kwargs)
    path = tmp_path / "store"
    ours = pc.sample_posterior_predictive(
        trace(post), **kwargs, output_memory="disk", output_path=path
    )
    for name in ("events", "hits"):  # read from the store, lazily
        variable = ours["posterior_predictive"][name].variable
        assert "preferred_chunks" in variable.encoding and not variable._in_memory, name
    ours_, theirs_ = (as_dataset(x["posterior_predictive"]).copy() for x in (ours, theirs))
    for x in (ours_, theirs_):
        x.attrs.pop("created_at")  # when each was packed
    xr.testing.assert_identical(ours_.load(), theirs_)
    assert pc.open_outputs(path).complete


def test_posterior_predictive_of_one_point_is_refused_on_disk(tmp_path, monkeypatch):
    """pymc 6's `sample_dims=[]`, one point: "disk" is refused before any work, "auto"
    keeps it in memory."""
    import test_posthoc

    if not test_posthoc.PYMC6:
        pytest.skip("pymc 5 takes sample dims")
    pm = pytest.importorskip("pymc")
    with pm.Model() as model:
        pm.Normal("y", pm.Normal("mu"), observed=np.zeros(3))
    point = xr.Dataset({"mu": ((), 0.5)})
    kwargs = dict(model=model, sample_dims=[], progressbar=False, output_path=tmp_path / "s")
    with pytest.raises(ValueError, match="stores draws along sample dims"):
        pc.sample_posterior_predictive(point, **kwargs, output_memory="disk")
    drawn = pc.sample_posterior_predictive(point, **kwargs)
    assert dict(drawn["posterior_predictive"].sizes) == {"y_dim_0": 3}
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("extend", [False, True])
def test_posterior_predictive_on_disk_equals_the_route_in_memory(posthoc_models, tmp_path, extend):
    """The same draws as the route in memory (each draw's keys are its seed and index), read
    lazily from the store under pymc's groups, names, dims and coords."""
    import test_posthoc

    model, post = posthoc_models["counts"]
    kwargs = dict(model=model, random_seed=3, progressbar=False, extend_inferencedata=extend)
    theirs = pc.sample_posterior_predictive(test_posthoc.idata_of(post), **kwargs)
    path = tmp_path / "store"
    ours = pc.sample_posterior_predictive(
        test_posthoc.idata_of(post), **kwargs, output_memory="disk", output_path=path
    )
    groups = (lambda x: list(x.children)) if test_posthoc.PYMC6 else (lambda x: x.groups())
    assert list(groups(ours)) == list(groups(theirs))
    for name in ("events", "hits"):  # read from the store (its Zarr chunking), lazily
        variable = ours["posterior_predictive"][name].variable
        assert "preferred_chunks" in variable.encoding and not variable._in_memory, name
    assert_like_pymc(ours["posterior_predictive"], theirs["posterior_predictive"])
    stored = pc.open_outputs(path)
    assert stored.complete
    assert set(stored.arrays) == {"posterior_predictive/events", "posterior_predictive/hits"}

    # Resumed: the same seed reads the complete store; another seed's draws are other
    # values; without a seed, each call draws from a new one: nothing to continue.
    def resume(seed):
        return pc.sample_posterior_predictive(
            test_posthoc.idata_of(post),
            **(kwargs | {"random_seed": seed}),
            output_memory="disk",
            output_path=path,
            resume=True,
        )

    assert_like_pymc(resume(3)["posterior_predictive"], theirs["posterior_predictive"])
    for seed, refusal in [(4, "computed from other inputs"), (None, "needs the `random_seed`")]:
        with pytest.raises(ValueError, match=refusal):
            resume(seed)
    assert pc.open_outputs(path).complete
