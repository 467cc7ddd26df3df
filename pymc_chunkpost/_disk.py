"""The on-disk cache folder, shared by the tuning cache and the compiled-executable store.

Invariants: a reader sees a whole file or none (writes go to a temporary file that is renamed
into place), and no failure of the disk (a read-only or missing home, a full disk, a corrupt
file, another process writing the same name) ever raises: it reads as "no entry" and skips
the write, so the caches can only save time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import jax

__all__ = ["cache_dir", "read_bytes", "write_bytes"]


def cache_dir() -> Path | None:
    """The cache folder; None disables every on-disk cache (`PYMC_CHUNKPOST_CACHE_DIR=""`).

    `PYMC_CHUNKPOST_CACHE_DIR`, else `<jax_compilation_cache_dir>/pymc_chunkpost` when JAX's
    persistent compilation cache is set, else `$XDG_CACHE_HOME/pymc_chunkpost`
    (`~/.cache/pymc_chunkpost`).
    """
    explicit = os.environ.get("PYMC_CHUNKPOST_CACHE_DIR")
    if explicit is not None:
        return Path(explicit) if explicit else None
    jax_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
    if jax_dir:
        return Path(jax_dir) / "pymc_chunkpost"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pymc_chunkpost"


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None where it cannot be read."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def write_bytes(path: Path, data: bytes) -> bool:
    """Write `data` to `path` atomically; False (and nothing raised) where that fails."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
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
