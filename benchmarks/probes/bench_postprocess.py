"""Post-processing side by side: `auto` against pymc's "vmap"/"scan", `jax.lax.map` and
numpyro's `soft_vmap`, each case in a fresh process.

    python benchmarks/probes/bench_postprocess.py --fixtures big_det,many_scalars --out bench.md

Every case runs in its own Python process: the model is built, the raw draws are put on
the device and a trivial function is compiled first (not timed: a session that has just
sampled has paid JAX's first-lowering costs) and Python's garbage is collected (a full
collection with pymc loaded takes about 0.2 s, and would otherwise land in a case's timing
by chance), then the peak RSS is reset
(`echo 5 > /proc/self/clear_refs`) and the post-processing is timed from the first call
(trace + compile + run: what a user waits for). Peak extra memory is `VmHWM - VmRSS` before
the call, from /proc/self/status. Every case donates the draws, as pymc does after sampling.
The floor is the bytes of the outputs that cannot reuse input buffers (pass-through outputs
are free). The cases run round-robin (one repeat of every case, then the next), and `auto`
is also compared with each case run by run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (8, 64, 512)


def child(fixture: str, case: str, chains: int, draws: int) -> dict:
    """Run one case in this (fresh) process; returns its measurements."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import numpy as np
    import tqdm.auto  # noqa: F401 - loaded in any session that sampled with numpyro

    from pymc_chunkpost._engine.call import postprocess as _postprocess
    from pymc_chunkpost._engine.data import problem as _problem
    from pymc_chunkpost.profiling.fixtures import on_device
    from pymc_chunkpost.profiling.proc import reset_peak, status_bytes

    _, fn, raw = on_device(fixture, chains, draws)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in raw]
    problem = _problem.analyse(fn, specs, jax.devices()[0])
    # A session that has just sampled has lowered and compiled before: pay JAX's one-time
    # costs of a first lowering (about 0.15 s) here, not in whichever case is timed.
    jax.block_until_ready(jax.jit(lambda x: x + 1).lower(raw[-1]).compile()(raw[-1]))
    # With pymc loaded, one full collection of Python's garbage collector takes about 0.2 s
    # (measured): start every case with none pending, so that none lands in one case's
    # timing by chance.
    gc.collect()
    n = chains * draws
    compile_seconds = planning = None
    name, _, batch = case.partition(":")

    def flat_call(mapper):
        """`mapper(g, flat_inputs)` over the flattened chain x draw axis, jitted, donated."""

        def g(args):
            return list(fn(*args))

        def whole(*xs):
            flat = [x.reshape((n,) + x.shape[2:]) for x in xs]
            return [y.reshape((chains, draws) + y.shape[1:]) for y in mapper(g, flat)]

        return jax.jit(whole, donate_argnums=tuple(range(len(raw))))

    if name.startswith("auto_cache"):  # JAX's persistent compilation cache, cold then warm
        jax.config.update("jax_compilation_cache_dir", os.environ["BENCH_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    device = jax.devices()[0]
    on_host = device.platform == "cpu"  # else: the device's own peak, from its allocator
    if on_host:
        base = status_bytes("VmRSS")
        reset_peak()
    else:
        base = device.memory_stats()["bytes_in_use"]
    tic = time.perf_counter()
    if name in ("auto", "auto_progress", "auto_cache_cold", "auto_cache_warm"):
        outputs, plan = _postprocess.run(
            fn, raw, None, "auto", True, progressbar=name == "auto_progress"
        )
        compile_seconds, planning = plan.compile_seconds, plan.planning_seconds
        detail = f"{plan.strategy} {plan.chunk_size or ''}".strip()
    elif name == "chunked":
        outputs, plan = _postprocess.run(fn, raw, None, "chunked", True, chunk_size=int(batch))
        compile_seconds, planning = plan.compile_seconds, plan.planning_seconds
        detail = f"chunk {batch}"
    elif name == "pymc_scan":
        from pymc.sampling.jax import _postprocess_samples

        outputs = _postprocess_samples(fn, raw, None, "scan", True)
        detail = "not jitted"
    else:
        if name == "pymc_vmap":  # exactly pymc's "vmap" path, compiled ahead to time it
            jitted = jax.jit(lambda x: jax.vmap(jax.vmap(fn))(*x), donate_argnums=0)
            args = (raw,)
        elif name == "lax_map":
            jitted = flat_call(lambda g, xs: jax.lax.map(g, xs, batch_size=int(batch)))
            args = tuple(raw)
        elif name == "soft_vmap":
            from numpyro.util import soft_vmap

            jitted = flat_call(lambda g, xs: soft_vmap(g, xs, batch_ndims=1, chunk_size=int(batch)))
            args = tuple(raw)
        else:
            raise ValueError(case)
        lowered = jitted.lower(*args)
        toc = time.perf_counter()
        compiled = lowered.compile()
        compile_seconds = time.perf_counter() - toc
        outputs = compiled(*args)
        detail = f"batch {batch}" if batch else ""
    jax.block_until_ready(outputs)
    total = time.perf_counter() - tic
    if on_host:
        peak = status_bytes("VmHWM") - base
    else:
        peak = device.memory_stats()["peak_bytes_in_use"] - base
    checksum = float(sum(np.asarray(jnp.sum(jnp.asarray(o, jnp.float64))) for o in outputs))
    return {
        "fixture": fixture,
        "case": case,
        "detail": detail,
        "total_s": total,
        "compile_s": compile_seconds,
        "planning_s": planning,
        "peak_extra_bytes": peak,
        "floor_bytes": problem.output_bytes,
        "checksum": checksum,
    }


def run_case(fixture, case, chains, draws, timeout, cache_dir) -> dict:
    command = [sys.executable, __file__, "--child", fixture, case, str(chains), str(draws)]
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, "BENCH_CACHE_DIR": cache_dir},
        )
    except subprocess.TimeoutExpired:
        return {"fixture": fixture, "case": case, "error": f"over {timeout} s"}
    if result.returncode != 0:
        return {"fixture": fixture, "case": case, "error": result.stderr.strip()[-300:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _fmt(x, spec):
    return "–" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    lines = [
        "| fixture | case | detail | total s | min-max s | compile s | peak extra MiB | vs floor "
        "| same |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    reference = {
        r["fixture"]: r["checksum"] for r in rows if r["case"] == "pymc_vmap" and "checksum" in r
    }
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['fixture']} | {r['case']} | {r['error'][:60]} | | | | | | |")
            continue
        ref = reference.get(r["fixture"])
        spread = r.get("all_total_s") or [r["total_s"]]
        same = (
            "–"
            if ref is None
            else ("yes" if abs(r["checksum"] - ref) <= 1e-8 * max(1, abs(ref)) else "NO")
        )
        lines.append(
            f"| {r['fixture']} | {r['case']} | {r['detail']} | {r['total_s']:.3f} | "
            f"{min(spread):.3f}-{max(spread):.3f} | {_fmt(r['compile_s'], '.3f')} | "
            f"{r['peak_extra_bytes'] / 2**20:,.0f} | "
            f"{r['peak_extra_bytes'] / max(r['floor_bytes'], 1):.2f} | {same} |"
        )
    return "\n".join(lines)


def paired(runs_by_fixture: dict[str, dict[str, list[dict]]]) -> str:
    """`auto` against each other case, run by run: the cases ran round-robin, so each
    repeat's runs were neighbours in time, and the median of their ratios cancels a drift in
    machine speed that the medians alone would not."""
    lines = [
        "| fixture | case | against | median ratio | ratios within | pairs |",
        "|---|---|---|---:|---:|---:|",
    ]
    for fixture, by_case in runs_by_fixture.items():
        for case in (c for c in by_case if c in ("auto", "auto_progress")):
            for other, other_runs in by_case.items():
                if other == case or other.startswith("auto_cache"):
                    continue
                ratios = sorted(
                    a["total_s"] / b["total_s"]
                    for a, b in zip(by_case[case], other_runs)
                    if "error" not in a and "error" not in b
                )
                if ratios:
                    lines.append(
                        f"| {fixture} | {case} | {other} | {ratios[len(ratios) // 2]:.3f} | "
                        f"{ratios[0]:.2f}-{ratios[-1]:.2f} | {len(ratios)} |"
                    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", default="big_det,many_scalars,wide,gp,eight_schools")
    parser.add_argument("--cases", default=None, help="comma-separated; default: all anchors")
    parser.add_argument("--chains", type=int, default=None)
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument(
        "--repeat", type=int, default=1, help="fresh processes per case; the median is shown"
    )
    parser.add_argument("--out", default=None, help="write the table (markdown) here too")
    parser.add_argument("--json", default=None, help="write the raw rows here")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        fixture, case, chains, draws = args.child
        print(json.dumps(child(fixture, case, int(chains), int(draws))))
        return 0
    sys.path.insert(0, str(ROOT))
    from pymc_chunkpost.profiling.fixtures import FIXTURES

    batches = args.batches.split(",")
    cases = (
        args.cases.split(",")
        if args.cases
        else (
            ["pymc_vmap", "pymc_scan"]
            + [f"lax_map:{b}" for b in batches]
            + [f"soft_vmap:{b}" for b in batches]
            + ["auto", "auto_progress", "auto_cache_cold", "auto_cache_warm"]
        )
    )
    rows, runs_by_fixture = [], {}
    for fixture in args.fixtures.split(","):
        spec = FIXTURES[fixture]
        chains, draws = args.chains or spec.chains, args.draws or spec.draws
        cache_dir = tempfile.mkdtemp(prefix=f"bench-cache-{fixture}-")
        runs_by_case = runs_by_fixture[fixture] = {case: [] for case in cases}
        # Round-robin over the cases, so that a drift in machine speed hits every case alike.
        for repeat in range(args.repeat):
            for case in cases:
                if case.startswith("auto_cache") and repeat:
                    continue  # cold then warm: one run each
                runs = runs_by_case[case]
                runs.append(run_case(fixture, case, chains, draws, args.timeout, cache_dir))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        for runs in runs_by_case.values():
            ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["total_s"])
            row = ok[len(ok) // 2] if ok else runs[0]
            row["runs"] = len(ok)
            row["all_total_s"] = [r["total_s"] for r in ok]
            rows.append(row)
    text = table(rows)
    if args.repeat > 1:
        text += "\n\nRun by run (ratio of total seconds, same repeat):\n\n" + paired(
            runs_by_fixture
        )
    print(text)
    import jax
    import pymc

    header = (
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPU cores "
        f"({jax.devices()[0].device_kind}), Python "
        f"{sys.version.split()[0]}, jax {jax.__version__}, pymc {pymc.__version__}; each case "
        f"in a fresh process, the median of {args.repeat} shown (persistent-cache cases: one "
        "run each, cold then warm); peak extra memory from VmHWM (on a GPU: the allocator's "
        "`peak_bytes_in_use`).\n\n"
    )
    if args.out:
        Path(args.out).write_text(header + text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
