"""Devices, their free memory, and XLA's GPU memory settings."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import os
import warnings
from typing import Any, Literal

import jax

__all__ = [
    "HOST_BUDGET_ENV",
    "OUTPUT_PATH_ENV",
    "configure_memory",
    "free_bytes",
    "host_free_bytes",
    "one_reading",
    "output_path_setting",
    "read_again",
    "resolve_device",
]

#: Bytes of host memory that this package's calls may take (outputs in host memory, their
#: staging, a CPU's whole work); unset: what the host has available. Read at each call, so
#: it may change between calls (`configure_memory(host_budget=...)` sets it).
HOST_BUDGET_ENV = "PYMC_CHUNKPOST_HOST_MEMORY_BUDGET"
#: The default folder of the disk tier's store (`output_memory="disk"`), where a call gives
#: none; where set, "auto" may put outputs too large for host memory on disk.
OUTPUT_PATH_ENV = "PYMC_CHUNKPOST_OUTPUT_PATH"

_ENV = {
    "preallocate": "XLA_PYTHON_CLIENT_PREALLOCATE",
    "mem_fraction": "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "allocator": "XLA_PYTHON_CLIENT_ALLOCATOR",
}
_ALLOCATORS = ("default", "platform", "bfc", "cuda_async")


def resolve_device(postprocessing_backend: str | None) -> jax.Device:
    """The device for `postprocessing_backend` (`None`, "cpu" or "gpu"), as pymc has it.

    The first device of this process: under `jax.distributed`, `jax.devices()[0]` may belong
    to another process.

    Raises:
        ValueError: for an unknown backend, or one that this JAX install does not have. The
            message names the backends that are available.
    """
    if postprocessing_backend is None:
        return jax.local_devices()[0]
    available = _available_backends()
    if not isinstance(postprocessing_backend, str) or postprocessing_backend not in (
        "cpu",
        "gpu",
        "cuda",
        "rocm",
        "tpu",
    ):
        raise ValueError(
            f"Unknown `postprocessing_backend={postprocessing_backend!r}`. Pass None (the "
            f"default device) or one of the available backends: {available}."
        )
    try:
        return jax.local_devices(backend=postprocessing_backend)[0]
    except RuntimeError:
        raise ValueError(
            f"`postprocessing_backend={postprocessing_backend!r}` is not available in this JAX "
            f"install. Available backends: {available}. Pass None for the default device."
        ) from None


def _available_backends() -> list[str]:
    names = []
    for name in ("cpu", "gpu", "tpu"):
        try:
            jax.devices(name)
        except RuntimeError:
            continue
        names.append(name)
    return names


#: Within `one_reading`: what this call has read of the machine's memory, by what was read.
_READING: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "pymc_chunkpost_reading", default=None
)


@contextlib.contextmanager
def one_reading():
    """Within it (one call of the package), free memory is read from the machine once: the
    first read of host memory, and of each accelerator's, serves every later question of the
    call, so that its decisions agree with each other. Nested, the outer reading holds.
    `read_again` starts afresh (after an out-of-memory failure)."""
    token = _READING.set({}) if _READING.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _READING.reset(token)


def read_again() -> None:
    """The next reads of free memory go to the machine (within `one_reading`)."""
    reading = _READING.get()
    if reading is not None:
        reading.clear()


def _read_once(what: Any, read: Any) -> Any:
    reading = _READING.get()
    if reading is None:
        return read()
    if what not in reading:
        reading[what] = read()
    return reading[what]


def free_bytes(device: jax.Device) -> int | None:
    """Memory free for new buffers on `device`, in bytes; None if the device cannot say.

    On a GPU this is the allocator's pool left after JAX's preallocation
    (`bytes_limit - bytes_in_use` from `device.memory_stats()`; with preallocation off,
    `bytes_limit` is still the pool's ceiling, `XLA_PYTHON_CLIENT_MEM_FRACTION` of the GPU).
    With `XLA_PYTHON_CLIENT_ALLOCATOR=platform` the GPU keeps no statistics: None
    (docs/memory.md). On the CPU it is the operating system's available RAM (`MemAvailable`
    of `/proc/meminfo`, or `os.sysconf` where that file is missing), capped by a cgroup
    memory limit if one is set.
    """
    if device.platform == "cpu":
        return host_free_bytes()
    return _read_once(device, functools.partial(_device_free_bytes, device))


def _device_free_bytes(device: jax.Device) -> int | None:
    stats = device.memory_stats()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return None


def host_free_bytes() -> int:
    """Host memory this process may still take, in bytes: the operating system's available
    RAM (`MemAvailable`), capped by a cgroup's limit less its usage where one is set, and by
    `HOST_BUDGET_ENV` where that is set (docs/memory.md#the-host-memory-budget).

    Raises:
        ValueError: `HOST_BUDGET_ENV` is set to something other than a positive number of
            bytes (read before any work).
    """
    available = _read_once("host", _host_available_bytes)
    budget = host_budget_setting()
    return available if budget is None else min(available, budget)


def output_path_setting() -> str | None:
    """The disk tier's default store folder (`configure_memory(output_path=...)`), or None."""
    return os.environ.get(OUTPUT_PATH_ENV) or None


def host_budget_setting() -> int | None:
    """The user's host budget (`HOST_BUDGET_ENV`), in bytes; None where unset.

    Raises:
        ValueError: it is not a positive number of bytes.
    """
    raw = os.environ.get(HOST_BUDGET_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 1:
        raise ValueError(
            f"{HOST_BUDGET_ENV}={raw!r} must be a positive number of bytes, such as "
            f"{8 * 2**30} for 8 GiB. Unset it to use the host's available memory."
        )
    return int(value)


def _host_available_bytes() -> int:
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_free_bytes()
    return min(available, cgroup) if cgroup is not None else available


def _cgroup_free_bytes() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        return int(limit) - current
    except (OSError, ValueError):
        return None


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc (macOS, musl, Windows)
        return None


def release_freed_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's `malloc_trim`).

    XLA's compiler works in the C heap and frees into it; large outputs are mapped apart
    and never reuse those pages, so until they are given back they stay in the process's
    resident memory on top of the outputs. False where the C library has no such call.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def configure_memory(
    preallocate: bool | None = None,
    mem_fraction: float | None = None,
    allocator: Literal["default", "platform", "bfc", "cuda_async"] | None = None,
    *,
    host_budget: float | None = None,
    output_path: str | os.PathLike | None = None,
) -> dict[str, str]:
    """Set XLA's GPU client memory settings, and the host memory budget of this package.

    XLA reads its settings when it initialises a backend: call this before the first JAX
    computation for them. The host budget is read at each call, and may be set at any time.

    - `preallocate=False` (`XLA_PYTHON_CLIENT_PREALLOCATE=false`): grow the pool on demand
      instead of taking `mem_fraction` of the GPU at start. Helps when several processes share
      a GPU, or when post-processing runs on the CPU (`postprocessing_backend="cpu"`) and the
      GPU needs little. Costs some allocation speed and more fragmentation.
    - `mem_fraction` (`XLA_PYTHON_CLIENT_MEM_FRACTION`, in (0, 1]): the share of GPU memory
      that the pool takes (JAX's default is 0.75). Raise it when post-processing on the GPU
      needs the room; the planner reads the pool that results.
    - `allocator="platform"` (`XLA_PYTHON_CLIENT_ALLOCATOR`): allocate exactly what is asked
      and free it at once. Slow; for debugging out-of-memory errors only.
    - `host_budget` (`PYMC_CHUNKPOST_HOST_MEMORY_BUDGET`, bytes): the host memory our calls
      may take: outputs landed in host memory and the chunks in flight to them, and on a
      CPU everything. By default the host's available memory (cgroup limits included). A
      call that cannot fit raises `MemoryError` before any work; a smaller budget costs
      smaller transfer chunks (more of them), not speed, down to a few MiB per chunk.
    - `output_path` (`PYMC_CHUNKPOST_OUTPUT_PATH`): the default folder of the disk tier's
      Zarr store, for calls that pass `output_memory="disk"` without a path; with it set,
      `output_memory="auto"` writes outputs that fit neither the device nor host memory
      there (each call needs an empty folder, or `resume=True`).

    Args:
        preallocate: whether to preallocate the pool; None leaves the setting as it is.
        mem_fraction: the pool's share of GPU memory; None leaves it as it is.
        allocator: one of "default", "platform", "bfc", "cuda_async"; None leaves it.
        host_budget: bytes of host memory for our calls; None leaves it as it is.
        output_path: the disk tier's default store folder; None leaves it as it is.

    Returns:
        The environment variables set, name to value.

    Raises:
        ValueError: for a value out of range. Nothing is set then.
    """
    settings: dict[str, str] = {}
    if preallocate is not None:
        if not isinstance(preallocate, bool):
            raise ValueError(f"`preallocate` must be a bool or None, got {preallocate!r}.")
        settings[_ENV["preallocate"]] = "true" if preallocate else "false"
    if mem_fraction is not None:
        if (
            isinstance(mem_fraction, bool)
            or not isinstance(mem_fraction, int | float)
            or not 0 < mem_fraction <= 1
        ):
            raise ValueError(
                f"`mem_fraction` must be a number in (0, 1], got {mem_fraction!r}. "
                "For example 0.9 lets JAX's GPU pool take 90% of the GPU."
            )
        settings[_ENV["mem_fraction"]] = f"{float(mem_fraction):g}"
    if allocator is not None:
        if allocator not in _ALLOCATORS:
            raise ValueError(f"`allocator` must be one of {_ALLOCATORS}, got {allocator!r}.")
        settings[_ENV["allocator"]] = allocator
    xla_settings = set(settings)
    if host_budget is not None:
        if (
            isinstance(host_budget, bool)
            or not isinstance(host_budget, int | float)
            or not host_budget >= 1
        ):
            raise ValueError(
                f"`host_budget` must be a positive number of bytes or None, got "
                f"{host_budget!r}. For example 8 * 2**30 for 8 GiB."
            )
        settings[HOST_BUDGET_ENV] = str(int(host_budget))
    if output_path is not None:
        if not isinstance(output_path, str | os.PathLike) or not os.fspath(output_path):
            raise ValueError(
                f"`output_path` must be a folder path (str or os.PathLike) or None, got "
                f"{output_path!r}."
            )
        settings[OUTPUT_PATH_ENV] = os.fspath(output_path)
    if xla_settings and _backend_initialised():
        warnings.warn(
            "A JAX backend is already initialised, so XLA memory settings cannot take effect "
            "in this process any more. Call `configure_memory` before the first JAX "
            "computation (before sampling), or set the environment variables "
            f"{sorted(xla_settings)} before starting Python.",
            RuntimeWarning,
            stacklevel=2,
        )
    os.environ.update(settings)
    return settings


def _backend_initialised() -> bool:
    # No public API says whether a backend exists yet; `jax._src.xla_bridge._backends` is the
    # registry that `jax.devices()` fills, read-only here.
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", {}))
