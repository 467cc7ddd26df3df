"""The disk tier's write rate against the disk's own sequential write rate, and its peak RSS.

A deterministic `mu = X @ beta` (big_det) of `--gb` GB at 4 x 1000 float64 draws is
post-processed with `output_memory="disk"` (`--route log_likelihood`: the pointwise
log-likelihood of its `y`, of the same size, with `compute_log_likelihood`; `--route
predictive`: draws of `y` with `sample_posterior_predictive`, their distribution checked at
one draw) under a host
budget (`--host-budget`, bytes; `PYMC_CHUNKPOST_HOST_MEMORY_BUDGET`), in a fresh process per
case. Measured in that process:

- `tier_seconds`: the call, then `os.sync()` so that the bytes are on the disk, not only in
  the page cache (`sync_seconds`, reported apart); twice, into a new store each time:
  `cold` (it compiles) and `warm` (the same call again);
- `peak_rss_above_start`: `VmHWM` after `clear_refs` minus `VmRSS` before the first call,
  over both calls;
- `in_memory_seconds`: the same call into host memory without the budget, twice, after
  the tier's runs: the compute's own pace (left out past half the available memory);
- `dd_seconds`: the same number of bytes written sequentially to a file in the same folder,
  64 MiB blocks from one buffer, then `fsync` (a `dd bs=64M conv=fsync` in Python), in the
  same process just before and just after the tier's runs (the mean of the two: a shared
  virtual disk's rate drifts); the file is deleted.

Rates are bytes / (seconds + sync seconds), both ways; `ratio` = tier rate / dd rate.
`--codec both` runs the tier once without compression and once with zarr's default (zstd),
and reports each store's size on disk. Every store is deleted after its case.

Run: `python benchmarks/bench_disk.py [--gb 3.2] [--host-budget 1073741824] [--dir /tmp]
[--codec none|default|both] [--route deterministic|log_likelihood|predictive]
[--json benchmarks/results/bench_disk_runN[_log_likelihood]_pyXY.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAINS, DRAWS = 4, 1000
BLOCK = 64 * 2**20


def _dd(folder: str, nbytes: int) -> float:
    """Seconds to write `nbytes` sequentially to a new file in `folder` and `fsync` it, in
    64 MiB blocks from one buffer (`dd bs=64M conv=fsync`); the file is deleted."""
    import numpy as np

    buffer = np.random.default_rng(0).bytes(BLOCK)
    target = Path(folder) / f"dd_{os.getpid()}.bin"
    try:
        tic = time.perf_counter()
        with open(target, "wb", buffering=0) as f:
            left = nbytes
            while left > 0:
                left -= f.write(buffer[: min(BLOCK, left)])
            os.fsync(f.fileno())
        return time.perf_counter() - tic
    finally:
        target.unlink(missing_ok=True)


def _posterior(raw, n_obs):
    """big_det's posterior from the raw draws (beta as drawn, sigma = exp of its log), as the
    installed pymc's inference data (pymc 6: DataTree; 5: InferenceData), and the fixture's
    own data (its seed): `(idata, beta, sigma, X, y)`."""
    import numpy as np
    import xarray as xr

    beta, sigma = np.asarray(raw[0]), np.exp(np.asarray(raw[1]))
    sample = {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
    posterior = xr.Dataset(
        {"beta": (("chain", "draw", "beta_dim_0"), beta), "sigma": (("chain", "draw"), sigma)},
        coords=sample,
    )
    if int(__import__("pymc").__version__[0]) >= 6:
        idata = xr.DataTree.from_dict({"posterior": posterior})
    else:
        import arviz as az

        idata = az.InferenceData(posterior=posterior)
    rng = np.random.default_rng(20_000)  # big_det's data
    X = rng.standard_normal((n_obs, 10))
    y = X @ rng.standard_normal(10) + rng.standard_normal(n_obs)
    return idata, beta, sigma, X, y


def _log_likelihood_call(model, raw, n_obs):
    """`compute_log_likelihood` of big_det's `y` on disk, and a spot check of draw (1, 7)
    against `scipy.stats.norm`."""
    import numpy as np
    from scipy import stats

    import pymc_chunkpost as pc

    idata, beta, sigma, X, y = _posterior(raw, n_obs)

    def call(store):
        dataset = pc.compute_log_likelihood(
            idata,
            model=model,
            extend_inferencedata=False,
            progressbar=False,
            output_memory="disk" if store else "host",
            output_path=store,
        )
        return [dataset["y"]]

    def spot(outputs):
        want = stats.norm.logpdf(y, X @ beta[1, 7], sigma[1, 7])
        return bool(np.allclose(outputs[0][1, 7].values, want))

    return call, spot


def _predictive_call(model, raw, n_obs):
    """`sample_posterior_predictive` of big_det's `y` on disk, and a check of its
    distribution at draw (1, 7): the draws standardised by that draw's mean and sigma
    follow a standard normal (Kolmogorov-Smirnov, p > 0.001), and two draws differ."""
    import numpy as np
    from scipy import stats

    import pymc_chunkpost as pc

    idata, beta, sigma, X, _ = _posterior(raw, n_obs)

    def call(store):
        result = pc.sample_posterior_predictive(
            idata,
            model=model,
            var_names=["y"],
            random_seed=1,
            progressbar=False,
            output_memory="disk" if store else "host",
            output_path=store,
        )
        return [result.posterior_predictive["y"]]

    def spot(outputs):
        drawn = outputs[0][1, 7].values
        z = (drawn - X @ beta[1, 7]) / sigma[1, 7]
        other = outputs[0][2, 9].values
        return bool(stats.kstest(z, "norm").pvalue > 1e-3 and not np.allclose(drawn, other))

    return call, spot


def child(gb: float, folder: str, codec: str, route: str = "deterministic") -> dict:
    sys.path.insert(0, str(ROOT))
    import warnings

    warnings.filterwarnings("ignore")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _internals import host_available_bytes

    import pymc_chunkpost as pc
    from pymc_chunkpost.profiling.fixtures import big_det, jax_fn, raw_draws
    from pymc_chunkpost.profiling.proc import reset_peak, status_bytes

    n_obs = int(gb * 1e9 / (CHAINS * DRAWS * 8))
    model = big_det(n_obs=n_obs)
    fn = jax_fn(model)
    raw = [jnp.asarray(x) for x in raw_draws(model, CHAINS, DRAWS, 0)]
    jax.block_until_ready(raw)
    if codec == "default":
        from _internals import use_disk_codec

        use_disk_codec("auto")  # zarr's default codec (zstd)
    if route == "deterministic":
        # The outputs' bytes: one draw's outputs (shapes without the sample axes) per draw.
        one_draw = jax.eval_shape(lambda *v: fn(*v), *[x[0, 0] for x in raw])
        nbytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize * CHAINS * DRAWS for x in one_draw)

        def call(store):
            memory = "disk" if store else "host"
            return pc.postprocess_samples(fn, raw, output_memory=memory, output_path=store)

        def spot(outputs):  # draw (1, 7) of every output against the per-draw function
            one = fn(*[x[1, 7] for x in raw])
            return all(np.allclose(o[1, 7], np.asarray(w)) for o, w in zip(outputs, one))
    else:
        made = _log_likelihood_call if route == "log_likelihood" else _predictive_call
        call, spot = made(model, raw, n_obs)
        nbytes = CHAINS * DRAWS * n_obs * 8
    dd_before = _dd(folder, nbytes)
    start = status_bytes("VmRSS")
    reset_peak()
    runs = []
    for phase in ("cold", "warm"):  # cold: compiles; warm: the same call again, compiled
        store = Path(tempfile.mkdtemp(dir=folder)) / "store"
        try:
            tic = time.perf_counter()
            outputs = call(store)
            tier_seconds = time.perf_counter() - tic
            tic = time.perf_counter()
            os.sync()
            sync_seconds = time.perf_counter() - tic
            written = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in outputs)
            assert written == nbytes, (written, nbytes)  # what `dd` writes: the same bytes
            stored = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
            complete = pc.open_outputs(store).complete
            checked = spot(outputs)
            del outputs
        finally:
            shutil.rmtree(store.parent, ignore_errors=True)
        runs.append((phase, tier_seconds, sync_seconds, stored, complete, checked))
    peak = status_bytes("VmHWM") - start
    # The same call into host memory, without the budget, twice (the second compiled): the
    # compute's own pace, which bounds the tier's where it is slower than the disk. Left out
    # (None) where the outputs would take over half the host's available memory.
    os.environ.pop("PYMC_CHUNKPOST_HOST_MEMORY_BUDGET", None)
    in_memory = None
    if nbytes < host_available_bytes() / 2:
        in_memory = []
        for _ in range(2):
            tic = time.perf_counter()
            outputs = call(None)
            in_memory.append(time.perf_counter() - tic)
            del outputs
    dd_after = _dd(folder, nbytes)
    dd_seconds = (dd_before + dd_after) / 2
    dd_rate = nbytes / dd_seconds
    return {
        "route": route,
        "codec": codec,
        "output_bytes": nbytes,
        "dd_seconds": dd_seconds,
        "dd_seconds_before_after": [dd_before, dd_after],
        "dd_rate_mb_s": dd_rate / 1e6,
        "peak_rss_above_start_mib": peak / 2**20,
        "in_memory_seconds": in_memory,
        "phases": [
            {
                "phase": phase,
                "stored_bytes": stored,
                "complete": complete,
                "spot_check": spot,
                "tier_seconds": seconds,
                "sync_seconds": sync,
                "tier_rate_mb_s": nbytes / (seconds + sync) / 1e6,
                "ratio": nbytes / (seconds + sync) / dd_rate,
            }
            for phase, seconds, sync, stored, complete, spot in runs
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=3.2)
    parser.add_argument("--host-budget", type=int, default=2**30)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--codec", choices=("none", "default", "both"), default="none")
    parser.add_argument(
        "--route",
        choices=("deterministic", "log_likelihood", "predictive"),
        default="deterministic",
    )
    parser.add_argument("--json")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        gb, folder, codec, route = args.child
        print(json.dumps(child(float(gb), folder, codec, route)))
        return
    codecs = ("none", "default") if args.codec == "both" else (args.codec,)
    env = dict(os.environ, PYMC_CHUNKPOST_HOST_MEMORY_BUDGET=str(args.host_budget))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    runs = []
    for codec in codecs:
        command = [sys.executable, __file__, "--child", str(args.gb), args.dir, codec, args.route]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    import jax

    record = {
        "benchmark": "bench_disk",
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "zarr": __import__("zarr").__version__,
        "gb": args.gb,
        "route": args.route,
        "host_budget": args.host_budget,
        "chains": CHAINS,
        "draws": DRAWS,
        "runs": runs,
    }
    print(
        "| codec | phase | output | on disk | tier s (+sync) | tier MB/s | dd MB/s | ratio "
        "| complete, values |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        for p in r["phases"]:
            print(
                f"| {r['codec']} | {p['phase']} | {r['output_bytes'] / 1e9:.2f} GB"
                f" | {p['stored_bytes'] / 1e9:.2f} GB | {p['tier_seconds']:.1f}"
                f" (+{p['sync_seconds']:.1f}) | {p['tier_rate_mb_s']:.0f}"
                f" | {r['dd_rate_mb_s']:.0f} | {p['ratio']:.2f}"
                f" | {p['complete']}, {p['spot_check']} |"
            )
        print(f"peak RSS above start ({r['codec']}): {r['peak_rss_above_start_mib']:.0f} MiB")
        if r["in_memory_seconds"]:
            first, second = r["in_memory_seconds"]
            print(f"the same call into host memory, no budget: {first:.1f} s, then {second:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
