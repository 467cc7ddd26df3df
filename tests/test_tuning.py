"""The evidence `auto` plans from: the online tuner, the on-disk tuning cache, compiled analysis.

No wall clock is asserted: the tuner is fed an injected timing table, and the cache is read
back from disk.
"""

from __future__ import annotations

import json
import math
import os
import threading

import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import assert_same, problem_of, reference

from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.execute import executor as _executor
from pymc_chunkpost._engine.execute.executor import hlo_text
from pymc_chunkpost._engine.plan import host as _host
from pymc_chunkpost._engine.plan import library_fusions as _library_fusions
from pymc_chunkpost._engine.plan import sizing as _sizing
from pymc_chunkpost._engine.plan import tuner as _tuner
from pymc_chunkpost._engine.plan import tuning as _tuning
from pymc_chunkpost._engine.plan.library_fusions import has_library_fusions
from pymc_chunkpost._support import compat as _compat
from pymc_chunkpost._support import disk as _disk
from pymc_chunkpost._support.config import current


def library_reductions(exe):
    return _compat.library_reductions(hlo_text(exe))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh tuning-cache folder for this test."""
    monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(tmp_path))
    return tmp_path


def _stored(cache):
    """The tuning entries on disk, once the background writes have landed."""
    _disk.wait()
    return sorted(cache.glob("*.json"))


def _table(best: int):
    """Seconds per draw by chunk size: a valley at `best`, 30% worse per doubling away."""
    return lambda size: 1e-4 * (1.3 ** abs(np.log2(size / best)))


@pytest.fixture
def timed(monkeypatch, configure):
    """Tune every run, and feed the tuner `table(size) * size` seconds per chunk."""
    configure(
        tune_min_seconds=0.0,
        tune_payback=0.0,
        tune_window_seconds=0.0,  # and so a chunk per segment
        vmap_temp_bytes=0,  # always a loop
        background_compiles=False,  # the next chunk always has the candidate
        library_try_compiles=math.inf,  # tests that want it say so
    )
    for module in (_sizing, _host):  # the rule's size, for chunks on the device and to the host
        monkeypatch.setattr(module, "fast_chunk_size", lambda *args: (8, "a start of 8"))
    real = _tuner.Tuner.record
    table = {}

    def record(self, step, seconds, draws):
        slower = 1.0 if step.library_fusions else table.get("without library", 1.0)
        real(self, step, table["f"](step.chunk_size) * slower * draws, draws)

    monkeypatch.setattr(_tuner.Tuner, "record", record)
    return table


@pytest.fixture
def ran_steps(monkeypatch):
    """Every compiled step the tuner hands the executor, in order."""
    ran = []
    real = _tuner.Tuner.next_step

    def next_step(self, start):
        step = real(self, start)
        ran.append(step)
        return step

    monkeypatch.setattr(_tuner.Tuner, "next_step", next_step)
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


def test_a_short_run_is_not_tuned(wide, configure):
    configure(vmap_temp_bytes=0, tune_min_seconds=1e9)
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 100)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert plan.source == "rule" and len(plan.tuning_seconds) <= 1
    assert_same(outputs, reference(jax_fn, raw))


def test_a_run_far_shorter_than_its_first_chunks_projected_keeps_the_rules_size(
    built, timed, ran_steps, cache, configure
):
    """First chunks timed through a stall of the machine project a long run and start the
    tuner; when the whole run then takes under `tune_trust_fraction` of `tune_min_seconds`,
    what it measured is not kept: the plan and the tuning cache get the rule's size, and the
    next run starts from it."""
    model, jax_fn = built("structured")
    timed["f"] = lambda size: 1e4 * _table(64)(size)  # seconds per draw, as in a stall
    configure(tune_min_seconds=1e3)  # projected: 4,000 s and more
    raw = models.raw_draws(model, 4, 1000)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert {step.chunk_size for step in ran_steps} > {8}  # the tuner did run other sizes
    assert plan.source == "rule" and plan.chunk_size == 8, plan.reason
    assert len(plan.tuning_seconds) > 1  # what was timed is still reported
    assert_same(outputs, reference(jax_fn, raw))
    (entry,) = [json.loads(p.read_text()) for p in _stored(cache)]
    assert entry["chunk_size"] == 8 and "not kept" in entry["why"]
    _, again = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert again.source == "cache" and again.chunk_size == 8
    # The same run with the measurement trusted keeps what it measured.
    for path in _stored(cache):
        path.unlink()
    configure(tune_trust_fraction=0.0)
    _, trusted = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert trusted.source == "measured" and trusted.chunk_size != 8


def test_candidates_over_the_budget_never_run(built, timed, ran_steps):
    """A candidate's compiled peak is checked before it runs: with a budget just above the
    rule's own chunk, larger chunks are compiled, found too big, and never run."""
    model, jax_fn = built("data_regression")
    timed["f"] = _table(256)  # larger is "faster"
    raw = models.raw_draws(model, 4, 250)
    first = _postprocess.plan(jax_fn, raw, memory_budget=2**32)
    problem = problem_of(jax_fn, raw)
    budget = problem.output_bytes + 3 * 2**16
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=budget)
    assert max(step.peak_bytes for step in ran_steps) <= budget and plan.peak_bytes <= budget
    assert_same(outputs, reference(jax_fn, raw))
    del first


