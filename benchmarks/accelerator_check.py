"""The routes users take, checked on an accelerator (a TPU or a GPU) in one call.

    python benchmarks/accelerator_check.py --out OUT_DIR [--sections ...] [--quick]
        [--min-available-gib 5]
    python benchmarks/accelerator_check.py --out OUT_DIR --sections gpu   # the GPU's checks

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
- `compile`: `probes/compile_cost.py`, the chunked programs' compile at 1.86 GiB of outputs;
- `host_budget`: `host_budget.py`, `auto` on 17.6 GB of outputs, more than the chip holds.
- `precision`: the post-hoc routes (`compute_log_likelihood`, `compute_log_prior`,
  `compute_deterministics`) of a 20,000-row float32 regression on the default device, at the
  routes' default `matmul_precision` ("highest") and at JAX's (None), each against pymc's own
  default function (float32, on the host) and against a float64 reference (pymc's own on the
  same model built in float64): the largest error relative to the largest value, cold and
  warm seconds beside pymc's.

The GPU's own checks (`--sections gpu` runs them all, in this order of worth; they were
`gpu_check.py`, whose run on an H200 is `benchmarks/results/gpu_check_run1_h200.md`), each
this script again in a fresh process (`--gpu-section`), its cases in fresh ones below it:

- `gpu_host_output`: issue 14's acceptance. A pool of about 1 GiB, 3 GiB of outputs: `auto`
  as users call it, then each host transfer driven directly; success, the device's peak
  against the draws plus two chunks' working sets, the speed against pymc's
  `postprocessing_backend="cpu"`, and the values against pymc's.
- `gpu_store`: the executables `auto` keeps on disk. Two fresh processes share one cache
  folder; each runs `auto` on three fixtures, on the GPU and with
  `postprocessing_backend="cpu"`. The second must load what the first stored (the plan's
  reason says "loaded from disk"), and both must equal pymc's values.
- `gpu_memory`: for each XLA client setting (`configure_memory`: preallocation on/off, the
  pool's fraction, the allocators), in a fresh process: what `device.memory_stats()` reports,
  what the engine's `free_bytes` reads from it, the plan `auto` makes for big_det, and the
  peak that running it reached (`peak_bytes_in_use`) against the plan's prediction.
- `gpu_oom`: a small pool (`XLA_PYTHON_CLIENT_MEM_FRACTION`) that pymc's "vmap" cannot fit:
  what pymc does, what `auto` plans and reaches, a real RESOURCE_EXHAUSTED retried down to a
  chunk that fits (the draws intact and the values right), and a budget below the outputs.
- `gpu_fixtures`: the real-model fixtures at full size, `auto` and `chunked` on the GPU and
  `auto` with `postprocessing_backend="cpu"` from a GPU-default session, against pymc's own
  `_postprocess_samples` (largest relative difference; 0 means identical).
- `gpu_sample`: `pm.sample(nuts_sampler="numpyro" | "blackjax")` patched, post-processing on
  the GPU and on the CPU, against unpatched pymc with the same seed.
- `gpu_bench`: `benchmarks/probes/bench_postprocess.py` on big_det with the anchors (peak from
  the device's `peak_bytes_in_use`).

They run on a CPU-only machine too (the GPU-only parts say so), which is how they are tried
before spending device time. On a GPU machine without pymc, carry its wheels (pymc, pytensor,
arviz, arviz-base, arviz-stats, arviz-plots, better-optimize, cachetools, blackjax<1.6),
install them with `pip install --no-deps --target /tmp/site`, and run with
`PYTHONPATH=/tmp/site`.

A watchdog thread reads the host's available memory (`MemAvailable`, capped by a cgroup's
limit: `_internals.host_available_bytes`) every 0.2 s and kills the running section
(its whole process group) when it falls under `--min-available-gib`: on a TPU machine the
runtime holds about 15 GB of host memory itself, and a host out of memory loses the
machine and everything not yet written. `--quick` runs every section at small sizes, as a
try-out on a CPU. `OUT_DIR/accelerator_check.json` gathers every section's record and the
device at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

GiB = 2**30
#: The GPU's own checks, in order of worth: `--sections gpu` runs them all.
GPU_SECTIONS = (
    "gpu_host_output",
    "gpu_store",
    "gpu_memory",
    "gpu_oom",
    "gpu_fixtures",
    "gpu_sample",
    "gpu_bench",
)
#: A GPU section's time limit in seconds (its cases run one after another inside it).
_GPU_LIMITS = {"gpu_host_output": 1260, "gpu_store": 460, "gpu_memory": 480, "gpu_oom": 240}


def _sections(out: Path, quick: bool) -> dict[str, tuple[list[str], int]]:
    """Section -> (the command's arguments after `python`, its time limit in seconds)."""
    rows = "2000,200" if quick else "20000,2000"
    big = "tiny_det" if quick else "big_det"
    return _own_sections(out, quick) | {
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
                "probes/compile_cost.py",
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


def _own_sections(out: Path, quick: bool) -> dict[str, tuple[list[str], int]]:
    """The sections this script runs itself, each in a fresh process: the GPU's checks and
    the precision of the post-hoc routes."""
    again = ["accelerator_check.py", f"--out={out}"] + (["--quick"] if quick else [])
    gpu = {
        name: (again + ["--gpu-section", name], _GPU_LIMITS.get(name, 300)) for name in GPU_SECTIONS
    }
    return gpu | {"precision": (again + ["--precision"], 300)}


class _Watchdog(threading.Thread):
    """Kills the process group of `proc` while the host's available memory is too low."""

    def __init__(self, min_bytes: int):
        super().__init__(daemon=True)
        self.min_bytes, self.proc, self.fired = min_bytes, None, False

    def run(self) -> None:
        from _internals import host_available_bytes

        while True:
            proc = self.proc
            if proc is not None and proc.poll() is None and host_available_bytes() < self.min_bytes:
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
        "--sections",
        default="precision,predictive,sample,huge_sample,numpyro,compile,host_budget",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a CPU try-out")
    parser.add_argument("--min-available-gib", type=float, default=5.0)
    parser.add_argument("--gpu-section", choices=GPU_SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--gpu-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--precision", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gpu_child:
        return gpu_child(*args.gpu_child)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.precision:
        record = section_precision(args.quick)
        (args.out / "precision.json").write_text(json.dumps(record, indent=1, default=str))
        print(json.dumps(record, default=str)[:3000], flush=True)
        return 0
    if args.gpu_section:
        return gpu_section(args.gpu_section, args.out, args.quick)
    table = _sections(args.out, args.quick)
    wanted = [s for name in args.sections.split(",") for s in _expand(name)]
    unknown = sorted(set(wanted) - set(table))
    if unknown:
        parser.error(f"--sections takes gpu, {', '.join(table)} (got {unknown})")
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


def _expand(name: str) -> tuple[str, ...]:
    return GPU_SECTIONS if name == "gpu" else (name,)


# --------------------------------------------------------------------------------------------
# The GPU's own checks (`--sections gpu`), once `gpu_check.py`.

MEMORY_SETTINGS = {
    "default": {},
    "no_preallocate": {"preallocate": False},
    "fraction_0.5": {"mem_fraction": 0.5},
    "platform": {"allocator": "platform"},
    "cuda_async": {"allocator": "cuda_async"},
    "no_preallocate_0.05": {"preallocate": False, "mem_fraction": 0.05},
    "no_autotune": {},  # with XLA_FLAGS=--xla_gpu_autotune_level=0 (see `_ENV`)
}
#: Extra environment per setting: XLA's GPU autotuner allocates buffers while compiling.
_ENV = {"no_autotune": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}}


def _setup() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))


