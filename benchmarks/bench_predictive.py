"""The predictive route against pymc's own `sample_posterior_predictive`, each case in a fresh
process.

    python benchmarks/bench_predictive.py --repeats 3 --memory --rng

Cases (a 4 x 1000-draw posterior each): `hier_2k` and `hier_20k`, row-indexed hierarchical
regressions with 2,000 and 20,000 rows (`bench_posthoc.build`), and `ar_500`, an order-2
`pm.AR` of 500 steps (its random variable is a Scan). Methods: `ours`
(`pymc_chunkpost.sample_posterior_predictive`, "auto"), `pymc_jax` (pymc's own in JAX mode:
`backend="jax"` on pymc 6, `compile_kwargs={"mode": "JAX"}` on pymc 5) and `pymc_default`
(pymc's own, its default backend).

Every (case, method) runs in a fresh Python process with an empty cache folder
(`PYMC_CHUNKPOST_CACHE_DIR`), round-robin (one repeat of every cell, then the next). In it,
the model and posterior are built, JAX's first lowering is paid on a trivial function and the
garbage is collected; then the first call (cold: graph, compile, run) and the second (warm)
are timed, and, on the hierarchical cases, a third after `pm.set_data` gave `x` new values
of the same shape (`new_data`: out-of-sample prediction, where nothing should compile again).
Speed-ups are medians of the run-by-run ratios.

`--memory` measures, in a fresh process each, memray's peak of `ours` on `hier_30k` (30,000
rows x 4,000 draws: 0.9 GiB of predictive draws, the floor), as `bench_posthoc` does.
`--rng` measures the random-number throughput bound: 80M float64 normals from JAX's PRNG
implementations (threefry2x32, rbg, unsafe_rbg, and threefry with its hash unrolled: compile
and run), from the route's own normals (`route`: those bits through AS 241, compiled as the
route compiles random draws on a CPU, `random_vector_width`; `route_xla_width`: at XLA's
default vector width), from numpy's
generator and from numba's (`Generator.standard_normal` in a jitted function, as pymc 6's
default backend draws; where numba is installed),
and the route on `hier_20k` under each JAX implementation (`JAX_DEFAULT_PRNG_IMPL`), with a
two-sample KS test of its draws against threefry's (the same distribution); `--rng-bound`
measures the 80M normals alone.
The results go to `--json` (default `benchmarks/results/bench_predictive_py3<minor>.json`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one
import _cell  # noqa: E402
from _cell import measured_call  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from bench_posthoc import build as build_hierarchical  # noqa: E402

CASES = ("hier_2k", "hier_20k", "ar_500")
METHODS = ("ours", "pymc_jax", "pymc_default")
IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
UNROLLED = "threefry2x32_unrolled"  # `_compat.unrolled_threefry`: threefry's bits, hashed unrolled
ROUTE = "route"  # the route's own float64 normals (`internals.route_standard_normal`, AS 241)
ROUTE_XLA_WIDTH = "route_xla_width"  # the same, compiled at XLA's default vector width
NUMBA = "numba"  # numba's `Generator.standard_normal` (ziggurat), as pymc 6's default draws
CHAINS, DRAWS = 4, 1000
N_NORMALS = 80_000_000


def build(case: str):
    """The model and a seeded (4, 1000) posterior Dataset of its free variables."""
    if case != "ar_500":
        return build_hierarchical(case)
    import numpy as np
    import pymc as pm
    import xarray as xr

    rng = np.random.default_rng(0)
    shape = (CHAINS, DRAWS)
    with pm.Model() as model:
        rho = pm.Normal("rho", 0.0, 0.3, shape=2)
        sigma = pm.HalfNormal("sigma", 1.0)
        init = pm.Normal.dist(0.0, 1.0, shape=2)
        pm.AR("y", rho=rho, sigma=sigma, init_dist=init, steps=500, observed=rng.normal(size=502))
    post = {
        "rho": (("chain", "draw", "rho_dim_0"), rng.normal([0.5, -0.2], 0.05, (*shape, 2))),
        "sigma": (("chain", "draw"), np.abs(rng.normal(1.0, 0.05, shape))),
    }
    coords = {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
    return model, xr.Dataset(post, coords=coords)


def _trace(posterior):
    import pymc as pm

    if int(pm.__version__.split(".")[0]) >= 6:
        import xarray as xr

        return xr.DataTree.from_dict({"posterior": posterior})
    import arviz as az

    return az.InferenceData(posterior=posterior)


def _caller(case: str, method: str):
    import pymc as pm

    import pymc_chunkpost

    model, posterior = build(case)
    pymc6 = int(pm.__version__.split(".")[0]) >= 6
    jax_mode = {"backend": "jax"} if pymc6 else {"compile_kwargs": {"mode": "JAX"}}
    function = {
        "ours": pymc_chunkpost.sample_posterior_predictive,
        "pymc_jax": lambda trace, **kw: pm.sample_posterior_predictive(trace, **kw, **jax_mode),
        "pymc_default": pm.sample_posterior_predictive,
    }[method]
    kwargs = dict(model=model, progressbar=False, random_seed=1, return_inferencedata=False)
    return model, lambda: function(_trace(posterior), **kwargs)


def child(case: str, method: str, measure: str) -> dict:
    """One cell in this (fresh) process: cold and warm seconds, or memray's peak bytes."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import pymc as pm

    model, call = _caller(case, method)
    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # JAX's first lowering
    result = {"case": case, "method": method, "pymc": pm.__version__, "jax": jax.__version__}
    result["impl"] = str(jax.config.values["jax_default_prng_impl"])
    if method == "ours" and measure == "time":
        _record_phases(result)
    phases = ("cold", "warm", "new_data") if "x" in model.named_vars else ("cold", "warm")
    for phase in phases:
        if phase == "new_data":
            import numpy as np

            x = model["x"].get_value()
            with model:
                pm.set_data({"x": np.random.default_rng(5).normal(size=x.shape)})
        out = measured_call(call, measure, phase, result)
        result["floor"] = int(sum(v.nbytes for v in out.values()))
        if measure == "sample":
            result["sample"] = out["y"].reshape(-1)[:: max(1, out["y"].size // 200_000)].tolist()
        del out
    return result


def _record_phases(result: dict) -> None:
    """Where the cold call's time goes: graph (pytensor, rewrites, trace check), planning and
    XLA compiling (the engine's plan), recorded on the first call only."""
    from _internals import on_plan, time_step

    def recorded(plan):
        result.setdefault("compile_s", plan.compile_seconds)
        result.setdefault("planning_s", plan.planning_seconds)
        result.setdefault("plan", f"{plan.strategy}:{plan.chunk_size}")

    time_step("predictive.graph", lambda seconds: result.setdefault("graph_s", seconds))
    on_plan(recorded)


def anchor_child(case: str) -> dict:
    """The issue's anchor: a vmapped `jax.random.normal` of the case's size, compiled."""
    import jax

    jax.config.update("jax_enable_x64", True)
    model, _ = build(case)
    size = int(sum(v.size.eval() for v in model.observed_RVs))
    keys = jax.random.split(jax.random.key(0), CHAINS * DRAWS)
    normal = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (size,), "float64")))
    tic = time.perf_counter()
    compiled = normal.lower(keys).compile()
    compile_s = time.perf_counter() - tic
    compiled(keys).block_until_ready()
    tic = time.perf_counter()
    compiled(keys).block_until_ready()
    return {"case": case, "anchor_compile_s": compile_s, "anchor_run_s": time.perf_counter() - tic}


