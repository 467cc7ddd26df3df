"""NumPyro's `Predictive` and `log_likelihood` with their outputs on disk (`output_memory="disk"`).

Every value is compared bit for bit with numpyro's own function and with the route in
memory, as tests/test_numpyro.py compares them; the store is read back as `zarr.Array`s of
numpyro's shapes, by `open_outputs` and by xarray. Crash safety and `resume` are tested as
tests/test_disk_output.py tests them for `postprocess_samples`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

import numpyro.distributions as dist  # noqa: E402
import test_numpyro  # noqa: E402
from helpers import ROOT, Stop, fail_after, read_only  # noqa: E402
from numpyro.infer import Predictive as NumpyroPredictive  # noqa: E402
from numpyro.infer.util import log_likelihood as numpyro_log_likelihood  # noqa: E402
from numpyro_models import MODELS  # noqa: E402
from test_numpyro import CHAINS, DRAWS, KEY, _batched, assert_identical  # noqa: E402

import pymc_chunkpost as pc  # noqa: E402
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink  # noqa: E402
from pymc_chunkpost._store import zarr as _zarr_store  # noqa: E402
from pymc_chunkpost._support.memory import OUTPUT_PATH_ENV  # noqa: E402
from pymc_chunkpost.numpyro import Predictive, log_likelihood  # noqa: E402

#: Per model: draws of its latent sites (seeded, from the prior) of shape (N, ...), and
#: observations (test_numpyro's fixture).
posteriors = test_numpyro.posteriors


def sample_dims(batch_ndims):
    return ("draw",) if batch_ndims == 1 else ("chain", "draw")


@pytest.mark.parametrize("batch_ndims", [1, 2])
@pytest.mark.parametrize("name", ["hierarchical", "deterministic_sites"])
def test_predictive_on_disk_equals_numpyro_and_the_route_in_memory(
    posteriors, tmp_path, name, batch_ndims
):
    model, args = MODELS[name]
    draws = _batched(posteriors(name)[0], batch_ndims)
    before = {k: np.asarray(v).copy() for k, v in draws.items()}
    theirs = NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, *args)
    in_memory = Predictive(model, draws, batch_ndims=batch_ndims, chunk_size=5)(KEY, *args)
    path = tmp_path / "store"
    predictive = Predictive(
        model,
        draws,
        batch_ndims=batch_ndims,
        chunk_size=5,
        output_memory="disk",
        output_path=path,
    )
    ours = predictive(KEY, *args)
    assert predictive.plan.output_memory == "disk"
    assert all(isinstance(v, zarr.Array) and v.read_only for v in ours.values())
    assert_identical(ours, theirs)
    assert_identical(ours, in_memory)
    for k, v in draws.items():  # the caller's draws, untouched
        np.testing.assert_array_equal(np.asarray(v), before[k])
    stored = pc.open_outputs(path, require_complete=True)
    assert stored.n_items == stored.items_written == CHAINS * DRAWS
    assert set(stored.arrays) == {f"posterior_predictive/{k}" for k in theirs}
    tree = xr.open_datatree(path, engine="zarr")
    for site, value in theirs.items():
        variable = tree["posterior_predictive"][site]
        assert variable.dims[:batch_ndims] == sample_dims(batch_ndims)
        np.testing.assert_array_equal(variable.values, np.asarray(value))


@pytest.mark.parametrize("batch_ndims", [1, 2])
def test_log_likelihood_on_disk_equals_numpyro(posteriors, tmp_path, batch_ndims):
    model, args = MODELS["hierarchical"]
    draws, y = posteriors("hierarchical")
    draws = _batched(draws, batch_ndims)
    theirs = numpyro_log_likelihood(model, draws, *args, y=y, batch_ndims=batch_ndims)
    path = tmp_path / "store"
    ours = log_likelihood(
        model, draws, *args, y=y, batch_ndims=batch_ndims, output_memory="disk", output_path=path
    )
    assert isinstance(ours["y"], zarr.Array)
    assert_identical(ours, theirs)
    assert set(pc.open_outputs(path).arrays) == {"log_likelihood/y"}


def test_a_slice_is_read_alone(posteriors, tmp_path):
    """A slice reads its own Zarr chunks: it reads back while another chunk's file is
    broken, which reading everything does not."""
    model, args = MODELS["hierarchical"]
    draws = posteriors("hierarchical")[0]
    path = tmp_path / "store"
    ours = Predictive(model, draws, chunk_size=6, output_memory="disk", output_path=path)(
        KEY, *args
    )
    theirs = NumpyroPredictive(model, draws)(KEY, *args)
    y = ours["y"]
    assert y.shape == (CHAINS * DRAWS, 60) and y.chunks == (6, 60)
    (path / "posterior_predictive" / "y" / "c" / "3" / "0").write_bytes(b"broken")
    np.testing.assert_array_equal(y[2:5, 7], np.asarray(theirs["y"])[2:5, 7])
    with pytest.raises(Exception):  # noqa: B017 - whichever error zarr raises for the chunk
        y[...]


def test_a_guide_on_disk_equals_numpyro(tmp_path):
    """The guide's draws stay in memory, as numpyro's; the model's predictions go to disk;
    a site holding a pytree is stored as one array per leaf."""

    def model():
        p = numpyro.param("p", {"loc": jnp.zeros(3), "scale": jnp.ones(3)})
        x = numpyro.sample("x", dist.Normal(p["loc"], p["scale"]).to_event(1))
        numpyro.sample("y", dist.Normal(x, 1.0).to_event(1))

    def guide():
        q = numpyro.param("q", jnp.arange(3.0))
        numpyro.sample("x", dist.Normal(q, 0.1).to_event(1))

    params = {"p": {"loc": jnp.zeros(3), "scale": jnp.ones(3)}, "q": jnp.arange(3.0)}
    options = dict(guide=guide, params=params, num_samples=20, return_sites=["p", "x", "y"])
    theirs = NumpyroPredictive(model, **options)(KEY)
    path = tmp_path / "store"
    ours = Predictive(model, **options, output_memory="disk", output_path=path)(KEY)
    assert isinstance(ours["p"]["loc"], zarr.Array)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for (where, a), b in zip(
        jax.tree_util.tree_flatten_with_path(ours)[0], jax.tree_util.tree_leaves(theirs)
    ):
        np.testing.assert_array_equal(a[...], np.asarray(b), err_msg=str(where))
    assert set(pc.open_outputs(path).arrays) == {
        "posterior_predictive/p['loc']",
        "posterior_predictive/p['scale']",
        "posterior_predictive/x",
        "posterior_predictive/y",
    }


@pytest.mark.parametrize("batch_ndims", [1, 2])
def test_a_failed_run_is_incomplete_and_resume_finishes_it(
    posteriors, tmp_path, monkeypatch, batch_ndims
):
    model, args = MODELS["deterministic_sites"]  # four sites: `b`, `y` drawn, `mu`, `scaled`
    draws = _batched({"a": posteriors("deterministic_sites")[0]["a"]}, batch_ndims)
    theirs = NumpyroPredictive(model, draws, batch_ndims=batch_ndims)(KEY, *args)
    path = tmp_path / "store"

    def predict(key=KEY, **options):
        return Predictive(
            model,
            draws,
            batch_ndims=batch_ndims,
            chunk_size=4,
            output_memory="disk",
            output_path=path,
            **options,
        )(key, *args)

    assert len(theirs) == 4
    fail_after(monkeypatch, 4 * 2 + 1)  # two chunks of 4 draws whole, the third begun
    with pytest.raises(Stop):
        predict()
    stored = pc.open_outputs(path)
    assert not stored.complete and stored.items_written == 8 and stored.n_items == 24
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not empty.*resume=True"):
        predict()
    writes = fail_after(monkeypatch, 10**6)
    with pytest.raises(ValueError, match="computed from other inputs"):  # another key
        predict(jax.random.PRNGKey(99), resume=True)
    assert writes[0] == 0
    ours = predict(resume=True)
    assert writes[0] == 4 * 4  # the four chunks left, four outputs each
    assert_identical(ours, theirs)
    assert pc.open_outputs(path).complete
    writes[0] = 0
    assert_identical(predict(resume=True), theirs)  # complete: nothing computed
    assert writes[0] == 0


KILLED = """
import os, signal, sys
import jax

