"""One process of the 2-process `jax.distributed` test (`tests/test_distributed.py`).

Run as `python distributed_worker.py PROCESS_ID NUM_PROCESSES PORT REFERENCE.npz RESULT.json`.
Every process starts JAX's multi-controller runtime on a coordinator at 127.0.0.1:PORT with
`LOCAL_DEVICES` CPU devices of its own, makes the same seeded raw draws of `CHAINS` chains,
and assembles global arrays from its own chains only (`jax.make_array_from_process_local_data`),
split over every process's devices: on the chain axis, and on the chain and draw axes. It
post-processes them with `pymc_chunkpost` and compares the output shards it can address with
pymc's own `_postprocess_samples` of the whole draws (computed once by the test, in
REFERENCE.npz, one array per output). Nothing crosses processes. It writes what it found to
RESULT.json, and exits 0 even when a comparison fails (the test reads the JSON).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import jax

LOCAL_DEVICES = 2
#: An option of this worker, not of `run`: fill the zero outputs by a compiled program, as
#: outputs of `PlannerConfig.host_zeros_max_bytes` or more are.
COMPILED_FILL = "compiled fill"
CHAINS = 4
DRAWS = 10
MODEL = "transforms"
#: (layout, strategy, options) of each run. Layouts: "chain" splits the chains over all 4
#: devices (10 draws per shard); "chain_draw" the chains over the processes and the draws over
#: each process's devices (2 chains x 5 draws per shard); "local" is each process's own chains
#: as numpy arrays, on one device of its own. The strategies: the planner, an explicit chunk of
#: 3 that overlaps at the end of each shard, pymc's own strategy, the host-driven and
#: segmented loops with a progress bar and donated draws (their zero outputs placed from the
#: host, and filled by a compiled program as large outputs are), and chunk sizes that differ
#: between the processes (as the online tuner's may: each process runs its own executable).
RUNS = [
    (layout, strategy, options)
    for layout in ("chain", "chain_draw")
    for strategy, options in [("auto", {}), ("chunked", {"chunk_size": 3}), ("vmap", {})]
] + [
    ("chain", "auto", {"chunk_size": 3, "progressbar": True, "donate_samples": True}),
    ("chain", "chunked", {"chunk_size": 4, "progressbar": True}),
    ("chain", "chunked", {"chunk_size": 5, "progressbar": True, COMPILED_FILL: True}),
    ("chain", "chunked", {"chunk_size": "3 + process id"}),
    ("local", "auto", {}),
]


def main(process_id: int, num_processes: int, port: int, reference: str, result: str) -> None:
    # Before anything touches a backend: 2 CPU devices here (this setting wins over the
    # `--xla_force_host_platform_device_count=100` that importing pymc.sampling.jax sets).
    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
    )
    report: dict = {"process_id": process_id, "checks": [], "errors": []}
    try:
        report.update(_run(process_id, num_processes, reference))
    except Exception:  # noqa: BLE001 - reported to the test, which fails on it
        report["errors"].append(traceback.format_exc())
    Path(result).write_text(json.dumps(report, indent=1))


def _run(process_id: int, num_processes: int, reference: str) -> dict:
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sys.path.insert(0, str(Path(__file__).parent))
    import models

    from pymc_chunkpost._engine.call.postprocess import run
    from pymc_chunkpost._engine.execute import program as _program
    from pymc_chunkpost._support.config import configured

    assert jax.process_index() == process_id and jax.process_count() == num_processes
    assert len(jax.local_devices()) == LOCAL_DEVICES
    model = models.MODELS[MODEL]()
    jax_fn = models.jax_fn(model)
    full = models.raw_draws(model, CHAINS, DRAWS, seed=0)
    expected = np.load(reference)
    devices = np.array(jax.devices())  # every process's, in process order
    meshes = {
        "chain": (Mesh(devices, ("chain",)), PartitionSpec("chain")),
        "chain_draw": (
            Mesh(devices.reshape(num_processes, -1), ("chain", "draw")),
            PartitionSpec("chain", "draw"),
        ),
    }
    checks = []
    for layout, strategy, options in RUNS:
        if options.get("chunk_size") == "3 + process id":
            options = {"chunk_size": 3 + process_id}
        if layout == "local":
            mine = _chains_here(NamedSharding(*meshes["chain"]), full[0].shape)
            raw = [np.ascontiguousarray(x[mine]) for x in full]
            sharding = jax.sharding.make_single_device_sharding(jax.local_devices()[0])
        else:
            mine = slice(None)
            sharding = NamedSharding(*meshes[layout])
            raw = [_global(sharding, x) for x in full]
        options = dict(options)
        fill = options.pop(COMPILED_FILL, False)
        host_zeros = _program._host_zeros
        if fill:  # and the host's zeros must not be what ran
            _program._host_zeros = _no_host_zeros
        tic = time.perf_counter()
        try:
            with configured(**({"host_zeros_max_bytes": 0} if fill else {})):
                outputs, plan = run(jax_fn, raw, None, strategy, **options)
        finally:
            _program._host_zeros = host_zeros
        seconds = time.perf_counter() - tic
        checks.append(
            {
                "layout": layout,
                "strategy": strategy,
                "options": {**options, COMPILED_FILL: fill},
                "seconds": seconds,
                "n_devices": plan.n_devices,
                "loop": str(plan.loop),
                "plan": plan.reason,
                **_compare(outputs, [expected[f"out{j}"][mine] for j in range(len(outputs))]),
                "same_sharding": all(
                    out.sharding.is_equivalent_to(sharding, out.ndim) for out in outputs
                ),
                # Donated draws are freed, except those an output passes through.
                "draws_as_expected": all(
                    _deleted(x)
                    == (options.get("donate_samples", False) and not _passed(x, outputs))
                    for x in raw
                ),
            }
        )
    checks.append(_refuses_replicated(jax_fn, full, meshes["chain"][0]))
    return {
        "checks": checks,
        "local_devices": [str(d) for d in jax.local_devices()],
        "global_devices": len(jax.devices()),
    }


def _no_host_zeros(*args, **kwargs):
    raise AssertionError("the zero outputs were placed from the host, not filled by XLA")


def _chains_here(sharding, shape) -> slice:
    """The chains of `shape` that this process holds under `sharding` (one block)."""
    index = sharding.addressable_devices_indices_map(shape)
    chains = sorted({i for idx in index.values() for i in range(*idx[0].indices(shape[0]))})
    assert chains == list(range(chains[0], chains[-1] + 1))
    return slice(chains[0], chains[-1] + 1)


def _global(sharding, x):
    """The global array of `x`, made from this process's chains only."""
    import numpy as np

    local = np.ascontiguousarray(x[_chains_here(sharding, x.shape)])
    return jax.make_array_from_process_local_data(sharding, local, x.shape)