def rng_child(impl: str) -> dict:
    """80M float64 normals from one of JAX's PRNG implementations (or numpy's)."""
    import numpy as np

    if impl == "numpy":
        generator = np.random.default_rng(0)
        tic = time.perf_counter()
        generator.standard_normal(N_NORMALS)
        return {"impl": impl, "run_s": time.perf_counter() - tic, "compile_s": 0.0}
    if impl == NUMBA:
        import numba

        @numba.njit
        def standard_normal(generator, n):
            return generator.standard_normal(n)

        generator = np.random.default_rng(0)
        tic = time.perf_counter()
        standard_normal(generator, 10)
        compile_s = time.perf_counter() - tic
        standard_normal(generator, N_NORMALS)
        tic = time.perf_counter()
        standard_normal(generator, N_NORMALS)
        return {"impl": impl, "run_s": time.perf_counter() - tic, "compile_s": compile_s}
    import jax

    jax.config.update("jax_enable_x64", True)
    draw, options = jax.random.normal, {}
    if impl in (ROUTE, ROUTE_XLA_WIDTH):
        from _internals import (
            PREFER_VECTOR_WIDTH,
            current,
            route_standard_normal,
        )

        draw = route_standard_normal
        if impl == ROUTE:
            options = {PREFER_VECTOR_WIDTH: current().random_vector_width}
    if impl in (
        UNROLLED,
        ROUTE,
        ROUTE_XLA_WIDTH,
    ):  # threefry's bits, the hash unrolled (the route's samplers')
        from _internals import unrolled_threefry

        key = jax.random.wrap_key_data(
            jax.random.key_data(jax.random.key(0)), impl=unrolled_threefry()
        )
    else:
        key = jax.random.key(0, impl=impl)
    tic = time.perf_counter()
    normal = jax.jit(lambda k: draw(k, (N_NORMALS,), "float64"))
    compiled = normal.lower(key).compile(compiler_options=options)
    compile_s = time.perf_counter() - tic
    compiled(key).block_until_ready()
    tic = time.perf_counter()
    compiled(jax.random.fold_in(key, 1)).block_until_ready()
    result = {"impl": impl, "run_s": time.perf_counter() - tic, "compile_s": compile_s}
    return result | {"compiler_options": options}


