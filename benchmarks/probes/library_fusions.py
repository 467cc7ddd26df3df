"""XLA's CPU library fusions (YNNPACK) in a chunk loop: compiled temporaries and run time,
with and without them.

For each model (a zoo fixture) and batch size, the `jax.lax.map` program over the flattened
chain x draw axis is lowered once and compiled with each setting of
`xla_cpu_experimental_ynn_fusion_type` (XLA's default, none, reductions only), in one
process; each executable then runs `--repeats` times on the same draws (a run's first call
pays for first touching its memory; each call allocates fresh outputs). The table gives the
compiled temporaries and every run's seconds (docs/strategies.md, "Library fusions").

    python benchmarks/probes/library_fusions.py
    python benchmarks/probes/library_fusions.py --case radon_slopes:5 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from pymc_chunkpost._support.compat import LIBRARY_FUSION_MARK
from pymc_chunkpost.profiling import fixtures

OPTION = "xla_cpu_experimental_ynn_fusion_type"
SETTINGS = {"default": None, "none": "", "reductions only": "LIBRARY_FUSION_TYPE_REDUCE"}
CASES = [("radon_slopes", 5), ("hierarchical", 16), ("big_data", 40), ("gp", 25)]


def measure(name: str, batch: int, repeats: int, chains: int = 4, draws: int = 1000) -> dict:
    model = getattr(fixtures, name)()
    fn = fixtures.jax_fn(model)
    raw = [jax.device_put(x) for x in fixtures.raw_draws(model, chains, draws, 0)]
    n = chains * draws

    def whole(*xs):
        flat = [x.reshape((n,) + x.shape[2:]) for x in xs]
        ys = jax.lax.map(lambda a: list(fn(*a)), flat, batch_size=batch)
        return [y.reshape((chains, draws) + y.shape[1:]) for y in ys]

    lowered = jax.jit(whole).lower(*raw)
    row: dict = {"model": name, "batch": batch, "jax": jax.__version__, "settings": {}}
    for label, value in SETTINGS.items():
        options = {} if value is None else {OPTION: value}
        tic = time.perf_counter()
        compiled = lowered.compile(compiler_options=options)
        compile_seconds = time.perf_counter() - tic
        runs = []
        for _ in range(repeats):
            tic = time.perf_counter()
            jax.block_until_ready(compiled(*raw))
            runs.append(time.perf_counter() - tic)
        row["settings"][label] = {
            "compile_seconds": compile_seconds,
            "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20,
            "library_fusions": compiled.as_text().count(LIBRARY_FUSION_MARK),
            "run_seconds": runs,
        }
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model, batch | jax | setting | library fusions | temporaries MiB | compile s | runs s |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        for label, s in r["settings"].items():
            runs = ", ".join(f"{t:.2f}" for t in s["run_seconds"])
            lines.append(
                f"| {r['model']}, {r['batch']} | {r['jax']} | {label} | {s['library_fusions']} "
                f"| {s['temp_mib']:.2f} | {s['compile_seconds']:.3f} | {runs} |"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="model:batch (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    cases = CASES
    if args.case:
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.case]
    rows = [measure(name, batch, args.repeats, draws=args.draws) for name, batch in cases]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
