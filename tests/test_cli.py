"""The `pymc-chunkpost` command: listing, argument errors, and small real profiles."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from pymc_chunkpost.cli import DEMO_MODULES, PROFILE_MODULES, main
from pymc_chunkpost.profiling.fixtures import FIXTURES, raw_draws


def _rows(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and ":" in cells[0] and cells[0].split(":")[0] in ("ours", "pymc"):
            rows[cells[0]] = cells
    return rows


def test_list_names_every_fixture(capsys):
    assert main(["profile", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line]
    assert listed == list(FIXTURES)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profile", "--fixture", "nope", "--out", "x"], "unknown fixture 'nope'"),
        (["profile", "--fixture", "wide"], "pass --out DIR"),
        (["profile", "--out", "x"], "pass --fixture NAME"),
        (["profile", "--fixture", "wide", "--strategies", "vmapp", "--out", "x"], "'vmapp'"),
        (["profile", "--fixture", "wide", "--baselines", "chunked", "--out", "x"], "baseline"),
        (["profile", "--fixture", "wide", "--draws", "0", "--out", "x"], "positive int"),
        (["profile", "--fixture", "wide", "--model", "m.p", "--out", "x"], "not allowed"),
        (["profile", "--model", "missing.p", "--out", "x"], "does not exist"),
        (["profile", "--model", "m.txt", "--out", "x"], "Cannot load a model"),
        (["demo", "--fixture", "nope"], "unknown fixture"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # the profiling harness: a fresh process per case
def test_profile_writes_report_with_equal_rows(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["profile", "--fixture", "eight_schools", "--chains", "2", "--draws", "10"]
    argv += ["--strategies", "chunked,auto", "--baselines", "vmap", "--out", str(out)]
    assert main(argv) == 0
    report = (out / "report.md").read_text()
    rows = _rows(report)
    assert set(rows) == {"pymc:vmap", "ours:chunked", "ours:auto"}
    assert all(cells[-1] == "yes" for cells in rows.values())
    assert all(float(cells[2].rstrip("x")) >= 1.0 for cells in rows.values())  # x floor
    assert "memray" in report and "2 chains x 10 draws" in report
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for case in rows:
        result = json.loads((out / "runs" / f"{case.replace(':', '_')}.json").read_text())
        assert result["equal"] is True and result["peak_bytes"] > 0
    assert _rows(capsys.readouterr().out) == rows


@pytest.mark.slow  # the profiling harness: a fresh process per case
def test_profile_user_model_with_draws_npz(tmp_path):
    source = tmp_path / "user_model.py"
    source.write_text(
        "import pymc as pm\n"
        "def build():\n"
        "    with pm.Model() as m:\n"
        "        s = pm.HalfNormal('s', 1.0, shape=3)\n"
        "        pm.Deterministic('total', s.sum())\n"
        "    return m\n"
    )
    from pymc_chunkpost.profiling.fixtures import load_model

    model = load_model(f"{source}:build")
    np.savez(tmp_path / "raw.npz", s_log__=raw_draws(model, 3, 7, seed=0)[0])
    out = tmp_path / "out"
    argv = ["profile", "--model", f"{source}:build", "--draws-npz", str(tmp_path / "raw.npz")]
    argv += ["--strategies", "auto", "--baselines", "", "--out", str(out)]
    assert main(argv) == 0
    report = (out / "report.md").read_text()
    assert _rows(report)["ours:auto"][-1] == "yes"
    assert "3 chains x 7 draws" in report


@pytest.mark.slow  # samples with numpyro, then a fresh process per case
def test_demo_samples_and_compares(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--fixture", "eight_schools", "--chains", "2", "--draws", "20"]
    argv += ["--tune", "20", "--out", str(out)]
    assert main(argv) == 0
    model = FIXTURES["eight_schools"].build()
    with np.load(out / "raw_draws.npz") as data:
        assert sorted(data) == sorted(v.name for v in model.value_vars)
        assert all(data[k].shape[:2] == (2, 20) for k in data)
        assert len({float(data[k][0, 0, ...].sum()) for k in data}) > 1  # real draws
    rows = _rows((out / "report.md").read_text())
    assert set(rows) == {"pymc:vmap", "ours:auto"}
    assert all(cells[-1] == "yes" for cells in rows.values())


@pytest.mark.parametrize(
    "command, missing",
    [("demo", name) for name in DEMO_MODULES] + [("profile", name) for name in PROFILE_MODULES],
)
def test_a_missing_extra_is_one_line_before_any_work(
    command, missing, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` fails, as if not installed
    out = tmp_path / "out"
    assert main([command, "--fixture", "eight_schools", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"pymc-chunkpost: {missing} is not installed; install it with: "
        'pip install "pymc-chunkpost[profile]"'
    ]
    assert "Traceback" not in captured.out
    assert not out.exists()  # nothing was sampled or profiled


def test_list_needs_no_extra(monkeypatch, capsys):
    for name in DEMO_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["profile", "--list"]) == 0
    assert "eight_schools" in capsys.readouterr().out


def test_version(capsys):
    import pymc_chunkpost

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.split() == ["pymc-chunkpost", pymc_chunkpost.__version__]


@pytest.mark.slow  # the profiling harness: a fresh process per case
def test_profile_fails_when_a_case_crashed(tmp_path, capsys):
    # The builder loads in this process (which checks the model) and crashes in the child.
    source = tmp_path / "crash_model.py"
    source.write_text(
        "import sys\n"
        "import pymc as pm\n"
        "def build():\n"
        "    if '--case' in sys.argv:\n"
        "        raise RuntimeError('boom in the child')\n"
        "    with pm.Model() as m:\n"
        "        pm.Normal('x', 0.0, 1.0)\n"
        "    return m\n"
    )
    out = tmp_path / "out"
    argv = ["profile", "--model", f"{source}:build", "--chains", "1", "--draws", "3"]
    argv += ["--strategies", "auto", "--baselines", "", "--out", str(out)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "ours:auto failed:" in captured.err
    assert "RuntimeError: boom in the child" in captured.err
    assert "1 of 1 cases failed: ours:auto" in captured.err
    assert _rows(captured.out)["ours:auto"][1] == "**failed** (see below)"
    report = (out / "report.md").read_text()
    assert "## Failures" in report and "RuntimeError: boom in the child" in report
