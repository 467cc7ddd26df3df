"""`pymc_chunkpost.loo` of bench_loo's model on one backend, cold in this fresh process (the
device opened before the clock): where a device's compile costs more than its run saves, the
host CPU's backend may be faster (issue 69's question for small work on an accelerator).

    python benchmarks/probes/loo_backend.py --model negbin --backend cpu [--rows 20000]

Prints one JSON line: model, rows, backend, seconds, elpd.
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--model", default="hierarchical", help="bench_loo.py's --model")
    parser.add_argument("--backend", default=None, help="postprocessing_backend; default: jax's")
    args = parser.parse_args()
    import jax
    from bench_loo import build

    import pymc_chunkpost

    jax.devices()
    jax.devices("cpu")
    model, idata = build(args.rows, family=args.model)
    warnings.simplefilter("ignore")
    tic = time.perf_counter()
    result = pymc_chunkpost.loo(idata, model, postprocessing_backend=args.backend)
    seconds = time.perf_counter() - tic
    elpd = float(getattr(result, "elpd_loo", None) or result.elpd)
    print(
        json.dumps(
            {
                "model": args.model,
                "rows": args.rows,
                "backend": args.backend,
                "platform": jax.devices()[0].platform,
                "seconds": seconds,
                "elpd": elpd,
            }
        )
    )


if __name__ == "__main__":
    main()
