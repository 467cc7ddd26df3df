"""`postprocess_samples` against pymc's own `_postprocess_samples`, on real models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import assert_donated, assert_same, compile_for, problem_of, reference

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call.postprocess import run

# (chains, draws, chunk_size): 1 chain, 1 draw, a chunk that does not divide chains x draws,
# and a chunk larger than chains x draws.
SHAPES = [(2, 37, 5), (1, 1, 3), (3, 4, 100)]


@pytest.mark.parametrize("chains,draws,chunk_size", SHAPES)
@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("strategy", pc.STRATEGIES)
def test_matches_pymc(built, name, strategy, chains, draws, chunk_size):
    model, jax_fn = built(name)
    raw = models.raw_draws(model, chains, draws, seed=chains * 100 + draws)
    options = {"chunk_size": chunk_size} if strategy == "chunked" else {}
    outputs = pc.postprocess_samples(jax_fn, raw, None, strategy, **options)
    assert_same(outputs, reference(jax_fn, raw))


@pytest.mark.parametrize("strategy", pc.STRATEGIES)
def test_float32(built, strategy):
    model, jax_fn = built("float32")
    raw = models.raw_draws(model, 3, 11)
    assert raw[0].dtype == np.float32
    options = {"chunk_size": 4} if strategy == "chunked" else {}
    outputs = pc.postprocess_samples(jax_fn, raw, None, strategy, **options)
    assert_same(outputs, reference(jax_fn, raw), rtol=1e-6)
    assert {o.dtype for o in outputs} >= {np.dtype(np.float32), np.dtype(np.int64)}


@pytest.mark.parametrize("n_chunks", [1, 3, 7, 1000])
def test_n_chunks(built, n_chunks):
    model, jax_fn = built("transforms")
    raw = models.raw_draws(model, 2, 10)
    outputs, plan = run(jax_fn, raw, None, "chunked", n_chunks=n_chunks)
    assert plan.chunk_size == -(-20 // min(n_chunks, 20))
    assert_same(outputs, reference(jax_fn, raw))


def test_jax_inputs_and_cpu_backend(built):
    model, jax_fn = built("structured")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 6)]
    outputs = pc.postprocess_samples(jax_fn, raw, "cpu", "chunked", chunk_size=4)
    assert all(o.devices() == {jax.devices("cpu")[0]} for o in outputs)
    assert_same(outputs, reference(jax_fn, raw))


def test_many_scalar_outputs_and_an_integer_one_are_exact():
    """Twelve scalar inputs, a float and an integer deterministic, in an odd-sized chunk."""
    import pymc as pm

    with pm.Model() as model:
        xs = [pm.HalfNormal(f"x{i}") for i in range(12)]
        pm.Deterministic("total", sum(xs))
        pm.Deterministic("count", sum(x > 0.5 for x in xs))
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 13)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=5)
    assert_same(outputs, reference(jax_fn, raw))


def test_second_call_does_not_trace_or_compile(built):
    model, jax_fn = built("data_regression")
    calls = []

    def counted(*args):
        calls.append(1)
        return jax_fn(*args)

    raw = models.raw_draws(model, 2, 8)
    for strategy in ("chunked", "auto", "scan"):
        options = {"chunk_size": 3} if strategy == "chunked" else {}
        pc.postprocess_samples(counted, raw, None, strategy, **options)
        traced = len(calls)
        assert traced > 0
        pc.postprocess_samples(
            counted, models.raw_draws(model, 2, 8, seed=5), None, strategy, **options
        )
        assert len(calls) == traced, f"{strategy} traced again on a second call"


# For each looping strategy, the axis its temporaries may not grow with.
LOOPED_AXIS = {"scan": "draws", "nested_scan": "draws", "chunked": "draws", "scan_vmap": "chains"}


@pytest.mark.parametrize("strategy", sorted(LOOPED_AXIS))
def test_temporaries_grow_with_chunk_not_draws(built, strategy):
    """No swapaxes, pad or concatenate copies: XLA's temporaries do not scale with the
    looped axis (a copy of any whole sample array or output would)."""
    model, jax_fn = built("data_regression")

    def temp_bytes(scale, chunk_size=7):
        chains, draws = (2, 50 * scale) if LOOPED_AXIS[strategy] == "draws" else (scale, 50)
        raw = models.raw_draws(model, chains, draws)
        size = chunk_size if strategy == "chunked" else None
        exe = compile_for(jax_fn, raw, strategy, size)
        return exe.temp_bytes, exe.problem.output_bytes

    # chunked: 100 items, 14 chunks of 7 and a remainder of 2. Looping over chains takes 2
    # (XLA compiles a loop over one chain away, writing straight into the outputs).
    small, _ = temp_bytes(2 if LOOPED_AXIS[strategy] == "chains" else 1)
    large, outputs_large = temp_bytes(8)  # chunked: 800 items, 114 chunks, remainder 2
    assert large <= small + 4096, (small, large)
    if LOOPED_AXIS[strategy] == "draws":
        assert large < outputs_large / 20
    else:  # draws are vmapped: at most one chain's outputs (of 8) in temporaries
        assert large < 1.1 * outputs_large / 8
    if strategy == "chunked":
        wider, _ = temp_bytes(8, chunk_size=56)
        assert wider > 2 * large, (large, wider)


def test_pass_through_outputs_are_the_inputs(built):
    """Untransformed variables are returned as the input arrays: no copy, no work."""
    model, jax_fn = built("structured")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 5)]
    problem = problem_of(jax_fn, raw)
    passed = [(j, k) for j, k in enumerate(problem.forwarded) if k is not None]
    assert passed, "the model should have an untransformed variable"
    outputs = pc.postprocess_samples(jax_fn, raw, None, "auto")
    for j, k in passed:
        assert outputs[j] is raw[k]


def test_donation_consumes_only_after_validation(built):
    model, jax_fn = built("data_regression")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 9)]
    expected = reference(jax_fn, raw)
    with pytest.raises(ValueError):
        pc.postprocess_samples(jax_fn, raw, None, "chunked", True, chunk_size=0)
    with pytest.raises(MemoryError):
        pc.postprocess_samples(jax_fn, raw, None, "auto", True, memory_budget=10)
    assert not any(x.is_deleted() for x in raw)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", True, chunk_size=4)
    assert_same(outputs, expected)
    assert_donated(jax_fn, raw)


def test_numpy_inputs_are_never_modified(built):
    model, jax_fn = built("transforms")
    raw = models.raw_draws(model, 2, 6)
    before = [x.copy() for x in raw]
    pc.postprocess_samples(jax_fn, raw, None, "vmap", True)
    for x, y in zip(raw, before):
        np.testing.assert_array_equal(x, y)


class TestBadInput:
    @pytest.fixture
    def case(self, built):
        model, jax_fn = built("transforms")
        return jax_fn, [jnp.asarray(x) for x in models.raw_draws(model, 2, 5)]

    def check(self, case, error, match, *args, **kwargs):
        jax_fn, raw = case
        with pytest.raises(error, match=match):
            pc.postprocess_samples(jax_fn, *args, **kwargs)
        assert not any(x.is_deleted() for x in raw)

    def test_unknown_strategy(self, case):
        self.check(case, ValueError, "vmap, scan, vmap_scan", case[1], None, "fast", True)

    @pytest.mark.parametrize("bad", [0, -3, 1.5, True, "4"])
    def test_bad_chunk_size(self, case, bad):
        self.check(case, ValueError, "chunk_size", case[1], None, "chunked", True, chunk_size=bad)

    @pytest.mark.parametrize("bad", [0, -1, 2.0])
    def test_bad_n_chunks(self, case, bad):
        self.check(case, ValueError, "n_chunks", case[1], None, "chunked", True, n_chunks=bad)

    def test_both_chunk_options(self, case):
        self.check(
            case, ValueError, "not both", case[1], None, "chunked", True, chunk_size=2, n_chunks=2
        )

    def test_chunk_size_for_a_strategy_without_chunks(self, case):
        self.check(case, ValueError, "apply to the strategies", case[1], None, "vmap", chunk_size=2)

    def test_disagreeing_chains_and_draws(self, case):
        raw = list(case[1])
        raw[1] = jnp.zeros((2, 4) + raw[1].shape[2:])
        self.check(case, ValueError, r"\(chains, draws\) = \(2, 4\)", raw, None, "auto", True)

    def test_fewer_than_two_dims(self, case):
        raw = list(case[1])
        raw[2] = jnp.zeros(5)
        self.check(case, ValueError, "at least 2 dimensions", raw, None, "auto", True)

    def test_wrong_number_of_arrays(self, case):
        self.check(case, ValueError, "takes 5 inputs but 4", case[1][:4], None, "auto", True)

    def test_not_a_list(self, case):
        self.check(case, ValueError, "list of arrays", {"a": case[1][0]}, None, "auto")

    def test_budget_too_small_for_outputs(self, case):
        self.check(
            case,
            MemoryError,
            r"needs at least .* MiB",
            case[1],
            None,
            "auto",
            True,
            memory_budget=64,
        )

    def test_unknown_backend(self, case):
        self.check(case, ValueError, r"available backends: \['cpu'", case[1], "tpu7", "auto", True)

    def test_absent_backend(self, case):
        if any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("a GPU is present")
        self.check(case, ValueError, "not available.*cpu", case[1], "gpu", "auto", True)


@pytest.mark.slow  # real NUTS sampling through pymc
def test_end_to_end_numpyro_through_pymc():
    """Sample with numpyro the way pymc does, then post-process both ways."""
    from pymc_chunkpost.profiling.fixtures import sample_raw_draws

    model = models.data_regression(n_obs=50)
    raw = sample_raw_draws(model, chains=2, draws=25, tune=30, seed=3)
    jax_fn = models.jax_fn(model)
    expected = reference(jax_fn, raw)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "auto", True)
    assert_same(outputs, expected)
    assert outputs[-1].shape == (2, 25, 50)


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("chunk_size", [7, 40])  # 7 spans chains and overlaps the last chunk
def test_accelerators_write_chunks_row_by_row_without_a_flat_view(
    built, monkeypatch, chunk_size, segments
):
    """Off a CPU the stepped programs write each chunk at its items' (chain, draw), never
    through a flat view of the whole outputs (docs/decisions.md): run here on the CPU by
    giving it that writer; the outputs equal pymc's, and the compiled step holds no reshape
    of an output-sized buffer."""
    from pymc_chunkpost._engine.execute import program as _program
    from pymc_chunkpost._support import config as _config

    model, jax_fn = built("data_regression")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 3, 20)]
    cpu_writer = _program._write_for

    def rows(problem):
        return _program._Write(list, _program._write_rows, lambda carried, outs: carried)

    monkeypatch.setattr(_program, "_write_for", rows)
    pc.clear_caches()
    options = {"progressbar": True} if segments else {}
    with _config.configured(host_loop_many_buffers=-1 if not segments else 10**6):
        outputs, plan = run(
            jax_fn, raw, None, "chunked", chunk_size=chunk_size, output_memory="device", **options
        )
    assert plan.loop == ("xla" if segments else "host")
    assert_same(outputs, reference(jax_fn, raw))
    # "chunked" without progress: an XLA loop, run off a CPU as one segment of the step.
    monkeypatch.setattr(_program, "_segmented_off_cpu", lambda problem, request: True)
    pc.clear_caches()
    with _config.configured(host_loop_many_buffers=10**6):
        outputs, plan = run(jax_fn, raw, None, "chunked", chunk_size=chunk_size)
    assert plan.loop == "xla"
    assert_same(outputs, reference(jax_fn, raw))
    request = _program.Request("chunked", pc.Loop.XLA, chunk_size)
    assert _program.program_for(jax_fn, problem_of(jax_fn, raw), request).call.name == "SEGMENT"
    problem = problem_of(jax_fn, raw)
    big = max((problem.out_specs[j].shape for j in problem.computed), key=np.prod)
    assert len(big) == 3  # a (chains, draws, rows) output: its flat view is (chains * draws, rows)
    for writer in (rows(problem), cpu_writer(problem)):
        bind = _program._binder(jax_fn, problem)
        step = _program._chunk_step(bind, problem.n_local, chunk_size, writer)
        specs = [
            jax.ShapeDtypeStruct(problem.out_specs[j].shape, problem.out_specs[j].dtype)
            for j in problem.computed
        ]
        samples, consts = _program._sample_specs(problem), _program.const_specs(problem)
        text = jax.jit(step).lower(specs, samples, jnp.int32(0), consts).as_text()
        flat = f"tensor<{big[0] * big[1]}x{big[2]}x"
        assert (flat in text) == (writer.write is _program._write_flat), text[:200]
    pc.clear_caches()
