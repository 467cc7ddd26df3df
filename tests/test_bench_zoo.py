"""benchmarks/bench_zoo.py: the structure of what it writes, and that a wrong answer shows."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from helpers import ROOT, run_script

SCRIPT = ROOT / "benchmarks" / "bench_zoo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_zoo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # the benchmark script, 8 fresh processes
def test_smoke_run_writes_runs_summary_and_tables(tmp_path, bench):
    out_json, out_md = tmp_path / "zoo.json", tmp_path / "zoo.md"
    done = run_script(SCRIPT, "--smoke", "--quiet", "--json", out_json, "--out", out_md)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out_json.read_text())
    runs = result["runs"]
    # Every smoke case of every smoke model ran once, each in its own process, and none failed.
    assert sorted((r["model"], r["case"]) for r in runs) == sorted(
        (m, c) for m in bench.SMOKE_MODELS for c in bench.SMOKE_CASES
    )
    assert not [r for r in runs if "error" in r]
    for r in runs:
        # Each child compared its outputs with pymc's "vmap", computed in another process.
        assert r["matches_pymc"] is True, r
        assert r["seconds"] > 0
        assert r["vmhwm_bytes"] >= r["rss_before_bytes"] > 0
        assert 0 < r["floor_bytes"] <= r["output_bytes"]
        if r["case"] in bench.AUTO_CASES:
            assert {"strategy", "chunk_size", "loop", "reason"} <= set(r["plan"])
            json.dumps(r["plan"])
    summary = {row["model"]: row for row in result["summary"]}
    assert set(summary) == set(bench.SMOKE_MODELS)
    for row in summary.values():
        assert row["best_anchor"] == "lax_map:8"  # the only anchor among the smoke cases
        assert row["auto_cold_ratio"] == pytest.approx(
            row["cases"]["auto_cold"]["median_s"] / row["best_anchor_s"]
        )
        assert row["auto_warm_ratio"] > 0
        assert row["auto_cold_paired"]["n"] == 1  # one repeat: its own ratio
        assert row["auto_cold_paired"]["median"] == pytest.approx(
            row["auto_cold_ratio"]  # one run per case: the median is that run
        )
    text = out_md.read_text()
    assert "| model | best anchor |" in text
    assert all(f"**{model}**" in text for model in bench.SMOKE_MODELS)
    assert "**NO**" not in text
    # The tables can be rebuilt from the JSON alone.
    again = run_script(SCRIPT, "--tables-from", out_json, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == text.strip()


def test_a_wrong_answer_is_flagged(tmp_path, bench):
    want = [np.linspace(-1.0, 1.0, 24).reshape(2, 3, 4), np.arange(6).reshape(2, 3)]
    for i, x in enumerate(want):
        np.save(tmp_path / f"{i}.npy", x)
    dtypes = [str(x.dtype) for x in want]
    assert bench._compare(want, tmp_path, dtypes)["matches_pymc"]
    # Within tolerance: a summation-order difference near zero, on the output's scale.
    close = [want[0] + 1e-14, want[1]]
    assert bench._compare(close, tmp_path, dtypes)["matches_pymc"]
    off = want[0].copy()
    off[1, 2, 3] += 1e-6
    assert not bench._compare([off, want[1]], tmp_path, dtypes)["matches_pymc"]
    ints = want[1].copy()
    ints[0, 0] += 1
    assert not bench._compare([want[0], ints], tmp_path, dtypes)["matches_pymc"]
    assert not bench._compare([want[0].astype(np.float32), want[1]], tmp_path, dtypes)[
        "matches_pymc"
    ]


@pytest.mark.parametrize(
    "cases, devices, match",
    [
        (["lax_map:0"], 1, "Unknown case"),
        (["nope"], 1, "Unknown case"),
        (["shard_map:8"], 1, "--devices"),
        (["auto_warm"], 1, "pass both"),
    ],
)
def test_bad_cases_are_rejected(bench, cases, devices, match):
    with pytest.raises(ValueError, match=match):
        bench.check_cases(cases, devices)


def test_default_cases_hold_every_anchor(bench):
    cases = bench.default_cases(1)
    assert cases[:2] == ["auto_cold", "auto_warm"]
    assert {f"lax_map:{b}" for b in (1, 2, 4, 8, 16, 32, 64, 128)} <= set(cases)
    assert {"pymc_vmap", "pymc_scan", "soft_vmap:8"} <= set(cases)
    assert "shard_map:8" in bench.default_cases(4)
    bench.check_cases(bench.default_cases(4), 4)


@pytest.mark.parametrize(
    "devices, host_devices, want",
    [(1, None, None), (1, 4, "4"), (4, None, "4"), (2, 8, "8")],
)
def test_host_devices_flag_comes_last(bench, monkeypatch, devices, host_devices, want):
    # pymc.sampling.jax puts its 100 first at import; the last flag on the line wins.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3 --xla_foo=1")
    flags = bench._child_env(devices, "/cache", host_devices)["XLA_FLAGS"].split()
    counts = [f.split("=")[1] for f in flags if "device_count" in f]
    assert counts == ([want] if want else ["3"])
    assert "--xla_foo=1" in flags
    assert want is None or flags[-1].endswith(f"={want}")


@pytest.mark.slow  # the benchmark script
def test_fewer_host_devices_than_devices_is_rejected():
    done = run_script(SCRIPT, "--devices", "4", "--host-devices", "2", timeout=120)
    assert done.returncode == 2
    assert "--host-devices 2 must be at least --devices 4" in done.stderr


@pytest.mark.slow  # the benchmark script
def test_list_names_the_zoo():
    from pymc_chunkpost.profiling.fixtures import ZOO

    done = run_script(SCRIPT, "--list", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = [line.split()[0] for line in done.stdout.splitlines() if not line.startswith("cases")]
    assert listed == list(ZOO)


def test_paired_ratios_divide_out_a_slow_round(bench):
    """Rounds 1 and 2 ran slow spells: the ratio of medians puts `auto` at 2.1x the anchor,
    the paired ratio at 1.1x, the median of what each round measured (1.0, 1.1, 2.1)."""
    runs = [
        {"model": "m", "case": c, "repeat": r, "seconds": t, "peak_extra_bytes": 1,
         "floor_bytes": 1, "matches_pymc": True, "output_devices": 1}
        for c, r, t in [
            ("auto_cold", 0, 1.0), ("lax_map:8", 0, 1.0),
            ("auto_cold", 1, 2.2), ("lax_map:8", 1, 2.0),
            ("auto_cold", 2, 2.1), ("lax_map:8", 2, 1.0),
        ]
    ]  # fmt: skip
    (row,) = bench.summarise(runs, ["auto_cold", "lax_map:8"])
    assert row["best_anchor"] == "lax_map:8"
    assert row["auto_cold_ratio"] == pytest.approx(2.1 / 1.0)
    assert row["auto_cold_paired"] == pytest.approx({"median": 1.1, "min": 1.0, "max": 2.1, "n": 3})
    assert row["auto_warm_paired"] is None
    assert "| 2.10 | 1.10 (1.00-2.10) |" in bench.tables([row])