def _stats(device) -> dict:
    keys = ("bytes_limit", "bytes_in_use", "peak_bytes_in_use", "bytes_reservable_limit")
    stats = device.memory_stats() or {}
    return {k: stats.get(k) for k in keys if k in stats} | {"n_keys": len(stats)}


def _plan_dict(plan) -> dict:
    import dataclasses

    return dataclasses.asdict(plan)


def _big_det(chains=4, draws=1000):
    from pymc_chunkpost.profiling.fixtures import on_device

    _, fn, raw = on_device("big_det", chains, draws)
    return fn, raw


def child_memory(setting: str) -> dict:
    """In a fresh process: configure, then read the pool and plan/run big_det."""
    _setup()
    import pymc_chunkpost as pc

    settings = pc.configure_memory(**MEMORY_SETTINGS[setting])
    import jax
    from _internals import free_bytes

    device = jax.devices()[0]
    result = {"setting": setting, "env": settings, "platform": device.platform}
    result["stats_at_start"] = _stats(device)
    result["free_bytes_at_start"] = free_bytes(device)
    fn, raw = _big_det()
    result["stats_with_draws"] = _stats(device)
    tic = time.perf_counter()
    plan = pc.plan(fn, raw)
    result["plan"] = _plan_dict(plan)
    result["stats_after_plan"] = _stats(device)  # compiled, not run: the autotuner's peak
    outputs = pc.postprocess_samples(fn, raw, None, "auto", True)
    jax.block_until_ready(outputs)
    result["auto_seconds"] = time.perf_counter() - tic
    result["stats_after_auto"] = _stats(device)
    return result


