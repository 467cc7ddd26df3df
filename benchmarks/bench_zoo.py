"""The zoo benchmark: `auto`, cold and warm, against every anchor, on every zoo model.

    python benchmarks/bench_zoo.py --repeats 3 --json zoo.json --out zoo.md
    python benchmarks/bench_zoo.py --models gp,basis --devices 4   # draws sharded over 4 devices
    python benchmarks/bench_zoo.py --models gp --host-devices 4    # one device of a JAX with 4
    python benchmarks/bench_zoo.py --list
    python benchmarks/bench_zoo.py --smoke                         # 2 models, 1 repeat, < 1 min

Each run is one case on one model in a fresh Python process. The cases run round-robin (one
run of every case, then the next repeat), so that a drift in machine speed hits them alike.

Cases:
- `auto_cold`: `pymc_chunkpost.postprocess_samples_with_plan(..., "auto")` in a process
  whose tuning cache (`PYMC_CHUNKPOST_CACHE_DIR`) is a new empty directory and without JAX's
  persistent compilation cache (`JAX_COMPILATION_CACHE_DIR` unset): nothing is left from an
  earlier run.
- `auto_warm`: the same, in a new process that reuses the directory the same repeat's cold
  run left.
- `pymc_vmap`, `pymc_scan`: `pymc.sampling.jax._postprocess_samples` (pymc's "scan" is not
  jitted and slow: it has its own `--scan-timeout`, and after a timeout it is not run again
  on that model).
- `lax_map:B`: `jax.lax.map(f, xs, batch_size=B)` over the flattened chain x draw axis, jitted.
- `soft_vmap:B`: `numpyro.util.soft_vmap(f, xs, chunk_size=B)` over the same axis, jitted.
- `shard_map:B` (only with `--devices N`, N > 1): `jax.shard_map` over the chain devices of
  `lax.map(batch_size=B)` on each device's chains.

In each run the model is built, the raw draws are placed on the device(s) and a trivial
function is compiled (a session that has just sampled has paid JAX's first-lowering costs),
Python's garbage is collected, and then only the post-processing call is timed, from just
before it to `block_until_ready` after it: tracing, planning, compiling and running. Every
case donates the draws, as `pymc.sampling.jax.sample_jax_nuts` does. Peak memory is the
process's `VmHWM` after `echo 5 > /proc/self/clear_refs` right before the call; the table
shows it less the `VmRSS` before the call ("peak extra"), against the floor: the bytes of
the outputs that do not pass an input through. With `--devices N` the N devices are CPU
devices in one RAM, so the peak is the process's, and the floor is all devices' share.

Host devices: a run with `--devices 1` keeps the 100 CPU devices that `pymc.sampling.jax`
forces at import, as pymc's users have them; with `--devices N` its JAX has N. On a CPU
that count sets XLA's compute threads, which slows loops on a small machine (README, "On a
CPU: one JAX device per chain"): `--host-devices H` gives every run H, so that both settings
can be measured side by side.

After timing, every run compares its outputs with pymc's own "vmap" outputs, computed once per
model in a separate process and saved: integers exactly, floats within `rtol=1e-10` plus
`1e-12` times the output's largest magnitude (summation orders differ between strategies).
A wrong answer is flagged in the tables and can never look fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAX_MAP_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
SOFT_VMAP_CHUNK = 8
SHARD_MAP_BATCH = 8
AUTO_CASES = ("auto_cold", "auto_warm")
SMOKE_MODELS = ("eight_schools", "integer_dets")
SMOKE_CASES = ("auto_cold", "auto_warm", "lax_map:8")
RTOL, SCALED_ATOL = 1e-10, 1e-12
CACHE_ENV = "PYMC_CHUNKPOST_CACHE_DIR"


def default_cases(devices: int) -> list[str]:
    """Every case: `auto` cold and warm, then the anchors."""
    cases = [*AUTO_CASES, "pymc_vmap", "pymc_scan"]
    cases += [f"lax_map:{b}" for b in LAX_MAP_BATCHES]
    cases.append(f"soft_vmap:{SOFT_VMAP_CHUNK}")
    if devices > 1:
        cases.append(f"shard_map:{SHARD_MAP_BATCH}")
    return cases


def check_cases(cases: list[str], devices: int) -> None:
    """Raise `ValueError` for an unknown case, a bad batch, or a warm run without a cold one."""
    for case in cases:
        name, sep, batch = case.partition(":")
        if name in (*AUTO_CASES, "pymc_vmap", "pymc_scan") and not sep:
            continue
        if name in ("lax_map", "soft_vmap", "shard_map") and batch.isdigit() and int(batch) > 0:
            if name == "shard_map" and devices < 2:
                raise ValueError(f"Case {case!r} needs `--devices N` with N >= 2.")
            continue
        raise ValueError(
            f"Unknown case {case!r}. Pass cases among auto_cold, auto_warm, pymc_vmap, "
            "pymc_scan, lax_map:B, soft_vmap:B and (with --devices) shard_map:B, B a positive int."
        )
    if "auto_warm" in cases and "auto_cold" not in cases:
        raise ValueError("Case 'auto_warm' reuses the cache of 'auto_cold'; pass both.")


# --------------------------------------------------------------------------------------------
# The child: one case on one model, in this fresh process.


def _jsonable(value):
    """`value` with what JSON cannot hold left out (enums become their values)."""
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            item = _jsonable(item)
            if item is not _DROP:
                out[str(key)] = item
        return out
    if isinstance(value, list | tuple):
        return [item for item in map(_jsonable, value) if item is not _DROP]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return _DROP
    return value


_DROP = object()


def _passed_through(fn, raw) -> list[bool]:
    """Which outputs of `fn` are its inputs unchanged (no new memory: not in the floor)."""
    import jax

    specs = [jax.ShapeDtypeStruct(x.shape[2:], x.dtype) for x in raw]
    closed = jax.make_jaxpr(lambda *xs: list(fn(*xs)))(*specs)
    invars = set(closed.jaxpr.invars)
    return [not hasattr(v, "val") and v in invars for v in closed.jaxpr.outvars]


def _place(raw, devices: int):
    """The draws as jax arrays: on the default device, or as pymc's parallel chains leave
    them, a `NamedSharding` over `devices` devices on the chain axis."""
    import jax
    import jax.numpy as jnp

    if devices <= 1:
        placed = [jnp.asarray(x) for x in raw]
    else:
        sharding = _chain_sharding(devices)
        placed = [jax.device_put(x, sharding) for x in raw]
    jax.block_until_ready(placed)
    return placed


def _chain_mesh(devices: int):
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("chain",))


def _chain_sharding(devices: int):
    import jax

    return jax.sharding.NamedSharding(_chain_mesh(devices), jax.sharding.PartitionSpec("chain"))


def _shard_map():
    import jax

    if hasattr(jax, "shard_map"):  # jax >= 0.7; the same signature in jax 0.10 and 0.12
        return jax.shard_map
    from jax.experimental.shard_map import shard_map

    return shard_map


def _compare(outputs, ref_dir: Path, dtypes: list[str]) -> dict:
    """Outputs against pymc's saved "vmap" outputs: integers exactly, floats within
    `RTOL` plus `SCALED_ATOL` times the output's largest magnitude."""
    import numpy as np

    worst, mismatched = 0.0, []
    for i, out in enumerate(outputs):
        want = np.load(ref_dir / f"{i}.npy", mmap_mode="r")
        got = np.asarray(out)
        if got.shape != want.shape or str(got.dtype) != dtypes[i]:
            mismatched.append(f"{i}: {got.shape} {got.dtype} != {want.shape} {dtypes[i]}")
            continue
        exact = not np.issubdtype(want.dtype, np.inexact)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        for c in range(want.shape[0]):  # chain by chain: a bounded temporary
            a, b = np.asarray(want[c]), got[c]
            if exact:
                if not np.array_equal(a, b):
                    mismatched.append(f"{i}: integers differ")
                    break
                continue
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                mismatched.append(f"{i}: NaNs differ")
                break
            err = np.abs(a - b)
            allowed = RTOL * np.abs(a) + SCALED_ATOL * scale
            if np.any(err > allowed):
                mismatched.append(f"{i}: off by {float(np.nanmax(err)):.3g} (scale {scale:.3g})")
                break
            if err.size:
                worst = max(worst, float(np.nanmax(err)) / max(scale, 1e-300))
    return {"matches_pymc": not mismatched, "mismatch": mismatched[:5], "max_scaled_error": worst}