def run_child(args: list[str], env: dict | None = None) -> dict:
    return _cell.run_child(__file__, args, env)


def timings(cases: list[str], methods: list[str], repeats: int) -> list[dict]:
    runs = []
    for repeat in range(repeats):  # round-robin: one repeat of every cell, then the next
        for case in cases:
            for method in methods:
                with tempfile.TemporaryDirectory() as cache:
                    env = {"PYMC_CHUNKPOST_CACHE_DIR": cache}
                    run = {"repeat": repeat} | run_child(["--child", case, method, "time"], env)
                runs.append(run)
                phases = ""
                if "compile_s" in run:
                    phases = (
                        f"  (graph {run['graph_s']:.2f} s, planning {run['planning_s']:.2f} s, "
                        f"compile {run['compile_s']:.2f} s, plan {run['plan']})"
                    )
                new = f"  new data {run['new_data_s']:7.2f} s" if "new_data_s" in run else ""
                print(
                    f"{case:9s} {method:13s} cold {run['cold_s']:7.2f} s  warm "
                    f"{run['warm_s']:7.2f} s{new}{phases}",
                    flush=True,
                )
    return runs


def memory(repeats: int) -> list[dict]:
    runs = []
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = {"PYMC_CHUNKPOST_CACHE_DIR": cache}
            run = {"repeat": repeat} | run_child(["--child", "hier_30k", "ours", "memory"], env)
        runs.append(run)
        print(
            f"hier_30k ours peak {run['cold_peak'] / run['floor']:.3f}x (cold), "
            f"{run['warm_peak'] / run['floor']:.3f}x (warm) of {run['floor'] / 2**30:.2f} GiB",
            flush=True,
        )
    return runs


