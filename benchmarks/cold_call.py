"""Where a cold call's time goes, outside XLA's compile: `auto` beside pymc's vmap.

    python benchmarks/cold_call.py                            # eight_schools, 10 rounds
    python benchmarks/cold_call.py --model softmax --rounds 8 --json cold.json

On a small model a cold call is mostly XLA's compile, the same program for `auto` as for
pymc's vmap where `auto` plans no loop; what `auto` adds is planning: its analysis trace,
the on-disk caches, the budget. Each round runs both cases, each in a fresh process with a
fresh `PYMC_CHUNKPOST_CACHE_DIR`, and times the call (to `block_until_ready`) and, inside
it, each step below (perf counters around the functions that do them, summed per call).
`nonxla` is the call less XLA's compile: the compile varies by several ms from process to
process, which hides a ms of planning in the totals (docs/strategies.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)

CHILD = r"""
import json, os, sys, tempfile, time, warnings
warnings.filterwarnings("ignore")
os.environ["PYMC_CHUNKPOST_CACHE_DIR"] = tempfile.mkdtemp()
model, case, draws = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])  # benchmarks/, for `_internals`
import jax
jax.config.update("jax_enable_x64", True)
from jax._src import compiler
from jax._src.interpreters import mlir
from pymc.sampling.jax import _postprocess_samples
from pymc_chunkpost import postprocess_samples_with_plan
import _internals as internals
from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn
spec = FIXTURES[model]
built = spec.build()
fn = jax_fn(built)
raw = [jax.device_put(x) for x in spec.raw_draws(built, 4, draws, seed=0)]
# A session that has just sampled has lowered and compiled before (as in bench_zoo.py).
jax.block_until_ready(jax.jit(lambda x: x + 1).lower(raw[-1]).compile()(raw[-1]))
seconds = {}
def adder(label):
    return lambda s: seconds.__setitem__(label, seconds.get(label, 0.0) + s)
internals.timed(compiler, "backend_compile_and_load", adder("xla_compile"))
internals.timed(mlir, "lower_jaxpr_to_module", adder("mlir_lower"))
for label in internals.STEPS:
    if label != "predictive.graph":
        internals.time_step(label, adder(label))
tic = time.perf_counter()
if case == "auto":
    outputs, _ = postprocess_samples_with_plan(fn, raw, None, "auto", True)
else:
    outputs = _postprocess_samples(fn, raw, None, "vmap", True)
jax.block_until_ready(outputs)
total = time.perf_counter() - tic
internals.wait_for_disk()
seconds.update(total=total, nonxla=total - seconds.get("xla_compile", 0.0))
print(json.dumps(seconds))
"""

CASES = ("auto", "pymc_vmap")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="eight_schools", help="a zoo model (docs/zoo.md)")
    parser.add_argument("--rounds", type=int, default=10, help="fresh processes per case")
    parser.add_argument("--draws", type=int, default=1000, help="per chain; 4 chains")
    parser.add_argument("--json", default=None, help="write every run's steps here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.draws < 1:
        parser.error("--rounds and --draws must be positive")
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, args.model, case, str(args.draws), HERE],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.model}, 4 x {args.draws} draws, {args.rounds} rounds: median ms per call")
    for case, mine in runs.items():
        steps = sorted({k for r in mine for k in r}, key=lambda k: (k != "total", k))
        cells = [f"{k} {1e3 * statistics.median(r.get(k, 0.0) for r in mine):.1f}" for k in steps]
        print(f"  {case}: " + ", ".join(cells))
    for key in ("total", "nonxla"):
        diffs = sorted(1e3 * (a[key] - b[key]) for a, b in zip(runs["auto"], runs["pymc_vmap"]))
        print(
            f"  auto - pymc_vmap, {key}, paired by round: median {statistics.median(diffs):+.1f}"
            f" ms ({diffs[0]:+.1f} to {diffs[-1]:+.1f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "draws": args.draws, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
