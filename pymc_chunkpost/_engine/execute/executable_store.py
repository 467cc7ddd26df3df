"""Compiled executables kept on disk, so that a model post-processed again skips XLA's compile.

A file's name comes from what the caller knows before lowering (the per-draw jaxpr's text,
the shapes, the plan, the devices, the versions): cheap, so a cold run pays nothing for it.
Inside, the file holds a digest of the program itself, the lowered module's text (with its
constants, a model's `pm.Data`, its shardings and donated inputs), the devices, the jax and
jaxlib versions, the backend's platform version and `XLA_FLAGS`. It is compared before
anything is loaded, so other data of the same shapes, or anything else that changes the
program, never loads an executable that computes something else: it compiles, and its
executable replaces the file. Beside the payload, the file names the devices XLA assigned
the executable, which it is loaded onto. A checksum of both guards against damage. The folder
(`<cache_dir>/executables`) is bounded by `PlannerConfig.store_max_bytes`, the files used
least recently going first; every failure reads as a miss (`_disk`).

This is JAX's own persistent compilation cache, narrowed to our executables: JAX's keeps only
compiles over `jax_persistent_cache_min_compile_time_secs` (1 s by default), and post-processing
compiles in 0.03-0.6 s (docs/strategies.md). Like JAX's, it loads native code from the user's
own cache folder, and `PYMC_CHUNKPOST_CACHE_DIR=""` turns it off. Unlike JAX's, it loads only
from a folder and files that the current user owns and no one else can write (`_disk`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._support.compat import const_args, serialized_parts
from ..._support.config import current
from ..._support.disk import cache_dir, later, read_bytes, trusted, write_bytes

__all__ = [
    "Slot",
    "slot_for",
    "load",
    "save_later",
    "Portable",
    "portable",
    "relocate",
    "stop_loading",
    "loading_stopped",
]

#: Bumped when the file layout, or what a file may hold, changes; older files are then never
#: read. (4: files of 3 written under jax 0.12.1 may hold their constants apart, `_compat` 7.)
MAGIC = b"pymc_chunkpost-executable-4\n"
SUBFOLDER = "executables"

#: Set once this jaxlib failed to load a whole, checksummed file: nothing more is stored,
#: loaded or moved in this process (some CPUs' loaders reject XLA's own files, as reported
#: upstream).
_LOADER_BROKEN = False
#: Set once an executable that was loaded or moved failed to run (`stop_loading`): nothing
#: more is loaded or moved in this process, but what it compiles in their place is stored,
#: replacing the entry that failed.
_LOADING_STOPPED = False
#: Temporary files of a write that was killed are swept after this many seconds.
STALE_TMP_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one executable is stored, and what it must have been compiled under.

    Attributes:
        path: its file.
        context: the compile settings, as text: versions, platform, devices, `XLA_FLAGS`,
            `LIBTPU_INIT_ARGS` and JAX's configuration, captured when it was compiled.
        devices: the devices it runs on, in its device-assignment order.
    """

    path: Path
    context: str
    devices: tuple[Any, ...]


def _context(devices: Sequence[Any]) -> str:
    import jaxlib

    device = devices[0]
    client = getattr(device, "client", None)
    config = getattr(jax.config, "values", {})
    return "\n".join(
        [
            MAGIC.decode(),
            jax.__version__,
            jaxlib.__version__,
            device.platform,
            str(getattr(device, "device_kind", "")),
            str(getattr(client, "platform_version", "")),
            ",".join(str(d.id) for d in devices),
            os.environ.get("XLA_FLAGS", ""),
            os.environ.get("LIBTPU_INIT_ARGS", ""),
            repr(sorted(config.items())),
        ]
    )


def slot_for(parts: Sequence[str], devices: Sequence[Any]) -> Slot | None:
    """The slot of an executable described by `parts` (what is known before lowering), run on
    `devices`; None where nothing is stored: the store is off, this process's loader is
    broken, the run spans several processes (`jax.distributed`), or the folder may hold
    someone else's code (`_disk.trusted`: it warns once)."""
    root = cache_dir()
    if (
        root is None
        or _LOADER_BROKEN
        or jax.process_count() > 1
        or not trusted(root / SUBFOLDER, root)
    ):
        return None
    context = _context(devices)
    name = hashlib.sha256("\n".join([context, *parts]).encode()).hexdigest()[:40]
    return Slot(root / SUBFOLDER / f"{name}.bin", context, tuple(devices))


