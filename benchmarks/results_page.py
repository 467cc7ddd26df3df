"""Write docs/results.md from the newest benchmark records in benchmarks/results/.

    python benchmarks/results_page.py                  # writes docs/results.md
    python benchmarks/results_page.py --out -          # prints the page instead
    python benchmarks/results_page.py --results DIR    # reads another folder of records

The page is made of sections, one per benchmark, each a small function of the results folder
that returns its markdown, or None when that benchmark has no record there (the section is
then left out). A benchmark is added with one function and one row of `SECTIONS`; one whose
JSON holds its own `table` (markdown) and `header` needs only `table_section`.

Records are found by name (benchmarks/results/README.md): a stack tag (`_py311`, `_py312`)
and a run number (`run22`) in the file name; the newest of a stack is the one with the
highest run number. The zoo's records carry their stack in the header that bench_zoo.py
writes. The numbers are summarised by each benchmark's own functions (bench_zoo's
`summarise` and `tables`, bench_posthoc's and bench_host_output's `report`), imported from
the scripts beside this one, so the page shows what the benchmark itself would print.
No JAX is imported: the page is rebuilt from the records alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = ROOT / "docs" / "results.md"
#: The lines the zoo is read by: cold `auto` within 1.05x of the best anchor, warm within 1.0x.
LEVEL = {"auto_cold": 1.05, "auto_warm": 1.0}


def _sibling(name: str) -> ModuleType:
    """The benchmark script `name`.py beside this one, imported by path (benchmarks/ is not a
    package); its top level imports the standard library only."""
    module = sys.modules.get(f"_results_page_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"_results_page_{name}", HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------
# Finding records


def _run_number(path: Path) -> int:
    found = re.search(r"run(\d+)", path.name)
    return int(found.group(1)) if found else -1


def _name_stack(path: Path) -> str:
    found = re.search(r"_(py3\d+)", path.name)
    return found.group(1) if found else ""


def by_stack(
    folder: Path, pattern: str, stack_of: Callable[[Path], str] = _name_stack
) -> dict[str, list[Path]]:
    """Files in `folder` whose whole name matches `pattern`, per stack, oldest to newest (by
    run number, then name). Stacks come newest Python first."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*")):
        if path.is_file() and re.fullmatch(pattern, path.name):
            found.setdefault(stack_of(path), []).append(path)
    return {
        stack: sorted(paths, key=lambda p: (_run_number(p), p.name))
        for stack, paths in sorted(found.items(), reverse=True)
    }


def _stack_label(stack: str) -> str:
    return f"Python 3.{stack[3:]}" if stack.startswith("py3") else (stack or "any stack")


# --------------------------------------------------------------------------------------------
# The zoo (bench_zoo.py)

_VERSIONS = re.compile(r"Python (3\.\d+)[\d.]*, jax ([\d.]+), pymc ([\d.]+)")


def load_zoo(path: Path) -> dict:
    """A zoo record as `{"runs", "headers"}`: one bench_zoo.py `--json`, or a dict of them
    keyed by model (one run of the script per model, merged)."""
    data = json.loads(path.read_text())
    parts = [data] if "runs" in data else list(data.values())
    runs = [run for part in parts for run in part["runs"] if run.get("case") != "reference"]
    return {"runs": runs, "headers": [part.get("header", "") for part in parts]}


def _zoo_stack(path: Path) -> str:
    """A zoo record's stack, from the versions in its header (its name may not say)."""
    header = load_zoo(path)["headers"][0]
    found = _VERSIONS.search(header)
    return "py3" + found.group(1).split(".")[1] if found else _name_stack(path)


def _cases(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(run["case"] for run in runs))


def zoo_summary(record: dict) -> list[dict]:
    """bench_zoo's own summary of a record's runs."""
    return _sibling("bench_zoo").summarise(record["runs"], _cases(record["runs"]))


def _versions(record: dict) -> str:
    found = _VERSIONS.search(record["headers"][0])
    if not found:
        return "versions unknown"
    return f"Python {found.group(1)}, jax {found.group(2)}, pymc {found.group(3)}"


def _measured(record: dict) -> str:
    dates = sorted(set(re.findall(r"Measured (\d{4}-\d{2}-\d{2})", " ".join(record["headers"]))))
    return " to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else "date unknown"


