"""One call reads the machine once: its free host memory (`_memory.one_reading`), and the
per-draw jaxpr walked once for LAPACK kernels, at its trace (`Problem.calls_lapack`)."""

from __future__ import annotations

import models
import pytest
from helpers import assert_same, reference

from pymc_chunkpost import clear_caches
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.data import problem as _problem
from pymc_chunkpost._support import compat as _compat
from pymc_chunkpost._support import memory as _memory


@pytest.fixture
def reads(monkeypatch):
    """Reads of the host's available memory, and walks of a jaxpr for LAPACK kernels."""
    counts = {"host": 0, "lapack": 0}
    available, uses = _memory._host_available_bytes, _problem.uses_primitives

    def read():
        counts["host"] += 1
        return available()

    depth = [0]

    def walk(jaxpr, names):  # counted where a walk starts, not at its nested jaxprs
        counts["lapack"] += depth[0] == 0 and names == _compat.LAPACK_PRIMITIVES
        depth[0] += 1
        try:
            return uses(jaxpr, names)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(_memory, "_host_available_bytes", read)
    monkeypatch.setattr(_problem, "uses_primitives", walk)
    return counts


@pytest.mark.parametrize("output_memory", ["auto", "host"])
def test_one_call_reads_host_memory_once_and_walks_the_jaxpr_once(reads, output_memory):
    model = models.structured()  # an LKJ prior: a Cholesky factor, a LAPACK kernel
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 20)
    clear_caches()
    outputs, _ = _postprocess.run(jax_fn, raw, None, "auto", output_memory=output_memory)
    assert reads == {"host": 1, "lapack": 1}
    assert_same(outputs, reference(jax_fn, raw))
    _postprocess.run(jax_fn, raw, None, "auto", output_memory=output_memory)
    assert reads == {"host": 2, "lapack": 1}  # a second call: read again, traced once


def test_an_out_of_memory_failure_reads_the_machine_again(reads, monkeypatch):
    """After a failure the planner's retry reads free memory afresh (`read_again`)."""
    import jax

    model = models.data_regression(n_obs=50)
    jax_fn = models.jax_fn(model)
    raw = models.raw_draws(model, 2, 20)
    clear_caches()
    execute, failures = _postprocess.execute, []

    def fail_once(exe, samples, tuner=None):
        if not failures:
            failures.append(1)
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: injected")
        return execute(exe, samples, tuner)

    monkeypatch.setattr(_postprocess, "execute", fail_once)
    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        outputs, _ = _postprocess.run(jax_fn, raw, None, "chunked", chunk_size=10)
    assert reads["host"] == 2
    assert_same(outputs, reference(jax_fn, raw))
