"""Lanes on models they were not tuned on: `Predictive` with one lane against one per core.

    python benchmarks/probes/numpyro_lanes.py --repeats 3

The models of `tests/numpyro_models.py` (none of them is a case of `bench_numpyro.py`, where
lanes were measured first), with data a few thousand rows long, 4 x 1,000 draws from each
prior (seeded). Methods: `one_lane` (`configured(max_lanes=1)`: the one-draw loop on one
thread, as before lanes), `lanes` (the defaults: one lane per core), and numpyro's own
`Predictive(parallel=True)` and `parallel=False`. Every (model, method) runs in a fresh
process with an empty cache folder: the first call is cold, the second warm (the first's
predictions still held, as `pred = predictive(...)` holds them while it runs again), then
`steady`: the median of three more calls, each after the last one's predictions were
dropped, so that the memory they take has been used before. (On this VM the first touch of
memory the process has not used costs about 2 ms/MB, the time of a whole warm call on the
larger models: `warm` carries it, `steady` does not.) Processes run round-robin; ratios are
medians of run-by-run ratios. Each run of ours is checked bit for bit
against `parallel=False`. Writes `benchmarks/results/numpyro_lanes_py3<minor>.json` (or
`--out`) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _cell.py, in benchmarks/
from _cell import measured_call, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("logistic", "poisson", "multivariate", "ar1", "regression", "deterministic_sites")
METHODS = ("one_lane", "lanes", "numpyro_vmap", "numpyro_map")
DRAWS = 4000
STEADY_CALLS = 3
PHASES = ("cold", "warm", "steady")


def build(name: str):
    """The model of `tests/numpyro_models.py`, its (larger) data, and 4,000 prior draws of
    its latent sites."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import Predictive as NumpyroPredictive

    sys.path.insert(0, str(ROOT / "tests"))
    import numpyro_models as m

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=5_000), jnp.float32)
    model, args = {
        "logistic": (m.logistic, (x,)),
        "poisson": (m.poisson, (x,)),
        "multivariate": (m.multivariate, (3, 500)),
        "ar1": (m.ar1, (300,)),
        "regression": (m.regression, (jnp.asarray(rng.normal(size=(2_000, 50)), jnp.float32),)),
        "deterministic_sites": (m.deterministic_sites, (x,)),
    }[name]
    # One draw more than the posterior, so that the prior's programs (numpyro's key split
    # among them) are not the ones a timed call of numpyro's would reuse.
    prior = NumpyroPredictive(model, num_samples=DRAWS + 1)(jax.random.PRNGKey(1), *args)
    trace = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(*args)
    latent = {k for k, s in trace.items() if s["type"] == "sample" and not s["is_observed"]}
    latent -= {"y"}
    return model, args, {k: v[:DRAWS] for k, v in prior.items() if k in latent}


def child(name: str, method: str) -> dict:
    """One (model, method) in this fresh process: cold and warm seconds."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from numpyro.infer import Predictive as NumpyroPredictive

    from pymc_chunkpost._support.config import configured
    from pymc_chunkpost.numpyro import Predictive

    model, args, posterior = build(name)
    key = jax.random.PRNGKey(0)
    make = {
        "one_lane": lambda: Predictive(model, posterior),
        "lanes": lambda: Predictive(model, posterior),
        "numpyro_vmap": lambda: NumpyroPredictive(model, posterior, parallel=True),
        "numpyro_map": lambda: NumpyroPredictive(model, posterior, parallel=False),
    }[method]
    lanes = {"max_lanes": 1} if method == "one_lane" else {}
    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # JAX's first lowering
    result = {"model": name, "method": method, "jax": jax.__version__}
    with configured(**lanes):
        for phase in ("cold", "warm"):
            predictive = make()
            out = measured_call(
                lambda p=predictive: jax.block_until_ready(p(key, *args)), "time", phase, result
            )
            plan = getattr(predictive, "plan", None)
            if plan is not None:
                result["lanes_used"] = plan.lanes
        steady = []
        for _ in range(STEADY_CALLS):
            out = None  # the last call's predictions are dropped before the next call
            predictive = make()
            out = measured_call(
                lambda p=predictive: jax.block_until_ready(p(key, *args)), "time", "steady", result
            )
            steady.append(result["steady_s"])
        result["steady_s"] = statistics.median(steady)
    if method in ("one_lane", "lanes"):
        reference = NumpyroPredictive(model, posterior)(key, *args)
        result["equal_to_numpyro_map"] = all(
            np.array_equal(np.asarray(out[k]), np.asarray(reference[k])) for k in reference
        )
    return result


def _ratio(runs: list[dict], name: str, method: str, anchor: str, phase: str) -> str:
    pairs = {}
    for r in runs:
        if r["model"] == name and f"{phase}_s" in r:  # no steady phase before run 4
            pairs.setdefault(r["repeat"], {})[r["method"]] = r[f"{phase}_s"]
    ratios = [p[method] / p[anchor] for p in pairs.values() if method in p and anchor in p]
    return f"{statistics.median(ratios):.2f}x" if ratios else ""


def report(runs: list[dict], models: list[str]) -> str:
    lines = [
        "| model | lanes used | one lane, cold / warm / steady s | lanes, cold / warm / steady s "
        "| lanes / one lane, cold / warm / steady | lanes / parallel=True, cold / warm / steady "
        "| lanes / parallel=False, cold / warm / steady | equal to map |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def med(name, method, phase):
        values = [
            r[f"{phase}_s"]
            for r in runs
            if r["model"] == name and r["method"] == method and f"{phase}_s" in r
        ]
        return statistics.median(values) if values else float("nan")

    for name in models:
        used = {r.get("lanes_used") for r in runs if r["model"] == name and r["method"] == "lanes"}
        equal = all(r.get("equal_to_numpyro_map", True) for r in runs if r["model"] == name)
        cells = [
            name,
            ",".join(str(u) for u in sorted(used, key=str)),
            " / ".join(f"{med(name, 'one_lane', p):.4f}" for p in PHASES),
            " / ".join(f"{med(name, 'lanes', p):.4f}" for p in PHASES),
        ]
        for anchor in ("one_lane", "numpyro_vmap", "numpyro_map"):
            cells.append(" / ".join(_ratio(runs, name, "lanes", anchor, p) for p in PHASES))
        cells.append("yes" if equal else "NO")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    models, methods = args.models.split(","), args.methods.split(",")
    runs = []
    for repeat in range(args.repeats):
        for name in models:
            for method in methods:
                with tempfile.TemporaryDirectory() as cache:
                    result = run_child(
                        __file__, ["--child", name, method], {"PYMC_CHUNKPOST_CACHE_DIR": cache}
                    )
                result["repeat"] = repeat
                runs.append(result)
                print(json.dumps(result), flush=True)
    table = report(runs, models)
    minor = sys.version_info.minor
    out = (
        Path(args.out).resolve()
        if args.out
        else ROOT / "benchmarks/results" / f"numpyro_lanes_py3{minor}.json"
    )
    record = {
        "command": "python " + " ".join(sys.argv),
        "python": platform.python_version(),
        "runs": runs,
        "table": table,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(table)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