def child(model: str, case: str, chains: int, draws: int, devices: int, ref_dir: str) -> dict:
    """Run one case of one model in this fresh process; returns its measurements."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import tqdm.auto  # noqa: F401 - loaded in any session that sampled with numpyro

    from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn
    from pymc_chunkpost.profiling.proc import reset_peak, status_bytes

    if devices > 1 and jax.device_count() < devices:
        raise RuntimeError(f"{devices} devices wanted, {jax.device_count()} present")
    spec = FIXTURES[model]
    built = spec.build()
    fn = jax_fn(built)
    host_draws = spec.raw_draws(built, chains, draws, seed=0)
    passed = _passed_through(fn, host_draws)
    raw = _place(host_draws, 1 if case == "reference" else devices)
    del host_draws
    # A session that has just sampled has lowered and compiled before: pay JAX's one-time
    # costs of a first lowering here, not in whichever case is timed.
    jax.block_until_ready(jax.jit(lambda x: x + 1).lower(raw[-1]).compile()(raw[-1]))
    name, _, batch = case.partition(":")
    n = chains * draws
    result = {"model": model, "case": case, "chains": chains, "draws": draws, "devices": devices}

    def flat(mapper):
        """`mapper(g, flat_inputs)` over the flattened chain x draw axis, jitted, donated."""

        def g(args):
            return list(fn(*args))

        def whole(*xs):
            flat_xs = [x.reshape((n,) + x.shape[2:]) for x in xs]
            return [y.reshape((chains, draws) + y.shape[1:]) for y in mapper(g, flat_xs)]

        return jax.jit(whole, donate_argnums=tuple(range(len(raw))))

    def sharded_lax_map(size):
        """Each chain device maps its own chains, `lax.map(batch_size=size)`; nothing moves."""
        from jax.sharding import PartitionSpec

        def per_shard(*xs):
            c, d = xs[0].shape[:2]
            flat_xs = [x.reshape((c * d,) + x.shape[2:]) for x in xs]
            ys = jax.lax.map(lambda a: list(fn(*a)), flat_xs, batch_size=size)
            return [y.reshape((c, d) + y.shape[1:]) for y in ys]

        spec = PartitionSpec("chain")
        mapped = _shard_map()(
            per_shard, mesh=_chain_mesh(devices), in_specs=spec, out_specs=spec, check_vma=False
        )
        return jax.jit(mapped, donate_argnums=tuple(range(len(raw))))

    # With pymc loaded, one full collection takes about 0.2 s: start with none pending.
    gc.collect()
    rss_before = status_bytes("VmRSS")
    reset_peak()
    tic = time.perf_counter()
    if name in AUTO_CASES:
        from pymc_chunkpost import postprocess_samples_with_plan

        outputs, plan = postprocess_samples_with_plan(fn, raw, None, "auto", True)
    elif name in ("pymc_vmap", "reference"):
        from pymc.sampling.jax import _postprocess_samples

        outputs = _postprocess_samples(fn, raw, None, "vmap", name == "pymc_vmap")
    elif name == "pymc_scan":
        from pymc.sampling.jax import _postprocess_samples

        outputs = _postprocess_samples(fn, raw, None, "scan", True)
    elif name == "lax_map":
        outputs = flat(lambda g, xs: jax.lax.map(g, xs, batch_size=int(batch)))(*raw)
    elif name == "soft_vmap":
        from numpyro.util import soft_vmap

        outputs = flat(lambda g, xs: soft_vmap(g, xs, batch_ndims=1, chunk_size=int(batch)))(*raw)
    elif name == "shard_map":
        outputs = sharded_lax_map(int(batch))(*raw)
    else:
        raise ValueError(f"unknown case {case!r}")
    jax.block_until_ready(outputs)
    seconds = time.perf_counter() - tic
    vmhwm = status_bytes("VmHWM")
    result.update(
        seconds=seconds,
        vmhwm_bytes=vmhwm,
        rss_before_bytes=rss_before,
        peak_extra_bytes=vmhwm - rss_before,
        output_bytes=sum(int(o.nbytes) for o in outputs),
        floor_bytes=sum(int(o.nbytes) for o, p in zip(outputs, passed) if not p),
        output_devices=max(len(o.devices()) for o in outputs),
    )
    if name in AUTO_CASES:
        result["plan"] = _jsonable(dataclasses.asdict(plan))
    dtypes = [str(o.dtype) for o in outputs]
    if name == "reference":
        for i, out in enumerate(outputs):
            np.save(Path(ref_dir) / f"{i}.npy", np.asarray(out))
        result["dtypes"] = dtypes
        (Path(ref_dir) / "meta.json").write_text(json.dumps(result))
    else:
        meta = json.loads((Path(ref_dir) / "meta.json").read_text())
        result.update(_compare(outputs, Path(ref_dir), meta["dtypes"]))
    return result


# --------------------------------------------------------------------------------------------
# The parent: round-robin over fresh processes, then the tables.


def host_device_count(devices: int, host_devices: int | None) -> int | None:
    """The CPU devices a child's JAX has: `host_devices` if given, else `devices` when the
    draws are sharded, else None (pymc's 100, forced at import, as its users have them)."""
    if host_devices is not None:
        return host_devices
    return devices if devices > 1 else None


def _child_env(devices: int, cache_dir: str, host_devices: int | None = None) -> dict:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env[CACHE_ENV] = cache_dir
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    count = host_device_count(devices, host_devices)
    if count is not None:
        # Last on the line, so that it wins over the 100 devices that pymc.sampling.jax puts
        # first at import (its rewrite keeps a last flag that no whitespace follows).
        flags = env.get("XLA_FLAGS", "").split()
        flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    return env


def run_child(
    model, case, chains, draws, devices, ref_dir, cache_dir, timeout, host_devices=None
) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        json.dumps([model, case, chains, draws, devices, str(ref_dir)]),
    ]
    head = {"model": model, "case": case}
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=_child_env(devices, cache_dir, host_devices),
        )
    except subprocess.TimeoutExpired:
        return {**head, "error": f"timeout: over {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {**head, "error": (done.stderr.strip() or done.stdout.strip())[-400:]}
    return json.loads(lines[-1])


def _median(xs):
    return statistics.median(xs) if xs else None


def summarise(runs: list[dict], cases: list[str]) -> list[dict]:
    """Per model: each case's median and spread, the best anchor, and `auto`'s ratios."""
    summary = []
    for model in dict.fromkeys(r["model"] for r in runs):
        per_case = {}
        for case in cases:
            mine = [r for r in runs if r["model"] == model and r["case"] == case]
            ok = [r for r in mine if "error" not in r]
            if not mine:
                continue
            seconds = [r["seconds"] for r in ok]
            peaks = [r["peak_extra_bytes"] for r in ok]
            per_case[case] = {
                "runs": len(mine),
                "errors": [r["error"][:120] for r in mine if "error" in r],
                "median_s": _median(seconds),
                "min_s": min(seconds) if seconds else None,
                "max_s": max(seconds) if seconds else None,
                "peak_extra_bytes": _median(peaks),
                "floor_bytes": ok[0]["floor_bytes"] if ok else None,
                "matches_pymc": all(r.get("matches_pymc", False) for r in ok) if ok else None,
                "plans": sorted({_plan_text(r["plan"]) for r in ok if "plan" in r}),
                "output_devices": max((r["output_devices"] for r in ok), default=None),
            }
        anchors = {
            c: s["median_s"]
            for c, s in per_case.items()
            if c not in AUTO_CASES and s["median_s"] is not None and s["matches_pymc"]
        }
        best = min(anchors, key=anchors.get) if anchors else None
        row = {"model": model, "cases": per_case, "best_anchor": best}
        row["best_anchor_s"] = anchors.get(best)
        for case in AUTO_CASES:
            s = per_case.get(case)
            ratio = None
            if s and s["median_s"] is not None and best is not None:
                ratio = s["median_s"] / anchors[best]
            row[f"{case}_ratio"] = ratio
            row[f"{case}_paired"] = _paired(runs, model, case, best)
        summary.append(row)
    return summary


def _paired(runs: list[dict], model: str, case: str, anchor: str | None) -> dict | None:
    """`case`'s time over `anchor`'s in each round-robin repeat that ran both: the median
    and spread of those ratios. Both ran in the same round, minutes apart at most, so a
    slow spell of the machine divides out; the ratio of medians keeps it."""
    if anchor is None:
        return None
    seconds: dict = {}
    for r in runs:
        if r["model"] == model and r["case"] in (case, anchor) and "error" not in r:
            if r.get("repeat") is None:
                continue  # unpaired: no round to pair it with
            seconds.setdefault(r.get("repeat"), {})[r["case"]] = r["seconds"]
    ratios = [x[case] / x[anchor] for x in seconds.values() if case in x and anchor in x]
    if not ratios:
        return None
    return {"median": _median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def _paired_text(paired: dict | None) -> str:
    if paired is None:
        return "–"
    return f"{paired['median']:.2f} ({paired['min']:.2f}-{paired['max']:.2f})"


def _plan_text(plan: dict) -> str:
    text = str(plan.get("strategy"))
    if plan.get("chunk_size"):
        text += f" {plan['chunk_size']}"
    if plan.get("loop"):
        text += f" ({plan['loop']})"
    return text


def _f(x, spec=".3f", missing="–"):
    return missing if x is None else format(x, spec)


def tables(summary: list[dict]) -> str:
    """The markdown: one line per model, then one table per model."""
    lines = [
        "| model | best anchor | best s | cold auto s | cold / best | cold / best, paired "
        "| warm auto s | warm / best | warm / best, paired | auto plan | auto peak / floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in summary:
        cold, warm = row["cases"].get("auto_cold", {}), row["cases"].get("auto_warm", {})
        lines.append(
            f"| {row['model']} | {row['best_anchor'] or '–'} | {_f(row['best_anchor_s'])} | "
            f"{_f(cold.get('median_s'))} | {_f(row['auto_cold_ratio'], '.2f')} | "
            f"{_paired_text(row.get('auto_cold_paired'))} | "
            f"{_f(warm.get('median_s'))} | {_f(row['auto_warm_ratio'], '.2f')} | "
            f"{_paired_text(row.get('auto_warm_paired'))} | "
            f"{'; '.join(cold.get('plans', [])) or '–'} | {_peak_ratio(cold)} |"
        )
    for row in summary:
        lines += [
            "",
            f"**{row['model']}** (best anchor: {row['best_anchor'] or '–'})",
            "",
            "| case | median s | min-max s | runs | peak extra MiB | peak / floor | = pymc "
            "| output devices | plan |",
            "|---|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for case, s in row["cases"].items():
            same = {True: "yes", False: "**NO**", None: "–"}[s["matches_pymc"]]
            errors = f" ({len(s['errors'])} failed: {s['errors'][0][:60]})" if s["errors"] else ""
            peak = s["peak_extra_bytes"]
            lines.append(
                f"| {case}{' **best**' if case == row['best_anchor'] else ''} | "
                f"{_f(s['median_s'])} | {_f(s['min_s'])}-{_f(s['max_s'])} | "
                f"{s['runs'] - len(s['errors'])}/{s['runs']}{errors} | "
                f"{_f(None if peak is None else peak / 2**20, ',.0f')} | {_peak_ratio(s)} | "
                f"{same} | {_f(s['output_devices'], 'd')} | {'; '.join(s['plans'])} |"
            )
    return "\n".join(lines)


def _peak_ratio(s: dict) -> str:
    if not s or s.get("peak_extra_bytes") is None or not s.get("floor_bytes"):
        return "–"
    return f"{s['peak_extra_bytes'] / s['floor_bytes']:.2f}"


def benchmark(
    models, cases, repeats, chains, draws, devices, timeout, scan_timeout, log, host_devices=None
) -> dict:
    """Run every case of every model `repeats` times, round-robin, each in a fresh process."""
    from pymc_chunkpost.profiling.fixtures import FIXTURES

    runs = []
    work = Path(tempfile.mkdtemp(prefix="bench-zoo-"))
    try:
        for model in models:
            spec = FIXTURES[model]
            c, d = chains or spec.chains, draws or spec.draws
            if devices > 1 and c % devices:
                raise ValueError(f"--devices {devices} must divide the {c} chains of {model!r}.")
            ref_dir = work / f"{model}-reference"
            ref_dir.mkdir()
            ref = run_child(model, "reference", c, d, 1, ref_dir, str(work / "none"), timeout)
            log(ref)
            if "error" in ref:
                runs.append(ref)
                continue
            skip = set()
            for repeat in range(repeats):
                cache_dir = work / f"{model}-cache-{repeat}"  # auto_cold's: new and empty
                for case in cases:
                    if case in skip:
                        continue
                    if case == "auto_cold":
                        cache_dir.mkdir()
                    elif case == "auto_warm" and not cache_dir.exists():
                        continue
                    case_dir = cache_dir if case in AUTO_CASES else work / "anchor-cache"
                    limit = scan_timeout if case == "pymc_scan" else timeout
                    run = run_child(
                        model, case, c, d, devices, ref_dir, str(case_dir), limit, host_devices
                    )
                    run["repeat"] = repeat
                    runs.append(run)
                    log(run)
                    if case == "pymc_scan" and run.get("error", "").startswith("timeout"):
                        skip.add(case)  # pymc's unjitted scan: once too slow, always too slow
            shutil.rmtree(ref_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "summary": summarise(runs, cases)}


def _header(args, models, cases) -> str:
    import jax
    import pymc

    command = "python benchmarks/bench_zoo.py " + " ".join(sys.argv[1:])
    devices = (
        f"{args.devices} CPU devices (draws sharded on chains)"
        if args.devices > 1
        else ("the default device")
    )
    count = host_device_count(args.devices, args.host_devices)
    devices += ", pymc's 100 host devices" if count is None else f", {count} host devices"
    return (
        f"Measured {time.strftime('%Y-%m-%d')} with `{command.strip()}`: {os.cpu_count()} CPU "
        f"cores ({jax.devices()[0].device_kind}), Python {sys.version.split()[0]}, "
        f"jax {jax.__version__}, pymc {pymc.__version__}, {devices}. {len(models)} models, "
        f"cases {', '.join(cases)}; each run in a fresh process, {args.repeats} round-robin "
        "repeats, median [min-max] of the seconds from just before the call to "
        "`block_until_ready` (tracing, planning and compiling included). Ratios are of "
        "medians; the best anchor is the fastest non-`auto` case whose outputs equal pymc's. "
        "A paired ratio is the median (min-max) over repeats of `auto`'s time over the best "
        "anchor's in the same repeat."
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated; default: the zoo")
    parser.add_argument("--cases", default=None, help="comma-separated; default: all")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per case")
    parser.add_argument("--chains", type=int, default=None, help="default: the model's (4)")
    parser.add_argument("--draws", type=int, default=None, help="default: the model's (1000)")
    parser.add_argument("--devices", type=int, default=1, help="shard the chains over N devices")
    parser.add_argument(
        "--host-devices",
        type=int,
        default=None,
        help="CPU devices of each run's JAX (default: --devices N, or pymc's 100 for one)",
    )
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--scan-timeout", type=int, default=60, help="seconds per pymc_scan run")
    parser.add_argument("--json", default=None, help="write all runs and the summary here")
    parser.add_argument("--out", default=None, help="write the markdown tables here")
    parser.add_argument("--list", action="store_true", help="list the models and cases; run none")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{', '.join(SMOKE_MODELS)} at 2 x 50 draws, 1 repeat, {', '.join(SMOKE_CASES)}",
    )
    parser.add_argument(
        "--tables-from",
        default=None,
        help="print the tables of an earlier --json (or of its stderr log); run none",
    )
    parser.add_argument("--quiet", action="store_true", help="no run-by-run log on stderr")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return 0
    if args.tables_from:  # a --json file, or the run-by-run log (JSON lines) of a partial run
        text = Path(args.tables_from).read_text()
        try:
            earlier = json.loads(text)
        except json.JSONDecodeError:
            runs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            runs = [r for r in runs if r.get("case") != "reference"]
            earlier = {"summary": summarise(runs, list(dict.fromkeys(r["case"] for r in runs)))}
        print(earlier.get("header", "") + "\n\n" + tables(earlier["summary"]))
        return 0
    sys.path.insert(0, str(ROOT))
    from pymc_chunkpost.profiling.fixtures import FIXTURES, ZOO

    if args.smoke:
        args.models = args.models or ",".join(SMOKE_MODELS)
        args.cases = args.cases or ",".join(SMOKE_CASES)
        args.repeats, args.chains, args.draws = 1, args.chains or 2, args.draws or 50
    models = args.models.split(",") if args.models else list(ZOO)
    cases = args.cases.split(",") if args.cases else default_cases(args.devices)
    if args.list:
        for name in models:
            print(f"{name:18s} {FIXTURES[name].description}")
        print("cases:", ", ".join(cases))
        return 0
    unknown = [m for m in models if m not in FIXTURES]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(FIXTURES)}")
    if args.repeats < 1 or args.devices < 1:
        parser.error(f"--repeats and --devices must be >= 1, got {args.repeats}, {args.devices}")
    if args.host_devices is not None and args.host_devices < args.devices:
        parser.error(
            f"--host-devices {args.host_devices} must be at least --devices {args.devices}"
        )
    try:
        check_cases(cases, args.devices)
    except ValueError as error:
        parser.error(str(error))

    def log(run):
        if not args.quiet:
            print(json.dumps(run), file=sys.stderr, flush=True)

    result = benchmark(
        models,
        cases,
        args.repeats,
        args.chains,
        args.draws,
        args.devices,
        args.timeout,
        args.scan_timeout,
        log,
        args.host_devices,
    )
    header = _header(args, models, cases)
    text = header + "\n\n" + tables(result["summary"]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        result["header"] = header
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