def _program_digest(slot: Slot, lowered: Any) -> bytes:
    return hashlib.sha256(f"{slot.context}\n{lowered.as_text()}".encode()).digest()


@dataclasses.dataclass(frozen=True)
class Portable:
    """An executable's serialized machine code: what the store writes, and, for a
    one-device executable, what `relocate` loads on any device of the client and kind it
    was compiled for.

    Invariant: it is serialized from an executable XLA compiled, never from one loaded from
    bytes (jaxlib 0.10's CPU client serializes a loaded one without its functions: it loads,
    then fails at its first call).

    Attributes:
        payload: the serialized executable.
        in_tree: its arguments' tree.
        out_tree: its results' tree.
        devices: the ids of the devices XLA assigned it, in order: what it is loaded onto.
            Not always the draws' devices: a program that reads no input and writes no
            output (every output passed through) is compiled for one device, whatever
            devices its arguments are on.
    """

    payload: bytes
    in_tree: Any
    out_tree: Any
    devices: tuple[int, ...]


def portable(compiled: Any) -> Portable | None:
    """`compiled` (just compiled by XLA) as a `Portable`; None where it cannot be serialized,
    or where it holds constants apart from its text (`_compat.const_args`): the digest that
    names it would not see them."""
    from jax.experimental import serialize_executable

    if const_args(compiled):
        return None
    try:
        devices = tuple(d.id for d in compiled.runtime_executable().local_devices())
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        return Portable(payload, in_tree, out_tree, devices)
    except Exception:  # noqa: BLE001 - a backend that cannot serialize cannot relocate
        return None


def load(slot: Slot, lowered: Any) -> tuple[Any, Portable] | None:
    """The stored `jax.stages.Compiled` of `lowered`, loaded on the slot's devices, and the
    bytes it was loaded from; None on a miss."""
    global _LOADER_BROKEN
    if _LOADING_STOPPED:
        return None
    data = read_bytes(slot.path, private=True)
    if data is None or not data.startswith(MAGIC):
        return None  # a miss costs no import: the worker imports the serializer (`start_worker`)
    from jax.experimental import serialize_executable

    start = len(MAGIC)
    program, digest = data[start : start + 32], data[start + 32 : start + 64]
    body = data[start + 64 :]
    if program != _program_digest(slot, lowered):
        return None  # another program under the same name: other data, flags or devices
    if hashlib.sha256(body).digest() != digest:
        return None  # a damaged file: never handed to the loader
    ids, _, payload = body.partition(b"\n")
    devices = _devices(slot, ids)
    if devices is None:
        return None
    try:
        compiled = serialize_executable.deserialize_and_load(
            payload,
            lowered.in_tree,
            lowered.out_tree,
            backend=getattr(devices[0], "client", None),
            execution_devices=devices,
        )
    except Exception:  # noqa: BLE001 - a whole file that this jaxlib cannot load is a miss
        _LOADER_BROKEN = True
        with contextlib.suppress(OSError):
            slot.path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(slot.path)  # used now: the last to be evicted
    code = Portable(payload, lowered.in_tree, lowered.out_tree, tuple(d.id for d in devices))
    return compiled, code


def _devices(slot: Slot, ids: bytes) -> list[Any] | None:
    """The devices a stored executable was compiled for (`Portable.devices`), found among
    this process's devices of the slot's platform; None if one is missing."""
    local = {d.id: d for d in jax.local_devices(backend=slot.devices[0].platform)}
    try:
        found = [local.get(int(i)) for i in ids.split(b",")]
    except ValueError:
        return None
    return None if not found or None in found else found


