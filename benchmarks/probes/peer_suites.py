"""pymc's or numpyro's own tests, run unpatched and patched: which fail only when patched.

    python benchmarks/probes/peer_suites.py --checkout DIR [--library pymc|numpyro|both]
        [-k EXPR] [--timeout SECONDS] [--patch-options JSON] [--what NAME] [--source LABEL]
        [--json FILE] TEST_PATH [TEST_PATH ...]

`DIR` is a folder holding the library's tests as in its repository (pymc: `tests/` and its
`pyproject.toml`, for pytest's settings; numpyro: `test/` and its `pyproject.toml`); the test
paths are relative to it. The tests run twice, each time in a pytest subprocess of its own
started in `DIR`, one after the other: once as they are, once with the library patched
(`pymc_chunkpost.patch(posterior_predictive=True)` for pymc, `pymc_chunkpost.numpyro.patch()`
for numpyro, or what `--patch-options` gives) by this module, loaded as a pytest plugin
(`-p peer_suites`) that patches before pytest imports any conftest or test module. Each run's
outcomes come from pytest's `--junitxml`. The script prints both runs' counts, the tests that
fail only patched (regressions, with their one-line errors) and those that fail only
unpatched, and writes a small JSON record, by default
`benchmarks/results/peer_suites_run<N>_<what>_<python>.json` (N the next free number).

Exit status: 0 when no test fails only patched, 1 when some do, 2 when a run timed out, wrote
no report, ended otherwise than with pytest's 0 or 1 (interrupted, a test path it could not
collect, no tests), or the patched run did not say it was patched.

The library is inferred from the test files when `--library` is not given (pymc when any of
them imports pymc, as pymc's `tests/sampling/test_jax.py` imports both). How to get the
upstream tests and the commands for each suite: docs/peer_suites.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LIBRARIES = ("pymc", "numpyro")
#: What the plugin passes to each library's `patch` unless `--patch-options` says otherwise:
#: pymc's predictive route is off by default, and `sample_posterior_predictive` is what pymc's
#: forward tests exercise.
DEFAULT_PATCH_OPTIONS = {"pymc": {"posterior_predictive": True}, "numpyro": {}}
#: The environment variable through which the script tells the plugin what to patch:
#: JSON, library name to the keyword arguments of its `patch`.
PATCH_ENV = "PYMC_CHUNKPOST_PEER_PATCH"
#: The line the plugin puts in pytest's header; the patched run must print it.
PATCHED_MARK = "pymc_chunkpost peer_suites: patched"
FAILED = ("failed", "error")
#: pytest's exit statuses when it ran the tests it was given: all passed, some failed.
PYTEST_RAN = (0, 1)


# --- The pytest plugin: these hooks run only in the patched subprocess (`-p peer_suites`).


def pytest_load_initial_conftests(early_config, parser, args):
    """Patch before pytest imports the suite's conftest files (pymc's imports pymc) and test
    modules, so that a name a test module binds at import is already the routed one."""
    import importlib

    for library, options in json.loads(os.environ[PATCH_ENV]).items():
        module = importlib.import_module(
            "pymc_chunkpost" if library == "pymc" else f"pymc_chunkpost.{library}"
        )
        module.patch(**options)
        if not module.is_patched():
            raise RuntimeError(f"pymc_chunkpost did not patch {library}")


def pytest_report_header(config):
    """The line that proves, in the run's output, that the plugin ran and what it patched."""
    import pymc_chunkpost

    where = Path(pymc_chunkpost.__file__).parent
    return f"{PATCHED_MARK} {os.environ[PATCH_ENV]} (pymc_chunkpost from {where})"


# --- The script.


def infer_library(checkout: Path, paths: list[str]) -> str:
    """pymc when any test file under `paths` imports pymc, else numpyro when any imports it.

    Raises:
        SystemExit: when no test file imports either.
    """
    files: list[Path] = []
    for path in paths:
        where = checkout / path.split("::")[0]
        files += sorted(where.rglob("test_*.py")) if where.is_dir() else [where]
    imports = set()
    for file in files:
        text = file.read_text() if file.is_file() else ""
        imports |= set(re.findall(r"^\s*(?:import|from) (pymc|numpyro)\b", text, flags=re.M))
    for library in LIBRARIES:
        if library in imports:
            return library
    raise SystemExit(f"no test file under {paths} imports pymc or numpyro; pass --library")


