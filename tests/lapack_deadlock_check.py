"""Run in a subprocess by tests/test_sharding.py: a JAX with 4 CPU devices (the README's
advice for 4 chains), a GP's draws split over all 4, chunks of 8 draws against pymc's vmap.
On jaxlib 0.10 the shards' loops over Cholesky kernels deadlocked when run at once
(`_resources.shard_by_shard`, `_compat.lapack_may_deadlock`)."""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from pymc.sampling.jax import _postprocess_samples as pymc_postprocess  # noqa: E402

from pymc_chunkpost._engine.call import postprocess as _postprocess  # noqa: E402
from pymc_chunkpost._support import compat as _compat  # noqa: E402
from pymc_chunkpost.profiling.fixtures import FIXTURES, jax_fn, raw_draws  # noqa: E402

if "--unfixed" in sys.argv:  # shows the deadlock on jaxlib 0.10: never returns
    _compat.LAPACK_DEADLOCK_FIXED_IN = (0, 0)
assert jax.device_count() == 4, jax.devices()
model = FIXTURES["gp"].build()
fn = jax_fn(model)
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("chain",)), PartitionSpec("chain"))
host = raw_draws(model, 4, 200, seed=2)
# pymc's reference on one device, finished before ours starts: its vmap over the 4 devices
# is the program that can hang on jaxlib 0.10 (1 run in 3 in zoo runs 12-14), and still
# running (dispatch is asynchronous) it would run LAPACK beside our shards.
expected = pymc_postprocess(fn, [jax.device_put(x, jax.devices()[0]) for x in host], None, "vmap")
jax.block_until_ready(expected)
raw = [jax.device_put(x, sharding) for x in host]
outputs, plan = _postprocess.run(fn, raw, None, "chunked", chunk_size=8)  # batched, in a loop
for got, want in zip(outputs, expected):
    assert got.sharding.is_equivalent_to(sharding, got.ndim)
    scale = float(np.max(np.abs(np.asarray(want))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7 * scale)
print("OK", plan.n_devices, plan.chunk_size, plan.devices_reason)
