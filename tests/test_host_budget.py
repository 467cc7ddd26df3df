"""Host memory as a budget: outputs in host memory fit it with their chunks in flight, or
the call raises `MemoryError` before any work, the draws intact.

Policy tests give the planner a fake accelerator and an injected host reading and assert the
chunk it asks to compile. The measured bound (peak RSS of a fresh process against
`1.10 x outputs + 1 GiB`) runs `benchmarks/host_budget.py` on three models of different
shapes (`slow`).
"""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import models
import pytest
from helpers import FakeAccelerator, count_compiles, facts_of, problem_of, run_script

import pymc_chunkpost as pc
from pymc_chunkpost._engine.data.problem import Placement
from pymc_chunkpost._engine.plan import device as _device
from pymc_chunkpost._engine.plan import host as _host
from pymc_chunkpost._engine.plan import planner as _planner
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._support import memory as _memory
from pymc_chunkpost._support.config import configured, current

MiB = 2**20


class _Asked(Exception):
    pass


@pytest.fixture
def asked(monkeypatch):
    """The chunk size the planner asks to compile first (the compile itself is not run)."""
    sizes = []

    def record(jax_fn, problem, request):
        sizes.append(request.chunk_size)
        raise _Asked

    for module in (_host, _device):  # where the first attempt compiles
        monkeypatch.setattr(module, "try_compile", record)
    return sizes


@pytest.fixture(scope="module")
def wide_problem():
    model = models.data_regression(n_obs=2000)  # 16 KiB of outputs per draw
    jax_fn = models.jax_fn(model)
    problem = problem_of(jax_fn, models.raw_draws(model, 4, 250))
    return jax_fn, problem


def _plenty(problem):
    """Host memory far beyond the outputs, the staging and the margin."""
    return current().host_margin_bytes + 100 * problem.output_bytes


def _plan_on_tpu(
    jax_fn, problem, device_free, host_free, monkeypatch, output_memory="auto", **kwargs
):
    monkeypatch.setattr(_resources, "host_free_bytes", lambda: host_free)
    device = FakeAccelerator(device_free, "tpu")
    problem = dataclasses.replace(problem, placement=Placement(device))
    facts = facts_of(problem, device_free, output_memory=output_memory)
    return _planner.first_attempt(jax_fn, facts, "auto", **kwargs)


def test_an_accelerators_chunk_is_bounded_by_the_hosts_staging(wide_problem, asked, monkeypatch):
    jax_fn, problem = wide_problem
    per_draw = problem.output_bytes // problem.n_items
    device_free = problem.output_bytes * 9 // 10  # the outputs go to the host
    with configured(host_staging_bytes=64 * per_draw * _resources.STAGED_CHUNKS):
        with pytest.raises(_Asked):  # plenty of host memory: the staging bound rules
            _plan_on_tpu(jax_fn, problem, device_free, _plenty(problem), monkeypatch)
        assert asked[-1] == 64
        # Less host memory beside the outputs than the staging bound: it rules.
        room = 10 * per_draw * _resources.STAGED_CHUNKS
        host = problem.output_bytes + current().host_margin_bytes + room
        with pytest.raises(_Asked):
            _plan_on_tpu(jax_fn, problem, device_free, host, monkeypatch)
        assert asked[-1] == 10
        # Without the host bound the device's quarter would have asked for more.
        quarter = int(device_free * current().host_output_chunk_fraction)
        assert quarter // (problem.per_item_bytes + problem.intermediate_bytes) > 64


def test_an_accelerators_chunk_keeps_each_outputs_part_to_land_chunk_bytes(
    wide_problem, asked, monkeypatch
):
    """On a TPU each output's part of a chunk lands in a host buffer the allocator reuses:
    at most `land_chunk_bytes` of the largest output per chunk. Not where the cap is 0, where
    no thread populates the outputs, where one draw's output is larger than the cap, or
    where a chunk size was requested."""
    jax_fn, problem = wide_problem
    largest = _resources.largest_output_bytes_per_draw(problem)
    assert largest == 2000 * 8  # the 2,000-row deterministic, float64
    per_draw = problem.output_bytes // problem.n_items
    device_free = problem.output_bytes * 9 // 10  # the outputs go to the host
    cases = [
        ({"land_chunk_bytes": 8 * largest + 1}, 8),
        ({"land_chunk_bytes": 0}, 64),
        ({"land_chunk_bytes": 8 * largest, "populate_threads": 0}, 64),
        ({"land_chunk_bytes": largest - 1}, 64),
    ]
    with configured(host_staging_bytes=64 * per_draw * _resources.STAGED_CHUNKS):
        for changes, want in cases:
            with configured(**changes), pytest.raises(_Asked):
                _plan_on_tpu(jax_fn, problem, device_free, _plenty(problem), monkeypatch)
            assert asked[-1] == want, changes
        with configured(land_chunk_bytes=8 * largest), pytest.raises(_Asked):
            _plan_on_tpu(jax_fn, problem, device_free, _plenty(problem), monkeypatch, chunk_size=20)
        assert asked[-1] == 20