def one_line(message: str) -> str:
    """A failure's message in one line: its first line, and the next one too where the first
    only names the exception (pytest writes `AssertionError:` above a multi-line message)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"[:300]
    return lines[0][:300]


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Each test of a junit XML report, as `classname::name`, and its outcome ("passed",
    "failed", "error" or "skipped", xfail included) with its error's first line. A test with
    a failure and an error (a teardown error after a failure) counts as failed."""
    result: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for kind in ("skipped", "error", "failure"):  # the last found wins: failure first
            element = case.find(kind)
            if element is not None:
                outcome = "failed" if kind == "failure" else kind
                message = one_line(element.get("message") or element.text or "")
                if message == "collection failure":  # the reason is the traceback's last E line
                    reasons = re.findall(r"^E +(.+)$", element.text or "", flags=re.M)
                    message = f"collection failure: {reasons[-1]}"[:300] if reasons else message
        result[test] = (outcome, message)
    return result


def run_pytest(
    checkout: Path,
    paths: list[str],
    *,
    keyword: str | None,
    timeout: float,
    patch: dict | None,
) -> dict:
    """One pytest subprocess in `checkout` (patched as `patch` says, or not), and its tests'
    outcomes. On timeout the whole process group is killed and no outcomes are read."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.xml"
        command = [sys.executable, "-m", "pytest", *paths, f"--junitxml={report}"]
        command += ["--color=no", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
        if keyword:
            command += ["-k", keyword]
        pythonpath = [str(ROOT)] + ([str(HERE)] if patch is not None else [])
        env = {k: v for k, v in os.environ.items() if k != PATCH_ENV}
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        if patch is not None:
            command += ["-p", "peer_suites"]
            env[PATCH_ENV] = json.dumps(patch)
        tic = time.perf_counter()
        proc = subprocess.Popen(
            command,
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, killed whole on timeout
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
        run = {
            "command": " ".join(command[1:]),
            "returncode": proc.returncode,
            "seconds": round(time.perf_counter() - tic, 1),
            "timed_out": timed_out,
            "marked_patched": PATCHED_MARK in output,
            "tests": outcomes(report) if report.exists() and not timed_out else None,
            "output_tail": output[-3000:],
        }
    return run


def counts(tests: dict[str, tuple[str, str]] | None) -> dict[str, int]:
    """How many tests had each outcome."""
    result = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome, _ in (tests or {}).values():
        result[outcome] += 1
    return result


def compare(unpatched: dict, patched: dict) -> dict:
    """The tests that fail only patched, only unpatched, both ways, and those that ran in one
    run only (a parametrisation that depends on the patch)."""
    before, after = unpatched["tests"] or {}, patched["tests"] or {}
    common = sorted(before.keys() & after.keys())

    def failing(tests, test):
        return tests[test][0] in FAILED

    return {
        "patched_only_failures": [
            {"test": t, "error": after[t][1]}
            for t in common
            if failing(after, t) and not failing(before, t)
        ],
        "unpatched_only_failures": [
            {"test": t, "error": before[t][1]}
            for t in common
            if failing(before, t) and not failing(after, t)
        ],
        "failing_both": [
            {"test": t, "error": after[t][1]}
            for t in common
            if failing(before, t) and failing(after, t)
        ],
        "only_unpatched": sorted(before.keys() - after.keys()),
        "only_patched": sorted(after.keys() - before.keys()),
    }


def versions() -> dict[str, str]:
    """The versions this interpreter has of the libraries involved (what the subprocesses
    import), and the commit of this checkout."""
    code = (
        "import importlib.metadata as m, json\n"
        "names = ('pymc', 'numpyro', 'jax', 'pytensor', 'arviz', 'pytest')\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    found = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {"python": platform.python_version(), **found, "pymc_chunkpost_commit": commit}


def stack() -> str:
    """`py311` or `py312`: the results folder's name for this interpreter's stack."""
    return "py" + "".join(platform.python_version_tuple()[:2])


def default_json(what: str) -> Path:
    """`benchmarks/results/peer_suites_run<N>_<what>_<stack>.json`, N one more than the
    highest run of that suite on this stack."""
    pattern = re.compile(rf"peer_suites_run(\d+)_{re.escape(what)}_{stack()}\.json")
    runs = [
        int(m.group(1))
        for p in RESULTS.glob("peer_suites_run*")
        if (m := pattern.fullmatch(p.name))
    ]
    return RESULTS / f"peer_suites_run{max(runs, default=0) + 1}_{what}_{stack()}.json"


def table(record: dict) -> str:
    """The record as markdown: both runs' counts, then the differences."""
    lines = [
        "| run | passed | failed | errors | skipped | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("unpatched", "patched"):
        run = record[name]
        c = run["counts"]
        lines.append(
            f"| {name} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} "
            f"| {run['seconds']} |"
        )
    diff = record["differences"]
    lines += ["", f"Failing only patched ({len(diff['patched_only_failures'])}):"]
    lines += [f"- `{d['test']}`: {d['error']}" for d in diff["patched_only_failures"]]
    lines += ["", f"Failing only unpatched ({len(diff['unpatched_only_failures'])}):"]
    lines += [f"- `{d['test']}`: {d['error']}" for d in diff["unpatched_only_failures"]]
    lines += ["", f"Failing both ways ({len(diff['failing_both'])}):"]
    lines += [f"- `{d['test']}`: {d['error']}" for d in diff["failing_both"]]
    for name in ("only_unpatched", "only_patched"):
        if diff[name]:
            lines.append(f"Ran {name.replace('_', ' ')}: " + ", ".join(diff[name]))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="test files or folders, relative to --checkout")
    parser.add_argument(
        "--checkout", type=Path, required=True, help="the folder holding the library's tests"
    )
    parser.add_argument("--library", choices=[*LIBRARIES, "both"], help="default: inferred")
    parser.add_argument("-k", dest="keyword", help="pytest's -k, passed to both runs")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds for each run (default 3600)"
    )
    parser.add_argument(
        "--patch-options",
        type=json.loads,
        help="JSON keyword arguments of the library's patch, e.g. '{\"chunk_size\": 7}' "
        '(default for pymc: {"posterior_predictive": true}; for numpyro: {})',
    )
    parser.add_argument(
        "--what", help="the suite's name in the record's file name (default: the first path's)"
    )
    parser.add_argument("--source", help="where the tests came from, e.g. pymc-devs/pymc@1ad929c")
    parser.add_argument("--json", type=Path, help="the record (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    args.checkout = args.checkout.resolve()
    if not args.checkout.is_dir():
        parser.error(f"--checkout {args.checkout} is not a folder")
    for path in args.paths:
        if not (args.checkout / path.split("::")[0]).exists():
            parser.error(f"{path} is not in --checkout {args.checkout}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.patch_options is not None and not isinstance(args.patch_options, dict):
        parser.error(f"--patch-options must be a JSON object, got {args.patch_options!r}")
    if args.patch_options is not None and args.library == "both":
        parser.error("--patch-options needs one --library, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs both ways, prints the table, writes the record; returns the exit status."""
    args = parse_args(argv)
    library = args.library or infer_library(args.checkout, args.paths)
    libraries = LIBRARIES if library == "both" else (library,)
    patch = {name: DEFAULT_PATCH_OPTIONS[name] for name in libraries}
    if args.patch_options is not None:
        patch = {library: args.patch_options}
    what = args.what or Path(args.paths[0].split("::")[0]).stem.removeprefix("test_")
    options = {"keyword": args.keyword, "timeout": args.timeout}
    print(f"{library} tests in {args.checkout}: {' '.join(args.paths)}", flush=True)
    unpatched = run_pytest(args.checkout, args.paths, patch=None, **options)
    print(f"unpatched: {counts(unpatched['tests'])} in {unpatched['seconds']} s", flush=True)
    patched = run_pytest(args.checkout, args.paths, patch=patch, **options)
    print(f"patched: {counts(patched['tests'])} in {patched['seconds']} s", flush=True)

    problems = []
    for name, run in (("unpatched", unpatched), ("patched", patched)):
        if run["timed_out"]:
            problems.append(f"the {name} run timed out after {args.timeout} s")
        elif run["tests"] is None:
            problems.append(f"the {name} run wrote no report (exit {run['returncode']})")
        elif run["returncode"] not in PYTEST_RAN:
            problems.append(
                f"the {name} run exited with {run['returncode']}: pytest was interrupted, "
                "misused (a test path it could not collect) or collected nothing"
            )
    if not patched["marked_patched"] and not patched["timed_out"]:
        problems.append("the patched run's output does not say it was patched")

    command = "python benchmarks/probes/peer_suites.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    record = {
        "command": command,
        "header": versions(),
        "library": library,
        "patch": patch,
        "checkout": str(args.checkout),
        "source": args.source,
        "paths": args.paths,
        "keyword": args.keyword,
        "problems": problems,
        "differences": compare(unpatched, patched),
    }
    for name, run in (("unpatched", unpatched), ("patched", patched)):
        kept = {k: v for k, v in run.items() if k not in ("tests", "output_tail")}
        if run["tests"] is None or run["returncode"] not in PYTEST_RAN:
            kept["output_tail"] = run["output_tail"]
        record[name] = {**kept, "counts": counts(run["tests"])}
    record["table"] = table(record)
    print()
    print(record["table"])
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    for name, run in (("unpatched", unpatched), ("patched", patched)):
        if (
            run["tests"] is None
            or run["returncode"] not in PYTEST_RAN
            or (name == "patched" and not run["marked_patched"])
        ):
            print(f"--- the {name} run's last output:\n{run['output_tail']}", file=sys.stderr)
    out = args.json or default_json(what)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    if problems:
        return 2
    return 1 if record["differences"]["patched_only_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