def child_oom(fraction: str) -> dict:
    """In a process whose pool is `fraction` of the GPU: pymc vmap, auto, a real retry."""
    _setup()
    import warnings

    import jax
    import numpy as np
    from pymc.sampling.jax import _postprocess_samples

    import pymc_chunkpost as pc
    from pymc_chunkpost import postprocess_samples_with_plan as run

    device = jax.devices()[0]
    result = {"fraction": fraction, "stats_at_start": _stats(device)}
    fn, raw = _big_det()
    n_items = raw[0].shape[0] * raw[0].shape[1]
    reference = None

    def attempt(name, call):
        tic = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = call()
                jax.block_until_ready(value)
            result[name] = {
                "ok": True,
                "seconds": time.perf_counter() - tic,
                "warnings": [str(w.message)[:300] for w in caught],
                "stats": _stats(device),
            }
            return value
        except Exception as error:  # noqa: BLE001 - recorded, the next attempt runs
            result[name] = {
                "ok": False,
                "error": f"{type(error).__name__}: {str(error)[:600]}",
                "seconds": time.perf_counter() - tic,
                "stats": _stats(device),
            }
            return None

    value = attempt("pymc_vmap", lambda: _postprocess_samples(fn, raw, None, "vmap", False))
    if value is not None:
        reference = [np.asarray(v) for v in value]
        del value
    result["draws_intact_after_pymc"] = not any(x.is_deleted() for x in raw)
    plan = attempt("plan_auto", lambda: pc.plan(fn, raw))
    if plan is not None:
        result["plan_auto"]["plan"] = _plan_dict(plan)
    got = attempt("auto", lambda: run(fn, raw, None, "auto", False))
    if got is not None:
        outputs, plan = got
        result["auto"]["plan"] = _plan_dict(plan)
        if reference is None:  # pymc could not fit it on the GPU: compare with the CPU
            reference = [
                np.asarray(v)
                for v in _postprocess_samples(
                    fn, [np.asarray(x) for x in raw], "cpu", "scan", False
                )
            ]
        result["auto"]["max_rel_diff"] = _max_rel_diff(outputs, reference)
        del outputs, got  # free the device buffers before the next case
    # A real out-of-memory error: a budget that lies (100 GiB) lets one chunk of every draw
    # through the planner; the run must fail on the device, retry smaller and keep the draws.
    got = attempt(
        "forced_retry",
        lambda: run(
            fn,
            raw,
            None,
            "chunked",
            True,
            chunk_size=n_items,
            memory_budget=100 * GiB,
        ),
    )
    if got is not None:
        outputs, plan = got
        result["forced_retry"]["plan"] = _plan_dict(plan)
        if reference is not None:
            result["forced_retry"]["max_rel_diff"] = _max_rel_diff(outputs, reference)
        del outputs, got
    result["draws_deleted_after_retry"] = [x.is_deleted() for x in raw]
    fn, raw = _big_det()
    attempt("budget_below_outputs", lambda: pc.plan(fn, raw, memory_budget=2**20))
    return result


