"""The seam between the benchmarks and the engine: `postprocess_samples_with_plan`,
`configured`, and `benchmarks/_internals.py`, whose every name must still reach the
engine (a benchmark that times a step the engine renamed fails here, not on the next run)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import models
import pytest
from helpers import assert_same, reference

import pymc_chunkpost as pc
from pymc_chunkpost._engine.call import postprocess as _postprocess
from pymc_chunkpost._support import config as _config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _internals as internals  # noqa: E402


def test_every_name_reaches_the_engine():
    for name in internals.__all__:
        assert getattr(internals, name) is not None, name
    for label, (module, function) in internals.STEPS.items():
        assert callable(getattr(importlib.import_module(f"pymc_chunkpost.{module}"), function)), (
            label
        )


def test_configured_is_the_engines():
    with pc.configured(jump_factor=7.0) as config:
        assert _config.current() is config
        assert internals.current().jump_factor == 7.0


def test_with_plan_returns_the_outputs_and_the_plan_that_ran(built):
    model, jax_fn = built("transforms")
    raw = models.raw_draws(model, 2, 10)
    outputs, plan = pc.postprocess_samples_with_plan(jax_fn, raw, None, "chunked", chunk_size=4)
    assert isinstance(plan, pc.Plan)
    assert (plan.strategy, plan.chunk_size) == ("chunked", 4)
    assert_same(outputs, reference(jax_fn, raw))


def test_steps_are_timed_and_plans_recorded(built, monkeypatch):
    model, jax_fn = built("transforms")
    raw = models.raw_draws(model, 2, 10)
    for module, function in internals.STEPS.values():
        owner = importlib.import_module(f"pymc_chunkpost.{module}")
        monkeypatch.setattr(owner, function, getattr(owner, function))  # undone at the end
    monkeypatch.setattr(_postprocess, "run", _postprocess.run)
    seconds: dict[str, list[float]] = {}
    for label in ("validate", "execute"):
        internals.time_step(label, seconds.setdefault(label, []).append)
    plans: list[pc.Plan] = []
    internals.on_plan(plans.append)
    outputs = pc.postprocess_samples(jax_fn, raw, None, "chunked", chunk_size=5)
    _, ran = pc.postprocess_samples_with_plan(jax_fn, raw, None, "vmap")
    assert [p.strategy for p in plans] == ["chunked", ran.strategy]
    assert len(seconds["validate"]) == 2 and min(seconds["validate"]) >= 0
    assert seconds["execute"]
    assert_same(outputs, reference(jax_fn, raw))


def test_an_unknown_step_is_refused():
    with pytest.raises(KeyError):
        internals.time_step("no_such_step", print)


def test_use_disk_codec_sets_the_disk_tiers_codec(monkeypatch):
    from pymc_chunkpost._engine.execute import disk_sink as _disk_sink

    monkeypatch.setattr(_disk_sink, "COMPRESSORS", None)
    internals.use_disk_codec("auto")
    assert _disk_sink.COMPRESSORS == "auto"