@pytest.fixture(scope="module")
def row_slopes():
    """radon_slopes, small: XLA gives its sum over 3 slopes per row to YNNPACK, which writes
    the products out (temporaries that XLA's own loop fusion does not need)."""
    from pymc_chunkpost.profiling import fixtures

    model = fixtures.radon_slopes(n_obs=500, n_groups=20)
    return model, fixtures.jax_fn(model)


@pytest.fixture(scope="module")
def long_sums():
    """hierarchical, small: XLA gives its R^2's sums over 2,000 observations to YNNPACK, a
    library fusion with no short reduction (jaxlib 0.10.2 and 0.12.1; data_regression's
    float64 dot went to YNNPACK up to jaxlib 0.12.0 only)."""
    from pymc_chunkpost.profiling import fixtures

    model = fixtures.hierarchical(n_obs=2000, n_groups=20)
    return model, fixtures.jax_fn(model)


def _library_run(model_fn, timed, without: float, configure, tries: float = 0.0):
    """A loop whose chunk XLA compiles with library fusions, tuned under a table in which the
    chunk without them takes `without` times as long; only the library trial runs (no other
    sizes)."""
    model, jax_fn = model_fn
    configure(library_try_compiles=tries, tune_min_seconds=math.inf)
    timed["f"] = _table(8)
    timed["without library"] = without
    raw = models.raw_draws(model, 4, 250)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    return jax_fn, raw, outputs, plan


def _close_to(outputs, expected):
    """Equal up to rounding: other kernels sum in another order (docs/strategies.md)."""
    for got, want in zip(outputs, expected):
        scale = float(np.max(np.abs(want), initial=0.0))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * scale)


def test_the_loop_without_library_fusions_runs_where_it_measured_faster(
    row_slopes, timed, ran_steps, cache, configure
):
    jax_fn, raw, outputs, plan = _library_run(row_slopes, timed, 0.5, configure)
    assert has_library_fusions(ran_steps[0])  # the rule's chunk, as XLA compiles it
    assert not plan.library_fusions and plan.source == "measured", plan.reason
    assert "without XLA's library fusions" in plan.reason
    assert not has_library_fusions(ran_steps[-1]) and not ran_steps[-1].library_fusions
    assert {s.chunk_size for s in ran_steps} == {plan.chunk_size}  # the same chunk, twice
    _close_to(outputs, reference(jax_fn, raw))
    # Kept, though the run took a moment where its first chunks projected far longer.
    (entry,) = [json.loads(p.read_text()) for p in _stored(cache)]
    assert entry["library_fusions"] is False, entry
    # The next run starts where this one ended: the same chunk, compiled the same way.
    again_outputs, again = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert again.source == "cache" and not again.library_fusions, again.reason
    _close_to(again_outputs, reference(jax_fn, raw))