def _max_rel_diff(outputs, reference) -> float:
    import numpy as np

    worst = 0.0
    for got, want in zip(outputs, reference):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            return float("inf")
        scale = np.maximum(np.abs(want), 1e-300)
        worst = max(worst, float(np.max(np.abs(got - want) / scale, initial=0.0)))
    return worst


def _precision_model(rows: int, float_x: str):
    """A regression of `rows` rows and 8 features in `float_x`, with an observation-level
    deterministic `mu = X @ beta` (the same data whatever `float_x`)."""
    import numpy as np
    import pymc as pm
    import pytensor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8))
    y = x @ rng.normal(size=8) + rng.normal(size=rows)
    with pytensor.config.change_flags(floatX=float_x), pm.Model() as model:
        data = pm.Data("X", x.astype(float_x))
        beta = pm.Normal("beta", 0.0, 1.0, shape=8)
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = pm.Deterministic("mu", data @ beta)
        pm.Normal("y", mu, sigma, observed=y.astype(float_x))
    return model


def section_precision(quick: bool) -> dict:
    """The post-hoc routes' error on the default device against pymc's own and a float64
    reference, at the routes' default precision and at JAX's (this process: float32)."""
    import jax
    import numpy as np
    import pymc as pm
    import pytensor
    import xarray as xr

    import pymc_chunkpost as pc

    jax.numpy.zeros(1).block_until_ready()  # the device opened before any timer
    rows, chains, draws = (2_000, 2, 100) if quick else (20_000, 4, 1_000)
    model = _precision_model(rows, "float32")
    reference_model = _precision_model(rows, "float64")
    rng = np.random.default_rng(1)
    beta = rng.normal(size=(chains, draws, 8))
    sigma = np.abs(rng.normal(size=(chains, draws))) + 0.5

    def posterior(dtype):
        data = {"beta": (("chain", "draw", "beta_dim_0"), beta.astype(dtype))}
        data["sigma"] = (("chain", "draw"), sigma.astype(dtype))
        dataset = xr.Dataset(data, coords={"chain": range(chains), "draw": range(draws)})
        if int(pm.__version__.split(".")[0]) >= 6:
            return xr.DataTree.from_dict({"posterior": dataset})
        import arviz as az

        return az.InferenceData(posterior=dataset)

    routes = {
        "compute_log_likelihood": ("y", lambda f, m, i, **o: f(i, model=m, **o)),
        "compute_log_prior": ("beta", lambda f, m, i, **o: f(i, model=m, **o)),
        "compute_deterministics": ("mu", lambda f, m, i, **o: f(i.posterior, model=m, **o)),
    }
    record: dict = {"device": str(jax.devices()[0]), "rows": rows, "draws": chains * draws}
    record["floatX"] = pytensor.config.floatX
    for name, (variable, call) in routes.items():
        pymc_own = getattr(pm, name) if hasattr(pm, name) else getattr(pm.stats, name)
        quiet: dict = {"progressbar": False}
        if name != "compute_deterministics":
            quiet["extend_inferencedata"] = False
        theirs64 = call(pymc_own, reference_model, posterior(np.float64), **quiet)[variable]
        tic = time.perf_counter()
        theirs = call(pymc_own, model, posterior(np.float32), **quiet)[variable]
        row = {"pymc_seconds": time.perf_counter() - tic}
        scale = float(np.max(np.abs(theirs64.values)))
        row["pymc_vs_float64"] = float(np.max(np.abs(theirs.values - theirs64.values))) / scale
        for precision in ("highest", None):
            times = []
            for _ in range(2):  # cold, then warm
                tic = time.perf_counter()
                ours = call(
                    getattr(pc, name),
                    model,
                    posterior(np.float32),
                    matmul_precision=precision,
                    **quiet,
                )[variable].values
                times.append(time.perf_counter() - tic)
            label = precision or "jax_default"
            row[f"{label}_cold_seconds"], row[f"{label}_warm_seconds"] = times
            row[f"{label}_vs_pymc"] = float(np.max(np.abs(ours - theirs.values))) / scale
            row[f"{label}_vs_float64"] = float(np.max(np.abs(ours - theirs64.values))) / scale
        record[name] = row
    return record


