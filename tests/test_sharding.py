"""Draws split over several devices stay there: every strategy runs per shard.

pymc forces 100 host devices at import (`--xla_force_host_platform_device_count=100`), so the
test process has several CPU devices, as `pm.sample`'s parallel chains have.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import models
import numpy as np
import pytest
from helpers import assert_same, count_compiles, reference
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call import draws as _draws
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._engine.plan import planner as _planner
from pymc_chunkpost._engine.plan import resources as _resources
from pymc_chunkpost._support import compat as _compat
from pymc_chunkpost._support import disk as _disk

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")


def _mesh(n, name="chain"):
    return Mesh(np.array(jax.devices()[:n]), (name,))


def _sharded(raw, spec, n=4):
    sharding = NamedSharding(_mesh(n, "d"), spec)
    return [jax.device_put(jnp.asarray(x), sharding) for x in raw]


SPECS = {"chains": PartitionSpec("d"), "draws": PartitionSpec(None, "d")}


@pytest.mark.parametrize("axis", sorted(SPECS))
@pytest.mark.parametrize(
    "strategy, options",
    [
        ("auto", {}),
        ("chunked", {"chunk_size": 7}),
        ("chunked", {"chunk_size": 7, "progressbar": True}),
        ("auto", {"chunk_size": 5}),
        ("vmap", {}),
        ("scan", {}),
        ("scan_vmap", {}),
        ("nested_scan", {}),
    ],
)
def test_every_strategy_keeps_the_split(built, axis, strategy, options):
    model, jax_fn = built("structured")
    raw = _sharded(models.raw_draws(model, 4, 40), SPECS[axis])
    expected = reference(jax_fn, raw)
    outputs, plan = _postprocess.run(jax_fn, raw, None, strategy, **options)
    assert_same(outputs, expected)
    assert plan.n_devices == 4 and "sharding over 4 devices" in plan.devices_reason
    for out, want in zip(outputs, expected):
        assert out.sharding.is_equivalent_to(raw[0].sharding, out.ndim)
        assert want.sharding.is_equivalent_to(raw[0].sharding, want.ndim)  # as pymc's


def test_per_device_plan_and_nothing_gathered(built):
    """Chunk sizes, peaks and the budget are per device: each device holds its share of the
    outputs plus one chunk, within 10% of its share of the floor."""
    model, jax_fn = built("data_regression")
    raw = _sharded(models.raw_draws(model, 4, 500), SPECS["chains"])
    floor = sum(
        int(np.prod(o.shape)) * o.dtype.itemsize for o in reference(jax_fn, raw)[1:]
    )  # the first output passes an input through
    outputs, plan = _postprocess.run(
        jax_fn, raw, None, "chunked", chunk_size=25, memory_budget=4 * floor
    )
    assert plan.n_chunks == 500 // 25  # one chain of 500 draws per device
    assert plan.budget_bytes == floor  # 4 x floor over 4 devices sharing one RAM
    assert plan.peak_bytes <= 1.10 * floor / 4
    for out in outputs:
        shards = out.addressable_shards
        assert len(shards) == 4 and all(s.data.shape[0] == 1 for s in shards)


def test_donated_sharded_draws_are_freed(built):
    model, jax_fn = built("structured")
    raw = _sharded(models.raw_draws(model, 4, 20), SPECS["chains"])
    expected = reference(jax_fn, raw)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "auto", True)
    assert_same(outputs, expected)
    assert any(x.is_deleted() for x in raw)


def test_other_splits_are_gathered_to_one_device(built):
    """A split of a trailing axis is not the chain/draw split: one device, still correct."""
    model, jax_fn = built("data_regression")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 2, 8)]
    expected = reference(jax_fn, raw)
    mesh = _mesh(2, "d")
    odd = [
        jax.device_put(x, NamedSharding(mesh, PartitionSpec(None, None, "d")))
        if x.ndim == 3 and x.shape[2] % 2 == 0
        else jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        for x in raw
    ]
    outputs, plan = _postprocess.run(jax_fn, odd, None, "auto")
    assert plan.n_devices == 1
    assert_same(outputs, expected)


def test_a_backend_on_another_platform_moves_the_draws(built, monkeypatch):
    """`postprocessing_backend` still moves the work when asked: draws on "cpu" devices asked
    for "cpu" stay split; the one-device rule applies to a backend of another platform."""
    model, jax_fn = built("structured")
    raw = _sharded(models.raw_draws(model, 4, 12), SPECS["chains"])
    _, plan = _postprocess.run(jax_fn, raw, "cpu", "auto")
    assert plan.n_devices == 4


def test_single_device_draws_are_not_spread_on_a_cpu(built):
    model, jax_fn = built("data_regression")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 4, 50)]
    problem, _ = _draws.validate(jax_fn, raw, None)
    assert _resources.spread(problem) is problem


def test_single_device_draws_spread_over_accelerators(built, monkeypatch, configure):
    """On a platform in `spread_platforms` (here the CPU with two local devices, made an
    accelerator for the test), a large enough run is split over the local devices along the
    chain axis, outputs equal."""
    configure(spread_platforms=("cpu",), spread_min_bytes=0)
    monkeypatch.setattr(_resources, "_local_devices", lambda platform: jax.devices(platform)[:2])
    model, jax_fn = built("data_regression")
    raw = [jnp.asarray(x) for x in models.raw_draws(model, 4, 50)]
    expected = reference(jax_fn, raw)
    outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")
    assert plan.n_devices == 2 and "chain axis" in plan.devices_reason
    assert_same(outputs, expected)
    outputs, plan = _postprocess.run(
        jax_fn, [jnp.asarray(x) for x in models.raw_draws(model, 1, 50)], None, "auto"
    )
    assert plan.n_devices == 2 and "draw axis" in plan.devices_reason


def test_vmap_threshold_counts_every_cpu_device(built):
    """On a CPU the devices share one memory system: `auto` weighs the loop-free vmap's
    temporaries of all devices together, not one device's."""
    from pymc_chunkpost._engine.data.types import Loop
    from pymc_chunkpost._engine.execute.executor import obtain
    from pymc_chunkpost._engine.execute.program import Request
    from pymc_chunkpost._support.config import configured

    model, jax_fn = built("transforms")  # a vmap with temporaries (not a product by data)
    raw = _sharded(models.raw_draws(model, 4, 500), SPECS["chains"])
    problem, _ = _draws.validate(jax_fn, raw, None)
    per_device = obtain(jax_fn, problem, Request("vmap", Loop.NONE, None)).temp_bytes
    assert per_device > 0
    expected = reference(jax_fn, raw)
    for threshold, strategy in ((2 * per_device, "chunked"), (5 * per_device, "vmap")):
        with configured(vmap_temp_bytes=threshold):
            outputs, plan = _postprocess.run(jax_fn, raw, None, "auto")
        assert plan.strategy == strategy, plan.reason
        assert_same(outputs, expected)