@pytest.mark.parametrize("without", [2.0, 0.9])
def test_library_fusions_stay_where_they_measured_faster_or_about_as_fast(
    row_slopes, timed, ran_steps, cache, configure, without
):
    """Slower without them, or faster by less than `library_min_gain` (1/0.9 = 1.11x)."""
    jax_fn, raw, outputs, plan = _library_run(row_slopes, timed, without, configure)
    assert any(not s.library_fusions for s in ran_steps)  # the trial did run
    assert plan.library_fusions and ran_steps[-1].library_fusions, plan.reason
    assert "with XLA's library fusions (measured" in plan.reason
    _close_to(outputs, reference(jax_fn, raw))
    (entry,) = [json.loads(p.read_text()) for p in _stored(cache)]
    assert entry["library_fusions"] is True


def test_no_library_trial_where_the_work_left_cannot_repay_a_compile(
    row_slopes, timed, ran_steps, cache, configure
):
    jax_fn, raw, outputs, plan = _library_run(row_slopes, timed, 0.5, configure, tries=1e9)
    assert all(s.library_fusions for s in ran_steps) and plan.library_fusions
    assert plan.source == "rule" and "library" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_library_reductions_are_read_from_the_compiled_program(built, row_slopes, long_sums):
    """row_slopes' library fusion sums 3 slopes per row; long_sums' sums none that short;
    structured's loop has no library fusion."""
    from helpers import compile_for

    short = current().library_short_reduction
    model, jax_fn = row_slopes
    exe = compile_for(jax_fn, models.raw_draws(model, 4, 250), "chunked", 8)
    assert 3 in library_reductions(exe)
    model, jax_fn = long_sums
    exe = compile_for(jax_fn, models.raw_draws(model, 4, 250), "chunked", 8)
    assert has_library_fusions(exe)  # and no reduction as short as row_slopes'
    assert all(k > short for k in library_reductions(exe))
    model, jax_fn = built("structured")
    exe = compile_for(jax_fn, models.raw_draws(model, 4, 250), "chunked", 8)
    assert library_reductions(exe) == []


@pytest.fixture
def without_library(monkeypatch):
    """Every executable obtained without library fusions, in order."""
    obtained = []
    real = _executor.obtain

    def obtain(jax_fn, problem, request, **kwargs):
        exe = real(jax_fn, problem, request, **kwargs)
        if not request.library_fusions:
            obtained.append(exe)
        return exe

    monkeypatch.setattr(_executor, "obtain", obtain)
    return obtained


def test_no_library_trial_without_a_short_library_reduction(
    long_sums, timed, ran_steps, cache, configure, without_library
):
    """long_sums' library fusions reduce long rows: nothing is compiled for a trial."""
    compiled = without_library
    jax_fn, raw, outputs, plan = _library_run(long_sums, timed, 0.1, configure)
    assert has_library_fusions(ran_steps[0])
    assert compiled == [] and plan.library_fusions and "library" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_no_library_trial_where_it_would_save_no_temporaries(
    long_sums, timed, ran_steps, cache, monkeypatch, configure, without_library
):
    """Taken for a loop with a short library reduction, long_sums' chunk is compiled
    without library fusions, needs as many temporaries, and is dropped unrun, however fast
    the table says it would be."""
    monkeypatch.setattr(_library_fusions, "library_reductions", lambda text: [1])
    jax_fn, raw, outputs, plan = _library_run(long_sums, timed, 0.1, configure)
    (exe,), step = without_library, ran_steps[0]  # compiled, without library fusions, as large
    assert not exe.library_fusions and exe.temp_bytes >= step.temp_bytes
    assert has_library_fusions(ran_steps[0])
    assert all(s.library_fusions for s in ran_steps) and plan.library_fusions
    assert "library" not in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_no_library_trial_where_xla_used_no_library(built, timed, ran_steps, configure):
    """structured's loop has no library fusion: the trial compiles nothing and the run goes
    on as the rule planned it."""
    model, jax_fn = built("structured")
    configure(library_try_compiles=0.0, tune_min_seconds=math.inf)
    timed["f"] = _table(8)
    timed["without library"] = 0.5
    raw = models.raw_draws(model, 4, 250)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
    assert not has_library_fusions(ran_steps[0])
    assert all(s.library_fusions for s in ran_steps) and plan.library_fusions
    assert_same(outputs, reference(jax_fn, raw))


