"""`benchmarks/probes/peer_suites.py`: its reading of pytest's reports, and (slow) a fake peer suite
run both ways, in which exactly one test fails only patched."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import run_script

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "probes"))
import peer_suites  # noqa: E402

# Each library's routed name, and the file its own definition lives in: the fake suite tells
# the patched run from the unpatched one by where the function's code comes from.
OWN = {
    "pymc": ("pymc.sample_posterior_predictive", "pymc/sampling/forward.py"),
    "numpyro": ("numpyro.infer.Predictive.__call__", "numpyro/infer/util.py"),
}


def fake_suite(library: str) -> str:
    """Four tests: one passes both ways, one fails only patched, one only unpatched, one
    both ways."""
    name, own_file = OWN[library]
    return textwrap.dedent(
        f"""
        import {library}


        def own():
            return {name}.__code__.co_filename.endswith("{own_file}")


        def test_passes_both_ways():
            assert 1 + 1 == 2


        def test_fails_patched():
            assert own(), "routed"


        def test_fails_unpatched():
            assert not own(), "own"


        def test_fails_both_ways():
            raise ValueError("always")
        """
    )


@pytest.mark.slow  # two pytest processes that import pymc or numpyro
@pytest.mark.parametrize("library", ["pymc", "numpyro"])
def test_a_fake_suite_reports_exactly_its_patched_only_failure(tmp_path, library):
    (tmp_path / "test_fake.py").write_text(fake_suite(library))
    record_path = tmp_path / "record.json"
    argv = ["--checkout", tmp_path, "--json", record_path, "--timeout", 300, "test_fake.py"]
    proc = run_script("benchmarks/probes/peer_suites.py", *argv, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(record_path.read_text())
    assert record["library"] == library  # inferred from the import
    assert record["problems"] == [] and record["patched"]["marked_patched"]
    diff = record["differences"]
    assert [d["test"] for d in diff["patched_only_failures"]] == ["test_fake::test_fails_patched"]
    assert "AssertionError: routed" in diff["patched_only_failures"][0]["error"]
    assert [d["test"] for d in diff["unpatched_only_failures"]] == [
        "test_fake::test_fails_unpatched"
    ]
    assert diff["failing_both"] == [
        {"test": "test_fake::test_fails_both_ways", "error": "ValueError: always"}
    ]
    assert diff["only_patched"] == diff["only_unpatched"] == []
    for run in ("unpatched", "patched"):
        assert record[run]["counts"] == {"passed": 2, "failed": 2, "error": 0, "skipped": 0}
    assert "Failing only patched (1):\n- `test_fake::test_fails_patched`: " in proc.stdout


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="2" tests="6">
<testcase classname="test.a.TestX" name="test_ok[1]" time="0.1"/>
<testcase classname="test.a.TestX" name="test_bad" time="0.1">
  <failure message="AssertionError: assert 1 == 2&#10;second line">traceback</failure>
</testcase>
<testcase classname="test.a" name="test_teardown" time="0.1">
  <failure message="ValueError: first">traceback</failure>
  <error message="failed on teardown with &quot;RuntimeError&quot;">traceback</error>
</testcase>
<testcase classname="" name="test.b" time="0.0">
  <error message="collection failure">test/b.py:15: in &lt;module&gt;
    from numpyro.contrib.funsor import config_kl
E   ModuleNotFoundError: No module named 'funsor'</error>
</testcase>
<testcase classname="test.a" name="test_skip" time="0.0">
  <skipped type="pytest.skip" message="no funsor">skip</skipped>
</testcase>
<testcase classname="test.a" name="test_xfail" time="0.0">
  <skipped type="pytest.xfail" message="known" />
</testcase>
</testsuite></testsuites>
"""


def test_a_report_gives_each_test_its_outcome_and_first_error_line(tmp_path):
    (tmp_path / "report.xml").write_text(REPORT)
    tests = peer_suites.outcomes(tmp_path / "report.xml")
    assert tests == {
        "test.a.TestX::test_ok[1]": ("passed", ""),
        "test.a.TestX::test_bad": ("failed", "AssertionError: assert 1 == 2"),
        "test.a::test_teardown": ("failed", "ValueError: first"),
        "::test.b": ("error", "collection failure: ModuleNotFoundError: No module named 'funsor'"),
        "test.a::test_skip": ("skipped", "no funsor"),
        "test.a::test_xfail": ("skipped", "known"),
    }
    assert peer_suites.counts(tests) == {"passed": 1, "failed": 2, "error": 1, "skipped": 2}


def test_a_message_that_only_names_its_exception_keeps_its_next_line():
    assert peer_suites.one_line("AssertionError: \n  assert not True\n  more") == (
        "AssertionError: assert not True"
    )
    assert peer_suites.one_line("ValueError: x\ny") == "ValueError: x"
    assert peer_suites.one_line("") == ""


def test_differences_count_errors_as_failures_and_name_tests_of_one_run():
    unpatched = {"tests": {"a": ("passed", ""), "b": ("error", "e"), "c": ("failed", "x")}}
    patched = {"tests": {"a": ("error", "boom"), "b": ("passed", ""), "d": ("passed", "")}}
    diff = peer_suites.compare(unpatched, patched)
    assert diff == {
        "patched_only_failures": [{"test": "a", "error": "boom"}],
        "unpatched_only_failures": [{"test": "b", "error": "e"}],
        "failing_both": [],
        "only_unpatched": ["c"],
        "only_patched": ["d"],
    }


def test_the_library_is_read_from_the_imports(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_n.py").write_text("import numpy as np\nimport numpyro\n")
    (tmp_path / "test_both.py").write_text("from numpyro import infer\nimport pymc as pm\n")
    assert peer_suites.infer_library(tmp_path, ["test"]) == "numpyro"
    assert peer_suites.infer_library(tmp_path, ["test", "test_both.py::test_x"]) == "pymc"
    with pytest.raises(SystemExit, match="pass --library"):
        peer_suites.infer_library(tmp_path / "test", [])


def test_bad_arguments_are_refused(tmp_path):
    for argv in (
        ["--checkout", str(tmp_path / "none"), "t.py"],
        ["--checkout", str(tmp_path), "missing.py"],
        ["--checkout", str(tmp_path), "--timeout", "0", "."],
        ["--checkout", str(tmp_path), "--patch-options", "[1]", "."],
    ):
        with pytest.raises(SystemExit):
            peer_suites.parse_args(argv)


@pytest.mark.slow  # two pytest processes, the patched one imports numpyro
def test_a_test_path_pytest_cannot_collect_is_a_problem_not_a_clean_run(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_one():\n    pass\n")
    argv = ["--checkout", tmp_path, "--library", "numpyro", "--json", tmp_path / "r.json"]
    script = "benchmarks/probes/peer_suites.py"
    proc = run_script(script, *argv, "test_plain.py::test_none", timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((tmp_path / "r.json").read_text())
    assert [p.split(":")[0] for p in record["problems"]] == [
        "the unpatched run exited with 4",
        "the patched run exited with 4",
    ]
