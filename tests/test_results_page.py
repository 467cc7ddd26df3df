"""benchmarks/results_page.py: the page it prints from small synthetic records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "results_page.py"
HEADER = (
    "Measured {date} with `python benchmarks/bench_zoo.py --models {models} --cases "
    "auto_cold,auto_warm,lax_map:1,lax_map:8 --repeats 2 --json /tmp/z.json --quiet`: 2 CPU "
    "cores (cpu), Python 3.12.1, jax 0.12.0.1, pymc 6.4.0, the default device."
)


PLAN = {"plan": {"strategy": "chunked", "chunk_size": 8, "loop": "xla"}}


def _zoo_runs(model: str, seconds: dict[str, list[float]], wrong: tuple = ()) -> list[dict]:
    return [
        {
            "model": model,
            "case": case,
            "repeat": repeat,
            "seconds": t,
            "peak_extra_bytes": 2 * 2**20,
            "floor_bytes": 2**20,
            "matches_pymc": case not in wrong,
            "output_devices": 1,
            **(PLAN if "auto" in case else {}),
        }
        for case, times in seconds.items()
        for repeat, t in enumerate(times)
    ]  # fmt: skip


def _records(folder: Path) -> None:
    """Two zoo runs on Python 3.12 (run 9, then run 10: newest by number, not by name), one
    in bench_zoo's own `--json` form and one merged per model; a cold-call record; a post-hoc
    run as JSON (py312) and as an older table (py311); a host-output run."""
    before = _zoo_runs("fast", {"auto_cold": [1.0, 1.1], "lax_map:8": [2.0, 2.0]})
    before += _zoo_runs("slow", {"auto_cold": [1.0, 1.1], "lax_map:8": [2.0, 2.0]})
    (folder / "zoo_run9_accept_py312.json").write_text(
        json.dumps({"runs": before, "header": HEADER.format(date="2026-12-01", models="fast,slow")})
    )
    fast = _zoo_runs(
        "fast",
        {
            "auto_cold": [1.0, 1.2],
            "auto_warm": [0.5, 0.5],
            "lax_map:1": [0.1, 0.1],  # fastest, but its outputs differ from pymc's
            "lax_map:8": [2.0, 2.2],
        },
        wrong=("lax_map:1",),
    )
    slow = _zoo_runs(
        "slow", {"auto_cold": [3.0, 3.2], "auto_warm": [2.5, 2.5], "lax_map:8": [2.0, 2.0]}
    )
    merged = {
        model: {"runs": runs, "header": HEADER.format(date="2026-12-04", models=model)}
        for model, runs in (("fast", fast), ("slow", slow))
    }
    (folder / "zoo_run10_accept_py312.json").write_text(json.dumps(merged))

    def steps(nonxla):
        return [{"total": 0.05, "xla_compile": 0.03, "nonxla": x, "budget": 0.001} for x in nonxla]

    cold = {"auto": steps([0.021, 0.022, 0.023]), "pymc_vmap": steps([0.020, 0.020, 0.020])}
    (folder / "zoo_run10_cold_call_py312.json").write_text(
        json.dumps({"model": "eight_schools", "draws": 1000, "runs": cold})
    )
    posthoc = [
        {"repeat": 0, "case": "hier_2k", "method": m, "pymc": "6.4.0", "jax": "0.12.0.1",
         "cold_s": cold_s, "warm_s": cold_s / 10, "rerun_s": cold_s / 2, "cold_peak": 110,
         "warm_peak": 101, "floor": 100}
        for m, cold_s in (("ours", 0.2), ("pymc_jax", 0.6))
    ]  # fmt: skip
    (folder / "bench_posthoc_run7_py312.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/bench_posthoc.py --repeats 1 --cases hier_2k",
                "date": "2026-12-05",
                "python": "3.12.1",
                "cases": ["hier_2k"],
                "methods": ["ours", "pymc_jax"],
                "fresh": False,
                "runs": posthoc,
            }
        )
    )
    (folder / "bench_posthoc_run6_py312.md").write_text("an older table, superseded\n")
    (folder / "bench_posthoc_run6_py311.md").write_text("| posterior | the py311 table |\n")
    row = {"jax": "0.12.0.1", "seconds": 1.0, "first_seconds": 2.0, "compile_seconds": 0.1,
           "peak_extra_MiB": 900.0, "output_MiB": 916.0, "checksum": 1.5}  # fmt: skip
    host = {"device": [row], "host_view": [row | {"seconds": 0.8}]}
    (folder / "bench_host_output_run2_py312.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/bench_host_output.py --repeat 1",
                "date": "2026-12-05",
                "python": "3.12.1",
                "chunk_size": 16,
                "repeat": 1,
                "rows": host,
            }
        )
    )


def _page(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(folder), "--out", "-"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def records(tmp_path) -> Path:
    _records(tmp_path)
    return tmp_path


def test_the_page_from_synthetic_records(records):
    done = _page(records)
    assert done.returncode == 0, done.stderr
    page = done.stdout
    # It begins with the command that wrote it.
    assert page.startswith(f"`python benchmarks/results_page.py --results {records} --out -`")
    # The newest zoo run is run 10 (by number), summarised by bench_zoo's own table: the best
    # anchor leaves out lax_map:1, whose outputs differ from pymc's; cold 1.1 s over 2.1 s,
    # paired 1.0/2.0 and 1.2/2.2.
    assert "`benchmarks/results/zoo_run10_accept_py312.json`, measured 2026-12-04" in page
    assert "### Python 3.12, jax 0.12.0.1, pymc 6.4.0" in page
    assert "| fast | lax_map:8 | 2.100 | 1.100 | 0.52 | 0.52 (0.50-0.55) | 0.500 | 0.24 |" in page
    assert "| slow | lax_map:8 | 2.000 | 3.100 | 1.55 | 1.55 (1.50-1.60) | 2.500 | 1.25 |" in page
    assert "(MODELS: fast, slow)" in page  # one command, merged over the two models
    assert "**Cold `auto`: within 1.05x of the best anchor on 1 of 2** " in page
    assert "over: slow 1.55" in page
    assert "**Warm `auto`: within 1.00x of the best anchor on 1 of 2** " in page
    assert "Outputs that differ from pymc's" in page and "fast (lax_map:1)" in page
    # Against run 9: slow's fastest cold run (3.0 s) is past its slowest before (1.1 s); fast's
    # spreads overlap.
    assert "`zoo_run9_accept_py312.json` -> `zoo_run10_accept_py312.json`" in page
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| ")}
    assert rows["| slow"].endswith("| 3.100 (3.000-3.200) | 2.95 | 0.53 | 1.55 | **slower** |")
    assert "slower" not in rows["| fast"]
    # The cold call: auto less pymc outside the compile, paired by round (1, 2 and 3 ms).
    assert "| 3 | 50.0 | 50.0 | 30.0 / 30.0 | +2.0 (+1.0 to +3.0) |" in page
    # The post-hoc run: bench_posthoc's own table from the JSON (pymc's 0.6 s over our 0.2 s),
    # the py311 stack from its recorded table; the older py312 table is superseded.
    assert "`python benchmarks/bench_posthoc.py --repeats 1 --cases hier_2k`, 2026-12-05" in page
    assert "| hier_2k | pymc_jax | 0.60 | 0.06 | 0.30 | 3.00x | 3.00x | 3.00x |" in page
    assert "| posterior | the py311 table |" in page
    assert "superseded" not in page
    # Host outputs: bench_host_output's own table.
    assert "| host_view | 0.800 | 0.80 | 2.000 | 900 | 0.10 | True |" in page
    # Benchmarks without a record are left out.
    assert "## The zoo on 4 devices" not in page
    assert "Posterior predictive" not in page and "NumPyro" not in page


def test_a_new_benchmark_with_its_own_table(records):
    (records / "bench_predictive_run1_py312.json").write_text(
        json.dumps(
            {"header": "4 x 1000 draws", "table": "| model | ratio |\n|---|---|\n| m | 0.5 |"}
        )
    )
    done = _page(records)
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("## Posterior predictive", 1)[1]
    assert "`benchmarks/results/bench_predictive_run1_py312.json`" in section
    assert "4 x 1000 draws" in section and "| m | 0.5 |" in section


def test_a_record_the_page_cannot_read_is_an_error(records):
    (records / "bench_numpyro_run1_py312.json").write_text(json.dumps({"runs": []}))
    done = _page(records)
    assert done.returncode != 0
    assert "bench_numpyro_run1_py312.json holds no `table`" in done.stderr
    assert "section function in benchmarks/results_page.py" in done.stderr


def test_the_default_page_is_written_where_the_docs_are(tmp_path, records):
    # --out FILE writes the page there (the default is docs/results.md); nothing is printed.
    out = tmp_path / "results.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(records), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert out.read_text().startswith("`python benchmarks/results_page.py --results ")
