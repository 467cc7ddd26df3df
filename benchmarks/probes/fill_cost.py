"""What zero outputs cost on a CPU: placed from the host, or filled by a compiled program.

    python benchmarks/probes/fill_cost.py                      # 1, 8, 32, 128, 640 MiB, 3 repeats
    python benchmarks/probes/fill_cost.py --mib 48,640 --repeats 5

A host-driven run (segments, the tuner) updates zero outputs in place. `_program` places
small ones from the host (`_host_zeros`: nothing compiles) and fills large ones with a
compiled program (`PlannerConfig.host_zeros_max_bytes`). Each case runs in a fresh process,
round-robin, so that every write touches fresh pages, as a cold run's do: `host` is
`_host_zeros`, `fill` is the compile of a jitted `jnp.zeros` plus its run. The outputs are
two float64 arrays of shape (4, 1000, k): one of the given size, and one small.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from pymc_chunkpost._engine.execute import program as _program
mib, how = float(sys.argv[1]), sys.argv[2]
specs = [jax.ShapeDtypeStruct((4, 1000, max(1, int(mib * 2**20 / 8 / 4000))), np.float64),
         jax.ShapeDtypeStruct((4, 1000, 3), np.float64)]
sharding = jax.sharding.make_single_device_sharding(jax.devices()[0])
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()  # JAX's first-lowering costs
tic = time.perf_counter()
if how == "host":
    outs = _program._host_zeros(specs, sharding)()
else:
    outs = jax.jit(lambda: [jnp.zeros(s.shape, s.dtype) for s in specs]).lower().compile()()
jax.block_until_ready(outs)
print(json.dumps({"seconds": time.perf_counter() - tic}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="1,8,32,128,640", help="output sizes in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [float(x) for x in args.mib.split(",")]
    if args.repeats < 1 or not sizes or min(sizes) <= 0:
        parser.error("--repeats and every --mib must be positive")
    times: dict[tuple[float, str], list[float]] = {}
    for _ in range(args.repeats):
        for mib in sizes:
            for how in ("host", "fill"):
                run = subprocess.run(
                    [sys.executable, "-c", CHILD, str(mib), how],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                seconds = json.loads(run.stdout.strip().splitlines()[-1])["seconds"]
                times.setdefault((mib, how), []).append(seconds)
    print("| MiB | host s (min-max) | fill s, compile included (min-max) |")
    print("|---:|---:|---:|")
    for mib in sizes:
        cells = []
        for how in ("host", "fill"):
            t = times[(mib, how)]
            cells.append(f"{statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f})")
        print(f"| {mib:g} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
