"""Where the outputs live: on the device, or landed in host memory chunk by chunk."""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import FakeAccelerator as FakeGpu
from helpers import assert_intact, assert_same, facts_of, out_of_memory, problem_of, reference

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.data.problem import Placement
from pymc_chunkpost._engine.plan import planner as _planner
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._support.config import current


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("options", [{}, {"chunk_size": 7}, {"progressbar": True}])
@pytest.mark.parametrize("output_memory", ["host", "device"])
def test_outputs_equal_pymc(built, name, options, output_memory):
    model, jax_fn = built(name)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 3, 31)]
    expected = reference(jax_fn, raw)
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", output_memory=output_memory, **options
    )
    assert_same(outputs, expected)
    assert plan.output_memory == output_memory
    if output_memory == "host":
        for out in outputs:  # plain numpy arrays that numpy and ArviZ take without a copy
            assert isinstance(out, np.ndarray) and np.asarray(out) is out


def test_float32(built):
    model, jax_fn = built("float32")
    raw = models.raw_draws(model, 2, 9)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", output_memory="host")
    assert_same(outputs, reference(jax_fn, raw), rtol=1e-6)


def _on(problem, device):
    return dataclasses.replace(problem, placement=Placement(device))


def test_auto_sends_outputs_that_do_not_fit_an_accelerator_to_host(wide):
    model, jax_fn = wide
    problem = problem_of(jax_fn, models.raw_draws(model, 4, 100))
    small = FakeGpu(problem.output_bytes // 2)
    where, why = _resources.output_memory_for(_on(problem, small), "auto", small.free)
    assert where == "host" and "exceed" in why
    large = FakeGpu(100 * problem.output_bytes)
    assert _resources.output_memory_for(_on(problem, large), "auto", large.free)[0] == "device"


def test_host_memory_too_small_too_is_a_memory_error_naming_both(wide, monkeypatch):
    model, jax_fn = wide
    problem = problem_of(jax_fn, models.raw_draws(model, 4, 100))
    monkeypatch.setattr(_resources, "host_free_bytes", lambda: problem.output_bytes // 3)
    small = FakeGpu(problem.output_bytes // 2)
    with pytest.raises(
        MemoryError, match="The outputs need .* of host memory .* host memory has .* for them"
    ):
        _resources.output_memory_for(_on(problem, small), "auto", small.free)


def test_auto_chooses_host_on_a_cpu_only_for_lanes(wide):
    """On a CPU the same budget still gives the clear `MemoryError` before any work; an
    explicit "host" works there."""
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    floor = problem_of(jax_fn, raw).output_bytes
    with pytest.raises(MemoryError, match="memory budget"):
        pc.postprocess_samples(jax_fn, raw, None, "auto", memory_budget=floor // 2)
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", memory_budget=floor // 2, output_memory="host"
    )
    assert plan.output_memory == "host" and plan.peak_bytes <= floor // 2
    assert_same(outputs, reference(jax_fn, raw))


@pytest.mark.parametrize("progressbar", [False, True])
def test_host_on_chains_split_over_devices(built, progressbar):
    """pymc's parallel chains leave one chain per device: each device streams its chains
    into their block of the host outputs."""
    model, jax_fn = built("structured")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    raw = [jax.device_put(jnp.asarray(x), sharding) for x in models.raw_draws(model, 4, 9)]
    expected = reference(jax_fn, raw)
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", output_memory="host", chunk_size=4, progressbar=progressbar
    )
    assert plan.output_memory == "host" and plan.n_devices == 2
    assert_same(outputs, expected)
    assert all(isinstance(out, np.ndarray) for out in outputs)


def test_host_on_draws_split_on_their_draw_axis_is_refused_before_work(built):
    model, jax_fn = built("structured")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "d"))
    raw = [jax.device_put(jnp.asarray(x), sharding) for x in models.raw_draws(model, 2, 6)]
    with pytest.raises(ValueError, match="split on their draw axis"):
        pc.postprocess_samples(jax_fn, raw, None, "auto", output_memory="host")
    assert not any(x.is_deleted() for x in raw)


@pytest.mark.parametrize("bad", ["gpu", None, 3])
def test_bad_output_memory(wide, bad):
    model, jax_fn = wide
    with pytest.raises(ValueError, match="output_memory"):
        pc.postprocess_samples(jax_fn, models.raw_draws(model, 1, 2), output_memory=bad)
    with pytest.raises(ValueError, match="applies to the strategies"):
        raw = models.raw_draws(model, 1, 2)
        pc.postprocess_samples(jax_fn, raw, None, "vmap", output_memory="host")


def test_out_of_memory_on_the_host_path_keeps_the_draws(wide, monkeypatch):
    """An out-of-memory failure mid-stream is retried at half the chunk; the draws are never
    handed to XLA on this path, and donated draws are freed only after success."""
    attempts = []
    real = _postprocess.execute

    def execute(exe, samples, tuner=None):
        attempts.append(exe.chunk_size)
        if exe.chunk_size > 10:
            raise out_of_memory()
        return real(exe, samples, tuner)

    monkeypatch.setattr(_postprocess, "execute", execute)
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    copies = [np.asarray(x).copy() for x in raw]
    expected = reference(jax_fn, raw)
    with pytest.warns(RuntimeWarning, match="The draws are intact"):
        outputs, plan = _postprocess.run(
            jax_fn, raw, None, "chunked", True, chunk_size=40, output_memory="host"
        )
    assert attempts == [40, 20, 10] and plan.output_memory == "host"
    assert_same(outputs, expected)
    passed = {k for k in problem_of(jax_fn, raw).forwarded if k is not None}
    assert all(x.is_deleted() == (i not in passed) for i, x in enumerate(raw))

    def always_out_of_memory(exe, samples, tuner=None):
        raise out_of_memory()

    monkeypatch.setattr(_postprocess, "execute", always_out_of_memory)
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 4)]
    copies = [np.asarray(x).copy() for x in raw]
    with pytest.warns(RuntimeWarning), pytest.raises(MemoryError, match="draws are intact"):
        pc.postprocess_samples(
            jax_fn, raw, None, "chunked", True, chunk_size=4, output_memory="host"
        )
    assert_intact(raw, copies)


