"""The `pymc-chunkpost` command: `profile` strategies in fresh processes, or run a `demo`.

pymc-chunkpost profile --list
pymc-chunkpost profile --fixture wide --out results/
pymc-chunkpost profile --fixture gp --draws 200 --strategies auto,chunked --out results/
pymc-chunkpost profile --model my_model.py:build --chains 4 --draws 1000 --out results/
pymc-chunkpost profile --model model_pm.p --draws-npz raw.npz --out results/
pymc-chunkpost demo
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._support.extras import MissingExtraError, require
from ._support.version import __version__

if TYPE_CHECKING:
    from .profiling.harness import CaseResult

__all__ = ["main"]

DEMO_FIXTURE = "demo_basis_grid"
#: What `profile` imports beyond the library's own dependencies (the `profile` extra).
PROFILE_MODULES = ("memray", "matplotlib")
#: What `demo` imports: `profile`'s, and numpyro to sample.
DEMO_MODULES = (*PROFILE_MODULES, "numpyro")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="pymc-chunkpost",
        description="Profile and demonstrate memory-bounded post-processing of PyMC JAX draws.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    profile = commands.add_parser(
        "profile",
        help="measure every strategy, each in a fresh process under memray",
        description="Run pymc's baselines and our strategies on one model, each in a fresh "
        "process under memray, and write DIR/report.md and DIR/report.png.",
    )
    profile.add_argument("--list", action="store_true", help="list the fixtures and exit")
    source = profile.add_mutually_exclusive_group()
    source.add_argument("--fixture", help="a bundled model (see --list)")
    source.add_argument("--model", help="FILE.py:builder, or a cloudpickled pm.Model (model.p)")
    profile.add_argument("--draws-npz", help="raw draws (.npz keyed by value variable name)")
    profile.add_argument("--chains", type=_positive_int, help="chains (default: the fixture's)")
    profile.add_argument("--draws", type=_positive_int, help="draws (default: the fixture's)")
    profile.add_argument("--seed", type=int, default=0, help="seed of the raw draws")
    profile.add_argument(
        "--strategies", type=_names, default=None, help="ours, comma-separated (default: all)"
    )
    profile.add_argument(
        "--baselines",
        type=_names,
        default=None,
        help="pymc's, comma-separated from vmap,scan (default: both; '' for none)",
    )
    profile.add_argument("--out", help="directory for report.md, report.png and captures")
    profile.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per run (default 900)"
    )

    demo = commands.add_parser(
        "demo",
        help="sample a bundled model with numpyro, then compare pymc's post-processing and ours",
        description="Sample a bundled model with numpyro (through pymc), save the raw draws, "
        "then post-process them with pymc's default ('vmap') and ours ('auto'), each in a "
        "fresh process under memray. The default model's fit on a fine grid makes pymc's "
        "default hold many times the outputs' bytes; ours stays near them.",
    )
    demo.add_argument("--fixture", default=DEMO_FIXTURE, help=f"default {DEMO_FIXTURE}")
    demo.add_argument("--chains", type=_positive_int, help="default: the fixture's")
    demo.add_argument("--draws", type=_positive_int, help="default: the fixture's")
    demo.add_argument("--tune", type=_positive_int, default=300, help="default 300")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", help="directory for the draws and report (default: a temp dir)")
    return parser, {"profile": profile, "demo": demo}


def _list_fixtures() -> int:
    from pymc_chunkpost.profiling.fixtures import FIXTURES

    width = max(map(len, FIXTURES))
    for name, fixture in FIXTURES.items():
        print(f"{name:<{width}}  {fixture.chains} x {fixture.draws}  {fixture.description}")
    return 0


def _run_cases(
    model_spec: str, cases: Sequence[str], out_dir: str | Path, **kwargs: Any
) -> list[CaseResult]:
    from tqdm.auto import tqdm

    from pymc_chunkpost.profiling.harness import run_case

    results = []
    with tqdm(cases, desc="profiling", unit="run") as bar:
        for case in bar:
            bar.set_postfix_str(case)
            results.append(run_case(model_spec, case, Path(out_dir) / "runs", **kwargs))
    return results


def _profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.list:
        return _list_fixtures()
    for module in PROFILE_MODULES:  # before any work
        require(module)
    from pymc_chunkpost import STRATEGIES
    from pymc_chunkpost.profiling.fixtures import FIXTURES, load_draws, load_model
    from pymc_chunkpost.profiling.harness import BASELINES, case_names

    if args.fixture is None and args.model is None:
        parser.error("pass --fixture NAME (see --list) or --model FILE.py:builder|model.p")
    if args.fixture is not None and args.fixture not in FIXTURES:
        parser.error(f"unknown fixture {args.fixture!r}; choose from {', '.join(FIXTURES)}")
    if args.out is None:
        parser.error("pass --out DIR for the report")
    strategies = list(STRATEGIES) if args.strategies is None else args.strategies
    baselines = list(BASELINES) if args.baselines is None else args.baselines
    for name in strategies:
        if name not in STRATEGIES:
            parser.error(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    for name in baselines:
        if name not in BASELINES:
            parser.error(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    if not strategies and not baselines:
        parser.error("nothing to run: pass at least one strategy or baseline")
    spec = args.fixture or args.model
    chains, draws = args.chains, args.draws
    if args.draws_npz is not None:
        if chains is not None or draws is not None:
            parser.error("--chains/--draws come from --draws-npz; pass one or the other")
    elif args.model is not None:
        chains, draws = chains or 4, draws or 1000
    try:  # fail fast, in this process, on a model or draws file that cannot load
        model = load_model(spec)
        if args.draws_npz is not None:
            shape = load_draws(model, args.draws_npz)[0].shape[:2]
            chains_text, draws_text = shape
        elif args.model is not None:  # set above
            chains_text, draws_text = chains, draws
        else:
            chains_text = chains or FIXTURES[spec].chains
            draws_text = draws or FIXTURES[spec].draws
    except ValueError as error:
        parser.error(str(error))
    del model

    results = _run_cases(
        spec,
        case_names(strategies, baselines),
        args.out,
        chains=chains,
        draws=draws,
        seed=args.seed,
        draws_npz=args.draws_npz,
        timeout=args.timeout,
    )
    return _finish(
        results,
        args.out,
        f"Post-processing {spec}, {chains_text} chains x {draws_text} draws",
        args.command_line,
    )


def _finish(results: Sequence[CaseResult], out_dir: str | Path, title: str, command: str) -> int:
    """Write and print the report; 1 if any case failed or differs from pymc's, else 0."""
    from pymc_chunkpost.profiling.report import HOW_MEASURED, failures, table, write_report

    path = write_report(results, out_dir, title, command)
    print(f"\n{title} (measured with memray, each row a fresh process)\n")
    print(table(results))
    print(f"\n{HOW_MEASURED}\n\nWrote {path} and {path.with_suffix('.png')}")
    status = 0
    failed = [r.case for r in results if not r.ok]
    if failed:
        print(f"\n{failures(results)}", file=sys.stderr)
        print(f"{len(failed)} of {len(results)} cases failed: {', '.join(failed)}", file=sys.stderr)
        status = 1
    wrong = [r.case for r in results if r.equal is False]
    if wrong:
        print(f"Results differ from pymc's for: {', '.join(wrong)}", file=sys.stderr)
        status = 1
    return status