def section_fixtures(quick: bool) -> dict:
    _setup()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from pymc.sampling.jax import _postprocess_samples

    from pymc_chunkpost import postprocess_samples_with_plan as run
    from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn, raw_draws

    names = ["eight_schools", "lkj", "gp", "hierarchical", "wide", "many_scalars", "big_det"]
    result = {"platform": jax.devices()[0].platform, "rows": []}
    for name in names:
        spec = FIXTURES[name]
        model = spec.build()
        fn = jax_fn(model)
        shapes = [(spec.chains, spec.draws if not quick else 50), (1, 1), (3, 37)]
        for chains, draws in shapes:
            host = raw_draws(model, chains, draws, 1)
            tic = time.perf_counter()
            reference = [np.asarray(v) for v in _postprocess_samples(fn, host, None, "vmap")]
            pymc_seconds = time.perf_counter() - tic
            cases = [("auto", None, {}), ("chunked", None, {"chunk_size": 7}), ("auto", "cpu", {})]
            for strategy, backend, options in cases:
                raw = [jnp.asarray(x) for x in host]
                tic = time.perf_counter()
                row = {"fixture": name, "shape": [chains, draws], "strategy": strategy}
                row |= {"backend": backend, **options}
                try:
                    outputs, plan = run(fn, raw, backend, strategy, True, **options)
                    jax.block_until_ready(outputs)
                    row["seconds"] = time.perf_counter() - tic
                    row["pymc_vmap_seconds"] = pymc_seconds
                    row["plan"] = f"{plan.strategy} {plan.chunk_size or ''} {plan.loop}"
                    row["max_rel_diff"] = _max_rel_diff(outputs, reference)
                    row["devices"] = sorted({str(d) for o in outputs for d in o.devices()})
                except Exception as error:  # noqa: BLE001
                    row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
    return result


