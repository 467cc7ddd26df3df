"""Which computations give numpyro's `Predictive(parallel=False)` numbers, bit for bit.

    python benchmarks/probes/numpyro_parity.py [--x64] [--draws 400]

For every model of `tests/numpyro_models.py` (posterior draws from its prior, seeded), the
share of predicted values that differ in any bit from numpyro's default, `parallel=False`:
numpyro's own `parallel=True`, ours by default (each draw a program of one draw) under
"auto" and in chunks of 7, and ours with `exact=False` (a chunk's draws vectorised), under
"auto" and in chunks of 7; and the same for `log_likelihood` (numpyro's has no
`parallel=True` worth the name: the same `soft_vmap`). Writes
`benchmarks/results/numpyro_parity_<python>[_x64].json` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = {
    "numpyro parallel=True": None,
    "ours": {},
    "ours, chunks of 7": {"postprocessing_vectorize": "chunked", "chunk_size": 7},
    "ours exact=False": {"exact": False},
    "ours exact=False, chunks of 7": {
        "exact": False,
        "postprocessing_vectorize": "chunked",
        "chunk_size": 7,
    },
}


def differing(ours: dict, theirs: dict) -> float:
    """The share of values, over all sites, that differ from `theirs` in any bit."""
    import numpy as np

    total = sum(np.size(v) for v in theirs.values())
    return sum(int(np.sum(np.asarray(ours[k]) != np.asarray(theirs[k]))) for k in theirs) / total


def parity(name: str, draws_n: int) -> dict:
    """The shares of differing values of every method, for one model."""
    import jax
    import numpyro
    from numpyro.infer import Predictive as NumpyroPredictive
    from numpyro.infer.util import log_likelihood as numpyro_log_likelihood
    from numpyro_models import MODELS

    from pymc_chunkpost.numpyro import Predictive, log_likelihood

    model, args = MODELS[name]
    prior = NumpyroPredictive(model, num_samples=draws_n, parallel=True)(
        jax.random.PRNGKey(1), *args
    )
    sites = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(*args)
    latent = {k for k, s in sites.items() if s["type"] == "sample" and not s["is_observed"]}
    latent -= {"y"}
    draws = {k: v for k, v in prior.items() if k in latent}
    y = prior["y"][0]
    key = jax.random.PRNGKey(7)
    reference = NumpyroPredictive(model, draws)(key, *args)
    reference_log = numpyro_log_likelihood(model, draws, *args, y=y)
    row: dict = {"model": name, "predictive": {}, "log_likelihood": {}}
    for method, options in METHODS.items():
        if options is None:
            ours = NumpyroPredictive(model, draws, parallel=True)(key, *args)
            ours_log = numpyro_log_likelihood(model, draws, *args, y=y, parallel=True)
        else:
            ours = Predictive(model, draws, **options)(key, *args)
            ours_log = log_likelihood(model, draws, *args, y=y, **options)
        row["predictive"][method] = differing(ours, reference)
        row["log_likelihood"][method] = differing(ours_log, reference_log)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--x64", action="store_true", help="with jax_enable_x64 (as pymc sets)")
    parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import jax

    if args.x64:
        jax.config.update("jax_enable_x64", True)
    import numpyro
    from numpyro_models import MODELS

    rows = [parity(name, args.draws) for name in MODELS]
    lines = [
        f"Python {platform.python_version()}, jax {jax.__version__}, numpyro "
        f"{numpyro.__version__}, {'float64' if args.x64 else 'float32'}, {args.draws} draws: "
        "the share of values that differ in any bit from numpyro's `parallel=False`.",
        "",
        "| model | " + " | ".join(METHODS) + " |",
        "|---|" + "---|" * len(METHODS),
    ]
    for what in ("predictive", "log_likelihood"):
        for row in rows:
            cells = [f"{row[what][m]:.1%}" if row[what][m] else "0" for m in METHODS]
            lines.append(f"| {row['model']} ({what}) | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table)
    suffix = f"py{platform.python_version().replace('.', '')[:3]}" + ("_x64" if args.x64 else "")
    out = ROOT / "benchmarks" / "results" / f"numpyro_parity_{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/probes/numpyro_parity.py " + " ".join(sys.argv[1:])
    out.write_text(json.dumps({"command": command.strip(), "rows": rows, "table": table}) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