def _commands(record: dict) -> list[str]:
    """The commands that made a record, with the models each ran (`--json`, `--out` dropped)."""
    commands: dict[str, list[str]] = {}
    for header in record["headers"]:
        found = re.search(r"with `([^`]*)`", header)
        if not found:
            continue
        command = re.sub(r" --(json|out) \S+", "", found.group(1))
        models = re.search(r" --models (\S+)", command)
        command = re.sub(r" --models \S+", " --models MODELS", command) if models else command
        commands.setdefault(command, []).extend(models.group(1).split(",") if models else [])
    return [
        f"`{command}`" + (f" (MODELS: {', '.join(models)})" if models else "")
        for command, models in commands.items()
    ]


def _first_table(markdown: str) -> str:
    """The summary table that starts bench_zoo's `tables` (the per-model tables follow)."""
    return markdown.split("\n\n", 1)[0]


def _zoo_findings(summary: list[dict]) -> list[str]:
    """What the summary says against the lines the zoo is read by, computed, not written."""
    n = len(summary)
    lines = []
    for case, name in (("auto_cold", "Cold"), ("auto_warm", "Warm")):
        ratios = {r["model"]: r[f"{case}_ratio"] for r in summary if r[f"{case}_ratio"] is not None}
        paired = {
            r["model"]: r[f"{case}_paired"]["median"] for r in summary if r.get(f"{case}_paired")
        }
        if not ratios:
            continue
        level = LEVEL[case]
        over = sorted((m for m, x in ratios.items() if x > level), key=ratios.get, reverse=True)
        text = (
            f"**{name} `auto`: within {level:.2f}x of the best anchor on {n - len(over)} of {n}** "
            f"by the ratio of medians (range {min(ratios.values()):.2f}-"
            f"{max(ratios.values()):.2f}x)"
        )
        if over:
            text += "; over: " + ", ".join(f"{m} {ratios[m]:.2f}" for m in over)
        if paired:
            paired_over = sorted(m for m, x in paired.items() if x > level)
            text += (
                f". Paired (each repeat's `auto` over the best anchor in that repeat): within "
                f"{level:.2f}x on {len(paired) - len(paired_over)} of {len(paired)}"
            )
            if paired_over:
                text += " (over: " + ", ".join(f"{m} {paired[m]:.2f}" for m in paired_over) + ")"
        lines.append(f"- {text}.")
    wrong = [
        f"{r['model']} ({case})"
        for r in summary
        for case, s in r["cases"].items()
        if s["matches_pymc"] is False
    ]
    lines.append(
        "- Outputs: every case's outputs equal pymc's."
        if not wrong
        else "- Outputs that differ from pymc's (left out of the best anchor where an anchor's): "
        + ", ".join(wrong)
        + "."
    )
    return lines


def _zoo_stack_section(path: Path) -> list[str]:
    """One stack's part of a zoo section: versions, record, commands, bench_zoo's summary
    table and its findings."""
    record = load_zoo(path)
    summary = zoo_summary(record)
    return [
        "",
        f"### {_versions(record)}",
        "",
        f"`benchmarks/results/{path.name}`, measured {_measured(record)}. Made by:",
        "",
        *[f"- {command}" for command in _commands(record)],
        "",
        _first_table(_sibling("bench_zoo").tables(summary)),
        "",
        *_zoo_findings(summary),
    ]


def zoo_section(folder: Path) -> str | None:
    """The newest whole-zoo run on each stack: bench_zoo's summary table, and its findings."""
    stacks = by_stack(folder, r"zoo_run\d+_accept_py3\d+\.json", _zoo_stack)
    if not stacks:
        return None
    out = [
        "## The zoo: cold and warm `auto` against the best anchor",
        "",
        "Each model of the zoo ([zoo.md](zoo.md)) at 4 chains x 1000 draws, every case in a fresh "
        "process, round-robin. Cold `auto` starts from empty caches; warm `auto` reuses the "
        "folder the cold run left (it loads the executable the cold run stored). The best "
        "anchor is the fastest of pymc's vmap and the `jax.lax.map` batches that ran whose "
        'outputs equal pymc\'s. Ratios are of medians; "paired" is the median (min-max) over '
        "repeats of `auto`'s time over the best anchor's in the same repeat. Peak / floor: the "
        "process's peak extra memory (`VmHWM`) over the bytes of the outputs that do not pass "
        "an input through.",
    ]
    for paths in stacks.values():
        out += _zoo_stack_section(paths[-1])
    return "\n".join(out)


