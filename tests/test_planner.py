"""`auto`: the planner, the budget, out-of-memory retries and progress."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import models
import numpy as np
import pymc as pm
import pytest
from helpers import (
    assert_donated,
    assert_intact,
    assert_same,
    compile_for,
    facts_of,
    out_of_memory,
    problem_of,
    reference,
)

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.execute import executor as _executor
from pymc_chunkpost._engine.execute.executor import CompileOutOfMemory
from pymc_chunkpost._engine.plan import attempt as _attempt
from pymc_chunkpost._engine.plan import device as _device
from pymc_chunkpost._engine.plan import facts as _facts
from pymc_chunkpost._engine.plan import host as _host
from pymc_chunkpost._engine.plan import planner as _planner
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._engine.plan import sizing as _sizing
from pymc_chunkpost._support import memory as _memory
from pymc_chunkpost._support.config import configured, current


@pytest.fixture(scope="module")
def wider():
    """An observation-level deterministic of 5,000 points: 40 KiB per draw."""
    model = models.data_regression(n_obs=5000)
    return model, models.jax_fn(model)


def test_small_problem_runs_loop_free(built):
    model, jax_fn = built("transforms")
    raw = models.raw_draws(model, 2, 20)
    plan = pc.plan(jax_fn, raw)
    assert plan.strategy == "vmap" and plan.chunk_size is None and plan.n_chunks is None
    assert 0 < plan.peak_bytes <= plan.budget_bytes
    assert plan.compile_seconds > 0 and plan.planning_seconds >= plan.compile_seconds
    assert "No loop" in plan.reason


def test_plan_fields_and_budget(wider):
    model, jax_fn = wider
    raw = models.raw_draws(model, 4, 1000)
    plan = pc.plan(jax_fn, raw)
    assert dataclasses.is_dataclass(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.strategy = "vmap"  # type: ignore[misc]
    floor = 4 * 1000 * (5000 + 1) * 8  # mu and sigma; beta passes through
    assert plan.output_bytes == floor
    assert plan.source == "rule" and plan.planning_seconds >= plan.compile_seconds > 0
    free = _memory.free_bytes(jax.devices()[0])
    assert plan.budget_bytes * plan.n_devices == pytest.approx(free, rel=0.2)  # RAM, once
    assert plan.peak_bytes <= current().comfort_fraction * plan.budget_bytes
    # A budget that vmap's peak would not fit comfortably: a loop, within 10% of the floor.
    tight = pc.plan(jax_fn, raw, memory_budget=1.5 * floor)
    assert tight.strategy == "chunked" and tight.loop == "xla"
    per_device = 4000 // tight.n_devices  # chunks and peaks are per device
    assert tight.n_chunks == -(-per_device // tight.chunk_size)
    assert floor <= tight.peak_bytes * tight.n_devices <= 1.1 * floor


def test_auto_runs_exactly_the_plan(wide, monkeypatch):
    model, jax_fn = wide
    raw = models.raw_draws(model, 3, 101)
    plan = pc.plan(jax_fn, raw, memory_budget=2**30)
    compiles = []
    real = _executor.obtain

    def spy(jax_fn, problem, request, **kwargs):
        compiles.append((request.strategy, request.chunk_size))
        return real(jax_fn, problem, request, **kwargs)

    monkeypatch.setattr(_executor, "obtain", spy)
    outputs, ran = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**30)
    assert (ran.strategy, ran.chunk_size, ran.peak_bytes) == (
        plan.strategy,
        plan.chunk_size,
        plan.peak_bytes,
    )
    assert compiles == [(plan.strategy, plan.chunk_size)]  # fetched from the cache
    assert_same(outputs, reference(jax_fn, raw))


def test_budget_caps_the_chunk(wide):
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 200)
    loose = pc.plan(jax_fn, raw, memory_budget=2**32)
    problem_out = loose.output_bytes
    tight_budget = problem_out + 3 * 16_008  # room for about three draws' temporaries
    tight = pc.plan(jax_fn, raw, memory_budget=tight_budget)
    assert tight.peak_bytes <= tight_budget
    assert tight.chunk_size is not None and tight.chunk_size <= 3
    outputs = pc.postprocess_samples(jax_fn, raw, None, "auto", memory_budget=tight_budget)
    assert_same(outputs, reference(jax_fn, raw))


def test_budget_below_outputs_is_a_memory_error_before_work(wide):
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    needed = 2 * 50 * 2001 * 8
    with pytest.raises(MemoryError, match=rf"{needed / 2**20:,.1f} MiB"):
        pc.postprocess_samples(jax_fn, raw, None, "auto", True, memory_budget=needed - 1)
    with pytest.raises(MemoryError):
        pc.plan(jax_fn, raw, memory_budget=needed - 1)
    assert not any(x.is_deleted() for x in raw)


@pytest.mark.parametrize("bad", [0, -5, "1GB", True])
def test_bad_budget(built, bad):
    model, jax_fn = built("transforms")
    with pytest.raises(ValueError, match="memory_budget"):
        pc.postprocess_samples(jax_fn, models.raw_draws(model, 1, 2), memory_budget=bad)


def test_default_budget_is_free_memory(monkeypatch, wide):
    model, jax_fn = wide
    monkeypatch.setattr(_resources, "free_bytes", lambda device: 123_456_789)
    assert pc.plan(jax_fn, models.raw_draws(model, 1, 3)).budget_bytes == 123_456_789


def test_data_every_draw_reads_shrinks_the_chunk(wide, configure):
    """The data (`pm.Data` x, 2000 x 3) share the cache with the chunk: the CPU chunk aims at
    `target_chunk_bytes` less those bytes, keeping at least half the target."""
    configure(target_chunk_bytes=4 * 2**20)
    model, jax_fn = wide
    raw = models.raw_draws(model, 4, 500)
    problem = problem_of(jax_fn, raw, jax.devices("cpu")[0])
    assert problem.shared_bytes >= 2000 * 3 * 8
    target, per_item = current().target_chunk_bytes, problem.per_item_bytes

    def size(shared):
        changed = dataclasses.replace(problem, shared_bytes=shared)
        return _sizing.fast_chunk_size(changed, 0.0, 2**40)[0]

    assert size(0) == target // per_item
    assert size(target // 4) == (target - target // 4) // per_item < size(0)
    assert size(10 * target) == (target // 2) // per_item  # it keeps half the target


def test_free_bytes_cpu_is_available_ram():
    """`MemAvailable`, capped by a cgroup's limit where the process runs in one. Other
    processes allocate meanwhile on a busy machine: the reads bracket the call."""

    def expected():
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
        cgroup = _memory._cgroup_free_bytes()
        return available if cgroup is None else min(available, cgroup)

    before = expected()
    free = _memory.free_bytes(jax.devices("cpu")[0])
    after = expected()
    assert 0.9 * min(before, after) <= free <= 1.1 * max(before, after)


def test_free_bytes_cpu_honours_a_cgroup_limit(monkeypatch):
    monkeypatch.setattr(_memory, "_cgroup_free_bytes", lambda: 12345)
    assert _memory.free_bytes(jax.devices("cpu")[0]) == 12345


def test_free_bytes_gpu_is_the_pool_left():
    class FakeGpu:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 10 * 2**30, "bytes_in_use": 3 * 2**30, "peak_bytes_in_use": 0}

    assert _memory.free_bytes(FakeGpu()) == 7 * 2**30


class TestOutOfMemoryRetry:
    """Fake XLA's RESOURCE_EXHAUSTED on large chunks: retried at half the chunk, draws kept."""

    @pytest.fixture
    def failing(self, monkeypatch):
        attempts, limit = [], [16]
        real = _postprocess.execute

        def execute(exe, samples, tuner=None):
            size = exe.chunk_size or (samples[0].shape[0] * samples[0].shape[1])
            attempts.append((exe.strategy, exe.chunk_size))
            if size > limit[0]:
                raise out_of_memory()
            return real(exe, samples, tuner)

        monkeypatch.setattr(_postprocess, "execute", execute)
        return attempts, limit

    def test_retry_halves_down_to_success(self, wide, failing):
        attempts, limit = failing
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
        expected = reference(jax_fn, raw)
        with pytest.warns(RuntimeWarning, match="retrying with chunks of 50"):
            outputs, plan = _postprocess.run(jax_fn, raw, None, "vmap", True)
        # Halved as the planner halves (`_sizing.smaller`): to divisors of the 100 draws.
        assert attempts == [("vmap", None), ("chunked", 50), ("chunked", 25), ("chunked", 10)]
        assert plan.strategy == "chunked" and plan.chunk_size == 10
        assert "out of memory" in plan.reason
        assert_same(outputs, expected)

    def test_failure_at_one_draw_keeps_the_draws(self, wide, failing):
        attempts, limit = failing
        limit[0] = 0  # even one draw "fails"
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 4)]
        copies = [np.asarray(x).copy() for x in raw]
        with pytest.warns(RuntimeWarning), pytest.raises(MemoryError, match="draws are intact"):
            pc.postprocess_samples(jax_fn, raw, None, "chunked", True, chunk_size=4)
        assert [a[1] for a in attempts] == [4, 2, 1]
        assert_intact(raw, copies)

    @pytest.mark.parametrize("xla_takes_donation", [True, False])
    def test_a_gpu_failure_that_deletes_donated_buffers(
        self, wide, monkeypatch, xla_takes_donation
    ):
        """On an H200 (jax 0.11) a RESOURCE_EXHAUSTED at run time deleted a donated input.
        Handing donation to XLA would lose the draws (the first case shows the failure mode);
        on accelerators the draws are instead deleted after success (the second)."""
        monkeypatch.setattr(_facts, "xla_may_donate", lambda device: xla_takes_donation)
        real = _postprocess.execute

        def execute(exe, samples, tuner=None):
            if (exe.chunk_size or samples[0].shape[0] * samples[0].shape[1]) > 16:
                for i in exe.donated:  # what the GPU runtime did
                    samples[i].delete()
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory (run time)")
            return real(exe, samples, tuner)

        monkeypatch.setattr(_postprocess, "execute", execute)
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
        expected = reference(jax_fn, raw)
        if xla_takes_donation:
            with pytest.raises(MemoryError, match="donated and are lost"):
                _postprocess.run(jax_fn, raw, None, "vmap", True)
            return
        with pytest.warns(RuntimeWarning, match="The draws are intact"):
            outputs, plan = _postprocess.run(jax_fn, raw, None, "vmap", True)
        assert plan.chunk_size == 10
        assert_same(outputs, expected)
        assert_donated(jax_fn, raw)  # freed after success, as donation would have

    def test_no_retry_when_the_outputs_alone_do_not_fit(self, wide, failing, monkeypatch):
        """Smaller chunks cannot help when the device has less free than the outputs need
        (on a GPU each failed attempt costs seconds: its autotuner tries every kernel)."""
        attempts, _ = failing
        monkeypatch.setattr(_facts, "free_bytes", lambda device: 1000)
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
        copies = [np.asarray(x).copy() for x in raw]
        with pytest.raises(MemoryError, match="smaller chunks cannot help.*draws are intact"):
            pc.postprocess_samples(jax_fn, raw, None, "vmap", True)
        assert attempts == [("vmap", None)]
        assert_intact(raw, copies)

    def test_a_many_variable_model_is_retried_in_a_host_loop(self, failing):
        """A vmap plan has no loop; its retry takes the planner's rule for the loop, so a
        model with many variables is not sent into XLA's slow-to-compile loop."""
        attempts, _ = failing
        with pm.Model() as model:
            xs = [pm.HalfNormal(f"x{i}") for i in range(60)]
            pm.Deterministic("total", sum(xs))
        jax_fn = models.jax_fn(model)
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 20)]
        expected = reference(jax_fn, raw)
        with pytest.warns(RuntimeWarning, match="retrying"):
            outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", True)
        assert attempts == [("vmap", None), ("chunked", 20), ("chunked", 10)]
        assert plan.loop == "host" and plan.chunk_size == 10
        assert_same(outputs, expected)

    def test_other_runtime_errors_are_not_retried(self, wide, monkeypatch):
        def execute(exe, samples, tuner=None):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")

        monkeypatch.setattr(_postprocess, "execute", execute)
        model, jax_fn = wide
        with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
            pc.postprocess_samples(jax_fn, models.raw_draws(model, 1, 4), None, "vmap")