def relocate(code: Portable, device: Any) -> Any:
    """The `jax.stages.Compiled` of `code` loaded on `device`, with that device assigned
    instead of the one it was compiled for: milliseconds, where XLA's compile takes
    0.1-0.3 s (docs/strategies.md). None where this jaxlib cannot.

    Only for a device of the client and kind that `code` was compiled for: the machine code
    is the same, only the device it is assigned to changes (as JAX's own persistent cache
    loads a GPU executable on another GPU of its kind).
    """
    if _LOADER_BROKEN or _LOADING_STOPPED or len(code.devices) != 1:
        return None
    # No public API loads an executable with another device assigned: these are the calls
    # JAX's own persistent cache makes for it (`compilation_cache.get_executable_and_time`),
    # and `serialize_executable.deserialize_and_load`'s, with the device mapped.
    from jax._src import compiler

    try:
        options = compiler.get_compile_options(
            num_replicas=1,
            num_partitions=1,
            device_assignment=np.array([[device]]),
            backend=device.client,
        )
        loaded = _Relocating(io.BytesIO(code.payload), device, options).load()
        unloaded, args_info, no_kwargs, constants = serialized_parts(loaded)
        if constants:  # never stored (`portable`): they would be on another device
            return None
        moved = jax.stages.Compiled(
            unloaded.load(),
            [],
            code.in_tree.unflatten(args_info),
            code.out_tree,
            no_kwargs=no_kwargs,
        )
        runtime: Any = moved.runtime_executable()
        if list(runtime.local_devices()) != [device]:  # XLA's own device assignment
            return None
    except Exception:  # noqa: BLE001 - whatever this jaxlib cannot do, the caller compiles
        return None
    return moved


def loading_stopped() -> bool:
    """Whether nothing more is loaded or moved in this process (`stop_loading`, or a broken
    loader)."""
    return _LOADER_BROKEN or _LOADING_STOPPED


def stop_loading() -> None:
    """Nothing more is loaded or moved in this process: an executable that this jaxlib
    loaded or moved failed to run. What is compiled in its place is still stored."""
    global _LOADING_STOPPED
    _LOADING_STOPPED = True


class _Relocating(pickle.Unpickler):
    """Reads what `serialize_executable.serialize` wrote for one device, onto `device`."""

    def __init__(self, file: io.BytesIO, device: Any, options: Any):
        super().__init__(file)
        self.device, self.options = device, options

    def persistent_load(self, pid: Any) -> Any:
        from jax._src.lib import xla_client

        if pid[0] == "exec":
            devices = xla_client.DeviceList((self.device,))
            return self.device.client.deserialize_executable(pid[1], devices, self.options)
        if pid[0] == "device":  # the one device it was compiled for
            return self.device
        if pid[0] == "client":
            return self.device.client
        raise pickle.UnpicklingError(f"unknown persistent id {pid[0]!r}")


def _import_serializer() -> None:
    from jax.experimental import serialize_executable  # noqa: F401


def start_worker() -> None:
    """Start the background thread and import the serializer: called just before XLA
    compiles (which releases the GIL), so that neither lands on the caller's path later.
    Started after the run instead, they held the GIL for 2-3 ms before the call could
    return (docs/strategies.md)."""
    later(_import_serializer)


def save_later(slot: Slot, lowered: Any, compiled: Any) -> None:
    """Store `compiled` (of `lowered`; XLA's executable, or a `Portable` of it) in `slot` on a
    background thread: digesting and serializing take 1-30 ms, off the caller's path (but
    for a program that `_compat.unserializable_after_run` names, which the executor
    serialized before its run). Nothing is raised; Python waits for the thread at exit."""
    later(_save, slot, lowered, compiled)


def _save(slot: Slot, lowered: Any, compiled: Any) -> bool:
    if _LOADER_BROKEN:
        return False
    code = compiled if isinstance(compiled, Portable) else portable(compiled)
    if code is None:  # a backend that cannot serialize stores nothing
        return False
    body = ",".join(map(str, code.devices)).encode() + b"\n" + code.payload
    data = MAGIC + _program_digest(slot, lowered) + hashlib.sha256(body).digest() + body
    if not write_bytes(slot.path, data):
        return False
    _evict(slot.path.parent)
    return True


def _evict(folder: Path) -> None:
    """Delete the least recently used files while the folder holds more than
    `store_max_bytes`, and temporary files of writes that were killed."""
    now = time.time()
    try:
        for tmp in folder.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > STALE_TMP_SECONDS:
                    tmp.unlink()
        files = [(p.stat(), p) for p in folder.glob("*.bin")]
    except OSError:
        return
    total = sum(s.st_size for s, _ in files)
    max_bytes = current().store_max_bytes
    if total <= max_bytes:
        return
    for stat, path in sorted(files, key=lambda f: f[0].st_mtime):
        if total <= max_bytes * 3 // 4:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= stat.st_size
