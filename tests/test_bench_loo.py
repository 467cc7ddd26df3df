"""benchmarks/bench_loo.py: ours and the anchor, each cold in a fresh process, give the same
elpd and the record the results page reads; its plot is drawn from records alone."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

pytestmark = pytest.mark.slow  # a benchmark script: fresh processes


@pytest.mark.parametrize("model", ["hierarchical", "logistic"])
def test_bench_loo_record_and_plot(tmp_path, model):
    record = tmp_path / "loo.json"
    done = run_script(
        "benchmarks/bench_loo.py",
        *("--rows", "300", "--model", model, "--check-subset", "40", "--json", record),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(record.read_text())
    assert data["model"] == model
    ours, anchor = sorted(data["cells"], key=lambda c: c["method"] != "ours")
    assert (ours["method"], anchor["method"]) == ("ours", "anchor")
    assert ours["elpd"] == pytest.approx(anchor["elpd"], rel=1e-9)
    assert ours["subset"] == 40 and ours["elpd_i_max_abs_diff"] < 1e-8
    assert all(c["peak_rss_above_start"] > 0 and c["seconds"] > 0 for c in data["cells"])
    assert set(data["speedup_cold"]) == {"300"}
    assert data["table"].count("| 300 |") == 2
    png = tmp_path / "loo.png"
    done = run_script("benchmarks/bench_loo.py", "--plot", png, "--plot-from", record)
    assert done.returncode == 0, done.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
