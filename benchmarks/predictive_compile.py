"""What the posterior predictive program costs XLA to compile, beside plain JAX of the same draws.

    python benchmarks/predictive_compile.py [--rows 20000,2000] [--cells ...] [--out FILE]
        [--dump DIR]

Issue 50 saw the predictive program of a 20,000-row normal regression compile for a minute
on a TPU v5e, where `jax.jit(jax.vmap(...))` of `jax.random.normal(key, (20000,))` over the
same 4,000 keys compiled in 4.3 s. Each cell runs in a fresh process, on the default
device, at 4 x 1,000 draws:

- `plain`: `jit(vmap(normal(key, (rows,))))` over 4,000 keys from `jax.random.split`;
- `plain_xb`: the same plus `X @ b` (`X` a `rows x 8` constant of the program);
- `plain_xb_arg`, `plain_xb_barrier_loc`, `plain_xb_barrier_draw` (`VARIANTS`): `plain_xb`
  with `X` an argument, or an optimisation barrier on `X @ b` or on the normal draws;
- `plain_2d`: `plain_xb` vmapped twice, over `(4, 1000)` keys made as the route makes them
  (`[seed, i]`, one threefry word pair per draw);
- `ours_vmap`, `ours_auto`: `pymc_chunkpost.sample_posterior_predictive` with that strategy,
  cold then warm, and XLA's own compile seconds from `jax.monitoring`; each cell has a fresh
  cache folder, but `ours_auto_again`, a second process in `ours_auto`'s (it must compile
  nothing);
- `pymc_default`, `pymc_jax`: pymc's own function, its default backend and JAX mode.

The plain cells time `lower(...).compile()`. `--dump DIR` writes XLA's HLO of the
`--dump-cells` (default `ours_vmap`; before and after optimisation) under DIR. The last line
printed is the JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _cell import run_child  # noqa: E402

CELLS = ("plain", "plain_xb", "plain_2d", "ours_vmap", "ours_auto", "ours_auto_again")
CELLS += ("pymc_default", "pymc_jax")
#: `plain_xb` variants, to find what its compile costs: `X` an argument of the program rather
#: than a constant; an optimisation barrier on `X @ b` (the normal's location), or on the
#: standard normal draws, so that XLA cannot fuse the two.
VARIANTS = ("plain_xb_arg", "plain_xb_barrier_loc", "plain_xb_barrier_draw")
CHAINS, DRAWS = 4, 1000


def _model(rows: int):
    import numpy as np
    import pymc as pm
    import pytensor
    import xarray as xr

    dtype = pytensor.config.floatX
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(dtype)
    y = (x @ rng.normal(size=8) + rng.normal(size=rows)).astype(dtype)
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=8)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", x @ b, s, observed=y)
    posterior = xr.Dataset(
        {
            "b": (("chain", "draw", "b_dim_0"), rng.normal(size=(CHAINS, DRAWS, 8)).astype(dtype)),
            "s": (("chain", "draw"), np.abs(rng.normal(size=(CHAINS, DRAWS))).astype(dtype)),
        }
    )
    return model, posterior, x


def _compiles() -> list:
    import jax

    seconds: list = []

    def listen(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            seconds.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    return seconds


def _plain(cell: str, rows: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    b = jnp.asarray(rng.normal(size=(CHAINS, DRAWS, 8)).astype(np.float32))
    if cell == "plain":
        keys = jax.random.split(jax.random.key(0), CHAINS * DRAWS)
        fn = jax.vmap(lambda k: jax.random.normal(k, (rows,), jnp.float32))
        args: tuple = (keys,)
    elif cell == "plain_xb_arg":
        keys = jax.random.split(jax.random.key(0), CHAINS * DRAWS)
        fn = jax.vmap(lambda k, b, x: x @ b + jax.random.normal(k, (rows,)), (0, 0, None))
        args = (keys, b.reshape(CHAINS * DRAWS, 8), jnp.asarray(x))
    elif cell.startswith("plain_xb"):
        keys = jax.random.split(jax.random.key(0), CHAINS * DRAWS)
        loc_barrier = lax.optimization_barrier if cell.endswith("loc") else lambda v: v
        draw_barrier = lax.optimization_barrier if cell.endswith("draw") else lambda v: v

        def one_xb(k, b):
            return loc_barrier(x @ b) + draw_barrier(jax.random.normal(k, (rows,), jnp.float32))

        fn = jax.vmap(one_xb)
        args = (keys, b.reshape(CHAINS * DRAWS, 8))
    else:
        words = np.zeros((CHAINS, DRAWS, 2), np.uint32)
        words[..., 1] = np.arange(CHAINS * DRAWS, dtype=np.uint32).reshape(CHAINS, DRAWS)

        def one(w, b):
            key = jax.random.wrap_key_data(w)
            return x @ b + jax.random.normal(key, (rows,), jnp.float32)

        fn = jax.vmap(jax.vmap(one))
        args = (jnp.asarray(words), b)
    tic = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    lower_s = time.perf_counter() - tic
    tic = time.perf_counter()
    compiled = lowered.compile()
    record = {"lower_s": lower_s, "compile_s": time.perf_counter() - tic}
    jax.block_until_ready(compiled(*args))
    tic = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return record | {"warm_s": time.perf_counter() - tic}


def _pymc(cell: str, rows: int) -> dict:
    import warnings

    import pymc as pm

    warnings.filterwarnings("ignore")
    model, posterior, _ = _model(rows)
    import arviz as az

    trace = az.InferenceData(posterior=posterior) if pm.__version__ < "6" else posterior
    options: dict = {"progressbar": False, "random_seed": 1}
    if cell == "pymc_jax":
        if pm.__version__ < "6":
            options["compile_kwargs"] = {"mode": "JAX"}
        else:
            options["backend"] = "jax"
    record: dict = {}
    for phase in ("cold", "warm"):
        tic = time.perf_counter()
        with model:
            pm.sample_posterior_predictive(trace, **options)
        record[f"{phase}_s"] = time.perf_counter() - tic
    return record


def _ours(cell: str, rows: int) -> dict:
    import warnings

    import jax

    import pymc_chunkpost as pc

    warnings.filterwarnings("ignore")
    model, posterior, _ = _model(rows)
    jax.jit(lambda v: v + 1)(1.0).block_until_ready()  # JAX's first lowering, paid here
    seconds = _compiles()
    strategy = cell.removeprefix("ours_").removesuffix("_again")
    record: dict = {}
    for phase in ("cold", "warm"):
        tic = time.perf_counter()
        with model:
            out = pc.sample_posterior_predictive(
                posterior,
                random_seed=1,
                progressbar=False,
                postprocessing_vectorize=strategy,
                return_inferencedata=False,
            )
        record[f"{phase}_s"] = time.perf_counter() - tic
        record[f"{phase}_xla_compile_s"] = sum(seconds)
        record[f"{phase}_compiles"] = len(seconds)
        seconds.clear()
    record["dtype"] = str(out["y"].dtype)
    return record


def _cell(cell: str, rows: int) -> dict:
    import jax

    record = {"cell": cell, "rows": rows, "device": jax.devices()[0].device_kind}
    if cell.startswith("plain"):
        return record | _plain(cell, rows)
    if cell.startswith("pymc"):
        return record | _pymc(cell, rows)
    return record | _ours(cell, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="20000,2000")
    parser.add_argument("--cells", default=",".join(CELLS), help=f"of {CELLS + VARIANTS}")
    parser.add_argument("--out", default=None)
    parser.add_argument("--dump", default=None, help="XLA's HLO of --dump-cells, here")
    parser.add_argument("--dump-cells", default="ours_vmap")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        cell, rows = args.child.split(":")
        print(json.dumps(_cell(cell, int(rows))))
        return
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    records = []
    folders = tempfile.TemporaryDirectory()
    for rows in map(int, args.rows.split(",")):
        for cell in args.cells.split(","):
            # A fresh cache folder per cell; `ours_auto_again` reuses `ours_auto`'s.
            folder = Path(folders.name) / f"{cell.removesuffix('_again')}_{rows}"
            env = {"PYTHONPATH": path, "PYMC_CHUNKPOST_CACHE_DIR": str(folder)}
            if args.dump and cell in args.dump_cells.split(","):
                flags = f"--xla_dump_to={args.dump}/{cell}_{rows} --xla_dump_hlo_as_text"
                env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
            try:
                r = run_child(__file__, ["--child", f"{cell}:{rows}"], env)
            except RuntimeError as error:
                r = {"cell": cell, "rows": rows, "error": str(error)[-2000:]}
            records.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(records) + "\n")
    print(json.dumps(records))


if __name__ == "__main__":
    main()
