"""The engine's internals that the benchmarks call, time or read, named in one place.

The benchmarks' scripts import no private module of the package (`pymc_chunkpost._...`;
tests/test_benchmarks_layout.py checks it): this module is the one that does. Where a script
needs more than the public API (`pymc_chunkpost.postprocess_samples_with_plan`,
`pymc_chunkpost.configured`), it takes it from here. It ships with the benchmarks, not with the
package: these names follow the engine and change with it. tests/test_benchmark_internals.py
resolves and runs each of them, so that a change to the engine fails a test there rather than
a benchmark months later.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from typing import Any

from pymc_chunkpost._engine.data.types import Plan
from pymc_chunkpost._engine.execute.host_output import Transfer as Transfer
from pymc_chunkpost._engine.execute.host_output import compile_host_chunks as compile_host_chunks
from pymc_chunkpost._engine.execute.host_output import host_chunk_function as host_chunk_function
from pymc_chunkpost._engine.execute.host_output import stream_to_host as stream_to_host
from pymc_chunkpost._pymc.samplers import _standard_normal as route_standard_normal
from pymc_chunkpost._support.compat import PREFER_VECTOR_WIDTH as PREFER_VECTOR_WIDTH
from pymc_chunkpost._support.compat import unrolled_threefry as unrolled_threefry
from pymc_chunkpost._support.config import current as current
from pymc_chunkpost._support.disk import wait as wait_for_disk
from pymc_chunkpost._support.memory import _host_available_bytes as host_available_bytes
from pymc_chunkpost._support.memory import free_bytes as free_bytes

__all__ = [
    "PREFER_VECTOR_WIDTH",
    "STEPS",
    "Transfer",
    "compile_host_chunks",
    "current",
    "free_bytes",
    "host_available_bytes",
    "host_chunk_function",
    "on_plan",
    "route_standard_normal",
    "stream_to_host",
    "time_step",
    "timed",
    "unrolled_threefry",
    "use_disk_codec",
    "wait_for_disk",
]

#: The steps inside one call that `time_step` can time: label -> (module of the package, the
#: function that does the step). `benchmarks/cold_call.py` times all but the last.
STEPS: dict[str, tuple[str, str]] = {
    "analysis_trace": ("_engine.data.problem", "_trace"),
    "validate": ("_engine.call.draws", "validate"),
    "budget": ("_engine.plan.resources", "resolve_budget"),
    "execute": ("_engine.call.postprocess", "execute"),
    "store.slot_for": ("_engine.execute.executable_store", "slot_for"),
    "store.load": ("_engine.execute.executable_store", "load"),
    "store.start_worker": ("_engine.execute.executable_store", "start_worker"),
    "store.save_later": ("_engine.execute.executable_store", "save_later"),
    "tuning.tuning_key": ("_engine.plan.tuning", "tuning_key"),
    "tuning.load": ("_engine.plan.tuning", "load"),
    "tuning.store": ("_engine.plan.tuning", "store"),
    "predictive.graph": ("_pymc.forward_graph", "build"),
}


def timed(owner: Any, name: str, record: Callable[[float], None]) -> None:
    """Replace `owner.name` (a module's function), for the rest of this process, by one that
    passes the seconds of each of its calls to `record`."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def outer(*args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            record(time.perf_counter() - tic)

    setattr(owner, name, outer)


def time_step(label: str, record: Callable[[float], None]) -> None:
    """`timed` on the function that does the step `label` of `STEPS`."""
    module, name = STEPS[label]
    timed(importlib.import_module(f"pymc_chunkpost.{module}"), name, record)


def on_plan(record: Callable[[Plan], None]) -> None:
    """Pass every plan that a call runs, from now on in this process, to `record`: those of
    `postprocess_samples`, of a patched `pm.sample` and of the pymc and NumPyro routes (every
    route runs through `postprocess_samples_with_plan`)."""
    from pymc_chunkpost._engine.call import postprocess as _postprocess

    run = _postprocess.run

    @functools.wraps(run)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        outputs, plan = run(*args, **kwargs)
        record(plan)
        return outputs, plan

    _postprocess.run = recorded


def use_disk_codec(compressors: Any) -> None:
    """The disk tier's Zarr codec from now on in this process (`"auto"`: zarr's default,
    zstd; None: none, the tier's choice): for `bench_disk.py`'s codec comparison."""
    from pymc_chunkpost._engine.execute import disk_sink as _disk_sink

    _disk_sink.COMPRESSORS = compressors