# --- lanes: a serial problem's chunks streamed by several host threads ----------------------


def _serial(problem, cores, monkeypatch):
    monkeypatch.setattr(_resources, "cpu_cores", lambda: cores)
    return dataclasses.replace(problem, one_draw_programs=True)


@pytest.mark.parametrize("cores", [1, 2, 3, 16])
def test_lanes_one_per_core_for_a_serial_problem_on_a_cpu(wide, monkeypatch, cores):
    model, jax_fn = wide
    problem = problem_of(jax_fn, models.raw_draws(model, 4, 100))
    assert _resources.lanes_for(problem)[0] == 1  # vectorised: XLA uses the cores itself
    serial = _serial(problem, cores, monkeypatch)
    lanes = min(cores, current().max_lanes)
    assert _resources.lanes_for(serial)[0] == lanes
    where, why = _resources.output_memory_for(serial, "auto", None)
    assert where == ("host" if lanes > 1 else "device")
    assert _resources.lanes_for(_on(serial, FakeGpu(2**40)))[0] == 1  # a CPU's only


def test_lanes_stay_within_the_budget_with_the_outputs(wide, monkeypatch):
    """Chosen on a CPU, host memory is the device's: the outputs count in the budget beside
    every lane's chunk, and a budget below them is the same `MemoryError` as without
    lanes."""
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    monkeypatch.setattr(_resources, "cpu_cores", lambda: 3)
    floor = problem_of(jax_fn, raw).output_bytes
    with pytest.raises(MemoryError, match="memory budget"):
        _postprocess.run(
            jax_fn, raw, None, "auto", memory_budget=floor // 2, one_draw_programs=True
        )
    budget = int(1.5 * floor)  # three lanes' chunks of a draw or two beside the outputs
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "auto", memory_budget=budget, one_draw_programs=True
    )
    assert plan.lanes == 3 and plan.output_memory == "host"
    assert floor < plan.peak_bytes <= budget
    assert_same(outputs, reference(jax_fn, raw))
    assert all(isinstance(x, jax.Array) for x in outputs)  # on the device, as not asked


def test_lanes_outputs_are_placed_on_the_cpu_without_a_copy():
    from pymc_chunkpost._engine.execute.host_output import aligned_empty

    device = jax.devices("cpu")[0]
    host = aligned_empty((3, 1000, 7), np.float32)
    host[:] = 1.5
    problem = dataclasses.replace(problem_of(lambda x: [x], [host]), placement=Placement(device))
    (placed,) = _postprocess._from_host([host], facts_of(problem, None))
    assert isinstance(placed, jax.Array) and placed.unsafe_buffer_pointer() == host.ctypes.data
    (kept,) = _postprocess._from_host([host], facts_of(problem, None, output_memory="host"))
    assert kept is host


def _advised_huge_pages(array: np.ndarray) -> bool:
    """Whether the mapping that holds the middle of `array`'s data was advised for huge pages
    (the `hg` flag of its `VmFlags` in /proc/self/smaps; numpy advises from the first page
    boundary inside its array, so the first bytes may lie in another mapping)."""
    address, flags, inside = array.ctypes.data + array.nbytes // 2, None, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: start-end ...
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif head == "VmFlags:" and inside:
                flags = line.split()[1:]
                break
    assert flags is not None, "no mapping holds the array"
    return "hg" in flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_lanes_outputs_are_not_advised_for_huge_pages():
    """numpy advises its large arrays for huge pages, and where the kernel compacts memory
    to find them at first touch, lanes wrote their predictions 2x slower (docs/numpyro.md).
    The lanes' outputs take the system's policy instead."""
    from pymc_chunkpost._engine.execute.host_output import aligned_empty

    size = 64 * 2**20
    numpy_array = np.empty(size, np.uint8)
    if not _advised_huge_pages(numpy_array):
        pytest.skip("this numpy does not advise huge pages: nothing to compare with")
    assert not _advised_huge_pages(aligned_empty((size,), np.uint8))


def test_the_peak_of_lanes_is_counted_once(wide, monkeypatch):
    """The executable owns the peak of its lanes (`Executable.peak_bytes`: each lane's two
    chunks' outputs and one chunk's temporaries); the plan adds only the outputs that host
    memory holds on a CPU, not the lanes a second time."""
    model, jax_fn = wide
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 50)]
    problem = _serial(problem_of(jax_fn, raw), 3, monkeypatch)
    attempt = _planner.first_attempt(jax_fn, facts_of(problem, 2**34), "auto")
    exe = attempt.exe
    assert exe.request.lanes == 3 and exe.output_memory == "host"
    lane = 2 * exe.output_bytes + exe.temp_bytes
    assert exe.peak_bytes == 3 * lane
    assert attempt.plan.peak_bytes == problem.output_bytes + 3 * lane