def test_compiled_without_library_fusions(long_sums):
    """The compiler option removes every library fusion from the one executable it is given,
    and the results stay pymc's up to rounding; other executables keep them."""
    from helpers import problem_of as problem_for

    from pymc_chunkpost._engine.data.types import Loop
    from pymc_chunkpost._engine.execute.executor import obtain
    from pymc_chunkpost._engine.execute.program import Request

    model, jax_fn = long_sums
    raw = models.raw_draws(model, 4, 100)
    problem = problem_for(jax_fn, raw)
    plain = obtain(jax_fn, problem, Request("chunked", Loop.XLA, 8))
    bare = obtain(jax_fn, problem, Request("chunked", Loop.XLA, 8, library_fusions=False))
    assert has_library_fusions(plain) and not has_library_fusions(bare)
    assert bare is not plain and not bare.library_fusions
    assert obtain(jax_fn, problem, Request("chunked", Loop.XLA, 8)) is plain
    with pytest.raises(ValueError, match="XLA loop on a CPU"):
        obtain(jax_fn, problem, Request("vmap", Loop.NONE, None, library_fusions=False))
    from pymc_chunkpost._engine.execute.executor import execute

    expected = reference(jax_fn, raw)
    computed = execute(bare, [jnp.asarray(x) for x in raw])  # the outputs it computes
    _close_to(computed, [expected[j] for j in problem.computed])


