"""The float32 accuracy of the operations the GLM families' log-likelihoods use, on the default
device beside the host CPU, against float64 references: the largest error of each in units of
float32's epsilon at the value (ulps), over inputs of the ranges those likelihoods meet.

    python benchmarks/probes/float32_ops.py [--json OUT]

Each operation runs as one jitted program on float32 inputs, on `jax.devices()[0]` and on
`jax.devices("cpu")[0]`; the reference is the same operation in float64 on the host CPU of
the same float32 inputs (cast). Near a zero of the function (lgamma at 1 and 2) the ulps
are large for any method of absolute accuracy: the absolute errors say what a log-likelihood
sum meets, and the mean signed error says whether they add up.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    from jax.scipy import special

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    inputs = {
        "small": rng.uniform(1e-3, 1.0, 200_000),
        "moderate": rng.uniform(0.5, 30.0, 200_000),
        "counts": rng.integers(0, 40, 200_000) + rng.uniform(0.5, 8.0, 200_000),
        "signed": rng.normal(0, 4, 200_000),
    }
    ops = {
        "lgamma": (special.gammaln, ("small", "moderate", "counts")),
        "digamma": (special.digamma, ("small", "moderate")),
        "log": (jnp.log, ("small", "moderate")),
        "log1p": (jnp.log1p, ("small", "signed_pos")),
        "exp": (jnp.exp, ("signed",)),
        "expm1": (jnp.expm1, ("signed",)),
        "softplus": (jax.nn.softplus, ("signed",)),
        "log_sigmoid": (jax.nn.log_sigmoid, ("signed",)),
        "sigmoid": (jax.nn.sigmoid, ("signed",)),
        "tanh": (jnp.tanh, ("signed",)),
        "sqrt": (jnp.sqrt, ("small", "moderate")),
        "log(x/(x+5))": (lambda x: jnp.log(x / (x + 5.0)), ("moderate",)),
    }
    inputs["signed_pos"] = np.abs(inputs["signed"])
    device, cpu = jax.devices()[0], jax.devices("cpu")[0]
    rows = []
    for name, (op, ranges) in ops.items():
        for what in ranges:
            x32 = inputs[what].astype(np.float32)
            with jax.default_device(cpu):
                reference = np.asarray(jax.jit(op)(x32.astype(np.float64)))
            row = {"op": name, "inputs": what}
            for where, dev in (("device", device), ("host", cpu)):
                got = np.asarray(jax.jit(op)(jax.device_put(x32, dev)), np.float64)
                ulp = np.spacing(np.abs(reference).astype(np.float32)).astype(np.float64)
                err = np.abs(got - reference) / np.maximum(ulp, np.finfo(np.float32).tiny)
                finite = np.isfinite(err)
                row[f"{where}_max_abs"] = float(np.nanmax(np.abs(got - reference)))
                row[f"{where}_mean_signed_abs"] = float(np.nanmean(got - reference))
                row[f"{where}_max_ulp"] = float(np.max(err[finite])) if finite.any() else None
                row[f"{where}_mean_signed_ulp"] = float(np.mean(((got - reference) / ulp)[finite]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    record = {
        "script": "benchmarks/probes/float32_ops.py",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "device": str(device),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
