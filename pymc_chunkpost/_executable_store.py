"""Compiled executables kept on disk, so that a model post-processed again skips XLA's compile.

A file's name comes from what the caller knows before lowering (the per-draw jaxpr's text,
the shapes, the plan, the devices, the versions): cheap, so a cold run pays nothing for it.
Inside, the file holds a digest of the program itself, the lowered module's text (with its
constants, a model's `pm.Data`, its shardings and donated inputs), the devices, the jax and
jaxlib versions, the backend's platform version and `XLA_FLAGS`. It is compared before
anything is loaded, so other data of the same shapes, or anything else that changes the
program, never loads an executable that computes something else: it compiles, and its
executable replaces the file. A checksum of the payload guards against damage. The folder
(`<cache_dir>/executables`) is bounded by `MAX_BYTES`, the files used least recently going
first; every failure reads as a miss (`_disk`).

This is JAX's own persistent compilation cache, narrowed to our executables: JAX's keeps only
compiles over `jax_persistent_cache_min_compile_time_secs` (1 s by default), and post-processing
compiles in 0.03-0.6 s (docs/strategies.md). Like JAX's, it loads native code from the user's
own cache folder, and `PYMC_CHUNKPOST_CACHE_DIR=""` turns it off.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from ._disk import cache_dir, read_bytes, write_bytes

__all__ = ["name_for", "load", "save_later", "wait", "MAX_BYTES", "MAX_CONSTANT_BYTES"]

#: Bumped when the file layout changes; older files are then never read.
MAGIC = b"pymc_chunkpost-executable-2\n"
#: The most bytes the folder holds; past it, the least recently used files are deleted until
#: it holds three quarters of this.
MAX_BYTES = 256 * 2**20
#: Executables whose program holds more constant data than this are not stored: digesting
#: and writing them would cost more than their compile, and each compiled candidate keeps its
#: lowered module (a copy of the constants) until it is stored or its function is freed.
MAX_CONSTANT_BYTES = 16 * 2**20
SUBFOLDER = "executables"

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _folder() -> Path | None:
    root = cache_dir()
    return None if root is None else root / SUBFOLDER


def _versions(devices: Sequence[Any]) -> list[str]:
    import jaxlib

    device = devices[0]
    client = getattr(device, "client", None)
    return [
        MAGIC.decode(),
        jax.__version__,
        jaxlib.__version__,
        device.platform,
        str(getattr(device, "device_kind", "")),
        str(getattr(client, "platform_version", "")),
        os.environ.get("XLA_FLAGS", ""),
        ",".join(str(d.id) for d in devices),
    ]


def name_for(parts: Sequence[str], devices: Sequence[Any], constant_bytes: int) -> str | None:
    """The file name for an executable described by `parts`, run on `devices`; None where
    nothing is stored: the store is off, the program holds over `MAX_CONSTANT_BYTES` of
    constants, or the run spans several processes (`jax.distributed`)."""
    if _folder() is None or constant_bytes > MAX_CONSTANT_BYTES or jax.process_count() > 1:
        return None
    text = "\n".join([*_versions(devices), *parts])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _program_digest(lowered: Any, devices: Sequence[Any]) -> bytes:
    text = "\n".join([*_versions(devices), lowered.as_text()])
    return hashlib.sha256(text.encode()).digest()


def load(name: str, lowered: Any, devices: Sequence[Any]) -> Any:
    """The stored `jax.stages.Compiled` of `lowered`, loaded on `devices`; None on a miss."""
    from jax.experimental import serialize_executable

    folder = _folder()
    if folder is None:
        return None
    path = folder / f"{name}.bin"
    data = read_bytes(path)
    if data is None or not data.startswith(MAGIC):
        return None
    start = len(MAGIC)
    program, digest = data[start : start + 32], data[start + 32 : start + 64]
    payload = data[start + 64 :]
    if program != _program_digest(lowered, devices):
        return None  # another program under the same name: other data, flags or devices
    if hashlib.sha256(payload).digest() != digest:
        return None  # a damaged file: never handed to the loader
    try:
        compiled = serialize_executable.deserialize_and_load(
            payload, lowered.in_tree, lowered.out_tree, execution_devices=list(devices)
        )
    except Exception:  # noqa: BLE001 - a whole file that this jaxlib cannot load is a miss
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used now: the last to be evicted
    return compiled


def save_later(name: str, lowered: Any, compiled: Any, devices: Sequence[Any]) -> None:
    """Store `compiled` (of `lowered`) under `name` on a background thread: digesting and
    serializing take 1-30 ms, off the caller's path. Nothing is raised; Python waits for
    the thread at exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pymc_chunkpost")
    _POOL.submit(_save, name, lowered, compiled, list(devices))


def wait() -> None:
    """Block until every background save has finished (tests, and before reading the store)."""
    with _POOL_LOCK:
        pool = _POOL
    if pool is not None:
        pool.submit(lambda: None).result()


def _save(name: str, lowered: Any, compiled: Any, devices: list[Any]) -> bool:
    from jax.experimental import serialize_executable

    folder = _folder()
    if folder is None:
        return False
    try:
        payload, _, _ = serialize_executable.serialize(compiled)
    except Exception:  # noqa: BLE001 - a backend that cannot serialize simply stores nothing
        return False
    program = _program_digest(lowered, devices)
    data = MAGIC + program + hashlib.sha256(payload).digest() + payload
    if not write_bytes(folder / f"{name}.bin", data):
        return False
    _evict(folder)
    return True


def _evict(folder: Path) -> None:
    """Delete the least recently used files while the folder holds more than `MAX_BYTES`."""
    try:
        files = [(p.stat(), p) for p in folder.glob("*.bin")]
    except OSError:
        return
    total = sum(s.st_size for s, _ in files)
    if total <= MAX_BYTES:
        return
    for stat, path in sorted(files, key=lambda f: f[0].st_mtime):
        if total <= MAX_BYTES * 3 // 4:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= stat.st_size