def _spread(stats: dict | None) -> str:
    if not stats or stats.get("median_s") is None:
        return "–"
    return f"{stats['median_s']:.3f} ({stats['min_s']:.3f}-{stats['max_s']:.3f})"


def zoo_change_section(folder: Path) -> str | None:
    """Each stack's newest whole-zoo run against the one before it: did any model slow down by
    more than its spread?"""
    stacks = by_stack(folder, r"zoo_run\d+_accept_py3\d+\.json", _zoo_stack)
    stacks = {stack: paths for stack, paths in stacks.items() if len(paths) >= 2}
    if not stacks:
        return None
    out = [
        "## The zoo: the newest run against the one before",
        "",
        "Cold `auto` per model in the two newest whole-zoo runs of each stack. **Slower** marks "
        "a model whose fastest cold run now is slower than its slowest cold run before (the two "
        "spreads do not overlap); the ratio to the best anchor of the same run is beside it, as "
        "the machine's speed moves between runs.",
    ]
    for stack, paths in stacks.items():
        before, after = (zoo_summary(load_zoo(p)) for p in paths[-2:])
        old = {row["model"]: row for row in before}
        out += [
            "",
            f"### {_stack_label(stack)}: `{paths[-2].name}` -> `{paths[-1].name}`",
            "",
            "| model | cold `auto` s before | cold `auto` s after | after / before "
            "| cold / best before | cold / best after | |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for row in after:
            prior = old.get(row["model"])
            now = row["cases"].get("auto_cold")
            then = prior["cases"].get("auto_cold") if prior else None
            ratio, flag = "–", ""
            if now and then and now["median_s"] and then["median_s"]:
                ratio = f"{now['median_s'] / then['median_s']:.2f}"
                flag = "**slower**" if now["min_s"] > then["max_s"] else ""
            cold_before = prior["auto_cold_ratio"] if prior else None
            out.append(
                f"| {row['model']} | {_spread(then)} | {_spread(now)} | {ratio} | "
                f"{_ratio(cold_before)} | {_ratio(row['auto_cold_ratio'])} | {flag} |"
            )
    return "\n".join(out)


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def zoo_devices_section(folder: Path) -> str | None:
    """The newest whole-zoo run on 4 CPU devices (the draws as pymc's parallel chains leave
    them) on each stack."""
    stacks = by_stack(folder, r"zoo_devices4_run\d+(_py3\d+)?\.json", _zoo_stack)
    if not stacks:
        return None
    out = [
        "## The zoo on 4 devices",
        "",
        "The draws split over 4 CPU devices on the chain axis, as pymc's parallel chains leave "
        "them, in a JAX with 4 CPU devices; cold `auto` against pymc's vmap (and any other "
        "anchor that ran). Peak / floor is the process's: the 4 devices share one RAM.",
    ]
    for paths in stacks.values():
        out += _zoo_stack_section(paths[-1])
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Where a cold call's time goes (cold_call.py)


def _ms(runs: list[dict], key: str) -> float:
    """The median of `key` over `runs`, in ms (0 where a run lacks the step)."""
    return 1e3 * statistics.median(r.get(key, 0.0) for r in runs)


def cold_call_section(folder: Path) -> str | None:
    """cold_call.py: where a cold call's time goes outside XLA's compile, `auto` against
    pymc's vmap, the newest record per stack."""
    stacks = by_stack(folder, r".*cold_call.*\.json")
    if not stacks:
        return None
    out = [
        "## What `auto` adds to a cold call",
        "",
        "`benchmarks/cold_call.py`: each round runs `auto` and pymc's vmap, each in a fresh "
        "process with an empty cache folder, and times the call and the steps inside it. "
        "Medians over rounds, in ms; the last column pairs the two cases of each round and "
        "gives the median (min to max) of `auto` less pymc's vmap, outside XLA's compile.",
        "",
        "| stack | model | rounds | `auto` total | pymc vmap total | XLA compile, `auto` / pymc "
        "| outside the compile, `auto` - pymc |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    steps = []
    for stack, paths in stacks.items():
        data = json.loads(paths[-1].read_text())
        auto, pymc = data["runs"]["auto"], data["runs"]["pymc_vmap"]
        diffs = sorted(1e3 * (a["nonxla"] - b["nonxla"]) for a, b in zip(auto, pymc))
        out.append(
            f"| {_stack_label(stack)} (`{paths[-1].name}`) | {data['model']} | {len(auto)} | "
            f"{_ms(auto, 'total'):.1f} | {_ms(pymc, 'total'):.1f} | "
            f"{_ms(auto, 'xla_compile'):.1f} / {_ms(pymc, 'xla_compile'):.1f} | "
            f"{statistics.median(diffs):+.1f} ({diffs[0]:+.1f} to {diffs[-1]:+.1f}) |"
        )
        names = sorted({k for r in auto for k in r} - {"total", "nonxla", "xla_compile"})
        steps.append(
            f"- {_stack_label(stack)}: " + ", ".join(f"{k} {_ms(auto, k):.1f}" for k in names)
        )
    out += ["", "`auto`'s steps, medians in ms:", "", *steps]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Benchmarks with one table per run: JSON where the script wrote it, else a recorded table


def _recorded(folder: Path, prefix: str) -> dict[str, Path]:
    """The newest record per stack whose name starts with `prefix`: JSON before markdown."""
    newest = {}
    for stack, paths in by_stack(folder, re.escape(prefix) + r".*\.(json|md)").items():
        best = max(paths, key=lambda p: (_run_number(p), p.suffix == ".json", p.name))
        newest[stack] = best
    return newest


def _recorded_markdown(path: Path) -> str:
    return (
        f"Recorded before the script wrote JSON (`benchmarks/results/{path.name}`):\n\n"
        + path.read_text().strip()
    )


def posthoc_section(folder: Path) -> str | None:
    """bench_posthoc.py: `compute_log_likelihood` against pymc's own, per stack."""
    records = _recorded(folder, "bench_posthoc")
    if not records:
        return None
    out = [
        "## After sampling: `compute_log_likelihood` against pymc's own",
        "",
        "`benchmarks/bench_posthoc.py` ([posthoc.md](posthoc.md)): a 4 x 1000-draw posterior of a "
        "2,000-row hierarchical model (`hier_2k`), eight schools, and the 30,000-row model "
        "(`hier_30k`, 0.9 GiB of log-likelihood); `pymc_jax` is pymc's own with the JAX backend, "
        "`pymc_default` with its default backend.",
    ]
    for stack, path in records.items():
        out += ["", f"### {_stack_label(stack)}", ""]
        if path.suffix == ".md":
            out.append(_recorded_markdown(path))
            continue
        data = json.loads(path.read_text())
        table = _sibling("bench_posthoc").report(
            data["runs"], data["cases"], data["methods"], data["fresh"]
        )
        out += [
            f"`{data['command']}`, {data['date']}, Python {data['python']} "
            f"(`benchmarks/results/{path.name}`):",
            "",
            table.strip(),
        ]
    return "\n".join(out)


def host_output_section(folder: Path) -> str | None:
    """bench_host_output.py: outputs in device memory, then numpy, against `stream_to_host`."""
    records = _recorded(folder, "bench_host_output")
    if not records:
        return None
    out = [
        "## Outputs in host memory",
        "",
        "`benchmarks/bench_host_output.py` ([host_output.md](host_output.md)): big_det with a "
        "30,000-point deterministic at 4 x 1000 draws (916 MiB of outputs), each case in fresh "
        "processes: the outputs computed on the device then read as numpy, against each "
        "`Transfer` of `stream_to_host`.",
    ]
    for stack, path in records.items():
        out += ["", f"### {_stack_label(stack)}", ""]
        if path.suffix == ".md":
            out.append(_recorded_markdown(path))
            continue
        data = json.loads(path.read_text())
        table = _sibling("bench_host_output").report(
            data["rows"], data["chunk_size"], data["repeat"]
        )
        out += [
            f"`{data['command']}`, {data['date']}, Python {data['python']} "
            f"(`benchmarks/results/{path.name}`):",
            "",
            table.strip(),
        ]
    return "\n".join(out)


def table_section(prefix: str, title: str) -> Callable[[Path], str | None]:
    """A section for a benchmark whose JSON carries its own markdown: `header` (optional) and
    `table`. The newest record per stack whose name starts with `prefix`."""

    def section(folder: Path) -> str | None:
        stacks = by_stack(folder, re.escape(prefix) + r".*\.json")
        if not stacks:
            return None
        out = [f"## {title}"]
        for stack, paths in stacks.items():
            data = json.loads(paths[-1].read_text())
            if not isinstance(data, dict) or not isinstance(data.get("table"), str):
                raise ValueError(
                    f"{paths[-1]} holds no `table` (markdown) for the results page: write one "
                    f"in the benchmark's JSON, or give {prefix!r} a section function in "
                    "benchmarks/results_page.py."
                )
            out += ["", f"### {_stack_label(stack)}", "", f"`benchmarks/results/{paths[-1].name}`"]
            if data.get("header"):
                out += ["", data["header"].strip()]
            out += ["", data["table"].strip()]
        return "\n".join(out)

    return section


def sample_route_tpu_section(folder: Path) -> str | None:
    """`bench_sample_route.py --models huge_det` on a TPU (`accelerator_check.py --sections
    huge_sample`): a patched `pm.sample` whose `Deterministic` is larger than the chip."""
    stacks = by_stack(folder, r"sample_route_tpu_run\d+.*\.json")
    if not stacks:
        return None
    out = ["## pm.sample with a Deterministic larger than the chip: TPU v5e"]
    for stack, paths in stacks.items():
        data = json.loads(paths[-1].read_text())
        out += ["", f"### {_stack_label(stack)}", "", f"`benchmarks/results/{paths[-1].name}`"]
        versions = data["header"].split(":")[0]
        out += [
            "",
            f'{versions}: a patched `pm.sample(nuts_sampler="numpyro", chains=4)`, '
            f"{data['draws']} draws, the four chains vectorized on the one chip, in a fresh "
            "process. The peak is the process's resident set above its size when `pm.sample` "
            "began; values: the `Deterministic` against NumPy's `X @ beta` on three draws.",
            "",
            "| model | case | Deterministic | post-processing | pm.sample | peak RSS above the "
            "start | allowed (1.10 x outputs + 1 GiB) | values (largest rel. diff.) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for model, cases in data["results"].items():
            for case, runs in cases.items():
                for r in runs:
                    above = r["peak_rss_bytes"] - r["rss_start_bytes"]
                    allowed = 1.10 * r["big_bytes"] + 2**30
                    out.append(
                        f"| {model} | {case} | {r['big_bytes'] / 2**30:.2f} GiB | "
                        f"{r['postprocess_seconds']:.2f} s | {r['sample_seconds']:.1f} s | "
                        f"{above / 2**30:.2f} GiB ({r['peak_method']}) | "
                        f"{allowed / 2**30:.2f} GiB | {r['largest_relative_difference']:.1e} |"
                    )
    return "\n".join(out)


#: The page's sections, in order. Each returns its markdown, or None to be left out.
SECTIONS: list[Callable[[Path], str | None]] = [
    zoo_section,
    zoo_change_section,
    zoo_devices_section,
    cold_call_section,
    posthoc_section,
    host_output_section,
    table_section("bench_predictive", "Posterior predictive"),
    table_section("bench_loo", "PSIS-LOO"),
    table_section("loo_logistic_run", "PSIS-LOO of a logistic regression (parameter checks)"),
    table_section("bench_numpyro", "NumPyro models"),
    table_section("bench_sample_route", "pm.sample's own route, run again (parallel chains)"),
    table_section(
        "predictive_sweep",
        "The predictive route's plans: auto against each fixed plan (the last three models "
        "never tuned on)",
    ),
    table_section("host_budget_cpu", "Outputs in host memory within a host budget: CPU"),
    table_section("host_budget_tpu", "Outputs in host memory within a host budget: TPU v5e"),
    sample_route_tpu_section,
    table_section("accelerator_check_tpu", "The routes on a TPU v5e: compiles, cold and warm"),
]


def page(folder: Path, command: str) -> str:
    """The whole page: the command that wrote it, then every section that has a record."""
    sections = [text for text in (section(folder) for section in SECTIONS) if text]
    head = [
        f"`{command}` wrote this page from the newest records in `benchmarks/results/`; "
        "rerun it after adding a record, and do not edit the page by hand.",
        "",
        "# Results",
        "",
        "Measured on 2 CPU cores (the machines the project runs on), each case in a fresh "
        "process. Timings from different runs and machines are compared as ratios within one "
        "run. How to read the zoo: [zoo.md](zoo.md); why each rule of `auto` is what it is: "
        "[strategies.md](strategies.md); what was tried and dropped: [decisions.md](decisions.md).",
    ]
    return "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=None, help="the records' folder (benchmarks/results)")
    parser.add_argument("--out", default=None, help="the page (docs/results.md); '-' prints it")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join(["python benchmarks/results_page.py", *argv])
    folder = Path(args.results) if args.results else RESULTS
    if not folder.is_dir():
        parser.error(f"--results {folder}: not a folder")
    text = page(folder, command)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out or PAGE).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
