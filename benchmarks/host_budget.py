"""Outputs in host memory within a host budget: peak host RSS, speed against the copy bound.

    python benchmarks/host_budget.py [--cases matvec,many,matrix] [--gib 1.0]
        [--output-memory host|auto] [--host-budget auto|BYTES] [--draws 4x250]
        [--impossible] [--config NAME=INT,...] [--out FILE]

Each case runs in a fresh process, and so does the bound:
- `bound`: the platform's raw rate into fresh host memory: on a CPU, a copy of a cached
  array into new numpy memory (its first touch included); on an accelerator, `np.asarray`
  of a device array (one device-to-host copy into new memory).
- a case: a per-draw function whose outputs come to `--gib` GiB over the draws, post-processed
  by `postprocess_samples(output_memory=...)` under the host budget (`configure_memory(
  host_budget=...)`; "auto": the host's available memory). The process's peak RSS
  (`VmHWM`, reset through `/proc/self/clear_refs` just before the call) is reported above
  the RSS at the call's start, against `1.10 x outputs + 1 GiB`; the time as a rate of
  output bytes, and as a fraction of the bound; the values against NumPy on a few draws.
  The cases differ in shape: `matvec` one wide output (`X @ beta`, as issue 49's 17.6 GB
  deterministic), `many` 24 outputs of a few thousand values each, `matrix` one square
  matrix per draw (an outer product).
- `--host-budget tight`: the outputs and 320 MiB, less than the default staging and margin,
  so that the plan must shrink its chunks to fit.
- `--impossible`: each case again with a host budget of half its outputs: it must raise
  `MemoryError` before compiling anything, the draws intact.

The last line printed is the JSON record (`--out` writes it too). On the TPU (DEVELOPERS.md):
`--gib 17.6 --output-memory auto --cases matvec --draws 4x1000`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cell import run_child  # noqa: E402

from pymc_chunkpost.profiling.proc import PeakRss  # noqa: E402
from pymc_chunkpost.profiling.proc import status_bytes as _rss_bytes  # noqa: E402

GiB = 2**30
CASES = ("matvec", "many", "matrix")
#: "tight": a host budget of the outputs and this, below the default staging and margin
#: (`PlannerConfig.host_staging_bytes + host_margin_bytes`): the plan must shrink its chunks.
TIGHT_EXTRA = 320 * 2**20


def _problem(case: str, gib: float, chains: int, draws: int):
    """The per-draw function, its raw draws `(chains, draws, ...)`, and a NumPy reference of
    one draw, for outputs of about `gib` GiB in float32."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    per_draw = int(gib * GiB / (chains * draws * 4))
    if case == "matvec":
        rows = per_draw
        x = rng.normal(size=(rows, 8)).astype(np.float32)
        beta = rng.normal(size=(chains, draws, 8)).astype(np.float32)
        xj = jnp.asarray(x)

        def fn(b):
            return [xj @ b]

        return fn, [beta], lambda b: [x @ b]
    if case == "many":
        width = max(per_draw // 24, 1)
        scales = rng.uniform(0.5, 2.0, size=(24, width)).astype(np.float32)
        theta = rng.normal(size=(chains, draws, 24)).astype(np.float32)
        sj = jnp.asarray(scales)

        def fn(t):
            return [jnp.exp(t[k]) * sj[k] for k in range(24)]

        return fn, [theta], lambda t: [np.exp(t[k]) * scales[k] for k in range(24)]
    side = max(int(per_draw**0.5), 1)
    v = rng.normal(size=(chains, draws, side)).astype(np.float32)

    def fn(u):
        return [jnp.outer(u, u)]

    return fn, [v], lambda u: [np.outer(u, u)]


def _case(args: argparse.Namespace) -> dict:
    import jax
    import numpy as np

    import pymc_chunkpost as pc

    chains, draws = args.chains, args.draws
    fn, raw, numpy_fn = _problem(args.case, args.gib, chains, draws)
    out_bytes = int(sum(4 * np.prod(y.shape) for y in numpy_fn(raw[0][0, 0]))) * chains * draws
    if args.host_budget == "half":
        pc.configure_memory(host_budget=out_bytes // 2)
    elif args.host_budget == "tight":
        pc.configure_memory(host_budget=out_bytes + TIGHT_EXTRA)
    elif args.host_budget != "auto":
        pc.configure_memory(host_budget=int(args.host_budget))
    kept = [x.copy() for x in raw]
    device = jax.devices()[0]
    raw_device = [jax.device_put(x, device) for x in raw]
    record = {
        "case": args.case,
        "platform": device.platform,
        "device": str(device.device_kind),
        "jax": jax.__version__,
        "output_bytes": int(out_bytes),
        "host_budget": args.host_budget,
        "output_memory": args.output_memory,
    }
    compiles = [0]
    compile_ = jax.stages.Lowered.compile

    def counted(self, *a, **k):
        compiles[0] += 1
        return compile_(self, *a, **k)

    jax.stages.Lowered.compile = counted  # type: ignore[method-assign]
    start = _rss_bytes("VmRSS")
    watch = PeakRss()
    tic = time.perf_counter()
    try:
        outputs = pc.postprocess_samples(
            fn, raw_device, None, "auto", output_memory=args.output_memory
        )
        jax.block_until_ready(outputs)
    except MemoryError as error:
        record |= {
            "memory_error": str(error),
            "compiles": compiles[0],
            "draws_intact": all(
                not x.is_deleted() and np.array_equal(np.asarray(x), k)
                for x, k in zip(raw_device, kept)
            ),
        }
        return record
    seconds = time.perf_counter() - tic
    peak = watch.bytes()
    worst = _largest_difference(outputs, raw[0], numpy_fn)
    record |= {
        "seconds": seconds,
        "rate_gb_s": out_bytes / seconds / 1e9,
        "rss_start": start,
        "peak_method": watch.method,
        "peak_above_start": peak - start,
        "allowed_above_start": int(1.10 * out_bytes + GiB),
        "within": bool(peak - start <= 1.10 * out_bytes + GiB),
        "outputs_type": type(outputs[0]).__name__,
        "largest_relative_difference": worst,
        "compiles": compiles[0],
    }
    del outputs  # the only reference: the warm call must not find the first's outputs alive
    gc.collect()
    tic = time.perf_counter()
    jax.block_until_ready(
        pc.postprocess_samples(fn, raw_device, None, "auto", output_memory=args.output_memory)
    )
    record["warm_seconds"] = time.perf_counter() - tic
    record["warm_rate_gb_s"] = out_bytes / record["warm_seconds"] / 1e9
    return record


def _largest_difference(outputs, draws, numpy_fn) -> float:
    """The largest relative difference from NumPy on three draws (first, last, one between)."""
    import numpy as np

    chains, n = draws.shape[:2]
    worst = 0.0
    for c, d in ((0, 0), (chains - 1, n - 1), (chains // 2, n // 3)):
        for y, want in zip(outputs, numpy_fn(draws[c, d])):
            got = np.asarray(y[c, d])
            worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30)))
    return worst


def _bound(args: argparse.Namespace) -> dict:
    """The raw rate into fresh host memory of `--gib` GiB (at most 2 GiB), best of three."""
    import jax
    import numpy as np

    nbytes = int(min(args.gib, 2.0) * GiB)
    device = jax.devices()[0]
    best = float("inf")
    if device.platform == "cpu":
        source = np.ones(nbytes // 4, np.float32)
        for _ in range(3):
            tic = time.perf_counter()
            target = np.empty_like(source)
            target[...] = source
            best = min(best, time.perf_counter() - tic)
            del target
        what = "copy into fresh numpy memory"
    else:
        x = jax.device_put(np.ones(nbytes // 4, np.float32), device)
        x.block_until_ready()
        for _ in range(3):
            y = x + 1  # a fresh device array each time: no cached host copy
            y.block_until_ready()
            tic = time.perf_counter()
            host = np.asarray(y)
            best = min(best, time.perf_counter() - tic)
            del host, y
        what = "np.asarray of a device array"
    return {"bound": what, "bytes": nbytes, "rate_gb_s": nbytes / best / 1e9}


def markdown(result: dict) -> tuple[str, str]:
    """The results page's header and table for a record (`benchmarks/results_page.py`)."""
    bound = result["bound"]
    ran = [c for c in result["cases"] if "seconds" in c]
    where = f"{ran[0]['platform']} ({ran[0]['device']})" if ran else "?"
    if ran and "jax" in ran[0]:
        where += f", jax {ran[0]['jax']}"
    header = (
        f"On {where}: the bound is {bound['bound']}, {bound['rate_gb_s']:.2f} GB/s. Peak host "
        "RSS above the call's start, against `1.10 x outputs + 1 GiB`; a host budget of half "
        "the outputs must raise `MemoryError` before any compile, the draws intact. "
        "`python benchmarks/host_budget.py` (docs/memory.md#the-host-memory-budget)."
    )
    rows = [
        "| case | outputs | output_memory | host budget | cold | warm | of the bound, cold / warm "
        "| peak above start | allowed | values (largest rel. diff.) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        gib = c["output_bytes"] / GiB
        if "seconds" not in c:
            rows.append(
                f"| {c['case']} | {gib:.2f} GiB | {c['output_memory']} | {c['host_budget']} | "
                f"MemoryError, {c['compiles']} compiles, draws intact: {c['draws_intact']} "
                "| | | | | |"
            )
            continue
        rows.append(
            f"| {c['case']} | {gib:.2f} GiB | {c['output_memory']} | {c['host_budget']} | "
            f"{c['seconds']:.2f} s | {c['warm_seconds']:.2f} s | "
            f"{c['fraction_of_bound']:.0%} / {c['warm_fraction_of_bound']:.0%} | "
            f"{c['peak_above_start'] / GiB:.2f} GiB | {c['allowed_above_start'] / GiB:.2f} GiB "
            f"| {c['largest_relative_difference']:.1e} |"
        )
    return header, "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--draws", default="4x250", help="chains x draws")
    parser.add_argument("--output-memory", default="host", choices=["host", "auto"])
    parser.add_argument("--host-budget", default="auto", help="'auto', 'tight' or bytes")
    parser.add_argument("--impossible", action="store_true")
    parser.add_argument(
        "--config",
        default="",
        help="PlannerConfig fields, `name=int,...` (e.g. populate_threads=0)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.chains, args.draws = map(int, args.draws.split("x"))
    if args.child is not None:
        args.case = args.child
        if args.child == "bound":
            print(json.dumps(_bound(args)))
            return
        from pymc_chunkpost import configured

        changes = {k: int(v) for k, v in (c.split("=") for c in args.config.split(",") if c)}
        with configured(**changes):
            record = _case(args)
        print(json.dumps(record | changes))
        return
    common = ["--gib", str(args.gib), "--draws", f"{args.chains}x{args.draws}"]
    common += ["--output-memory", args.output_memory]
    if args.config:
        common += ["--config", args.config]
    script = str(Path(__file__).resolve())
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    bound = run_child(script, [*common, "--child", "bound"], env)
    print(f"bound: {bound['rate_gb_s']:.2f} GB/s ({bound['bound']})", file=sys.stderr)
    records = []
    for case in args.cases.split(","):
        budgets = [args.host_budget] + (["half"] if args.impossible else [])
        for budget in budgets:
            r = run_child(script, [*common, "--host-budget", budget, "--child", case], env)
            if "seconds" in r:
                r["fraction_of_bound"] = r["rate_gb_s"] / bound["rate_gb_s"]
                r["warm_fraction_of_bound"] = r["warm_rate_gb_s"] / bound["rate_gb_s"]
                print(
                    f"{case}: {r['output_bytes'] / GiB:.2f} GiB in {r['seconds']:.2f} s cold, "
                    f"{r['warm_seconds']:.2f} s warm ({r['fraction_of_bound']:.0%} and "
                    f"{r['warm_fraction_of_bound']:.0%} of the bound); "
                    f"peak {r['peak_above_start'] / GiB:.2f} GiB above the start, allowed "
                    f"{r['allowed_above_start'] / GiB:.2f}; values within "
                    f"{r['largest_relative_difference']:.1e}",
                    file=sys.stderr,
                )
            else:
                print(f"{case} ({budget}): {r['memory_error'][:120]}...", file=sys.stderr)
            records.append(r)
    result = {"bound": bound, "cases": records}
    result["header"], result["table"] = markdown(result)
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
