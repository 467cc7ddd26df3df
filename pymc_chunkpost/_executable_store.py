"""Compiled executables kept on disk, so that a model post-processed again skips XLA's compile.

An executable is stored under a hash of everything that decides it: the lowered module's text
(the program with its constants, shardings and donated inputs), the devices it runs on, the
jax and jaxlib versions, the backend's platform version and `XLA_FLAGS`. Another model, other
data, other shapes or another install never hit. Each file holds a checksum of its payload,
checked before anything is loaded. The folder (`<cache_dir>/executables`) is bounded by
`MAX_BYTES`: the files used least recently go first. Every failure reads as a miss (`_disk`).

This is JAX's own persistent compilation cache, narrowed to our executables: JAX's keeps only
compiles over `jax_persistent_cache_min_compile_time_secs` (1 s by default), and post-processing
compiles in 0.05-0.5 s (docs/strategies.md). Like JAX's, it loads native code from the user's
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

__all__ = ["key", "load", "save_later", "wait", "MAX_BYTES"]

#: Bumped when the file layout changes; older files are then never read.
MAGIC = b"pymc_chunkpost-executable-1\n"
#: The most bytes the folder holds; past it, the least recently used files are deleted until
#: it holds three quarters of this.
MAX_BYTES = 256 * 2**20
SUBFOLDER = "executables"

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _folder() -> Path | None:
    root = cache_dir()
    return None if root is None else root / SUBFOLDER


def key(lowered: Any, devices: Sequence[Any]) -> str | None:
    """The store's key for `lowered` run on `devices`, or None where nothing is stored:
    the store is off, or the run spans several processes (`jax.distributed`)."""
    if _folder() is None or jax.process_count() > 1:
        return None
    import jaxlib

    device = devices[0]
    client = getattr(device, "client", None)
    parts = [
        MAGIC.decode(),
        jax.__version__,
        jaxlib.__version__,
        device.platform,
        str(getattr(device, "device_kind", "")),
        str(getattr(client, "platform_version", "")),
        os.environ.get("XLA_FLAGS", ""),
        ",".join(str(d.id) for d in devices),
        lowered.as_text(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def load(name: str, lowered: Any, devices: Sequence[Any]) -> Any:
    """The stored `jax.stages.Compiled` for key `name`, loaded on `devices`; None on a miss."""
    from jax.experimental import serialize_executable

    folder = _folder()
    if folder is None:
        return None
    path = folder / f"{name}.bin"
    data = read_bytes(path)
    if data is None or not data.startswith(MAGIC):
        return None
    digest, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
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


def save_later(name: str, compiled: Any) -> None:
    """Store `compiled` under key `name` on a background thread (serializing takes 1-30 ms,
    which then overlaps the run); nothing is raised. Python waits for it at exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pymc_chunkpost")
    _POOL.submit(_save, name, compiled)


def wait() -> None:
    """Block until every background save has finished (tests, and before reading the store)."""
    with _POOL_LOCK:
        pool = _POOL
    if pool is not None:
        pool.submit(lambda: None).result()


def _save(name: str, compiled: Any) -> bool:
    from jax.experimental import serialize_executable

    folder = _folder()
    if folder is None:
        return False
    path = folder / f"{name}.bin"
    if path.exists():
        return True
    try:
        payload, _, _ = serialize_executable.serialize(compiled)
    except Exception:  # noqa: BLE001 - a backend that cannot serialize simply stores nothing
        return False
    data = MAGIC + hashlib.sha256(payload).digest() + payload
    if not write_bytes(path, data):
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
