"""The on-disk tuning cache: the chunk plan a model's previous run found best.

One small JSON file per key, under `PYMC_CHUNKPOST_CACHE_DIR`, else beside JAX's persistent
compilation cache (`<jax_compilation_cache_dir>/pymc_chunkpost`) when one is set, else
`$XDG_CACHE_HOME/pymc_chunkpost` (`~/.cache/pymc_chunkpost`). The key covers the per-draw
function (its jaxpr and the shapes of its data), the draws' shapes and dtypes, the devices,
and the jax and package versions, so a stale entry is never read for another problem.

Every failure (a read-only or missing home, a corrupt or half-written file, another process
writing the same key) reads as "no entry" or skips the write: the cache can only save time,
never raise. Writes go to a temporary file that is renamed into place, so readers see a
whole file or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax

from ._problem import Problem

__all__ = ["cache_dir", "tuning_key", "load", "store"]

#: Bumped when the meaning of an entry changes; older entries are then ignored.
FORMAT = 1


def cache_dir() -> Path | None:
    """Where tuning entries live; None disables the cache (`PYMC_CHUNKPOST_CACHE_DIR=""`)."""
    explicit = os.environ.get("PYMC_CHUNKPOST_CACHE_DIR")
    if explicit is not None:
        return Path(explicit) if explicit else None
    jax_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
    if jax_dir:
        return Path(jax_dir) / "pymc_chunkpost"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pymc_chunkpost"


def tuning_key(problem: Problem, request: str) -> str:
    """A stable key for `problem` planned under `request` (the strategy and output memory)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("pymc-chunkpost")
    except PackageNotFoundError:
        ours = "unknown"
    placement = problem.placement
    device = placement.device
    parts = [
        str(FORMAT),
        ours,
        jax.__version__,
        device.platform,
        str(getattr(device, "device_kind", "")),
        f"{placement.n_devices}:{placement.spec}",
        ";".join(f"{s.shape}{s.dtype}" for s in problem.in_specs),
        request,
        problem.fingerprint,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def load(key: str) -> dict[str, Any] | None:
    """The entry stored under `key`, or None (missing, unreadable, corrupt or stale)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        entry = json.loads((root / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    return entry


def store(key: str, entry: dict[str, Any]) -> bool:
    """Write `entry` under `key`; False (and nothing raised) where that is not possible."""
    root = cache_dir()
    if root is None:
        return False
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=root, prefix=f".{key}.", suffix=".tmp", delete=False
        ) as f:
            tmp = f.name
            json.dump({"format": FORMAT, **entry}, f)
        os.replace(tmp, root / f"{key}.json")
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
