"""Helpers shared by the test modules: the trusted reference and the checks against it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from pymc.sampling.jax import _postprocess_samples as pymc_postprocess

from pymc_chunkpost._engine.data import problem as _problem
from pymc_chunkpost._engine.data.types import Loop
from pymc_chunkpost._engine.execute import disk_sink as _disk_sink
from pymc_chunkpost._engine.execute import executor as _executor
from pymc_chunkpost._engine.execute.program import Request


def reference(jax_fn, raw):
    """pymc's own post-processing ("vmap") of `raw`: the trusted reference."""
    return pymc_postprocess(jax_fn, [jnp.asarray(x) for x in raw], None, "vmap")


ROOT = Path(__file__).resolve().parents[1]


def assert_same(outputs, expected, rtol=1e-10, *, on_host=False):
    """The same number of outputs, each of the expected shape and dtype, values within
    `rtol`; with `on_host`, each output is a numpy array (landed on the host)."""
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        if on_host:
            assert isinstance(got, np.ndarray)
        assert got.shape == want.shape
        assert got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=0)


class FakeAccelerator:
    """An accelerator as the planner sees it: a platform, a pool of `free` bytes, and pinned
    host memory to stream to."""

    def __init__(self, free, platform="gpu"):
        self.free = free
        self.platform = platform

    def memory_stats(self):
        return {"bytes_limit": self.free, "bytes_in_use": 0}

    def addressable_memories(self):
        return [type("Memory", (), {"kind": k})() for k in ("device", "pinned_host")]


def problem_of(jax_fn, raw, device=None):
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in raw]
    return _problem.analyse(jax_fn, specs, device or jax.devices()[0])


def facts_of(problem, budget, *, output_memory="auto", disk=False):
    """The call's facts as `run` gathers them for "auto", with `budget` bytes per device
    (None: no limit) in place of the free memory."""
    from pymc_chunkpost._engine.plan import facts as _facts

    given = 2**62 if budget is None else budget * problem.n_local_shards
    facts = _facts.gather(
        problem, "auto", memory_budget=given, output_memory=output_memory, disk=disk
    )
    return dataclasses.replace(facts, budget=_facts.Fact(budget, "the test's"))


def compile_for(jax_fn, raw, strategy, size=None, loop=None, donate=(), progress=False):
    """A fresh or cached executable of `strategy` for `raw`'s shapes on the default device."""
    if loop is None:
        loop = Loop.NONE if size is None else Loop.XLA
    problem = problem_of(jax_fn, raw)
    request = Request(strategy, loop, size, tuple(donate), progress)
    return _executor.obtain(jax_fn, problem, request)


def assert_donated(jax_fn, raw):
    """Every input was freed by donation except those an output passes through."""
    passed_through = {k for k in problem_of(jax_fn, raw).forwarded if k is not None}
    for i, x in enumerate(raw):
        assert x.is_deleted() == (i not in passed_through), i


def assert_intact(raw, copies):
    """The draws are alive and hold what they held before the call."""
    for x, y in zip(raw, copies):
        assert not x.is_deleted()
        np.testing.assert_array_equal(np.asarray(x), y)


def out_of_memory(what="Out of memory while trying to allocate 1.00GiB."):
    """The error XLA raises when a device runs out of memory."""
    return jax.errors.JaxRuntimeError(f"RESOURCE_EXHAUSTED: {what}")


def count_compiles(monkeypatch) -> list[int]:
    """From now on, count the ahead-of-time compiles (`jax.stages.Lowered.compile`, which
    the executor makes; not those of a jitted function's first call) in the returned
    one-element list, which the caller may reset."""
    count = [0]
    compile_ = jax.stages.Lowered.compile

    def counted(self, *args, **kwargs):
        count[0] += 1
        return compile_(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    return count


def run_script(path, *args, timeout=600, env=None) -> subprocess.CompletedProcess:
    """`path` (relative to the repository root, such as "benchmarks/cold_call.py") run with
    `args` in a fresh Python that imports this checkout's package, with `env` added to this
    process's environment; output captured as text."""
    env = dict(os.environ) | (env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / path), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


class Stop(Exception):
    """The failure `fail_after` injects."""


def fail_after(monkeypatch, n_writes):
    """Make the disk tier's writer fail with `Stop` at its `n_writes + 1`-th region write
    (a chunk writes one region per computed output). Returns the count of writes so far."""
    write = _disk_sink._write_items
    count = [0]

    def failing(*args):
        count[0] += 1
        if count[0] > n_writes:
            raise Stop("injected")
        return write(*args)

    monkeypatch.setattr(_disk_sink, "_write_items", failing)
    return count


@contextlib.contextmanager
def read_only(folder, monkeypatch):
    """`folder`, made, read-only for the body of a `with` block (root may write anywhere:
    for root, the disk tier's check is shown what a user sees)."""
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:
        monkeypatch.setattr(_disk_sink.os, "access", lambda path, mode: False)
    try:
        yield folder
    finally:
        folder.chmod(0o700)
