"""The routes users take, checked on an accelerator (a TPU or a GPU) in one call.

    python benchmarks/accelerator_check.py --out OUT_DIR [--sections ...] [--quick]
        [--min-available-gib 5]

Each section runs one benchmark script of this folder in fresh processes, against pymc's
and numpyro's own in the same run, and writes `OUT_DIR/<section>.json` as soon as it ends,
so that a run cut short still reports what it finished:

- `predictive`: `predictive_compile.py`, the posterior predictive of a 20,000- and a
  2,000-row regression: ours cold and warm, XLA's compile beside plain JAX's of the same
  draws, a second process in the first one's cache folder, and pymc's default backend;
- `sample`: `bench_sample_route.py --models big_det`, a patched `pm.sample(nuts_sampler=
  "numpyro")` with an 8 GB `Deterministic`, unpatched, cold and warm;
- `huge_sample`: the same route, patched, with a `Deterministic` larger than the chip
  (`--models huge_det`: 17.6 GB over 4 x 1,000 draws), which pymc's own vmap cannot hold;
- `numpyro`: `bench_numpyro.py --cases hier_30k`, ours against `Predictive(parallel=True)`
  and `parallel=False`;
- `compile`: `compile_cost.py`, the chunked programs' compile at 1.86 GiB of outputs;
- `host_budget`: `host_budget.py`, `auto` on 17.6 GB of outputs, more than the chip holds.

A watchdog thread reads the host's available memory (`MemAvailable`, capped by a cgroup's
limit: `_memory._host_available_bytes`) every 0.2 s and kills the running section
(its whole process group) when it falls under `--min-available-gib`: on a TPU machine the
runtime holds about 15 GB of host memory itself, and a host out of memory loses the
machine and everything not yet written. `--quick` runs every section at small sizes, as a
try-out on a CPU. `OUT_DIR/accelerator_check.json` gathers every section's record and the
device at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from pymc_chunkpost._memory import _host_available_bytes  # noqa: E402

GiB = 2**30


def _sections(out: Path, quick: bool) -> dict[str, tuple[list[str], int]]:
    """Section -> (the command's arguments after `python`, its time limit in seconds)."""
    rows = "2000,200" if quick else "20000,2000"
    big = "tiny_det" if quick else "big_det"
    return {
        "predictive": (
            [
                "predictive_compile.py",
                f"--rows={rows}",
                "--cells=ours_auto,ours_auto_again,pymc_default,plain_xb_barrier_loc",
                f"--out={out / 'predictive.json'}",
            ],
            300,
        ),
        "sample": (
            [
                "bench_sample_route.py",
                f"--models={big}",
                "--repeats=1",
                f"--draws={50 if quick else 500}",
                f"--tune={50 if quick else 300}",
                f"--json={out / 'sample.json'}",
            ],
            330,
        ),
        "huge_sample": (
            [
                "bench_sample_route.py",
                f"--models={'tiny_det' if quick else 'huge_det'}",
                "--cases=cold",
                "--repeats=1",
                f"--draws={50 if quick else 1000}",
                f"--tune={50 if quick else 300}",
                f"--json={out / 'huge_sample.json'}",
            ],
            400,
        ),
        "numpyro": (
            [
                "bench_numpyro.py",
                f"--cases={'hier_2k' if quick else 'hier_30k'}",
                "--methods=ours,numpyro_vmap,numpyro_map",
                "--repeats=1",
                "--measures=time",
                f"--out={out / 'numpyro.json'}",
            ],
            150,
        ),
        "compile": (
            [
                "compile_cost.py",
                f"--rows={2500 if quick else 250000}",
                "--draws=4x500",
                "--plans=chunked,chunked_host_loop,auto",
                f"--out={out / 'compile.json'}",
            ],
            90,
        ),
        "host_budget": (
            [
                "host_budget.py",
                f"--gib={0.2 if quick else 17.6}",
                "--output-memory=auto",
                "--cases=matvec",
                "--draws=4x1000",
                f"--out={out / 'host_budget.json'}",
            ],
            150,
        ),
    }


class _Watchdog(threading.Thread):
    """Kills the process group of `proc` while the host's available memory is too low."""

    def __init__(self, min_bytes: int):
        super().__init__(daemon=True)
        self.min_bytes, self.proc, self.fired = min_bytes, None, False

    def run(self) -> None:
        while True:
            proc = self.proc
            if (
                proc is not None
                and proc.poll() is None
                and _host_available_bytes() < self.min_bytes
            ):
                self.fired = True
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.2)


def run_section(name: str, args: list[str], limit: int, dog: _Watchdog, out: Path) -> dict:
    """One section in its own process group, within `limit` seconds; its record."""
    tic = time.perf_counter()
    log = (out / f"{name}.log").open("w")
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    }
    proc = subprocess.Popen(
        [sys.executable, str(HERE / args[0]), *args[1:]],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    dog.fired, dog.proc = False, proc
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    dog.proc = None
    record = {
        "section": name,
        "command": " ".join(args),
        "seconds": time.perf_counter() - tic,
        "returncode": code,
        "stopped_by_watchdog": dog.fired,
        "min_available_bytes_allowed": dog.min_bytes,
    }
    written = out / f"{name}.json"
    if written.exists():
        record["result"] = json.loads(written.read_text())
    (out / f"{name}.section.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="accel_")))
    parser.add_argument(
        "--sections", default="predictive,sample,huge_sample,numpyro,compile,host_budget"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a CPU try-out")
    parser.add_argument("--min-available-gib", type=float, default=5.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    table = _sections(args.out, args.quick)
    wanted = args.sections.split(",")
    unknown = sorted(set(wanted) - set(table))
    if unknown:
        parser.error(f"--sections takes {', '.join(table)} (got {unknown})")
    dog = _Watchdog(int(args.min_available_gib * GiB))
    dog.start()
    records = {}
    for name in wanted:
        command, limit = table[name]
        records[name] = run_section(name, command, limit, dog, args.out)
        print(json.dumps({k: v for k, v in records[name].items() if k != "result"}), flush=True)
    summary = {"device": _device(), "sections": records}
    (args.out / "accelerator_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(r["returncode"] == 0 for r in records.values()) else 1


def _device() -> str:
    code = "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-200:]


if __name__ == "__main__":
    sys.exit(main())