class TestOutOfMemoryWhileCompiling:
    """On a GPU, XLA's autotuner runs candidate kernels on buffers of the chunk's size while
    compiling; with too little free it fails with "NOT_FOUND: All configs failed during
    profiling" listing RESOURCE_EXHAUSTED errors (seen on an H200: a 640 MiB chunk in a
    1.1 GiB pool). Compiling smaller must be tried, as for a failure while running."""

    AUTOTUNE_FAILURE = (
        "NOT_FOUND: All configs failed during profiling or were excluded from selection.\n"
        "Failures (8):\nEXECUTION FAILED: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 626.35MiB with allocator GPU_0_bfc on device 0."
    )

    @pytest.fixture
    def failing(self, monkeypatch):
        """`obtain` fails to compile chunks over `limit[0]` draws (vmap: all draws), as it
        does when XLA's compile fails so (`test_the_autotuner_failure_is_out_of_memory`)."""
        attempts, limit = [], [16]
        real = _executor.obtain

        def obtain(jax_fn, problem, request, **kwargs):
            attempts.append((request.strategy, request.chunk_size))
            if (request.chunk_size or problem.n_items) > limit[0]:
                failure = jax.errors.JaxRuntimeError(self.AUTOTUNE_FAILURE)
                raise CompileOutOfMemory(request.strategy) from failure
            return real(jax_fn, problem, request, **kwargs)

        monkeypatch.setattr(_executor, "obtain", obtain)
        return attempts, limit

    def test_the_autotuner_failure_is_out_of_memory(self, wide, monkeypatch):
        """XLA's compile failing so is read as running out of memory while compiling."""
        from pymc_chunkpost._engine.data.problem import is_out_of_memory

        def compile(self, *args, **kwargs):
            raise jax.errors.JaxRuntimeError(TestOutOfMemoryWhileCompiling.AUTOTUNE_FAILURE)

        monkeypatch.setattr(jax.stages.Lowered, "compile", compile)
        model, jax_fn = wide
        pc.clear_caches()
        with pytest.raises(CompileOutOfMemory) as caught:
            compile_for(jax_fn, models.raw_draws(model, 2, 3), "vmap")
        assert is_out_of_memory(caught.value) and is_out_of_memory(caught.value.__cause__)

    def test_planner_halves_what_fails_to_compile(self, wide, failing):
        attempts, _ = failing
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
        expected = reference(jax_fn, raw)
        outputs, plan = _postprocess.run(
            jax_fn, raw, None, "chunked", True, chunk_size=100, memory_budget=2**30
        )
        assert [a[1] for a in attempts] == [100, 50, 25, 10]  # halved, to divisors of 100
        assert plan.strategy == "chunked" and plan.chunk_size == 10
        assert "ran out of device memory" in plan.reason
        assert_same(outputs, expected)

    def test_fixed_strategy_that_fails_to_compile_is_retried_in_chunks(self, wide, failing):
        attempts, _ = failing
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
        expected = reference(jax_fn, raw)
        with pytest.warns(RuntimeWarning, match="'vmap' at 100 draw"):
            outputs, plan = _postprocess.run(jax_fn, raw, None, "vmap", True)
        assert attempts == [("vmap", None), ("chunked", 50), ("chunked", 25), ("chunked", 10)]
        assert plan.chunk_size == 10 and "out of memory" in plan.reason
        assert_same(outputs, expected)

    def test_failing_at_one_draw_keeps_the_draws(self, wide, failing):
        _, limit = failing
        limit[0] = 0
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 4)]
        copies = [np.asarray(x).copy() for x in raw]
        with pytest.raises(MemoryError, match="Compiling even one draw"):
            pc.postprocess_samples(jax_fn, raw, None, "auto", True, memory_budget=2**30)
        assert_intact(raw, copies)


