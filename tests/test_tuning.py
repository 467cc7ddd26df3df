"""The evidence `auto` plans from: the online tuner, the on-disk tuning cache, compiled analysis.

No wall clock is asserted: the tuner is fed an injected timing table, and the cache is read
back from disk.
"""

from __future__ import annotations

import json
import os
import threading

import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import assert_same, problem_of, reference

from pymc_chunkpost import _planner, _postprocess, _tuning


@pytest.fixture(scope="module")
def wide():
    model = models.data_regression(n_obs=2000)
    return model, models.jax_fn(model)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh tuning-cache folder for this test."""
    monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(tmp_path))
    return tmp_path


def _table(best: int):
    """Seconds per draw by chunk size: a valley at `best`, 30% worse per doubling away."""
    return lambda size: 1e-4 * (1.3 ** abs(np.log2(size / best)))


@pytest.fixture
def timed(monkeypatch):
    """Tune every run, and feed the tuner `table(size) * size` seconds per chunk."""
    monkeypatch.setattr(_planner, "TUNE_MIN_SECONDS", 0.0)
    monkeypatch.setattr(_planner, "TUNE_WINDOW_SECONDS", 0.0)
    monkeypatch.setattr(_planner.Tuner, "segment_seconds", 1e-9)  # a chunk per segment
    monkeypatch.setattr(_planner, "VMAP_TEMP_BYTES", 0)  # always a loop
    monkeypatch.setattr(_planner, "_fast_chunk_size", lambda *args: (8, "a start of 8"))
    monkeypatch.setattr(_planner.Tuner, "synchronous", True)
    real = _planner.Tuner.record
    table = {}

    def record(self, step, seconds, draws):
        real(self, step, table["f"](step.chunk_size) * draws, draws)

    monkeypatch.setattr(_planner.Tuner, "record", record)
    return table


@pytest.fixture
def ran_steps(monkeypatch):
    """Every compiled step the tuner hands the executor, in order."""
    ran = []
    real = _planner.Tuner.next_step

    def next_step(self, start):
        step = real(self, start)
        ran.append(step)
        return step

    monkeypatch.setattr(_planner.Tuner, "next_step", next_step)
    return ran


# Three models of different kinds, each with the best chunk in another place.
TUNED = [("data_regression", 2), ("structured", 16), ("transforms", 64)]


@pytest.mark.parametrize("name, best", TUNED)
def test_tuner_finds_the_best_chunk_of_a_timing_table(built, timed, name, best):
    model, jax_fn = built(name)
    timed["f"] = _table(best)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 4, 1000)]
    expected = reference(jax_fn, raw)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert plan.source == "measured" and plan.loop == "xla", plan.reason
    grid = [2**k for k in range(8)]  # the benchmark's grid of lax.map batch sizes
    fastest = min(timed["f"](s) for s in grid)
    assert timed["f"](plan.chunk_size) <= 1.10 * fastest, (plan.chunk_size, plan.tuning_seconds)
    assert "measured fastest" in plan.reason
    assert_same(outputs, expected)  # chunks of mixed sizes tile every draw exactly once


def test_a_short_run_is_not_tuned(wide, monkeypatch):
    monkeypatch.setattr(_planner, "VMAP_TEMP_BYTES", 0)
    monkeypatch.setattr(_planner, "TUNE_MIN_SECONDS", 1e9)
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 100)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert plan.source == "rule" and len(plan.tuning_seconds) <= 1
    assert_same(outputs, reference(jax_fn, raw))


def test_a_run_far_shorter_than_its_first_chunks_projected_keeps_the_rules_size(
    built, timed, ran_steps, cache, monkeypatch
):
    """First chunks timed through a stall of the machine project a long run and start the
    tuner; when the whole run then takes under `TUNE_TRUST_FRACTION` of `TUNE_MIN_SECONDS`,
    what it measured is not kept: the plan and the tuning cache get the rule's size, and the
    next run starts from it."""
    model, jax_fn = built("structured")
    timed["f"] = lambda size: 1e4 * _table(64)(size)  # seconds per draw, as in a stall
    monkeypatch.setattr(_planner, "TUNE_MIN_SECONDS", 1e3)  # projected: 4,000 s and more
    raw = models.raw_draws(model, 4, 1000)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert {step.chunk_size for step in ran_steps} > {8}  # the tuner did run other sizes
    assert plan.source == "rule" and plan.chunk_size == 8, plan.reason
    assert len(plan.tuning_seconds) > 1  # what was timed is still reported
    assert_same(outputs, reference(jax_fn, raw))
    (entry,) = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    assert entry["chunk_size"] == 8 and "not kept" in entry["why"]
    _, again = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert again.source == "cache" and again.chunk_size == 8
    # The same run with the measurement trusted keeps what it measured.
    for path in cache.glob("*.json"):
        path.unlink()
    monkeypatch.setattr(_planner, "TUNE_TRUST_FRACTION", 0.0)
    _, trusted = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert trusted.source == "measured" and trusted.chunk_size != 8


def test_candidates_over_the_budget_never_run(built, timed, ran_steps, monkeypatch):
    """A candidate's compiled peak is checked before it runs: with a budget just above the
    rule's own chunk, larger chunks are compiled, found too big, and never run."""
    model, jax_fn = built("data_regression")
    timed["f"] = _table(256)  # larger is "faster"
    raw = models.raw_draws(model, 4, 250)
    first = _postprocess.plan(jax_fn, raw, memory_budget=2**32)
    monkeypatch.setattr(_planner, "VMAP_TEMP_BYTES", 0)
    problem = problem_of(jax_fn, raw)
    budget = problem.output_bytes + 3 * 2**16
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=budget)
    assert max(step.peak_bytes for step in ran_steps) <= budget and plan.peak_bytes <= budget
    assert_same(outputs, reference(jax_fn, raw))
    del first