def _compare(outputs, expected) -> dict:
    """Each output against pymc's, shard by shard (the shards this process can address)."""
    import numpy as np

    mismatches, shards = [], 0
    for j, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        if out.shape != want.shape or out.dtype != want.dtype:
            mismatches.append(f"output {j}: {out.shape} {out.dtype} != {want.shape} {want.dtype}")
            continue
        for shard in out.addressable_shards:
            shards += 1
            if not np.allclose(np.asarray(shard.data), want[shard.index], rtol=1e-10, atol=0):
                mismatches.append(f"output {j}, shard {shard.index}: values differ")
    return {
        "equal": not mismatches and shards > 0,
        "mismatches": mismatches,
        "shards_compared": shards,
        "fully_addressable": [out.is_fully_addressable for out in outputs],
    }


def _refuses_replicated(jax_fn, full, mesh) -> dict:
    """Draws copied whole onto every process cannot run where they are: a ValueError, before
    any work, and the draws are intact."""
    from jax.sharding import NamedSharding, PartitionSpec

    from pymc_chunkpost._engine.call.postprocess import run

    sharding = NamedSharding(mesh, PartitionSpec())
    raw = [jax.make_array_from_process_local_data(sharding, x, x.shape) for x in full]
    try:
        run(jax_fn, raw, None, "auto")
    except ValueError as error:
        message = str(error)
    else:
        message = ""
    return {
        "layout": "replicated",
        "strategy": "auto",
        "equal": "spans several processes" in message and not any(_deleted(x) for x in raw),
        "message": message,
    }


def _deleted(x) -> bool:
    return isinstance(x, jax.Array) and x.is_deleted()


def _passed(x, outputs) -> bool:
    return any(x is out for out in outputs)


if __name__ == "__main__":
    pid, count, port_number, ref, out = sys.argv[1:6]
    main(int(pid), int(count), int(port_number), ref, out)