def test_a_jump_at_one_draw_is_not_a_memory_error(wide, monkeypatch):
    """XLA's temporaries "jump" (over 4x the estimate) at every size here: the planner halves
    down to one draw and runs that, since it fits the budget; no MemoryError."""
    real = _executor.obtain

    def obtain(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), temp_bytes=2**30)

    monkeypatch.setattr(_executor, "obtain", obtain)
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 4)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "chunked", memory_budget=2**40)
    assert plan.chunk_size == 1 and "jumped" in plan.reason
    assert_same(outputs, reference(jax_fn, raw))


def test_free_bytes_is_unknown_without_statistics():
    class PlatformAllocatorGpu:  # `XLA_PYTHON_CLIENT_ALLOCATOR=platform` keeps no statistics
        platform = "gpu"

        def memory_stats(self):
            return {}

    assert _memory.free_bytes(PlatformAllocatorGpu()) is None


def test_unknown_free_memory_plans_without_a_limit(monkeypatch, wide):
    model, jax_fn = wide
    monkeypatch.setattr(_resources, "free_bytes", lambda device: None)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 30)]
    expected = reference(jax_fn, raw)
    with pytest.warns(RuntimeWarning, match="free memory is unknown"):
        outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")
    assert plan.budget_bytes is None and "no known memory limit" in plan.reason
    assert_same(outputs, expected)
    with pytest.warns(RuntimeWarning, match="memory_budget"):
        assert pc.plan(jax_fn, raw).budget_bytes is None