def prng(repeats: int, bound_only: bool = False) -> dict:
    """The RNG-throughput bound, and the route on hier_20k under each JAX implementation
    (not with `bound_only`)."""
    from scipy import stats

    bound = [
        run_child(["--rng-child", impl])
        for _ in range(repeats)
        for impl in (*IMPLS, UNROLLED, ROUTE, ROUTE_XLA_WIDTH, "numpy", NUMBA)
        if impl != NUMBA or importlib.util.find_spec("numba")
    ]
    route, samples = [], {}
    for repeat in range(0 if bound_only else repeats):
        for impl in IMPLS:
            with tempfile.TemporaryDirectory() as cache:
                env = {"PYMC_CHUNKPOST_CACHE_DIR": cache, "JAX_DEFAULT_PRNG_IMPL": impl}
                measure = "sample" if repeat == 0 else "time"
                run = run_child(["--child", "hier_20k", "ours", measure], env)
            samples[impl] = run.pop("sample", samples.get(impl))
            route.append({"repeat": repeat} | run)
            print(f"hier_20k ours {impl:13s} cold {run['cold_s']:.2f} s warm {run['warm_s']:.2f} s")
    ks = {
        impl: stats.ks_2samp(samples[impl], samples["threefry2x32"]).pvalue
        for impl in IMPLS[1:]
        if samples.get(impl)
    }
    return {"bound": bound, "route": route, "ks_against_threefry": ks}


def report(runs: list[dict], cases: list[str], methods: list[str]) -> str:
    def pick(case, method, key):
        return [r[key] for r in runs if r["case"] == case and r["method"] == method]

    first = runs[0]
    lines = [
        f"pymc {first['pymc']}, jax {first['jax']}, {CHAINS} x {DRAWS} draws; medians of "
        f"{max(r['repeat'] for r in runs) + 1} fresh processes per cell; speed-up = median of "
        "run-by-run ratios (pymc's time / ours); cold = the first call in the process (graph, "
        "compile, run), warm = the second.",
        "",
        "| posterior | method | cold s | warm s | new data s | cold speed-up | warm speed-up "
        "| new data speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for method in methods:
            cold, warm = pick(case, method, "cold_s"), pick(case, method, "warm_s")
            if not cold:
                continue
            new = [r.get("new_data_s") for r in runs if r["case"] == case and r["method"] == method]
            new = [x for x in new if x is not None]
            keys = ("cold_s", "warm_s", "new_data_s")
            speed = ["", "", ""]
            if method != "ours" and "ours" in methods:
                for i, key in enumerate(keys):
                    ours = [r.get(key) for r in runs if r["case"] == case and r["method"] == "ours"]
                    theirs = [
                        r.get(key) for r in runs if r["case"] == case and r["method"] == method
                    ]
                    ratios = [a / b for a, b in zip(theirs, ours) if a is not None and b]
                    speed[i] = f"{statistics.median(ratios):.2f}x" if ratios else ""
            new_s = f"{statistics.median(new):.2f}" if new else ""
            lines.append(
                f"| {case} | {method} | {statistics.median(cold):.2f} | "
                f"{statistics.median(warm):.2f} | {new_s} | {speed[0]} | {speed[1]} | {speed[2]} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="peak memory on hier_30k")
    parser.add_argument("--rng", action="store_true", help="the RNG-throughput bound")
    parser.add_argument(
        "--rng-bound", action="store_true", help="with --rng: the 80M normals alone"
    )
    parser.add_argument("--out", default=None, help="write the markdown table here")
    default_json = (
        ROOT / "benchmarks" / "results" / f"bench_predictive_py3{sys.version_info[1]}.json"
    )
    parser.add_argument("--json", default=str(default_json))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--rng-child", help=argparse.SUPPRESS)
    parser.add_argument("--anchor-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.rng_child:
        print(json.dumps(rng_child(args.rng_child)))
        return
    if args.anchor_child:
        print(json.dumps(anchor_child(args.anchor_child)))
        return
    cases, methods = args.cases.split(","), args.methods.split(",")
    result: dict = {"command": " ".join(sys.argv)}
    if args.repeats and cases != [""]:
        result["anchors"] = [run_child(["--anchor-child", case]) for case in cases]
        result["timings"] = timings(cases, methods, args.repeats)
        table = report(result["timings"], cases, methods)
        result["table"] = table
        print(table)
        if args.out:
            Path(args.out).write_text(table)
    if args.memory:
        result["memory"] = memory(max(1, min(args.repeats, 3)))
    if args.rng:
        result["rng"] = prng(max(1, min(args.repeats, 3)), args.rng_bound)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