# jaxlib 0.10's deadlock (`_resources.shard_by_shard`): loops over LAPACK kernels on every CPU
# device of a process at once. The GP fixture calls a Cholesky per draw.


@pytest.fixture(scope="module")
def gp():
    from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn, raw_draws

    model = FIXTURES["gp"].build()
    return model, jax_fn(model), raw_draws(model, 4, 12, seed=1)


def _deadlock_prone(monkeypatch):
    """As on jaxlib 0.10 with 4 CPU devices in the process."""
    monkeypatch.setattr(_compat, "LAPACK_DEADLOCK_FIXED_IN", (10**6, 0))
    monkeypatch.setattr(_resources, "_cpu_device_count", lambda: 4)


def _assert_close_gp(outputs, expected):
    # Batched and per-draw Cholesky calls differ by rounding, amplified by the GP's
    # ill-conditioned covariance (tests/test_zoo.py, ILL_CONDITIONED).
    for got, want in zip(outputs, expected):
        got, want = np.asarray(got), np.asarray(want)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * scale)


def test_shard_by_shard_only_where_the_deadlock_can_happen(gp, built, monkeypatch):
    _, jax_fn, raw = gp
    sharded = _sharded(raw, SPECS["chains"])
    problem = _draws.validate(jax_fn, sharded, None)[0]
    structured_model, structured_fn = built("structured")
    plain = _draws.validate(
        structured_fn, _sharded(models.raw_draws(structured_model, 4, 10), SPECS["chains"]), None
    )[0]
    one_device = _draws.validate(jax_fn, [jnp.asarray(x) for x in raw], None)[0]
    if not _compat.lapack_may_deadlock():
        assert _resources.shard_by_shard(problem) is None  # a fixed jaxlib
    _deadlock_prone(monkeypatch)
    reason = _resources.shard_by_shard(problem)
    assert reason is not None and "one shard after another" in reason
    assert _resources.shard_by_shard(plain) is None  # no LAPACK kernel
    assert _resources.shard_by_shard(one_device) is None
    monkeypatch.setattr(_resources, "_cpu_device_count", lambda: 8)  # 4 shards of 8 ran
    assert _resources.shard_by_shard(problem) is None


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("auto", {}),
        ("auto", {"donate": True}),
        ("chunked", {"chunk_size": 3}),
        ("vmap", {}),  # pymc's own loop-free vmap hung too, once in seven runs
        ("scan", {}),
    ],
)
def test_deadlock_prone_runs_equal_pymc_and_keep_the_split(gp, monkeypatch, strategy, options):
    _, jax_fn, raw = gp
    _deadlock_prone(monkeypatch)
    options = dict(options)
    donate = options.pop("donate", False)
    for axis in sorted(SPECS):
        sharded = _sharded(raw, SPECS[axis])
        expected = reference(jax_fn, sharded)
        kept = [np.asarray(x).copy() for x in sharded]
        problem = _draws.validate(jax_fn, sharded, None)[0]
        outputs, plan = _postprocess.run(jax_fn, sharded, None, strategy, donate, **options)
        _assert_close_gp(outputs, expected)
        assert plan.n_devices == 4 and "one shard after another" in plan.devices_reason
        assert plan.output_bytes == problem.output_bytes  # all shards', not the last one's
        for out in outputs:
            assert out.sharding.is_equivalent_to(sharded[0].sharding, out.ndim)
        if donate:
            passed = {k for k in problem.forwarded if k is not None}
            assert all(x.is_deleted() == (i not in passed) for i, x in enumerate(sharded))
        else:
            for x, before in zip(sharded, kept):
                np.testing.assert_array_equal(np.asarray(x), before)


