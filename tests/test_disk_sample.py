"""The patched `pm.sample` with its outputs on disk: the whole InferenceData in one store.

One real NUTS run, patched and not, at the same seed: the store holds pymc's groups, names,
dims, coords and values. The checks before sampling replace only the NUTS step
(`test_patch.fake_nuts`), and find it never called.
"""

from __future__ import annotations

import os
import shutil
import types

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")
pytest.importorskip("numpyro")

import test_patch  # noqa: E402
from test_patch import PYMC6, _sample  # noqa: E402

import pymc_chunkpost as pc  # noqa: E402
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink  # noqa: E402
from pymc_chunkpost._store import zarr as _zarr_store  # noqa: E402
from pymc_chunkpost._support.memory import OUTPUT_PATH_ENV  # noqa: E402

# test_patch's fixtures: its model, the NUTS step replaced, the engine's calls recorded.
model, fake_nuts, spy = test_patch.model, test_patch.fake_nuts, test_patch.spy
_restore_pymc = test_patch._restore_pymc

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*log_likelihood.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def disk(path, **more):
    return {"postprocessing_output_memory": "disk", "postprocessing_output_path": path, **more}


def groups(idata):
    return sorted(idata.children) if PYMC6 else sorted(idata.groups())


def dataset(idata, group):
    found = idata[group]
    return found.to_dataset() if hasattr(found, "to_dataset") else found


def from_store(variable):
    """Whether `variable` is read lazily from a Zarr store, not held in memory."""
    return not variable.variable._in_memory and "preferred_chunks" in variable.encoding


# Attributes that differ between any two runs (when each was packed, how long it sampled).
VARYING = ("created_at", "sampling_time")


@pytest.mark.parametrize("entry", ["pm.sample", "sample_numpyro_nuts"])
def test_store_holds_the_groups_pymc_returns(model, tmp_path, entry):
    theirs = _sample(entry, "numpyro", model, {})  # unpatched pymc, the same seed
    path = tmp_path / "store"
    with pc.patched():
        ours = _sample(entry, "numpyro", model, disk(path, postprocessing_chunk_size=7))
    tree = xr.open_datatree(path, engine="zarr")
    assert groups(ours) == groups(theirs) == sorted(tree.children)
    assert set(groups(theirs)) >= {"posterior", "log_likelihood", "sample_stats", "observed_data"}
    for group in groups(theirs):
        want = dataset(theirs, group)
        for got in (dataset(ours, group), tree[group].to_dataset()):
            kept = {k: v for k, v in want.attrs.items() if k not in VARYING}
            assert {k: got.attrs[k] for k in kept} == kept, group
            xr.testing.assert_identical(got.drop_attrs(), want.drop_attrs())
    assert dataset(ours, "posterior").attrs["postprocessing_chunk_size"] == 7
    # The posterior is read from the store, lazily: nothing in memory until asked.
    assert from_store(dataset(ours, "posterior")["theta_sq"])
    stored = pc.open_outputs(path)
    assert stored.complete
    assert set(stored.arrays) == {
        *(f"posterior/{v}" for v in dataset(theirs, "posterior").data_vars),
        *(f"log_likelihood/{v}" for v in dataset(theirs, "log_likelihood").data_vars),
    }
    assert not (path / _zarr_store.PARTS).exists()


def test_configure_memory_default_path(model, fake_nuts, tmp_path, monkeypatch):
    theirs = _sample("pm.sample", "numpyro", model, {})  # fake NUTS: the same draws
    path = tmp_path / "default"
    monkeypatch.setenv(OUTPUT_PATH_ENV, str(path))
    with pc.patched():
        ours = _sample("pm.sample", "numpyro", model, {"postprocessing_output_memory": "disk"})
        auto = _sample("pm.sample", "numpyro", model, {})
    assert pc.open_outputs(path).complete
    want = dataset(theirs, "posterior").drop_attrs()
    xr.testing.assert_identical(dataset(ours, "posterior").drop_attrs(), want)
    # "auto" never writes a sampling call to disk, with a default path or not.
    assert not from_store(dataset(auto, "posterior")["theta"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default"]


def _not_empty(path, monkeypatch):
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    return "is not empty"


def _a_store(path, monkeypatch):
    pc.postprocess_samples(
        lambda x: (x * 2,), [np.ones((1, 4))], output_memory="disk", output_path=path
    )
    return "holds outputs of ours"


def _read_only(path, monkeypatch):
    path.parent.chmod(0o500)
    if os.geteuid() == 0:  # root may write anywhere: the check is shown what a user sees
        monkeypatch.setattr(_disk_sink.os, "access", lambda path, mode: False)
    return "cannot be written"


def _no_room(path, monkeypatch):  # the model's draws alone need more than the disk has
    usage = shutil.disk_usage(path.parent)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100))
    return "on disk, but"