def test_progress_bar_counts_every_draw(wide, capsys, monkeypatch, configure):
    import tqdm.auto

    updates = []

    class Recording(tqdm.auto.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    model, jax_fn = wide
    raw = models.raw_draws(model, 2, 30)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=7, progressbar=True)
    err = capsys.readouterr().err
    assert "Transforming variables" in err and "60/60" in err
    # A first, timed segment of one chunk, then segments sized by the measured speed.
    assert updates[0] == 7 and sum(updates) == 60, updates
    assert_same(outputs, reference(jax_fn, raw))

    # Segments of (almost) no time: one update per chunk (9 chunks, the last overlapping).
    updates.clear()
    configure(segment_seconds=0.0)
    raw = models.raw_draws(model, 2, 30)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=7, progressbar=True)
    assert [u for u in updates if u] == [7] * 8 + [4], updates
    assert_same(outputs, reference(jax_fn, raw))


class TestSegmentsKeepTheDraws:
    """With a progress bar, chunks run in host-dispatched segments that all read the draws:
    the draws are freed (as donation would) only after the last segment, and a failure in a
    later segment leaves them intact."""

    @pytest.fixture
    def segments(self, monkeypatch, configure):
        configure(segment_seconds=0.0)  # one chunk per segment
        calls = []
        real = _executor.obtain

        def obtain(*args, **kwargs):
            exe = real(*args, **kwargs)
            if not exe.segments:
                return exe

            def step(outs, samples, lo, hi, consts):
                calls.append((int(lo), int(hi)))
                if fail_at and len(calls) == fail_at[0]:
                    raise jax.errors.JaxRuntimeError("INTERNAL: injected failure")
                assert not any(x.is_deleted() for x in samples)
                return exe.compiled(outs, samples, lo, hi, consts)

            return dataclasses.replace(exe, compiled=step)

        fail_at = []
        monkeypatch.setattr(_executor, "obtain", obtain)
        return calls, fail_at

    def test_donated_draws_are_freed_after_the_last_segment(self, wide, segments):
        calls, _ = segments
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 30)]
        expected = reference(jax_fn, raw)
        outputs, plan = _postprocess.run(
            jax_fn, raw, None, "chunked", True, chunk_size=7, progressbar=True
        )
        assert calls == [(7 * i, 1) for i in range(9)]  # 9 chunks, one per segment
        assert plan.loop == "xla" and plan.chunk_size == 7
        assert_same(outputs, expected)
        assert_donated(jax_fn, raw)

    def test_a_failing_segment_leaves_the_draws(self, wide, segments):
        calls, fail_at = segments
        fail_at.append(3)
        model, jax_fn = wide
        raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 30)]
        copies = [np.asarray(x).copy() for x in raw]
        with pytest.raises(jax.errors.JaxRuntimeError, match="injected"):
            pc.postprocess_samples(
                jax_fn, raw, None, "chunked", True, chunk_size=7, progressbar=True
            )
        assert len(calls) == 3
        assert_intact(raw, copies)