jax.config.update("jax_enable_x64", sys.argv[3] == "1")  # as in the test process
sys.path.insert(0, sys.argv[2])
from numpyro_models import MODELS
from numpyro.infer import Predictive as NumpyroPredictive
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink
from pymc_chunkpost.numpyro import Predictive

model, args = MODELS["deterministic_sites"]
draws = NumpyroPredictive(model, num_samples=24)(jax.random.PRNGKey(1), *args)
write, count = _disk_sink._write_items, [0]

def killed(*a):
    count[0] += 1
    if count[0] == 4 * 3 + 2:  # chunks 0-2 whole (four outputs each), chunk 3's begun
        os.kill(os.getpid(), signal.SIGKILL)
    return write(*a)

_disk_sink._write_items = killed
Predictive(model, {"a": draws["a"]}, chunk_size=4, output_memory="disk", output_path=sys.argv[1])(
    jax.random.PRNGKey(7), *args
)
"""


def test_a_killed_run_never_reads_as_complete_and_resumes(posteriors, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    path = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(path),
            str(ROOT / "tests"),
            str(int(jax.config.jax_enable_x64)),
        ],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    stored = pc.open_outputs(path)
    # Three chunks were written whole; each is marked once flushed, behind the writes (none
    # past them). Host lanes land chunks in any order, so the marked ones need not be a prefix.
    marked = sorted(_zarr_store._read_markers(path / _zarr_store.MARKERS))
    assert not stored.complete and len(set(marked)) == len(marked) <= 3
    assert all(a % 4 == 0 and b == a + 4 <= 24 for a, b in marked), marked
    assert stored.items_written == 4 * len(marked)
    model, args = MODELS["deterministic_sites"]
    draws = NumpyroPredictive(model, num_samples=24)(jax.random.PRNGKey(1), *args)
    draws = {"a": draws["a"]}
    ours = Predictive(
        model, draws, chunk_size=4, output_memory="disk", output_path=path, resume=True
    )(KEY, *args)
    assert_identical(ours, NumpyroPredictive(model, draws)(KEY, *args))
    assert pc.open_outputs(path).complete


def test_the_default_path_and_auto(posteriors, tmp_path, monkeypatch):
    """`configure_memory`'s path where the call gives none; "auto" with a path keeps
    outputs that fit in memory."""
    model, args = MODELS["hierarchical"]
    draws = posteriors("hierarchical")[0]
    monkeypatch.setenv(OUTPUT_PATH_ENV, str(tmp_path / "default"))
    theirs = NumpyroPredictive(model, draws)(KEY, *args)
    ours = Predictive(model, draws, output_memory="disk")(KEY, *args)
    assert isinstance(ours["y"], zarr.Array)
    assert_identical(ours, theirs)
    assert pc.open_outputs(tmp_path / "default").complete
    auto = Predictive(model, draws)(KEY, *args)
    assert isinstance(auto["y"], jax.Array)
    assert_identical(auto, theirs)


def test_bad_disk_input_raises_before_any_work(posteriors, tmp_path, monkeypatch):
    model, args = MODELS["deterministic_sites"]
    draws = posteriors("deterministic_sites")[0]
    before = {k: np.asarray(v).copy() for k, v in draws.items()}
    monkeypatch.setenv(OUTPUT_PATH_ENV, "")
    with pytest.raises(ValueError, match="needs `output_path`"):
        Predictive(model, draws, output_memory="disk")
    with pytest.raises(ValueError, match="`resume` must be True or False"):
        Predictive(model, draws, output_memory="disk", output_path=tmp_path / "s", resume=1)
    with pytest.raises(ValueError, match="cannot be honoured here: one draw"):
        Predictive(
            model,
            {k: v[:1] for k, v in draws.items()},
            output_memory="disk",
            output_path=tmp_path / "s",
        )
    with pytest.raises(ValueError, match="cannot be honoured here: infer_discrete"):
        Predictive(model, draws, infer_discrete=True, output_memory="disk", output_path=tmp_path)
    with pytest.raises(ValueError, match="cannot be honoured here: no posterior draws"):
        log_likelihood(model, {}, *args, output_memory="disk", output_path=tmp_path / "s")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")

    def call(path, **options):
        return Predictive(model, draws, output_memory="disk", output_path=path, **options)(
            KEY, *args
        )

    with pytest.raises(ValueError, match="not empty"):
        call(tmp_path / "other")
    with pytest.raises(ValueError, match="holds other outputs.*not a store of ours"):
        call(tmp_path / "other", resume=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    call(tmp_path / "small")
    with pytest.raises(ValueError, match="other names or shapes"):
        Predictive(
            model,
            draws,
            return_sites=["mu"],
            output_memory="disk",
            output_path=tmp_path / "small",
            resume=True,
        )(KEY, *args)
    with read_only(tmp_path / "locked", monkeypatch) as locked:
        with pytest.raises(ValueError, match="cannot be written.*read-only"):
            call(locked / "store")
    monkeypatch.undo()
    monkeypatch.setattr(_disk_sink.shutil, "disk_usage", lambda path: type("U", (), {"free": 10})())
    with pytest.raises(ValueError, match=r"need .* MiB on disk, but .* has 0.0 MiB free"):
        call(tmp_path / "full")
    assert not (tmp_path / "full").exists() and not (locked / "store").exists()
    for k, v in draws.items():
        np.testing.assert_array_equal(np.asarray(v), before[k])


def test_sites_a_store_cannot_name_are_refused_on_disk_and_kept_in_memory_by_auto(tmp_path):
    def model():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.deterministic("draw", x * 2)

    path = tmp_path / "s"
    with pytest.raises(ValueError, match="'draw' is the name of a sample dim"):
        Predictive(model, num_samples=6, output_memory="disk", output_path=path)(KEY)
    assert not path.exists()
    ours = Predictive(model, num_samples=6, output_path=path)(KEY)
    theirs = NumpyroPredictive(model, num_samples=6)(KEY)
    assert_identical(ours, theirs)
    assert not path.exists()


def test_a_patch_path_takes_one_store_and_a_call_overrides_it(posteriors, tmp_path):
    """`patch(output_memory="disk", output_path=...)`: the first routed call's store fills
    the path, a second call there is refused before any work, and a call's own path wins."""
    from pymc_chunkpost.numpyro import patched

    model, args = MODELS["hierarchical"]
    draws = posteriors("hierarchical")[0]
    theirs = NumpyroPredictive(model, draws)(KEY, *args)
    first, second = tmp_path / "first", tmp_path / "second"
    with patched(output_memory="disk", output_path=first, chunk_size=5):
        routed = numpyro.infer.Predictive
        ours = routed(model, draws)(KEY, *args)
        assert_identical(ours, theirs)
        assert pc.open_outputs(first).complete
        written = sorted(p.relative_to(first) for p in first.rglob("*"))
        with pytest.raises(ValueError, match="is not empty"):
            routed(model, draws)(KEY, *args)
        assert sorted(p.relative_to(first) for p in first.rglob("*")) == written
        again = routed(model, draws, output_path=second)(KEY, *args)
        assert_identical(again, theirs)
        assert pc.open_outputs(second).complete