class TestCache:
    def test_a_tuned_size_is_reused(self, built, timed, cache):
        model, jax_fn = built("structured")
        timed["f"] = _table(16)
        raw = models.raw_draws(model, 4, 250)
        _, tuned = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
        assert tuned.source == "measured"
        assert len(list(cache.glob("*.json"))) == 1
        outputs, again = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
        assert again.source == "cache" and again.chunk_size == tuned.chunk_size
        assert "tuning cache" in again.reason
        assert_same(outputs, reference(jax_fn, raw))

    def test_other_shapes_do_not_hit(self, built, timed, cache):
        model, jax_fn = built("structured")
        timed["f"] = _table(16)
        _postprocess.run(jax_fn, models.raw_draws(model, 4, 250), None, "auto")
        _, other = _postprocess.run(jax_fn, models.raw_draws(model, 4, 251), None, "auto")
        assert other.source != "cache"
        assert len(list(cache.glob("*.json"))) == 2

    def test_a_stale_or_corrupt_entry_is_a_miss(self, built, cache):
        model, jax_fn = built("structured")
        raw = models.raw_draws(model, 2, 50)
        key = _tuning.tuning_key(problem_of(jax_fn, raw), "auto|device")
        assert _tuning.store(key, {"loop": "host", "chunk_size": 5})
        assert _tuning.load(key)["chunk_size"] == 5
        entry = json.loads((cache / f"{key}.json").read_text())
        (cache / f"{key}.json").write_text(json.dumps(entry | {"format": -1}))
        assert _tuning.load(key) is None  # another format
        (cache / f"{key}.json").write_text('{"format": 1, "loop": "ho')  # half-written
        assert _tuning.load(key) is None
        (cache / f"{key}.json").write_text(json.dumps({"format": 1, "loop": "spiral"}))
        outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")  # plans, no error
        assert plan.source == "rule"
        assert_same(outputs, reference(jax_fn, raw))

    def test_two_writers(self, cache):
        """Concurrent writers of one key: every reader sees one whole entry."""
        errors = []

        def write(i):
            for _ in range(50):
                _tuning.store("k", {"loop": "host", "chunk_size": i})
                entry = _tuning.load("k")
                if entry is None or entry["chunk_size"] not in range(8):
                    errors.append(entry)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert [p.name for p in cache.iterdir()] == ["k.json"]  # no temporary left behind

    @pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only folder")
    def test_a_read_only_folder(self, cache):
        cache.chmod(0o500)
        try:
            assert not _tuning.store("k", {"loop": "host", "chunk_size": 1})
        finally:
            cache.chmod(0o700)

    def test_an_unwritable_folder_plans_without_error(self, built, monkeypatch, tmp_path):
        blocker = tmp_path / "file"
        blocker.write_text("not a folder")
        monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(blocker / "cache"))
        assert not _tuning.store("k", {"loop": "host", "chunk_size": 1})
        assert _tuning.load("k") is None
        model, jax_fn = built("structured")
        raw = models.raw_draws(model, 2, 50)
        outputs, _ = _postprocess.run(jax_fn, raw, None, "auto")
        assert_same(outputs, reference(jax_fn, raw))

    def test_the_folder(self, monkeypatch, tmp_path):
        monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", "")
        assert _tuning.cache_dir() is None
        monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(tmp_path))
        assert _tuning.cache_dir() == tmp_path
        monkeypatch.delenv("PYMC_CHUNKPOST_CACHE_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert _tuning.cache_dir() == tmp_path / "pymc_chunkpost"
