"""`benchmarks/bench_sample_route.py`: its table from synthetic runs, its argument checks, and
(slow) one real round."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import bench_sample_route  # noqa: E402


def _run(post, loaded, warnings=()):
    return {
        "postprocess_seconds": post,
        "sample_seconds": 2 * post,
        "loaded": loaded,
        "plans": 2,
        "executable_warnings": list(warnings),
    }


def test_the_table_gives_medians_ranges_loads_and_warnings():
    results = {"regression": {"warm": [_run(0.3, 2), _run(0.1, 2), _run(0.2, 1, ["x"])]}}
    line = bench_sample_route.table(results).splitlines()[-1]
    assert line == "| regression | warm | 0.200 (0.100-0.300) | 0.40 | 5/6 | 1 |"


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench_sample_route.main(["--models", "nope"])


@pytest.mark.slow
def test_one_round_loads_warm_and_warns_nothing(tmp_path):
    out = tmp_path / "route.json"
    bench_sample_route.main(["--repeats", "1", "--draws", "20", "--json", str(out)])
    import json

    record = json.loads(out.read_text())
    assert record["table"].count("\n| ") == 6 and "pymc " in record["header"]  # results page
    results = record["results"]
    for by_case in results.values():
        (warm,) = by_case["warm"]
        assert warm["loaded"] == warm["plans"] > 0 and not warm["executable_warnings"]