class TestCache:
    def test_a_tuned_size_is_reused(self, built, timed, cache):
        model, jax_fn = built("structured")
        timed["f"] = _table(16)
        raw = models.raw_draws(model, 4, 250)
        _, tuned = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**32)
        assert tuned.source == "measured"
        assert len(list(_stored(cache))) == 1
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
        assert len(list(_stored(cache))) == 2

    def test_a_stale_or_corrupt_entry_is_a_miss(self, built, cache):
        model, jax_fn = built("structured")
        raw = models.raw_draws(model, 2, 50)
        key = _tuning.tuning_key(problem_of(jax_fn, raw), "auto|device")
        _tuning.store(key, {"loop": "host", "chunk_size": 5})
        assert _tuning.load(key)["chunk_size"] == 5
        _disk.wait()
        entry = json.loads((cache / f"{key}.json").read_text())
        (cache / f"{key}.json").write_text(json.dumps(entry | {"format": -1}))
        assert _tuning.load(key) is None  # another format
        (cache / f"{key}.json").write_text('{"format": 1, "loop": "ho')  # half-written
        assert _tuning.load(key) is None
        (cache / f"{key}.json").write_text(json.dumps({"format": 1, "loop": "spiral"}))
        outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")  # plans, no error
        assert plan.source == "rule"
        assert_same(outputs, reference(jax_fn, raw))
        # No library fusions to turn off in a loop-free plan, nor a bool's worth of them.
        for bad in (
            {"loop": "none", "chunk_size": None, "library_fusions": False},
            {"loop": "xla", "chunk_size": 5, "library_fusions": "no"},
        ):
            _tuning.store(key, bad)
            _, plan = _postprocess.run(jax_fn, raw, None, "auto")
            assert plan.source == "rule" and plan.library_fusions, bad

    def test_a_queued_entry_reads_back_before_it_lands(self, cache):
        """`store` writes on the background thread; this process reads the newest entry at
        once, whatever has landed, and two writes of one key land in order."""
        first, second, landed = threading.Event(), threading.Event(), threading.Event()
        _disk.later(first.wait, 10)  # the background thread is busy until released
        try:
            _tuning.store("k", {"loop": "host", "chunk_size": 3})
            _disk.later(landed.set)
            _disk.later(second.wait, 10)
            _tuning.store("k", {"loop": "host", "chunk_size": 4})
            assert not (cache / "k.json").exists()
            assert _tuning.load("k")["chunk_size"] == 4
            first.set()
            assert landed.wait(10)
            # 3 is on disk, 4 still queued: the newer one is read, not the one that landed.
            assert json.loads((cache / "k.json").read_text())["chunk_size"] == 3
            assert _tuning.load("k")["chunk_size"] == 4
        finally:
            first.set()
            second.set()
        _disk.wait()
        assert json.loads((cache / "k.json").read_text())["chunk_size"] == 4
        assert not _disk._PENDING

    def test_a_planned_run_stores_its_entry(self, built, cache):
        model, jax_fn = built("structured")
        raw = models.raw_draws(model, 2, 50)
        _, plan = _postprocess.run(jax_fn, raw, None, "auto")
        (entry,) = [json.loads(p.read_text()) for p in _stored(cache)]
        assert entry["loop"] == plan.loop.value and entry["chunk_size"] == plan.chunk_size

    def test_the_background_thread_never_waits_for_itself(self):
        done = threading.Event()
        _disk.later(lambda: (_disk.wait(), done.set()))
        if not done.wait(10):  # it waits for its own queue: cancel that wait, then fail
            _disk._POOL.shutdown(wait=False, cancel_futures=True)
            _disk._POOL = None
            pytest.fail("_disk.wait() on the background thread waited for itself")

    def test_two_writers(self, cache):
        """Concurrent writers of one key (processes, each writing from its own thread):
        every reader sees one whole entry."""
        errors = []

        def write(i):
            for _ in range(50):
                _disk.write_bytes(
                    cache / "k.json", _tuning._encode({"loop": "host", "chunk_size": i})
                )
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
            _tuning.store("k", {"loop": "host", "chunk_size": 1})  # nothing raised
            _disk.wait()
            assert _tuning.load("k") is None and not list(cache.iterdir())
        finally:
            cache.chmod(0o700)

    def test_an_unwritable_folder_plans_without_error(self, built, monkeypatch, tmp_path):
        blocker = tmp_path / "file"
        blocker.write_text("not a folder")
        monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(blocker / "cache"))
        _tuning.store("k", {"loop": "host", "chunk_size": 1})  # nothing raised
        _disk.wait()
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