def assert_zero_outputs_donated_to_the_step(exe, raw):
    """`exe.init()` gives zeros of the computed outputs' shapes and dtypes, and a segment
    takes them by donation: it writes into the same buffers, nothing is copied."""
    outs = exe.init()
    computed = [exe.problem.out_specs[j] for j in exe.problem.computed]
    assert [(o.shape, o.dtype) for o in outs] == [(s.shape, s.dtype) for s in computed]
    assert all(not np.asarray(o).any() for o in outs)
    pointers = [o.unsafe_buffer_pointer() for o in outs]
    step = exe.compiled(outs, raw, np.int32(0), np.int32(1), list(exe.consts))
    assert all(o.is_deleted() for o in outs)  # donated, not copied
    assert [o.unsafe_buffer_pointer() for o in step] == pointers


@pytest.fixture
def compiles(monkeypatch):
    """The programs XLA compiles from here on (`jax.stages.Lowered`), in order."""
    lowered = []
    real = jax.stages.Lowered.compile

    def compile(self, *args, **kwargs):
        lowered.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile)
    return lowered


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="elsewhere the fill is compiled")
def test_segments_on_a_cpu_compile_no_fill_program(wide, compiles):
    """On a CPU, outputs under `host_zeros_max_bytes` that segments update start as zeros
    placed from the host: the step is the only program XLA compiles, and it still takes
    those outputs by donation."""
    pc.clear_caches()  # a fresh compile
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 30)]
    exe = compile_for(jax_fn, raw, "chunked", 7, progress=True)
    assert exe.segments and len(compiles) == 1
    assert_zero_outputs_donated_to_the_step(exe, raw)


def test_segments_with_large_outputs_compile_a_fill_program(wide, configure, compiles):
    """Outputs of `host_zeros_max_bytes` or more are filled by a compiled program (the
    host's copy writes them slower): two programs compile, the fill gives zeros of the
    outputs' shapes and dtypes, and the step takes them by donation."""
    pc.clear_caches()
    configure(host_zeros_max_bytes=0)
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 30)]
    exe = compile_for(jax_fn, raw, "chunked", 7, progress=True)
    assert exe.segments and len(compiles) == 2
    assert_zero_outputs_donated_to_the_step(exe, raw)
    pc.clear_caches()  # the executables compiled under the patched threshold


def test_progress_bar_off_prints_nothing(wide, capsys):
    model, jax_fn = wide
    pc.postprocess_samples(jax_fn, models.raw_draws(model, 2, 30), None, "chunked", chunk_size=7)
    assert "Transforming" not in capsys.readouterr().err


def test_many_scalars_stay_out_of_the_loop_compilation_trap():
    """Issue 7: on a many-scalar model, `auto` must not compile a loop whose compile time is
    far above the loop-free version's (XLA can take minutes on such loops)."""
    with pm.Model() as model:
        xs = [pm.HalfNormal(f"x{i}") for i in range(60)]
        pm.Deterministic("total", sum(xs))
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 4, 500)
    plan = pc.plan(jax_fn, raw)
    assert plan.strategy == "vmap", plan.reason
    loop_free = compile_for(jax_fn, raw, "vmap", progress=True)  # a fresh compile
    assert plan.planning_seconds < 5 * loop_free.compile_seconds + 1.0


