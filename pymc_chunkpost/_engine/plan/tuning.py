"""The on-disk tuning cache: the chunk plan a model's previous run found best.

One small JSON file per key, in the cache folder (`_disk.cache_dir`). The key covers the
per-draw function (its jaxpr and the shapes of its data), the draws' shapes and dtypes, the
devices, and the jax, jaxlib and package versions, so a stale entry is never read for another
problem. Every failure reads as "no entry" or skips the write (`_disk`): the cache can only
save time, never raise.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax

from ..._support.disk import cache_dir, read_bytes, write_later
from ..._support.version import __version__
from ..data.problem import Problem

__all__ = ["cache_dir", "tuning_key", "load", "store"]

#: Bumped when the meaning of an entry changes; older entries are then ignored.
FORMAT = 1


def tuning_key(problem: Problem, request: str) -> str:
    """A stable key for `problem` planned under `request` (the strategy and output memory)."""
    import jaxlib

    placement = problem.placement
    device = placement.device
    parts = [
        str(FORMAT),
        __version__,
        jax.__version__,
        jaxlib.__version__,
        device.platform,
        str(getattr(device, "device_kind", "")),
        f"{placement.n_devices}:{placement.spec}",
        ";".join(f"{s.shape}{s.dtype}" for s in problem.in_specs),
        request,
        problem.fingerprint,
    ]
    if problem.random:  # planned otherwise than before `Problem.random`: a key of its own
        parts.append("random")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def load(key: str) -> dict[str, Any] | None:
    """The entry stored under `key`, or None (missing, unreadable, corrupt or stale)."""
    root = cache_dir()
    data = None if root is None else read_bytes(root / f"{key}.json")
    if data is None:
        return None
    try:
        entry = json.loads(data)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    return entry


def store(key: str, entry: dict[str, Any]) -> None:
    """Write `entry` under `key` on the background thread, off the caller's path
    (`_disk.write_later`): `load` reads it back at once; a write that fails is skipped."""
    root = cache_dir()
    if root is not None:
        write_later(root / f"{key}.json", _encode(entry))


def _encode(entry: dict[str, Any]) -> bytes:
    return json.dumps({"format": FORMAT, **entry}).encode()