def section_sample(quick: bool) -> dict:
    _setup()
    import jax
    import numpy as np
    import pymc as pm

    import pymc_chunkpost as pc

    pymc6 = int(pm.__version__.split(".")[0]) >= 6
    rng = np.random.default_rng(0)
    group = np.arange(40) % 4
    with pm.Model(coords={"group": range(4)}) as model:
        x = pm.Data("x", rng.normal(size=40))
        mu = pm.Normal("mu", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        theta = pm.Normal("theta", mu, sigma, dims="group")
        w = pm.Dirichlet("w", np.ones(3))
        cut = pm.Normal(
            "cut",
            [-1, 0, 1],
            1,
            transform=pm.distributions.transforms.ordered,
        )
        pm.Deterministic("eta", theta[group] + x, dims=None)
        pm.Deterministic("w_sum", w.sum() + cut.sum())
        pm.Normal("y", theta[group] + x, 1, observed=rng.normal(size=40))
    draws = 100
    result = {"platform": jax.devices()[0].platform, "rows": []}
    key = "nuts" if pymc6 else "nuts_sampler_kwargs"

    def sample(sampler, options, patched):
        common = dict(
            draws=draws,
            tune=draws,
            chains=2,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
            nuts_sampler=sampler,
        )
        # One GPU: pmap ("parallel", the default) over 2 chains would need 2 devices.
        options = {"chain_method": "vectorized"} | options
        if not patched:
            options = {k: v for k, v in options.items() if not k.startswith("postprocessing_v")}
        with model, pc.patched() if patched else contextlib.nullcontext():
            return pm.sample(**common, **{key: options})

    runs = [("numpyro", None, ("auto", "chunked")), ("numpyro", "cpu", ("auto",))]
    runs += [("blackjax", None, ("auto",))]
    for sampler, backend, strategies in runs:
        base = {} if backend is None else {"postprocessing_backend": backend}
        row = {"sampler": sampler, "backend": backend}
        try:
            reference = sample(sampler, base, False)
            control = sample(sampler, base, False)  # pymc against itself, same seed
            row["control_max_rel_diff"] = max(
                _max_rel_diff([control.posterior[k].values], [reference.posterior[k].values])
                for k in reference.posterior.data_vars
            )
            for strategy in strategies:
                tic = time.perf_counter()
                idata = sample(sampler, base | {"postprocessing_vectorize": strategy}, True)
                worst = 0.0
                for name in reference.posterior.data_vars:
                    worst = max(
                        worst,
                        _max_rel_diff(
                            [idata.posterior[name].values], [reference.posterior[name].values]
                        ),
                    )
                row[strategy] = {
                    "seconds": time.perf_counter() - tic,
                    "max_rel_diff": worst,
                    "attrs": {
                        k: str(v)
                        for k, v in idata.posterior.attrs.items()
                        if k.startswith("postprocessing")
                    },
                }
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
            row["traceback"] = traceback.format_exc()[-1500:]
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    return result


def child_store(quick: str) -> dict:
    """One process of the `store` section: `auto` on three fixtures, on the default device
    and with `postprocessing_backend="cpu"`, against pymc's values."""
    _setup()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _internals import wait_for_disk
    from pymc.sampling.jax import _postprocess_samples

    from pymc_chunkpost import postprocess_samples_with_plan as run
    from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn, raw_draws

    rows = []
    for name in ("eight_schools", "gp", "hierarchical"):
        spec = FIXTURES[name]
        model = spec.build()
        fn = jax_fn(model)
        host = raw_draws(model, spec.chains, 50 if quick == "quick" else spec.draws, 1)
        reference = [np.asarray(v) for v in _postprocess_samples(fn, host, None, "vmap")]
        for backend in (None, "cpu"):
            raw = [jnp.asarray(x) for x in host]
            tic = time.perf_counter()
            outputs, plan = run(fn, raw, backend, "auto", True)
            jax.block_until_ready(outputs)
            rows.append(
                {
                    "fixture": name,
                    "backend": backend,
                    "seconds": time.perf_counter() - tic,
                    "loaded": "loaded from disk" in plan.reason,
                    "compile_seconds": plan.compile_seconds,
                    "max_rel_diff": _max_rel_diff(outputs, reference),
                    "devices": sorted({str(d) for o in outputs for d in o.devices()}),
                }
            )
    wait_for_disk()
    return {"platform": jax.devices()[0].platform, "rows": rows}


def _child(args: list[str], timeout: float, env: dict | None = None) -> dict:
    command = [sys.executable, __file__, "--gpu-child", *args]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as expired:
        partial = expired.stdout or ""
        partial = partial.decode() if isinstance(partial, bytes) else partial
        return {"args": args, "error": f"over {timeout} s", "partial": partial[-6000:]}
    if done.returncode != 0:
        return {"args": args, "error": done.stderr.strip()[-1500:], "partial": done.stdout[-6000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# Outputs in host memory (issue 14): `--sections gpu_host_output`.

#: The chunk step's chunk on the GPU: 64 draws of the 100k-point deterministic (51 MB of outputs).
HOST_OUTPUT_CHUNK = 64


def child_host_output(n_obs: str, chunk_size: str, transfer: str) -> dict:
    """In a process whose pool is smaller than the outputs: `stream_to_host` with one
    transfer, pymc's CPU backend as the reference, and the device's peak memory."""
    _setup()
    import jax
    import numpy as np
    from _internals import Transfer, compile_host_chunks, stream_to_host
    from pymc.sampling.jax import _postprocess_samples

    from pymc_chunkpost.profiling.fixtures import big_det, jax_fn, raw_draws

    planned = transfer == "auto"  # `postprocess_samples(..., "auto")`, as users call it
    n_obs, chunk_size = int(n_obs), int(chunk_size)
    pinned_output = transfer == "pinned_output"  # compiled into pinned host memory
    if planned:
        transfer = Transfer.PINNED_COPY
    else:
        transfer = Transfer.VIEW if pinned_output else Transfer(transfer)
    device = jax.devices()[0]
    model = big_det(n_obs=n_obs)
    fn = jax_fn(model)
    host = raw_draws(model, 4, 1000, 0)
    result = {"platform": device.platform, "transfer": "auto" if planned else transfer.value}
    if pinned_output:
        result["transfer"] = "pinned_output"
    result["stats_at_start"] = _stats(device)
    raw = [jax.device_put(x, device) for x in host]
    jax.block_until_ready(raw)
    draws_bytes = sum(x.nbytes for x in raw)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in raw]
    out_specs = jax.eval_shape(jax.vmap(jax.vmap(fn)), *specs)
    result["output_GiB"] = sum(np.prod(s.shape) * s.dtype.itemsize for s in out_specs) / GiB
    result["draws_bytes"] = draws_bytes
    result["memories"] = [m.kind for m in device.addressable_memories()]

    # The reference: pymc's own post-processing on the CPU, the usual advice for this case.
    tic = time.perf_counter()
    reference = [np.asarray(v) for v in _postprocess_samples(fn, host, "cpu", "vmap", False)]
    result["pymc_cpu_seconds"] = time.perf_counter() - tic
    try:
        if planned:
            from pymc_chunkpost import postprocess_samples_with_plan

            tic = time.perf_counter()
            outputs, plan = postprocess_samples_with_plan(fn, raw, None, "auto", False)
            outputs = [np.asarray(x) for x in outputs]
            result["compile_seconds"] = 0.0  # inside the call
            result["run_seconds"] = time.perf_counter() - tic
            result["plan"] = {k: str(v) for k, v in plan.__dict__.items()}
            result["output_memory"] = plan.output_memory
            chunk_size = int(plan.chunk_size or 1)
            compiled = compile_host_chunks(fn, specs, chunk_size)
        else:
            tic = time.perf_counter()
            if pinned_output:
                from bench_host_output import compile_pinned_output

                compiled = compile_pinned_output(fn, specs, chunk_size)
            else:
                compiled = compile_host_chunks(fn, specs, chunk_size)
            result["compile_seconds"] = time.perf_counter() - tic
        memory = compiled.memory_analysis()
        chunk_bytes = int(memory.output_size_in_bytes) + int(memory.temp_size_in_bytes)
        result["chunk_working_set_bytes"] = chunk_bytes
        if not planned:
            tic = time.perf_counter()
            outputs = stream_to_host(compiled, raw, 4000, chunk_size, out_specs, transfer=transfer)
            result["run_seconds"] = time.perf_counter() - tic
        total = result["compile_seconds"] + result["run_seconds"]
        result["speedup_vs_pymc_cpu"] = result["pymc_cpu_seconds"] / total
        result["max_rel_diff"] = _max_rel_diff(outputs, reference)
        result["draws_intact"] = not any(x.is_deleted() for x in raw)
        stats = _stats(device)
        result["stats"] = stats
        # The draws, two chunks' working sets, and the model's design matrix (a constant of
        # the executable, n_obs x 10 float64).
        bound = draws_bytes + 2 * chunk_bytes + n_obs * 10 * 8
        result["peak_bound_bytes"] = bound
        peak = stats.get("peak_bytes_in_use")
        result["peak_within_bound"] = None if peak is None else peak <= bound
        result["ok"] = (
            result["max_rel_diff"] < 1e-10
            and result["speedup_vs_pymc_cpu"] >= 3
            and result["peak_within_bound"] is not False
            and result["draws_intact"]
            and (not planned or device.platform == "cpu" or result["output_memory"] == "host")
        )
    except Exception as error:  # noqa: BLE001 - recorded for the report
        result["error"] = f"{type(error).__name__}: {str(error)[:600]}"
        result["stats"] = _stats(device)
        result["ok"] = False
    return result


def section_host_output(quick: bool = False, pool_gib: float = 1.0) -> dict:
    """Issue 14's acceptance: a ~1 GiB pool, 3 GiB of outputs streamed to host memory.

    "auto" is `postprocess_samples(..., "auto")` as a user calls it: it must plan host
    outputs by itself. The others drive the mechanism with one transfer each. Checks per
    case: success, peak device memory <= the draws + 2 chunks' working sets (outputs +
    temporaries of the compiled step), >= 3x faster (compile + run) than pymc's
    `postprocessing_backend="cpu"`, and the values equal to pymc's. The pool's fraction comes
    from the GPU's total memory (`nvidia-smi`), so that the pool is about `pool_gib`.
    On a CPU it runs with small sizes (`quick`), the pool setting having no effect there.
    """
    n_obs = 2_000 if quick else 100_000  # 4 x 1000 draws x 100k x 8 bytes: 3.0 GiB
    env = {}
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        total_gib = float(done.stdout.split()[0]) / 1024  # MiB
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, pool_gib / total_gib):.4f}"
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        total_gib = None  # no GPU: the CPU try-out
    result = {"env": env, "gpu_total_GiB": total_gib}
    for transfer in ("auto", "pinned_copy", "pinned_output", "view"):
        # One fresh process per transfer: the device's peak is per process.
        args = (str(n_obs), str(HOST_OUTPUT_CHUNK), transfer)
        code = (
            f"import sys, json; sys.path.insert(0, {str(HERE)!r}); "
            f"import accelerator_check as a; print(json.dumps(a.child_host_output(*{args!r}), "
            "default=str))"
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=ROOT,
                env={**os.environ, **env},
            )
        except subprocess.TimeoutExpired as expired:
            partial = expired.stdout or ""
            partial = partial.decode() if isinstance(partial, bytes) else partial
            result[transfer] = {"error": "over 300 s", "partial": partial[-3000:]}
            continue
        if done.returncode != 0:
            result[transfer] = {"error": done.stderr.strip()[-2000:]}
        else:
            result[transfer] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({transfer: result[transfer]}, default=str)[:2000], flush=True)
    return result


