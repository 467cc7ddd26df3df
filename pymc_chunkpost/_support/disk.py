"""The on-disk cache folder, shared by the tuning cache and the compiled-executable store.

Invariants: a reader sees a whole file or none (writes go to a temporary file that is renamed
into place), and no failure of the disk (a read-only or missing home, a full disk, a corrupt
file, another process writing the same name) ever raises: it reads as "no entry" and skips
the write, so the caches can only save time.

Writes that the caller need not wait for go to one background thread (`later`), which Python
waits for at exit. A file written later reads back at once in this process: `read_bytes`
sees a pending write before it reaches the disk.

The folder is a trust boundary: the executable store loads native code from it. Folders are
created readable and writable by their owner alone (0700), files likewise (0600), and what
holds code is read only from a folder and file that the current user owns and that no one
else can write (`trusted`, `read_bytes(..., private=True)`), as ssh refuses a key file that
others can write.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

__all__ = [
    "cache_dir",
    "trusted",
    "read_bytes",
    "write_bytes",
    "write_later",
    "later",
    "wait",
]

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_WORKER: int | None = None  # the background thread's ident, once it has started
_LOCK = threading.Lock()
#: Files queued by `write_later` and not yet on disk: what `read_bytes` returns for them.
_PENDING: dict[Path, bytes] = {}
#: Folders `trusted` refused in this process: each is warned about once.
_REFUSED: set[Path] = set()


def _reset_after_fork() -> None:
    global _POOL, _WORKER, _LOCK
    # The parent's worker thread does not exist in the child, nor do its queued writes, and
    # its lock may have been held by another thread at the fork.
    _POOL, _WORKER, _LOCK = None, None, threading.Lock()
    _PENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def cache_dir() -> Path | None:
    """The cache folder; None disables every on-disk cache (`PYMC_CHUNKPOST_CACHE_DIR=""`).

    `PYMC_CHUNKPOST_CACHE_DIR`, else `<jax_compilation_cache_dir>/pymc_chunkpost` when JAX's
    persistent compilation cache is set, else `$XDG_CACHE_HOME/pymc_chunkpost`
    (`~/.cache/pymc_chunkpost`).
    """
    # Absolute: a write queued now lands in the same folder after an `os.chdir`.
    explicit = os.environ.get("PYMC_CHUNKPOST_CACHE_DIR")
    if explicit is not None:
        return Path(explicit).absolute() if explicit else None
    jax_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
    if jax_dir:
        return Path(jax_dir).absolute() / "pymc_chunkpost"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).absolute() / "pymc_chunkpost"


def _why_untrusted(status: os.stat_result) -> str | None:
    """Why a file or folder with this status may hold someone else's code; None if only the
    current user can have written it (or the system has no POSIX owners)."""
    if not hasattr(os, "getuid"):
        return None
    if status.st_uid != os.getuid():
        return "is not owned by you"
    if status.st_mode & 0o022:
        return "can be written by others"
    return None


def _refuse(where: Path, why: str) -> None:
    if where in _REFUSED:
        return
    _REFUSED.add(where)
    warnings.warn(
        f"pymc_chunkpost: {where} {why}, so no compiled executable is loaded from it (an "
        f"executable is code); compiling instead. Make it yours alone (`chmod go-w {where}`), "
        "or point PYMC_CHUNKPOST_CACHE_DIR at a private folder.",
        RuntimeWarning,
        stacklevel=2,
    )


def trusted(folder: Path, root: Path) -> bool:
    """Whether `root` and every folder from it down to `folder` that exists are owned by the
    current user and writable by no one else; warns once per folder refused."""
    where = folder
    while True:
        try:
            why = _why_untrusted(where.stat())
        except OSError:
            why = None  # not there yet: it will be created private
        if why is not None:
            _refuse(where, why)
            return False
        if where == root or where == where.parent:
            return True
        where = where.parent


def read_bytes(path: Path, *, private: bool = False) -> bytes | None:
    """The file's bytes (or those of a write still queued for it), or None where it cannot
    be read. `private`: also None for a file on disk that `trusted` would refuse (checked on
    the open file, so that it cannot be swapped between the check and the read)."""
    with _LOCK:
        pending = _PENDING.get(path)
    if pending is not None:
        return pending
    try:
        with open(path, "rb") as f:
            why = _why_untrusted(os.fstat(f.fileno())) if private else None
            if why is None:
                return f.read()
    except OSError:
        return None
    _refuse(path, why)
    return None


def _make_folders(folder: Path) -> None:
    """Create `folder` and every missing folder above it, each its owner's alone (0700)."""
    missing = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):
            new.mkdir(mode=0o700)


def write_bytes(path: Path, data: bytes) -> bool:
    """Write `data` to `path` atomically, readable by its owner alone (0600); False (and
    nothing raised) where that fails."""
    tmp = None
    try:
        _make_folders(path.parent)
        with tempfile.NamedTemporaryFile(
            "wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as f:
            tmp = f.name
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


def later(task: Callable[..., Any], *args: Any) -> bool:
    """Run `task(*args)` on the background thread, after what was queued before it. False
    (nothing raised) where it cannot be queued: the interpreter is shutting down."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="pymc_chunkpost", initializer=_started
            )
        try:
            _POOL.submit(task, *args)
        except RuntimeError:
            return False
    return True


def _started() -> None:
    global _WORKER
    _WORKER = threading.get_ident()


def write_later(path: Path, data: bytes) -> None:
    """`write_bytes` on the background thread, off the caller's path (docs/strategies.md);
    `read_bytes` reads it back at once."""
    with _LOCK:
        _PENDING[path] = data
    if not later(_write_pending, path, data):
        _forget(path, data)


def _write_pending(path: Path, data: bytes) -> None:
    try:
        write_bytes(path, data)
    finally:
        _forget(path, data)


def _forget(path: Path, data: bytes) -> None:
    with _LOCK:
        if _PENDING.get(path) is data:  # not since replaced by a newer write
            del _PENDING[path]


def wait() -> None:
    """Block until everything queued on the background thread has run (tests, and before
    reading the folder by other means than `read_bytes`). A no-op on that thread itself,
    which would otherwise wait for itself, and once the interpreter is shutting down."""
    with _LOCK:
        pool = _POOL
    if pool is None or threading.get_ident() == _WORKER:
        return
    try:
        pool.submit(lambda: None).result()
    except RuntimeError:
        return