def test_plan_of_a_deadlock_prone_call_is_the_shard_by_shard_run(gp, monkeypatch):
    _, jax_fn, raw = gp
    _deadlock_prone(monkeypatch)
    sharded = _sharded(raw, SPECS["chains"])
    planned = pc.plan(jax_fn, sharded)
    _, ran = _postprocess.run(jax_fn, sharded, None, "auto")
    assert planned.n_devices == ran.n_devices == 4
    assert planned.devices_reason == ran.devices_reason
    assert "one shard after another" in planned.devices_reason
    assert (planned.strategy, planned.chunk_size) == (ran.strategy, ran.chunk_size)
    assert planned.output_bytes == ran.output_bytes
    assert planned.peak_bytes == ran.peak_bytes
    # Each shard planned alone: a quarter of the draws on one device.
    one = pc.plan(jax_fn, [np.asarray(x)[:1] for x in raw])
    assert planned.output_bytes == 4 * one.output_bytes


@pytest.mark.parametrize("serial, random", [(True, False), (False, True)])
def test_each_shard_runs_as_the_call_says_its_function_computes(gp, monkeypatch, serial, random):
    """A shard is planned as the whole call would be: one draw at a time (`serial`, that is
    `one_draw_programs`), or
    random draws (`random`)."""
    _, jax_fn, raw = gp
    _deadlock_prone(monkeypatch)
    seen = []
    real = _planner.first_attempt

    def first_attempt(fn, facts, *args, **kwargs):
        seen.append((facts.problem.one_draw_programs, facts.problem.random))
        return real(fn, facts, *args, **kwargs)

    monkeypatch.setattr(_planner, "first_attempt", first_attempt)
    sharded = _sharded(raw, SPECS["chains"])
    _postprocess.run(jax_fn, sharded, None, "auto", one_draw_programs=serial, random=random)
    assert seen == [(serial, random)] * 4


def test_shard_by_shard_plan_says_what_the_first_shard_chose(gp, monkeypatch, tmp_path):
    """The later shards start from the tuning entry that the first one stored; the plan of a
    cold run still says what was chosen, and how, not "from the tuning cache"."""
    _, jax_fn, raw = gp
    _deadlock_prone(monkeypatch)
    monkeypatch.setenv("PYMC_CHUNKPOST_CACHE_DIR", str(tmp_path))
    try:
        _, ran = _postprocess.run(jax_fn, _sharded(raw, SPECS["draws"]), None, "auto")
    finally:
        _disk.wait()
    assert list(tmp_path.glob("*.json")), "the first shard stored its plan"
    assert ran.n_devices == 4
    assert ran.source == "rule" and "tuning cache" not in ran.reason


@pytest.mark.slow  # a fresh process with 4 CPU devices
def test_gp_on_every_device_of_a_4_device_jax_returns():
    """The README's advice (one CPU device per chain) with a GP: on jaxlib 0.10 this hung
    forever before `shard_by_shard`; on later jaxlib it runs the shards together."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=4"])
    script = Path(__file__).with_name("lapack_deadlock_check.py")
    try:
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail("post-processing a GP on 4 of 4 CPU devices did not return in 240 s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("OK 4"), done.stdout


def test_a_shard_by_shard_run_compiles_as_one_shard_does(gp, monkeypatch):
    """The later shards load the first shard's executables on their devices
    (`_executable_store.relocate`): one compile of each, not one per device."""
    _, jax_fn, raw = gp
    _deadlock_prone(monkeypatch)
    count = count_compiles(monkeypatch)
    pc.clear_caches()
    _postprocess.run(jax_fn, [np.asarray(x)[:1] for x in raw], None, "auto")
    one_shard = count[0]
    pc.clear_caches()
    count[0] = 0
    outputs, plan = _postprocess.run(jax_fn, _sharded(raw, SPECS["chains"]), None, "auto")
    assert "one shard after another" in plan.devices_reason
    assert count[0] == one_shard > 0
    _assert_close_gp(outputs, reference(jax_fn, raw))