def gpu_child(kind: str, *rest: str) -> int:
    """One fresh process of a GPU section: prints its record as the last line."""
    children = {
        "memory": child_memory,
        "oom": child_oom,
        "fixtures": lambda quick: section_fixtures(quick == "quick"),
        "sample": lambda quick: section_sample(quick == "quick"),
        "store": child_store,
    }
    print(json.dumps(children[kind](*rest), default=str))
    return 0


def gpu_section(section: str, out: Path, quick: bool) -> int:
    """One GPU section, its cases in fresh processes: writes `out/<section>.json`."""
    tic = time.perf_counter()
    try:
        value = _gpu_value(section.removeprefix("gpu_"), out, quick)
    except Exception as error:  # noqa: BLE001 - recorded; the next section still runs
        value = {"error": f"{type(error).__name__}: {error}", "tb": traceback.format_exc()}
    value = {"section_seconds": time.perf_counter() - tic, "result": value}
    (out / f"{section}.json").write_text(json.dumps(value, indent=1, default=str))
    print(json.dumps(value, default=str)[:3000], flush=True)
    return 0


def _gpu_value(name: str, out: Path, quick: bool) -> dict:
    size = "quick" if quick else "full"
    if name == "memory":
        return {s: _child(["memory", s], 60, _ENV.get(s)) for s in MEMORY_SETTINGS}
    if name == "oom":
        return {
            f: _child(["oom", f], 90, {"XLA_PYTHON_CLIENT_MEM_FRACTION": f})
            for f in ("0.008", "0.02")
        }
    if name in ("fixtures", "sample"):
        # NUTS on a GPU is not reproducible run to run by default (scatter-adds in gradients
        # use atomics): compare with deterministic ops.
        return _child([name, size], 200, {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"})
    if name == "host_output":
        return section_host_output(quick=quick)
    if name == "store":
        with tempfile.TemporaryDirectory() as cache:
            env = {"PYMC_CHUNKPOST_CACHE_DIR": cache}
            return {run: _child(["store", size], 200, env) for run in ("first", "second")}
    assert name == "bench", name
    cases = "pymc_vmap,lax_map:64,lax_map:4000,auto,auto_progress"
    command = [sys.executable, str(HERE / "probes" / "bench_postprocess.py"), "--fixtures"]
    command += ["big_det", "--cases", cases, "--repeat", "1", "--out", str(out / "bench.md")]
    done = subprocess.run(
        command + (["--draws", "100"] if quick else []),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    return {"stdout": done.stdout[-4000:], "stderr": done.stderr[-3000:]}


def _device() -> str:
    code = "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-200:]


if __name__ == "__main__":
    sys.exit(main())