@pytest.mark.parametrize("make", [_not_empty, _a_store, _read_only, _no_room])
def test_a_bad_place_is_refused_before_sampling(model, fake_nuts, spy, tmp_path, monkeypatch, make):
    path = tmp_path / "parent" / "store"
    path.parent.mkdir()
    message = make(path, monkeypatch)
    before, runs = sorted(p.name for p in path.parent.iterdir()), len(spy)
    try:
        with pc.patched(), pytest.raises(ValueError, match=message) as raised:
            _sample("pm.sample", "numpyro", model, disk(path))
    finally:
        path.parent.chmod(0o700)
    assert "Nothing was sampled" in str(raised.value)
    assert fake_nuts == [] and len(spy) == runs
    assert sorted(p.name for p in path.parent.iterdir()) == before


@pytest.mark.parametrize(
    "options, message",
    [
        ({"postprocessing_output_memory": "disk"}, "needs `postprocessing_output_path`"),
        ({"postprocessing_output_path": "somewhere"}, "output memory is 'auto'"),
        ({"postprocessing_resume": True}, "cannot be resumed"),
        (disk(""), "must be a folder path"),
    ],
)
def test_bad_disk_options_are_refused_before_sampling(
    model, fake_nuts, spy, monkeypatch, options, message
):
    monkeypatch.setenv(OUTPUT_PATH_ENV, "")
    with pc.patched(), pytest.raises(ValueError, match=message):
        _sample("pm.sample", "numpyro", model, options)
    assert fake_nuts == [] and spy == []


def test_no_room_after_sampling_says_what_is_lost(model, fake_nuts, tmp_path, monkeypatch):
    """The exact bytes, checked again once pymc's shapes are known: a refusal then says that
    NUTS ran, under pymc's option name, and leaves no store."""
    from pymc_chunkpost._pymc import sample_store as _sample_store

    next_run, usage = _sample_store.SampleStore.next_run, shutil.disk_usage(tmp_path)

    def squeezed(self):  # the disk fills up while NUTS runs
        monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100))
        return next_run(self)

    monkeypatch.setattr(_sample_store.SampleStore, "next_run", squeezed)
    path = tmp_path / "store"
    with pc.patched(), pytest.raises(ValueError, match="need .* MiB on disk, but") as raised:
        _sample("pm.sample", "numpyro", model, disk(path))
    message = str(raised.value)
    assert "`postprocessing_output_path`" in message and "NUTS had run" in message
    assert "Nothing was" not in message
    assert len(fake_nuts) == 1 and not path.exists()


def test_a_failed_run_leaves_no_store(model, fake_nuts, tmp_path, monkeypatch):
    def broken(path, group, dataset):
        raise OSError("disk full")

    monkeypatch.setattr(_zarr_store, "write_dataset", broken)
    path = tmp_path / "store"
    with pc.patched(), pytest.raises(OSError, match="disk full"):
        _sample("pm.sample", "numpyro", model, disk(path))
    assert len(fake_nuts) == 1  # it sampled, post-processed, then failed to write
    assert not path.exists()  # what the call wrote is gone: the path can be passed again
    monkeypatch.undo()
    with pc.patched():
        _sample("pm.sample", "numpyro", model, disk(path))
    assert pc.open_outputs(path).complete


def test_a_failure_keeps_the_callers_folder_and_a_complete_store(
    model, fake_nuts, tmp_path, monkeypatch
):
    """A folder the caller made stays (emptied); a failure after the store is complete
    (pymc's convergence checks) leaves it whole; a store that cannot be removed is a
    warning beside the caller's own exception."""
    path = tmp_path / "made"
    path.mkdir()

    def broken(path, group, dataset):
        raise OSError("disk full")

    monkeypatch.setattr(_zarr_store, "write_dataset", broken)
    with pc.patched(), pytest.raises(OSError, match="disk full"):
        _sample("pm.sample", "numpyro", model, disk(path))
    assert path.is_dir() and not any(path.iterdir())

    def failed_removal(*args, **kwargs):
        raise PermissionError("busy")

    from pymc_chunkpost._pymc import sample_store as _sample_store

    monkeypatch.setattr(_sample_store, "shutil", types.SimpleNamespace(rmtree=failed_removal))
    other = tmp_path / "other"
    with pc.patched(), pytest.raises(OSError, match="disk full"):
        with pytest.warns(RuntimeWarning, match="could not remove"):
            _sample("pm.sample", "numpyro", model, disk(other))
    monkeypatch.undo()

    import pymc.stats.convergence as convergence

    def checks(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(convergence, "run_convergence_checks", checks)
    done = tmp_path / "done"
    with pc.patched(), pytest.raises(KeyboardInterrupt):
        _sample("pm.sample", "numpyro", model, disk(done), compute_convergence_checks=True)
    assert pc.open_outputs(done).complete