class TestPolicies:
    """The tuner's two policies on injected timings: no compile, no wall clock."""

    def _search(self, table, first=8, n=4000, **changes):
        """The sizes `SizeSearch` tries from `first` under `table` (seconds per draw by size),
        each timed over a warm-up call and two timed calls of 100 draws, with plenty left."""
        import dataclasses

        config = dataclasses.replace(
            current(), tune_min_seconds=0.0, tune_window_seconds=0.0, **changes
        )
        search = _tuner.SizeSearch(config, [first])
        size = first
        while size is not None:
            for _ in range(3):
                complete = search.record(size, table(size) * 100, 100)
            assert complete
            size = search.next_size(search.fastest(), left_seconds=1e9, n=n)
        return search.tried, search.fastest()

    def test_the_size_search_climbs_to_the_valley(self):
        tried, best = self._search(_table(64))
        assert tried == [8, 16, 32, 64, 128] and best == 64
        tried, best = self._search(_table(2))
        assert tried == [8, 16, 4, 2, 1] and best == 2

    def test_the_size_search_stops_where_the_work_left_cannot_repay_a_compile(self):
        import dataclasses

        config = dataclasses.replace(current(), tune_min_seconds=3.0, tune_window_seconds=0.0)
        search = _tuner.SizeSearch(config, [8])
        for _ in range(3):
            search.record(8, 1e-3, 1)
        assert search.next_size(8, left_seconds=2.9, n=4000) is None
        assert search.next_size(8, left_seconds=3.1, n=4000) == 16

    def test_the_size_search_weighs_what_a_compile_costs_here(self):
        import dataclasses

        config = dataclasses.replace(
            current(), tune_min_seconds=0.0, tune_payback=10.0, tune_window_seconds=0.0
        )
        search = _tuner.SizeSearch(config, [8])
        for _ in range(3):
            search.record(8, 1e-3, 1)
        assert search.next_size(8, left_seconds=9.0, n=4000, compile_seconds=1.0) is None
        assert search.next_size(8, left_seconds=11.0, n=4000, compile_seconds=1.0) == 16

    def test_calls_beside_a_compile_in_flight_are_not_timed_on_a_cpu(self):
        """On a CPU a chunk that ran while a candidate compiled had a core less: its time
        would make the running size look slower than it is."""
        import concurrent.futures
        import dataclasses
        import types

        from pymc_chunkpost._engine.data.types import Loop

        cpu = types.SimpleNamespace(platform="cpu")
        exe = types.SimpleNamespace(
            problem=types.SimpleNamespace(n_local=4000, device=cpu),
            chunk_size=8,
            library_fusions=True,
            loop=Loop.HOST,
            peak_bytes=0,
            compile_seconds=1e9,  # no candidate repays it: the search ends at one size
        )
        config = dataclasses.replace(current(), tune_window_seconds=0.0, tune_chunks=2)
        tuner = _tuner.Tuner(exe, lambda size, fusions: None, "key", config)  # type: ignore[arg-type]
        tuner.record(exe, 1.0, 8)  # type: ignore[arg-type]  # the warm-up call
        tuner._pending = concurrent.futures.Future()  # a compile in flight
        for _ in range(3):
            tuner.record(exe, 5.0, 8)  # type: ignore[arg-type]
        assert tuner.seconds_per_draw == {}
        tuner._pending = None
        for _ in range(2):
            tuner.record(exe, 0.8, 8)  # type: ignore[arg-type]
        assert tuner.seconds_per_draw == {8: 0.1}

    def test_a_window_needs_its_calls_and_its_seconds(self):
        import dataclasses

        config = dataclasses.replace(current(), tune_chunks=2, tune_window_seconds=0.05)
        search = _tuner.SizeSearch(config, [8])
        assert not search.record(8, 1.0, 8)  # the warm-up call
        assert not search.record(8, 0.01, 8) and not search.record(8, 0.01, 8)  # 0.02 s
        assert search.record(8, 0.04, 8) and search.rates == {8: 0.01 / 8}  # the median

    @pytest.mark.parametrize("with_library, kept", [(1.0, True), (0.9, False), (0.5, False)])
    def test_the_library_trial_keeps_a_variant_only_past_its_gain(self, with_library, kept):
        import types

        trial = _library_fusions.LibraryTrial(current(), decided=False)
        variant = types.SimpleNamespace(to_store=[])
        trial.start(variant)  # type: ignore[arg-type]
        assert (trial.judge(with_library, without=0.75) is variant) is kept
        assert trial.fusions is not kept and trial.variant is None
        assert trial.seconds == {True: with_library, False: 0.75}

    def test_the_library_trial_is_tried_only_where_the_work_left_repays_a_compile(self):
        import types

        from pymc_chunkpost._engine.data.types import Origin

        first = types.SimpleNamespace(origin=Origin.COMPILED, compile_seconds=0.5)
        loaded = types.SimpleNamespace(origin=Origin.LOADED, compile_seconds=0.0)
        config = current()
        for step, left, tried in [(first, 1.1, True), (first, 0.9, False), (loaded, 9, False)]:
            trial = _library_fusions.LibraryTrial(config, decided=False)
            assert trial.worth_trying(step, left) is tried  # type: ignore[arg-type]
            assert trial.decided