def test_many_variables_that_must_chunk_use_a_host_loop():
    """Issue 7: when a many-variable model must chunk, its loop must stay cheap to compile.
    XLA's CPU compile time of a loop grows steeply with the buffers it updates (jax 0.12: 146 s
    at 400 buffers); `auto` drives such chunks from the host instead."""
    with pm.Model() as model:
        xs = [pm.HalfNormal(f"x{i}") for i in range(60)]
        pm.Deterministic("total", sum(xs))
        grid = np.random.default_rng(0).normal(size=(500, 40))  # a (500, 40) temporary per draw
        pm.Deterministic("curve", pm.math.dot(pm.math.exp(0.1 * sum(xs[:3]) * grid), np.ones(40)))
    jax_fn = models.jax_fn(model)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 200)]
    expected = reference(jax_fn, raw)
    budget = 2 * 200 * (500 + 61) * 8 + 4 * 2**20  # outputs, plus 4 MiB: vmap does not fit
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", True, memory_budget=budget)
    assert plan.strategy == "chunked" and plan.loop == "host", plan
    assert plan.peak_bytes <= budget
    assert_same(outputs, expected)
    problem = problem_of(jax_fn, raw)
    loop_free = compile_for(jax_fn, raw, "vmap", progress=True)
    assert plan.compile_seconds < 5 * loop_free.compile_seconds + 1.0
    # Donation: the host loop frees the donated (non-pass-through) inputs at the end.
    passed = {k for k in problem.forwarded if k is not None}
    assert all(x.is_deleted() == (i not in passed) for i, x in enumerate(raw))


class TestWarningsPointAtTheCaller:
    """Warnings name the user's own line, through every public route."""

    def test_retry_warning(self, wide, monkeypatch):
        real = _postprocess.execute

        def execute(exe, samples, tuner=None):
            if exe.chunk_size is None:
                raise out_of_memory()
            return real(exe, samples, tuner)

        monkeypatch.setattr(_postprocess, "execute", execute)
        model, jax_fn = wide
        with pytest.warns(RuntimeWarning, match="retrying") as caught:
            pc.postprocess_samples(jax_fn, models.raw_draws(model, 2, 8), None, "vmap")
        assert [w.filename for w in caught] == [__file__]

    def test_unknown_pool_warning(self, wide, monkeypatch):
        monkeypatch.setattr(_resources, "free_bytes", lambda device: None)
        model, jax_fn = wide
        raw = models.raw_draws(model, 2, 8)
        with pytest.warns(RuntimeWarning, match="free memory is unknown") as caught:
            pc.postprocess_samples(jax_fn, raw, None, "auto")
        with pytest.warns(RuntimeWarning, match="free memory is unknown") as planned:
            pc.plan(jax_fn, raw)
        assert {w.filename for w in [*caught, *planned]} == {__file__}

    def test_through_patched_pymc(self, monkeypatch):
        monkeypatch.setattr(_resources, "free_bytes", lambda device: None)
        with pm.Model() as model:
            mu = pm.Normal("mu")
            pm.Normal("y", mu, 1.0, observed=np.zeros(3))
        with pc.patched(), model, pytest.warns(RuntimeWarning, match="unknown") as caught:
            pm.sample(
                draws=5, tune=5, chains=1, nuts_sampler="numpyro", progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
        assert {w.filename for w in caught if "unknown" in str(w.message)} == {__file__}


def test_a_fixed_strategy_over_an_explicit_budget_is_refused_before_work(built):
    """`memory_budget` covers outputs and temporaries for every strategy: a fixed strategy
    whose compiled peak exceeds it raises before anything runs, and a plan never reports a
    peak over its budget."""
    model, jax_fn = built("transforms")  # its vmap has temporaries beyond the outputs
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    copies = [np.asarray(x).copy() for x in raw]
    exe = compile_for(jax_fn, raw, "vmap")
    floor = exe.problem.output_bytes
    assert floor < exe.peak_bytes  # vmap needs temporaries beyond its outputs
    with pytest.raises(MemoryError, match="'vmap' needs .* over the memory budget"):
        pc.postprocess_samples(jax_fn, raw, None, "vmap", True, memory_budget=floor)
    assert_intact(raw, copies)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "vmap", memory_budget=exe.peak_bytes)
    assert plan.peak_bytes <= plan.budget_bytes
    assert_same(outputs, reference(jax_fn, raw))


@pytest.mark.parametrize(
    "n, target, size",
    [
        # down to a divisor within a quarter below: the working set stays within the target
        (4000, 18, 16),
        (4000, 6, 5),
        (4000, 41, 40),
        (4000, 167, 160),
        (4000, 12, 10),
        (4000, 5000, 4000),
        # none that near below: the nearest by ratio, within a factor of 2
        (4000, 3, 4),
        (4000, 7, 8),
        # none at all (a prime count): the size itself
        (997, 10, 10),
        (12, 1, 1),
    ],
)
def test_rule_rounds_to_a_divisor_preferring_one_below(n, target, size):
    """The rule's size goes to the largest divisor of the draws within `round_down_within`
    below it, else the nearest by ratio within a factor of 2 (no overlapping last chunk), or
    stays as it is when there is none."""
    assert _sizing._rule_divisor(n, target) == size


