"""Outputs on disk: each chunk lands in host memory, then goes to a Zarr store at its place.

The device computes the chunks exactly as for outputs in host memory (`_host_output`, the
same compiled `TO_HOST` step); only the sink differs: a landed chunk is handed to one writer
thread, which writes it into the store's arrays at its region, while the device computes the
next chunks; a second thread flushes each written chunk to the disk and marks it.

The store's layout, its markers and its description are `_store.zarr`'s; this module checks
the place, makes or reopens the store, and writes the chunks into it.

Invariants:

- The writer's queue holds at most `QUEUE_CHUNKS` landed chunks: host memory holds those, the
  chunk being written, and the landing's two, never the outputs.
- A chunk's marker (a file under `MARKERS`, named by its item range) is created only once
  every output's region of that chunk has been written and flushed to the disk (its chunk
  files and their folders `fsync`ed): the markers say which items were written whole. A
  run killed at any point, the machine's power cut included, leaves the markers of whole
  chunks only. The markers are made in the chunks' order, each `fsync`ed before the next,
  behind the writes (by up to `QUEUE_CHUNKS` chunks).
- The root group's `chunkpost.complete` attribute becomes true last, after every chunk, the
  pass-through outputs, the coordinates and the consolidated metadata, all flushed to the
  disk first (`DiskSink.finish`, then `complete`): a killed run never reads back as
  complete.
- `resume=True` skips the chunks whose items the markers cover and computes the others:
  each draw's outputs depend on that draw alone, so the values are those of a run that was
  never interrupted. The draws given are only read.
- A store records a digest of what its outputs are computed from (`inputs_digest`: the
  draws, random keys included, the program's printed form and its constants, the model's
  data among them, JAX's settings and version); a call resumes it only with an equal
  digest, so a resumed store does not hold two calls' values (except where the digest
  cannot see a difference: data that a callback reads, draws that span processes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import queue
import re
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..._store.zarr import (
    ATTRIBUTE,
    FORMAT,
    MARKERS,
    Output,
    _mark,
    _outputs_of,
    _read_description,
    _read_markers,
    _sync,
    _write_coords,
    _zarr,
    complete,
    sample_dims,
    stored_arrays,
)
from ..data.problem import host_copy

__all__ = [
    "COMPRESSORS",
    "DISK_CHUNK_BYTES",
    "QUEUE_CHUNKS",
    "DiskSink",
    "check_place",
    "chunk_draws",
    "create_or_resume",
    "inputs_digest",
    "outputs_for",
]

#: The writer's queue: landed chunks waiting to be written. Two keep the writer busy while
#: the device computes, and bound host memory to a few chunks.
QUEUE_CHUNKS = 2
#: A chunk's outputs on the way to disk are kept within this many bytes (when one draw
#: fits): host memory holds `QUEUE_CHUNKS` + 3 of them (docs/memory.md, "Outputs on disk").
DISK_CHUNK_BYTES = 64 * 2**20
#: The arrays' codec: none. Measured against zarr's default (zstd) on float64 outputs,
#: compression cost write rate and saved little (docs/memory.md, "Outputs on disk";
#: `benchmarks/bench_disk.py --codec both`). zarr's `compressors` argument.
COMPRESSORS: Any = None
#: An object's address where a program prints one (`<function f at 0x7f...>`).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def chunk_draws(draws: int, per_draw_bytes: int, most: int | None = None) -> int:
    """Draws per chunk on disk: the most that fit `DISK_CHUNK_BYTES` (and `most`; at least
    one), made a divisor of `draws` where one is at least half that: then no chunk
    straddles two chains, each chunk is one whole Zarr chunk (none is read back to be
    rewritten), and the chains' last Zarr chunks are not padded."""
    fit = max(1, min(int(draws), DISK_CHUNK_BYTES // max(int(per_draw_bytes), 1)))
    fit = fit if most is None else max(1, min(fit, int(most)))
    divisor = max(d for d in range(1, fit + 1) if draws % d == 0)
    return divisor if 2 * divisor >= fit else fit


def outputs_for(
    specs: Sequence[Any],
    names: Sequence[str] | None = None,
    group: str = "posterior",
    dims: Mapping[str, Sequence[str]] | None = None,
    dtypes: Sequence[Any] | None = None,
    sample_shape: Sequence[int] | None = None,
) -> list[Output]:
    """The stored outputs for `specs` (the engine's shape `(a, b, ...)` and dtype each):
    named `names` (by default `output_0`, ...), in `group`, with `dims[name]` after the
    sample dims where given, else `<name>_dim_<i>` (pymc's default names); stored as
    `dtypes` where given (the route's own dtypes: each chunk is cast as it is written).
    `sample_shape`: the leading sample dims as stored (`sample_dims` names them), whose
    items are the engine's `a * b` in C order; None: the engine's `(a, b)`."""
    names = [f"output_{j}" for j in range(len(specs))] if names is None else list(names)
    if len(names) != len(specs) or len(set(names)) != len(names):
        raise ValueError(f"Need one distinct name per output, got {names!r}.")
    outputs = []
    dtypes = [s.dtype for s in specs] if dtypes is None else list(dtypes)
    for name, spec, dtype in zip(names, specs, dtypes):
        engine = tuple(int(s) for s in spec.shape)
        lead = engine[:2] if sample_shape is None else tuple(int(s) for s in sample_shape)
        if math.prod(lead) != math.prod(engine[:2]):
            raise ValueError(f"Sample shape {lead} for draws {engine[:2]} of {name!r}.")
        shape = lead + engine[2:]
        own = list((dims or {}).get(name, ()))
        own += [f"{name}_dim_{i}" for i in range(len(own), len(engine) - 2)]
        sample = sample_dims(len(lead))
        outputs.append(Output(group, name, shape, np.dtype(dtype).str, (*sample, *own), len(lead)))
    return outputs


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def inputs_digest(
    arrays: Sequence[Any], dtypes: Sequence[Any], consts: Sequence[Any], program: str
) -> str | None:
    """A digest of what a call's outputs are computed from: the input arrays' values as the
    program reads them (`dtypes`, little-endian; a random key's data), the program's printed
    form (with JAX's settings and the platform it runs on), its constants' values and JAX's
    version.
    Equal for the same call in another process: an address printed in the program (a
    callable parameter's) is left out. None where some draws span processes (each process
    holds only its own). A device array is copied to the host shard by shard, into a copy
    dropped once hashed (`host_copy`)."""
    import jax

    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in arrays):
        return None
    digest = hashlib.blake2b(_ADDRESS.sub("", program).encode(), digest_size=16)
    digest.update(f"|jax {jax.__version__}|".encode())
    for x, dtype in zip((*arrays, *consts), (*dtypes, *(None,) * len(consts))):
        value = _host_value(x, dtype)
        digest.update(f"|{value.dtype.str}{value.shape}|".encode())
        digest.update(value.reshape(-1).view(np.uint8).data)
    return digest.hexdigest()


def _host_value(x: Any, dtype: Any) -> np.ndarray:
    """`x` on the host as a contiguous little-endian array of `dtype` (default its own; a
    random key's data as they are), in a copy that `x` does not keep (`host_copy`)."""
    import jax

    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        dtype = None
    value = host_copy(x)
    dtype = np.dtype(value.dtype if dtype is None else dtype).newbyteorder("<")
    return np.ascontiguousarray(value, dtype=dtype)


def check_place(
    path: Any,
    outputs: Sequence[Output],
    output_bytes: int,
    *,
    resume: bool,
    name: str,
    inputs: str | None = None,
    refused: str = "Nothing was run.",
) -> None:
    """Every check of the place, before any work. `inputs`: the call's `inputs_digest`,
    which a store resumed must have recorded; `name`: the caller's option for the path;
    `refused`: what a refusal leaves, the messages' last sentence (none where empty).

    Raises:
        ValueError: `path` is not a path; it holds something else than these outputs
            (anything at all, unless `resume`), or outputs of other inputs; it cannot be
            written; or its disk has less free space than the outputs need
            (`output_bytes`, uncompressed).
    """
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(
            f"`{name}` must be a path (str or os.PathLike) for the disk tier, got {path!r}."
        )
    path, tail = Path(os.fspath(path)), f" {refused}" if refused else ""
    exists = path.exists()
    if exists and not path.is_dir():
        raise ValueError(f"`{name}={str(path)!r}` is a file, not a folder for a Zarr store.")
    written = 0
    if exists and any(path.iterdir()):
        described = _read_description(path)
        if not resume:
            raise ValueError(
                f"`{name}={str(path)!r}` is not empty"
                + (" (it holds outputs of ours)" if described else "")
                + ". Pass another path, delete it, or pass `resume=True` to continue a store "
                "of the same outputs." + tail
            )
        if described is None or _outputs_of(described) != list(outputs):
            raise ValueError(
                f"`{name}={str(path)!r}` holds other outputs than this call's "
                + ("(not a store of ours)" if described is None else "(other names or shapes)")
                + ", so it cannot be resumed. Pass another path."
                + tail
            )
        if inputs is not None and described.get("inputs") != inputs:
            raise ValueError(
                f"`{name}={str(path)!r}` holds outputs of the same names and shapes computed "
                "from other inputs (other draws, random seed or data, another function, or "
                "other JAX settings or version"
                + ("" if "inputs" in described else "; or a version that did not record them")
                + "), so resuming would mix two calls' values. Resume with the call's own "
                "arguments, or pass another path." + tail
            )
        written = _du(path)
    target = path if exists else _nearest_existing(path.parent)
    if not os.access(target, os.W_OK | os.X_OK):
        raise ValueError(
            f"`{name}={str(path)!r}` cannot be written ({str(target)!r} is read-only for "
            "this user). Pass a path on a writable disk." + tail
        )
    free = shutil.disk_usage(target).free
    needed = max(int(output_bytes) - written, 0)
    if needed > free:
        raise ValueError(
            f"The outputs need {needed / 2**20:,.1f} MiB on disk, but {str(target)!r} has "
            f"{free / 2**20:,.1f} MiB free. Pass an `{name}` on a disk with more room, or "
            "post-process fewer variables (`var_names`)." + tail
        )


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def create_or_resume(
    path: Any,
    outputs: Sequence[Output],
    *,
    resume: bool,
    coords: Mapping[str, Any] | None = None,
    draws_per_chunk: int | None = None,
    inputs: str | None = None,
) -> DiskSink:
    """The store at `path` for `outputs` (checked by `check_place`), made or reopened, and
    the sink that writes chunks into it.

    Args:
        path: the store's folder.
        outputs: what it holds.
        resume: reopen a store of the same outputs (its written chunks are kept).
        coords: coordinate values by dim name (beside the sample dims, which are
            `0..n-1`), written with the outputs.
        draws_per_chunk: the run's chunk size: where it divides the draws (the last sample
            dim), the Zarr chunks hold that many draws of one chain, so that each chunk is
            written whole.
        inputs: the call's `inputs_digest`, recorded in a new store.
    """
    zarr = _zarr()
    path = Path(os.fspath(path))
    description = {"format": FORMAT, "complete": False, "outputs": [o.describe() for o in outputs]}
    if inputs is not None:
        description["inputs"] = inputs
    described = _read_description(path) if resume and path.exists() else None
    if described is None:
        root = zarr.open_group(str(path), mode="w")
        for output in outputs:
            group = root.require_group(output.group)
            group.create_array(
                output.name,
                shape=output.shape,
                dtype=np.dtype(output.dtype),
                chunks=_zarr_chunks(output, draws_per_chunk),
                dimension_names=list(output.dims),
                compressors=COMPRESSORS,
                fill_value=0,
            )
        root.attrs[ATTRIBUTE] = description
        (path / MARKERS).mkdir(exist_ok=True)
    else:
        root = zarr.open_group(str(path), mode="r+")
        (path / MARKERS).mkdir(exist_ok=True)
    return DiskSink(path, root, list(outputs), dict(coords or {}))


def _zarr_chunks(output: Output, draws_per_chunk: int | None) -> tuple[int, ...]:
    """One chain (one item of every sample dim before the last), whole in the draw's own
    dims, and the run's chunk of draws where it divides the draws (each chunk written is
    then one Zarr chunk), else `chunk_draws`'s."""
    k = output.n_sample_dims
    draws = output.shape[k - 1]
    if not draws_per_chunk or draws % draws_per_chunk:
        per_draw = math.prod(output.shape[k:]) * np.dtype(output.dtype).itemsize
        draws_per_chunk = chunk_draws(draws, per_draw)
    return (*(1,) * (k - 1), max(1, min(draws, draws_per_chunk)), *output.shape[k:])


class DiskSink:
    """Where landed chunks go for outputs on disk: `write(start, stop, arrays)` queues the
    flat items `[start, stop)` of every computed output (the engine's `(a * b)` axis, the
    sample dims' items in C order, counted from `offset`) for the writer thread;
    `written(start, stop)` says whether a whole earlier chunk covers them (a resumed run
    skips them)."""

    def __init__(
        self,
        path: Path,
        root: Any,
        outputs: list[Output],
        coords: dict[str, Any],
        offset: int = 0,
        computed: Sequence[int] | None = None,
        shared: _Writer | None = None,
    ) -> None:
        self.path, self.root, self.outputs, self.coords = path, root, outputs, coords
        self.arrays = [root[f"{o.group}/{o.name}"] for o in outputs]
        self.files = [_ChunkFiles.of(a, o.n_sample_dims) for a, o in zip(self.arrays, outputs)]
        self.draws = outputs[0].shape[outputs[0].n_sample_dims - 1] if outputs else 1
        self.offset = offset
        self.computed = list(range(len(outputs))) if computed is None else list(computed)
        self.done = _read_markers(path / MARKERS)
        self.writer = shared if shared is not None else _Writer(self)

    def with_computed(self, computed: Sequence[int]) -> DiskSink:
        """This sink for the outputs at `computed` alone (the others are passed through)."""
        return DiskSink(
            self.path, self.root, self.outputs, self.coords, self.offset, computed, self.writer
        )

    def for_chains(self, chains: slice) -> DiskSink:
        """The sink of one shard's block of whole chains (its items counted from zero)."""
        first = chains.start or 0
        return DiskSink(
            self.path,
            self.root,
            self.outputs,
            self.coords,
            self.offset + first * self.draws,
            self.computed,
            self.writer,
        )

    def written(self, start: int, stop: int) -> bool:
        a, b = start + self.offset, stop + self.offset
        return any(x <= a and b <= y for x, y in self.done)

    def write(self, start: int, stop: int, arrays: Sequence[np.ndarray]) -> None:
        """Queue `arrays` (each `(stop - start, ...)`, read only after this returns: they
        must stay unchanged, e.g. views of the chunk's own buffers) for the writer."""
        self.writer.put((start + self.offset, stop + self.offset, self.computed, list(arrays)))

    def _write_now(self, start: int, stop: int, which: Sequence[int], arrays: list) -> set[Path]:
        """Write the chunk's regions; returns the chunk files written (`_Writer` flushes
        them, then marks the chunk)."""
        written: set[Path] = set()
        for j, x in zip(which, arrays):
            written |= _write_items(self.arrays[j], self.outputs[j], start, stop, x, self.files[j])
        return written

    def _flush_and_mark(self, start: int, stop: int, written: set[Path]) -> None:
        _sync(written, self.path)
        _mark(self.path / MARKERS, start, stop)  # after the data, on the disk: the chunk is whole

    def finish(self, passed: Mapping[int, Any], chunk_items: int) -> list[Any]:
        """Wait for the writer, write the pass-through outputs (`passed`: output index to
        its array, read `chunk_items` draws at a time) and the coordinates, then mark the
        store complete. Returns the stored arrays (Zarr arrays, read lazily)."""
        self.writer.close()
        n = self.outputs[0].n_items if self.outputs else 0
        for j, x in passed.items():
            step = max(int(chunk_items), 1)
            for start in range(0, n, step):
                stop = min(start + step, n)
                flat = x.reshape((n,) + tuple(x.shape[2:]))
                _write_items(
                    self.arrays[j],
                    self.outputs[j],
                    start,
                    stop,
                    np.asarray(flat[start:stop]),
                    self.files[j],
                )
        _write_coords(self.root, self.outputs, self.coords)
        complete(self.path)
        return stored_arrays(self.path, self.outputs)

    def abandon(self) -> None:
        """Stop the writer after a failure; what it wrote whole stays marked."""
        self.writer.close(raise_error=False)


def _write_items(
    array: Any,
    output: Output,
    start: int,
    stop: int,
    x: np.ndarray,
    files: _ChunkFiles | None = None,
) -> set[Path]:
    """Items `[start, stop)` of the flat sample axis, one region per chain (per item of the
    sample dims before the last, the draws): a region that is one whole Zarr chunk of an
    uncompressed array on a local disk is written as that chunk's file (`_ChunkFiles`),
    any other through zarr. Returns the chunk files written, where they are known (a local
    store)."""
    chains = output.shape[: output.n_sample_dims - 1]
    draws = output.shape[output.n_sample_dims - 1]
    item, written = start, set()
    while item < stop:
        row, draw = divmod(item, draws)
        chain = tuple(int(i) for i in np.unravel_index(row, chains))
        end = min(stop, (row + 1) * draws)
        part = x[item - start : end - start]
        if files is None or not files.write(chain, draw, end - item, part):
            array[(*chain, slice(draw, draw + end - item))] = part
        written |= _chunk_paths(array, chain, draw, end - item)
        item = end
    return written


def _chunk_paths(array: Any, chain: tuple[int, ...], draw: int, count: int) -> set[Path]:
    """The files of the Zarr chunks that draws `[draw, draw + count)` of `chain` lie in,
    for an array in a local folder (its event dims whole in each chunk, as
    `_zarr_chunks` makes them); none for another store."""
    root = getattr(array.store, "root", None)
    if root is None or count <= 0:
        return set()
    k, per = len(chain) + 1, int(array.chunks[len(chain)])
    event = (0,) * (len(array.shape) - k)
    folder = Path(root) / array.path
    return {
        folder / array.metadata.encode_chunk_key((*chain, c, *event))
        for c in range(draw // per, (draw + count - 1) // per + 1)
    }


@dataclasses.dataclass(frozen=True)
class _ChunkFiles:
    """The chunk files of an uncompressed Zarr v3 array in a local folder: there a chunk is
    its values' little-endian bytes in C order, in the file its key names (the format's
    `bytes` codec alone), so a whole chunk is written with one write from the landed
    chunk's memory, as `dd` would, where zarr's own path copies it twice on the way.
    Measured: docs/memory.md, "Outputs on disk"."""

    folder: Path
    array: Any
    draws_per_chunk: int
    dtype: np.dtype

    @classmethod
    def of(cls, array: Any, n_sample_dims: int = 2) -> _ChunkFiles | None:
        """The array's chunk files, or None where they are not so simple (a codec, another
        store, chunks that split a chain's draw of values)."""
        zarr = _zarr()
        k = n_sample_dims
        try:
            plain = (
                isinstance(array.store, zarr.storage.LocalStore)
                and not array.compressors
                and not array.filters
                and type(array.serializer).__name__ == "BytesCodec"
                and all(c == 1 for c in array.chunks[: k - 1])
                and tuple(array.chunks[k:]) == tuple(array.shape[k:])
            )
            dtype = np.dtype(array.dtype).newbyteorder("<")
        except (AttributeError, TypeError):  # another zarr's API: zarr writes every chunk
            return None
        if not plain:
            return None
        return cls(Path(array.store.root) / array.path, array, int(array.chunks[k - 1]), dtype)

    def write(self, chain: tuple[int, ...], draw: int, count: int, values: np.ndarray) -> bool:
        """Write draws `[draw, draw + count)` of `chain` (its index in the sample dims
        before the last) if they are one whole chunk."""
        if draw % self.draws_per_chunk or count != self.draws_per_chunk:
            return False
        key = self.array.metadata.encode_chunk_key(
            (*chain, draw // count) + (0,) * (values.ndim - 1)
        )
        target = self.folder / key
        target.parent.mkdir(parents=True, exist_ok=True)
        data = np.ascontiguousarray(values, dtype=self.dtype)
        with open(target, "wb") as f:
            f.write(data.data.cast("B"))  # the chunk's own memory, no copy
        return True


class _Writer:
    """Two threads behind the landing: one writes queued chunks into the store, the other
    flushes each written chunk to the disk and then marks it (`DiskSink._flush_and_mark`),
    while the first writes the next. An error of either is raised by the next `put`, or by
    `close`.

    Invariant: a chunk's marker follows its own flush, and the markers follow the chunks'
    order; each queue holds at most `QUEUE_CHUNKS` chunks."""

    def __init__(self, sink: DiskSink) -> None:
        self.sink = sink
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_CHUNKS)
        self.written: queue.Queue = queue.Queue(maxsize=QUEUE_CHUNKS)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chunkpost-disk", daemon=True)
        self.flusher = threading.Thread(target=self._flush, name="chunkpost-sync", daemon=True)
        self.thread.start()
        self.flusher.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                self.written.put(None)
                return
            if self.error is None:
                try:
                    files = self.sink._write_now(*item)
                    self.written.put((item[0], item[1], files))
                except BaseException as error:  # noqa: BLE001 - raised on the caller's thread
                    self.error = error

    def _flush(self) -> None:
        failed = False  # a chunk written whole is flushed and marked after the writer's error
        while True:
            item = self.written.get()
            if item is None:
                return
            if not failed:
                try:
                    self.sink._flush_and_mark(*item)
                except BaseException as error:  # noqa: BLE001 - raised on the caller's thread
                    failed = True
                    self.error = self.error or error

    def put(self, item: tuple) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(item)

    def close(self, raise_error: bool = True) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        self.flusher.join()
        if raise_error and self.error is not None:
            raise self.error