def _sample(fixture_name: str, chains: int, draws: int, tune: int, seed: int, path: Path) -> None:
    """Sample with numpyro the way `pymc.sampling.jax.sample_jax_nuts` does; save raw draws."""
    import numpy as np

    from pymc_chunkpost.profiling.fixtures import FIXTURES, sample_raw_draws

    model = FIXTURES[fixture_name].build()
    raw = sample_raw_draws(model, chains, draws, tune, seed)
    arrays: dict[str, Any] = {v.name: np.asarray(x) for v, x in zip(model.value_vars, raw)}
    np.savez(path, **arrays)


def _summary(results: Sequence[CaseResult]) -> str:
    """One line per successful case: its peak, and how many times the outputs' bytes."""
    lines = []
    for r in results:
        if r.ok and r.peak_bytes is not None and r.output_bytes:
            floor = r.output_bytes / 2**20
            lines.append(
                f"  {r.case:<10} {r.peak_bytes / 2**20:8,.1f} MiB, "
                f"{r.peak_bytes / r.output_bytes:5.2f} x the outputs' {floor:,.1f} MiB"
            )
    return "\n".join(lines)


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    for module in DEMO_MODULES:  # before any work
        require(module)
    from pymc_chunkpost.profiling.fixtures import FIXTURES

    if args.fixture not in FIXTURES:
        parser.error(f"unknown fixture {args.fixture!r}; choose from {', '.join(FIXTURES)}")
    fixture = FIXTURES[args.fixture]
    chains = args.chains or fixture.chains
    draws = args.draws or fixture.draws
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="pymc-chunkpost-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    draws_path = out / "raw_draws.npz"
    print(f"{args.fixture}: {fixture.description}")
    print(f"Sampling it with numpyro: {chains} chains x {args.tune} tune + {draws} draws...")
    tic = time.perf_counter()
    _sample(args.fixture, chains, draws, args.tune, args.seed, draws_path)
    print(f"Sampled in {time.perf_counter() - tic:.1f} s; raw draws in {draws_path}.")
    print("Post-processing them with pymc's default and ours, each in a fresh process...")
    results = _run_cases(args.fixture, ["pymc:vmap", "ours:auto"], out, draws_npz=draws_path)
    status = _finish(
        results,
        out,
        f"Post-processing {args.fixture} after numpyro, {chains} chains x {draws} draws",
        args.command_line,
    )
    summary = _summary(results)
    if summary:
        print(f"\nPeak memory of the post-processing call:\n{summary}")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pymc-chunkpost`.

    Returns:
        0 on success; 1 when a case failed, a result differs from pymc's, or an optional
        dependency is missing (one line names the extra to install); argparse exits with 2
        on bad arguments.
    """
    parser, commands = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.command_line = "pymc-chunkpost " + shlex.join(argv)
    try:
        if args.command == "profile":
            return _profile(commands["profile"], args)
        return _demo(commands["demo"], args)
    except MissingExtraError as error:
        print(f"pymc-chunkpost: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