@pytest.mark.parametrize(
    "name, compiled",
    [("big_data", False), ("big_det", True), ("wide", True), ("hierarchical", False)],
)
def test_the_vmap_candidate_is_compiled_only_where_it_may_run(name, compiled, monkeypatch):
    """Compiled evidence costs a compile: the loop-free vmap is compiled only when the
    jaxpr's bound leaves it a chance. big_data reduces 0.6 GiB of dot products per run to
    tiny summaries (its vmap compiled to 1.2 GiB of temporaries, and lost); big_det and wide
    write temporaries as large as their outputs straight into them (none compiled, the vmap
    runs); hierarchical's bound is over `vmap_bound_slack` times the threshold."""
    from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn

    spec = FIXTURES[name]
    model = spec.build()
    fn = jax_fn(model)
    raw = spec.raw_draws(model, 4, 1000)
    problem = problem_of(fn, raw, jax.devices("cpu")[0])
    assert _sizing.vmap_may_fit(problem, 1) is compiled
    strategies = []
    real = _executor.obtain

    def spy(jax_fn, problem, request, **kwargs):
        strategies.append(request.strategy)
        return real(jax_fn, problem, request, **kwargs)

    monkeypatch.setattr(_executor, "obtain", spy)
    plan = pc.plan(fn, raw, "cpu", memory_budget=2**34)
    assert ("vmap" in strategies) is compiled, plan.reason
    if compiled:
        assert plan.strategy == "vmap", plan.reason


@pytest.mark.parametrize("shards, cores, together", [(1, 2, 1), (4, 2, 2), (4, 8, 4), (2, 2, 2)])
def test_devices_on_one_cpu_split_the_chunk_target(shards, cores, together, monkeypatch, configure):
    """Shards on one CPU run at once, up to one per core, and share its caches: each aims at
    `target_chunk_bytes` over the shards running together (docs/strategies.md#chunk-target-bytes,
    "Split over shards")."""
    import types

    configure(target_chunk_bytes=8 * 2**20)
    monkeypatch.setattr(_sizing, "cpu_cores", lambda: cores)
    per_item = 2**16
    problem = types.SimpleNamespace(
        n_local=1000,
        per_item_bytes=per_item,
        output_bytes=shards * 1000 * per_item,
        n_shards=shards,
        n_local_shards=shards,
        device=jax.devices("cpu")[0],
        shared_bytes=0,
        n_buffers=1,
    )
    size, why = _sizing.fast_chunk_size(problem, 0.0, None)
    assert size == 8 * 2**20 // together // per_item
    assert ("running at once" in why) == (together > 1)


def test_random_draws_on_a_cpu_run_in_a_host_loop():
    """The predictive route's random draws: a host loop of straight-line chunk steps on a
    CPU (XLA's CPU runtime spreads their elementwise work over the cores outside its loops
    only), an XLA loop elsewhere and for everything else; their tuning has a key of its own."""
    from helpers import FakeAccelerator

    from pymc_chunkpost._engine.data.problem import Placement
    from pymc_chunkpost._engine.data.types import Loop
    from pymc_chunkpost._engine.plan import tuning as _tuning

    model = models.data_regression(n_obs=50)
    problem = problem_of(models.jax_fn(model), models.raw_draws(model, 2, 10))
    random = dataclasses.replace(problem, random=True)
    assert _sizing.loop_for(problem) is Loop.XLA
    assert _sizing.loop_for(random) is Loop.HOST
    on_tpu = dataclasses.replace(random, placement=Placement(FakeAccelerator(2**30, "tpu")))
    assert _sizing.loop_for(on_tpu) is Loop.XLA
    assert _tuning.tuning_key(random, "auto") != _tuning.tuning_key(problem, "auto")


def test_random_draws_on_a_cpu_prefer_wider_vectors(monkeypatch):
    """Random draws on a CPU compile with `random_vector_width`, on the device and to the
    host alike; nothing else does, and 0 keeps XLA's default."""
    from helpers import FakeAccelerator

    from pymc_chunkpost._engine.data.problem import Placement
    from pymc_chunkpost._engine.data.types import Loop
    from pymc_chunkpost._support.compat import PREFER_VECTOR_WIDTH

    model = models.data_regression(n_obs=50)
    problem = problem_of(models.jax_fn(model), models.raw_draws(model, 2, 10))
    random = dataclasses.replace(problem, random=True)
    on_tpu = dataclasses.replace(random, placement=Placement(FakeAccelerator(2**30, "tpu")))
    assert _sizing.vector_width(random) == 512
    assert _sizing.vector_width(problem) == 0 and _sizing.vector_width(on_tpu) == 0
    with configured(random_vector_width=0):
        assert _sizing.vector_width(random) == 0
    call = _attempt.Call(None, facts_of(random, None), (), False, 0.0)
    for request in (call.request("chunked", Loop.HOST, 5), _host.host_request(call, 5, 2)):
        assert request.compiler_options() == {PREFER_VECTOR_WIDTH: 512}
        assert "vectors of 512 bits" in request.key(random)
    plain = dataclasses.replace(call, facts=facts_of(problem, None))
    assert plain.request("chunked", Loop.XLA, 5).compiler_options() == {}