def test_a_requested_chunk_too_large_for_the_host_is_shrunk(wide_problem, asked, monkeypatch):
    jax_fn, problem = wide_problem
    per_draw = problem.output_bytes // problem.n_items
    with configured(host_staging_bytes=16 * per_draw * _resources.STAGED_CHUNKS):
        with pytest.raises(_Asked):
            _plan_on_tpu(
                jax_fn,
                problem,
                problem.output_bytes * 4,
                _plenty(problem),
                monkeypatch,
                chunk_size=500,
                output_memory="host",
            )
    assert asked == [16]


@pytest.mark.parametrize("output_memory", ["auto", "host"])
def test_outputs_larger_than_the_host_raise_before_any_compile(
    wide_problem, asked, monkeypatch, output_memory
):
    jax_fn, problem = wide_problem
    with pytest.raises(MemoryError, match=r"outputs need .* of host memory.*var_names"):
        _plan_on_tpu(
            jax_fn,
            problem,
            problem.output_bytes // 2,
            problem.output_bytes // 2,
            monkeypatch,
            output_memory=output_memory,
        )
    assert asked == []


def test_the_host_budget_setting_caps_the_hosts_free_memory(monkeypatch):
    monkeypatch.setenv(_memory.HOST_BUDGET_ENV, "1")  # recorded first: restored last
    monkeypatch.delenv(_memory.HOST_BUDGET_ENV)
    available = _memory.host_free_bytes()
    settings = pc.configure_memory(host_budget=100 * MiB)
    assert settings == {_memory.HOST_BUDGET_ENV: str(100 * MiB)}
    assert _memory.host_free_bytes() == min(available, 100 * MiB)
    monkeypatch.setenv(_memory.HOST_BUDGET_ENV, "not bytes")
    with pytest.raises(ValueError, match=_memory.HOST_BUDGET_ENV):
        _memory.host_free_bytes()
    for bad in (0, -1, True, "8GB"):
        with pytest.raises(ValueError, match="host_budget"):
            pc.configure_memory(host_budget=bad)
    monkeypatch.delenv(_memory.HOST_BUDGET_ENV)


def test_a_cpu_call_beyond_the_host_budget_raises_before_any_compile(monkeypatch):
    """On a CPU the host budget is the device's: explicit host outputs and device outputs
    alike raise before anything compiles, and the draws are untouched."""
    model = models.data_regression(n_obs=2000)
    jax_fn = models.jax_fn(model)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    kept = [x.copy() for x in raw]
    output_bytes = problem_of(jax_fn, raw).output_bytes
    monkeypatch.setenv(_memory.HOST_BUDGET_ENV, str(output_bytes // 2))
    compiles = count_compiles(monkeypatch)
    for output_memory in ("host", "device", "auto"):
        with pytest.raises(MemoryError, match="host budget"):
            pc.postprocess_samples(jax_fn, raw, None, "auto", output_memory=output_memory)
    assert compiles[0] == 0
    for x, k in zip(raw, kept):
        assert not x.is_deleted() and bool((x == k).all())


@pytest.mark.slow
def test_host_outputs_stay_within_the_bound_in_fresh_processes(tmp_path):
    """Three models of different shapes, a host budget of the outputs and 320 MiB: peak RSS
    above the start at most `1.10 x outputs + 1 GiB`, the values NumPy's; half the outputs
    as the budget: `MemoryError` before any compile, the draws intact."""
    out = tmp_path / "host_budget.json"
    proc = run_script(
        "benchmarks/host_budget.py",
        "--gib",
        "0.5",
        "--host-budget",
        "tight",
        "--impossible",
        "--out",
        out,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    cases = json.loads(out.read_text())["cases"]
    ran = [c for c in cases if "seconds" in c]
    refused = [c for c in cases if "memory_error" in c]
    assert sorted(c["case"] for c in ran) == ["many", "matrix", "matvec"]
    for case in ran:
        assert case["peak_above_start"] <= 1.10 * case["output_bytes"] + 2**30, case
        assert case["peak_above_start"] >= case["output_bytes"] * 0.9, case  # they were made
        assert case["largest_relative_difference"] < 1e-5, case
    assert len(refused) == 3
    for case in refused:
        assert case["compiles"] == 0 and case["draws_intact"], case