def test_random_draws_on_a_cpu_skip_the_vmap_where_their_products_leave_the_cache(
    configure, monkeypatch
):
    """Random draws on a CPU go to chunks, without compiling the loop-free vmap, where the
    results of their products over all draws exceed `random_vmap_product_bytes`: the vmap
    writes them to memory and reads them back (`_sizing.vmap_may_pay`)."""
    from helpers import FakeAccelerator

    from pymc_chunkpost._engine.data import problem as _problem
    from pymc_chunkpost._engine.data.problem import Placement

    model = models.data_regression(n_obs=50)
    problem = problem_of(models.jax_fn(model), models.raw_draws(model, 2, 10))
    per_draw = _problem.product_bytes(problem.jaxpr.jaxpr)
    assert per_draw == 50 * 8  # X @ beta, which no output holds
    random = dataclasses.replace(problem, random=True)
    products = per_draw * problem.n_local
    configure(random_vmap_product_bytes=products - 1)
    assert not _sizing.vmap_may_pay(random)
    assert _sizing.vmap_may_pay(problem)  # not random: the compiled vmap decides
    on_tpu = dataclasses.replace(random, placement=Placement(FakeAccelerator(2**30, "tpu")))
    assert _sizing.vmap_may_pay(on_tpu)
    configure(random_vmap_product_bytes=products)
    assert _sizing.vmap_may_pay(random)

    compiled = []
    real = _device.try_compile
    monkeypatch.setattr(
        _device,
        "try_compile",
        lambda fn, p, request, **kw: compiled.append(request) or real(fn, p, request, **kw),
    )
    configure(random_vmap_product_bytes=0)
    facts = facts_of(random, None)
    attempt = _planner.first_attempt(models.jax_fn(model), facts, "auto", use_cache=False)
    assert [r.strategy for r in compiled] == ["chunked"], compiled
    assert attempt.plan.strategy == "chunked"
    _executor.release(attempt.exe)


def test_products_inside_calls_count():
    """A product inside a nested jaxpr (a `jit` or `checkpoint` call) counts, as its result
    goes to memory all the same."""
    from pymc_chunkpost._engine.data import problem as _problem

    x = np.ones((500, 10))

    def plain(b):
        return (x @ b).sum()

    for wrap in (lambda f: f, jax.jit, jax.checkpoint):
        closed = jax.make_jaxpr(wrap(plain))(np.ones(10))
        assert _problem.product_bytes(closed.jaxpr) == 500 * x.itemsize, wrap


def test_off_a_cpu_auto_runs_no_loop_of_one_chunk(configure, monkeypatch):
    """Where one chunk would cover every draw, an accelerator runs the loop-free program
    (`_sizing.one_chunk_runs_whole`), from the rule and from the tuning cache alike; a CPU
    keeps its loop, and a requested size is kept everywhere."""
    from helpers import FakeAccelerator

    from pymc_chunkpost._engine.data.problem import Placement
    from pymc_chunkpost._engine.data.types import Loop

    model = models.data_regression(n_obs=50)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 10)
    problem = problem_of(jax_fn, raw)
    on_tpu = dataclasses.replace(problem, placement=Placement(FakeAccelerator(2**30, "tpu")))
    n = problem.n_local
    assert _sizing.one_chunk_runs_whole(on_tpu, n)
    assert not _sizing.one_chunk_runs_whole(on_tpu, n - 1)
    assert not _sizing.one_chunk_runs_whole(problem, n)
    entry = {"loop": "xla", "chunk_size": n}
    assert _device._cached_entry(entry, on_tpu) == (Loop.NONE, None, True)
    assert _device._cached_entry(entry, problem) == (Loop.XLA, n, True)

    # The planner's wiring, on this CPU taken for an accelerator: the vmap's temporaries are
    # refused (so the rule sizes chunks), and the budget holds every draw in one chunk.
    monkeypatch.setattr(
        _device, "one_chunk_runs_whole", lambda problem, size: size >= problem.n_local
    )
    configure(vmap_temp_bytes=0)
    pc.clear_caches()
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto", memory_budget=2**30)
    assert (plan.strategy, plan.loop, plan.chunk_size) == ("vmap", "none", None)
    assert "one chunk would hold all 20 draws" in plan.reason
    assert_same(outputs, reference(jax_fn, raw))
    outputs, plan = _postprocess.run(jax_fn, raw, None, "chunked", chunk_size=n)
    assert (plan.strategy, plan.chunk_size) == ("chunked", n)
