"""Outputs in host memory: the device computes chunk by chunk, each chunk lands in numpy.

The device evaluates one compiled chunk step, `(samples, start) -> chunk outputs`, for every
chunk. The host preallocates the outputs as plain numpy arrays and writes each chunk into its
slice. Chunk `k + 1` is dispatched before chunk `k` is landed, so the device computes `k + 1`
while chunk `k` travels to the host and is written into place.

Invariant: at most two chunks' outputs are alive on the device at once (chunk `k`, being
landed, and chunk `k + 1`, being computed); the device holds the draws, these two chunks and
one chunk's temporaries, never all the outputs. The samples are only read, never donated.

How a chunk reaches the host (`Transfer`, chosen per platform by `default_transfer`; the
reasons and the measurements are in docs/host_output.md):

- `VIEW` (CPU): the "device" memory *is* host memory, so `np.asarray(chunk)` is a zero-copy
  view, and the one copy is the write into the output slice.
- `PINNED_COPY` (accelerators): each chunk's outputs are moved to the device's `pinned_host`
  memory with `jax.device_put`, an asynchronous DMA that runs beside the next chunk's compute;
  `np.asarray` of a pinned-host array is again a zero-copy view, and the one host copy is the
  write into the output slice. Pinned memory is only ever two chunks' worth, far below the
  pinned pool's limit (`XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB`).
- `DIRECT` (TPU): each chunk's outputs start their device-to-host copy when dispatched
  (`copy_to_host_async`), and land through `np.asarray`, the runtime's own copy into host
  memory, then the write into the output slice. On a TPU v5e (jax 0.10.2) the pinned route
  moved 17.6 GB at 0.3 GB/s, where `np.asarray` of a device array runs at 3.2 GB/s.

On an accelerator, host threads fault in the outputs' pages ahead of the landing
(`_Populator`): the first touch of fresh host pages is the host's slowest part of the
transfer (docs/host_output.md, "Fresh host pages").

Donation: never compile the chunk step (or anything else) with donated inputs and a host
memory-kind output. On CPU (jax 0.10 and 0.12) XLA aliases the donated device buffer to the
`pinned_host` output and the process then aborts ("PjRtBuffer's memory kind does not match
sharding's memory kind"): see `tests/test_host_output.py`. Donated draws are freed by the
caller once every chunk has landed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import math
import mmap
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import make_single_device_sharding

from ..._support.config import current
from ..kernels.chunked import read_slice
from ..kernels.jaxpr_eval import vmap_draws

__all__ = [
    "ALIGNMENT",
    "ChunkSink",
    "Transfer",
    "aligned_empty",
    "default_transfer",
    "host_memory_kind",
    "chunk_starts",
    "host_chunk_function",
    "host_chunk_program",
    "compile_host_chunks",
    "stream_to_host",
]


class Transfer(enum.Enum):
    """How each chunk's outputs reach host memory (see the module docstring)."""

    VIEW = "view"
    PINNED_COPY = "pinned_copy"
    DIRECT = "direct"


#: The memory kind that accelerators expose for host memory they can DMA into.
PINNED_HOST = "pinned_host"


def host_memory_kind(device: jax.Device) -> str | None:
    """`"pinned_host"` if `device` can address pinned host memory, else None."""
    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except Exception:  # noqa: BLE001 - a backend without memory spaces: no host kind
        return None
    return PINNED_HOST if PINNED_HOST in kinds else None


def default_transfer(device: jax.Device) -> Transfer:
    """`VIEW` on a CPU, `DIRECT` on a TPU, `PINNED_COPY` where another accelerator has pinned
    host memory.

    Raises:
        ValueError: an accelerator without a `pinned_host` memory kind.
    """
    if device.platform == "cpu":
        return Transfer.VIEW
    if device.platform == "tpu":
        return Transfer.DIRECT
    if host_memory_kind(device) is None:
        raise ValueError(
            f"Device {device} ({device.platform}) has no 'pinned_host' memory kind, so its "
            "outputs cannot be streamed to host memory. Pass `output_memory='device'`."
        )
    return Transfer.PINNED_COPY


def chunk_starts(n_items: int, chunk_size: int) -> list[int]:
    """Where each chunk starts: `k * chunk_size`, except that the last chunk overlaps the one
    before (it starts at `n_items - chunk_size`) when `chunk_size` does not divide `n_items`,
    so that one compiled shape serves every chunk (the rule of `_chunked.chunk_start`)."""
    chunk_size = min(chunk_size, n_items)  # a chunk larger than the draws is all of them
    n_chunks = -(-n_items // chunk_size) if n_items else 0
    return [min(k * chunk_size, n_items - chunk_size) for k in range(n_chunks)]


def _check_sizes(n_items, chunk_size) -> int:
    """Validate before any tracing; return the chunk size used (at most `n_items`)."""
    if isinstance(n_items, bool) or not isinstance(n_items, int | np.integer) or n_items < 0:
        raise ValueError(f"`n_items` must be a non-negative int (chains * draws), got {n_items!r}.")
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, int | np.integer)
        or chunk_size <= 0
    ):
        raise ValueError(
            f"`chunk_size` must be a positive int, got {chunk_size!r}. Pass the number of "
            "draws each chunk evaluates, e.g. `chunk_size=256`."
        )
    return max(1, min(int(chunk_size), int(n_items)))


def host_chunk_function(
    per_draw: Callable, n_items: int, chunk_size: int
) -> Callable[[Sequence[jax.Array], jax.Array], list[jax.Array]]:
    """The chunk step to jit: `(samples, start) -> outputs of draws [start, start + size)`.

    Args:
        per_draw: one draw's values (one per sample, without the `(chains, draws)` axes) to a
            sequence of outputs.
        n_items: `chains * draws`.
        chunk_size: draws per chunk (clipped to `n_items`). Memory: the step's outputs and
            temporaries scale with it; time: one dispatch per chunk (tens of us), and very
            small chunks lose vectorisation.

    Returns:
        `chunk(samples, start)`: `samples` are the `(chains, draws, ...)` arrays, read through
        their flattened `(chains * draws, ...)` view (a free reshape); `start` is an int32
        scalar from `chunk_starts`. It returns one array of shape `(size, ...)` per output.

    Raises:
        ValueError: bad `n_items` or `chunk_size` (before any tracing).
    """
    size = _check_sizes(n_items, chunk_size)
    n = int(n_items)

    def chunk(samples, start):
        flat = [x.reshape((n,) + x.shape[2:]) for x in samples]  # free: a bitcast
        sliced = [read_slice(x, start, size, 0) for x in flat]
        return list(vmap_draws(per_draw, 1)(*sliced))

    return jax.named_call(chunk, name=f"chunk_{size}")


def host_chunk_program(
    per_draw: Callable,
    in_specs: Sequence[jax.ShapeDtypeStruct],
    chunk_size: int,
    device: jax.Device,
    consts: Sequence[Any] | None = None,
) -> tuple[Any, tuple]:
    """The jitted chunk step of `host_chunk_function` on `device`, and the specs to lower it
    with: samples shaped like `in_specs`, and the chunk's start. Nothing is donated: every
    chunk reads the samples, and a donated buffer must never meet a host memory-kind output
    (see the module docstring).

    With `consts` (the model's data), `per_draw(consts)` gives the per-draw function, and the
    step takes them as its third argument, `(samples, start, consts)`: the program holds no
    data (`_program`'s invariant)."""
    if not in_specs:
        raise ValueError("`in_specs` is empty: pass one spec per raw sample array.")
    chains, draws = in_specs[0].shape[:2]
    sharding = make_single_device_sharding(device)
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in in_specs]
    start = jax.ShapeDtypeStruct((), np.int32, sharding=sharding)
    if consts is None:
        chunk = host_chunk_function(per_draw, chains * draws, chunk_size)
        return jax.jit(chunk, out_shardings=sharding), (specs, start)

    def bound(samples, start, data):
        return host_chunk_function(per_draw(data), chains * draws, chunk_size)(samples, start)

    data = [jax.ShapeDtypeStruct(np.shape(c), c.dtype, sharding=sharding) for c in consts]
    return jax.jit(bound, out_shardings=sharding), (specs, start, data)


def compile_host_chunks(
    per_draw: Callable,
    in_specs: Sequence[jax.ShapeDtypeStruct],
    chunk_size: int,
    *,
    device: jax.Device | None = None,
):
    """Compile `host_chunk_function` for samples shaped like `in_specs`; nothing runs.

    Args:
        per_draw: as for `host_chunk_function`.
        in_specs: the samples' shapes and dtypes, `(chains, draws, ...)` each.
        chunk_size: draws per chunk.
        device: where to compute; defaults to JAX's default device.

    Returns:
        The `jax.stages.Compiled` step, to pass to `stream_to_host`.
    """
    device = jax.devices()[0] if device is None else device
    jitted, args = host_chunk_program(per_draw, in_specs, chunk_size, device)
    return jitted.lower(*args).compile()


def stream_to_host(
    compiled_chunk: Callable,
    samples: Sequence[jax.Array],
    n_items: int,
    chunk_size: int,
    out_specs: Sequence[jax.ShapeDtypeStruct],
    on_progress: Callable[[int, int], None] | None = None,
    *,
    transfer: Transfer | None = None,
    out: Sequence[np.ndarray] | None = None,
    lanes: int = 1,
    sink: ChunkSink | None = None,
) -> list[np.ndarray]:
    """Run the chunk step over every chunk and land each chunk's outputs in host memory.

    Chunk `k + 1` is dispatched before chunk `k` is landed: the device computes it while
    chunk `k` travels to the host and is written into place. At most two chunks' outputs are
    alive on the device at once per lane. On an error (an out-of-memory RESOURCE_EXHAUSTED
    included) the chunks in flight are released and the error is raised; the samples are
    never donated here, so they are intact, and the caller may retry (with `out` to reuse the
    host arrays).

    With `lanes > 1`, the chunks are cut into that many contiguous runs, each streamed by its
    own host thread: the same compiled step, called concurrently on other draws, for a step
    that XLA runs on one thread (a loop of one-draw programs on a CPU). Every chunk is
    computed and written as with one lane, so the outputs are the same, bit for bit.

    Args:
        compiled_chunk: the step from `compile_host_chunks` (or any callable with the
            signature of `host_chunk_function`'s result, compiled for `chunk_size`).
        samples: the raw draws, `(chains, draws, ...)` each, on the device.
        n_items: `chains * draws`.
        chunk_size: the step's chunk size (clipped to `n_items`, as in `host_chunk_function`).
        out_specs: each output's shape `(chains, draws, ...)` and dtype.
        on_progress: called as `on_progress(items_done, n_items)` after each chunk has landed.
        transfer: how chunks reach the host. Defaults to `default_transfer` of the samples'
            device.
        out: preallocated C-contiguous outputs to fill (e.g. from a failed attempt); by
            default new ones are made with `np.empty`.
            Memory: the outputs, once, in host memory (pages are touched as chunks land), plus
            two chunks per lane; time: one host copy of every output byte, overlapped with
            compute.
        lanes: host threads that stream chunks at once (at most one per chunk).
        sink: where landed chunks go instead of `out` (outputs on disk, `_disk_sink`):
            no host arrays are made; each chunk's rows are handed to `sink.write`, and
            chunks that `sink.written` reports whole (a resumed run) are not computed.

    Returns:
        One numpy array per output, shape and dtype of `out_specs`: plain, C-contiguous,
        writeable arrays that own their memory (numpy and ArviZ take them without a copy);
        with a `sink`, an empty list.

    Raises:
        ValueError: bad sizes or specs (before any work).
        jax.errors.JaxRuntimeError: from the device, e.g. RESOURCE_EXHAUSTED.
    """
    size = _check_sizes(n_items, chunk_size)
    if isinstance(lanes, bool) or not isinstance(lanes, int | np.integer) or lanes < 1:
        raise ValueError(f"`lanes` must be a positive int, got {lanes!r}.")
    n = int(n_items)
    samples = list(samples)
    lead = tuple(samples[0].shape[:2]) if samples else None
    if lead is not None and lead[0] * lead[1] != n:
        raise ValueError(
            f"`n_items`={n} does not match the samples' (chains, draws)={lead}. Pass "
            f"`n_items={lead[0] * lead[1]}`."
        )
    for spec in out_specs:
        if lead is not None and tuple(spec.shape[:2]) != lead:
            raise ValueError(
                f"`out_specs` must have shape (chains, draws, ...)={lead} + ..., got "
                f"{tuple(spec.shape)}. Pass the full output shapes, not per-draw ones."
            )
    if sink is not None:
        out = []
    elif out is None:
        out = [np.empty(s.shape, s.dtype) for s in out_specs]
    else:
        out = list(out)
        for o, s in zip(out, out_specs, strict=True):
            if o.shape != tuple(s.shape) or o.dtype != s.dtype or not o.flags.c_contiguous:
                raise ValueError(
                    f"`out` arrays must be C-contiguous with the shapes and dtypes of "
                    f"`out_specs`; got {o.shape} {o.dtype} for {tuple(s.shape)} {s.dtype}."
                )
    if n == 0:
        return out
    flats = [o.reshape((n,) + o.shape[2:]) for o in out]  # views: `out` is C-contiguous
    device = next(iter(samples[0].devices())) if samples else jax.devices()[0]
    transfer = default_transfer(device) if transfer is None else Transfer(transfer)
    pinned = make_single_device_sharding(device, memory_kind=PINNED_HOST)
    starts = chunk_starts(n, size)
    # The chunks to compute: with a sink, those not already written whole (a resumed run).
    todo = list(range(len(starts)))
    if sink is not None:
        todo = [k for k in todo if not sink.written(k * size, starts[k] + size)]

    def dispatch(i):
        ys = compiled_chunk(samples, np.int32(starts[todo[i]]))
        if transfer is Transfer.PINNED_COPY:
            # Asynchronous DMA into pinned host memory, queued behind chunk k's compute.
            ys = jax.device_put(ys, pinned)
        elif transfer is Transfer.DIRECT:
            for y in ys:  # the runtime's copy to host, queued behind chunk k's compute
                y.copy_to_host_async()
        return ys

    def land(i, ys):
        k = todo[i]
        start, written = starts[k], k * size  # the last chunk's overlap is already written
        if sink is not None:  # views of the chunk's buffers, which the sink's queue holds
            sink.write(written, start + size, [np.asarray(y)[written - start :] for y in ys])
            return
        populating.wait(k, n)
        for flat, y in zip(flats, ys, strict=True):
            # A zero-copy view (CPU memory or pinned host memory), or the runtime's host
            # copy (DIRECT); blocks until it is ready.
            view = np.asarray(y)
            writers.copy(flat[written : start + size], view[written - start :])

    with contextlib.ExitStack() as threads_to_end:
        writers = _Writers(1 if transfer is Transfer.VIEW else current().land_threads)
        threads_to_end.callback(writers.close)
        # An accelerator's outputs: their pages faulted in ahead of the landing, off its thread.
        populate = 0 if transfer is Transfer.VIEW else current().populate_threads
        populating = _Populator(flats, size, populate)
        threads_to_end.callback(populating.close)
        _in_lanes(dispatch, land, len(todo), int(lanes), size, n, on_progress)
    return out


class ChunkSink(Protocol):
    """Where `stream_to_host` hands landed chunks instead of host arrays (`_disk_sink`)."""

    def written(self, start: int, stop: int) -> bool:
        """Whether the flat items `[start, stop)` were written whole before."""
        ...

    def write(self, start: int, stop: int, arrays: Sequence[np.ndarray]) -> None:
        """Take the flat items `[start, stop)` of every output (kept unchanged after)."""
        ...


#: The populating threads take each output's bytes in blocks of this many (the last one less).
POPULATE_BLOCK_BYTES = 32 * 2**20


class _Populator:
    """Host threads that fault in the pages of the outputs ahead of the landing: the
    kernel's work of a first touch, off the landing's thread and spread over several.

    Each output's bytes are cut into blocks of `POPULATE_BLOCK_BYTES`, taken in the order
    the chunks land (by how far into its output each block starts), each by one thread
    that writes a zero into every page of the block. Invariant: a block is written by its
    populating thread before the landing writes any of it, never after: `wait(k)` returns
    once every block that chunk `k`'s rows overlap has its event set, and a block's event
    is set once its thread is done with it (or skipped it: after `close`, or after any
    thread's error, every block left is skipped, and the landing touches its pages)."""

    def __init__(self, flats: Sequence[np.ndarray], size: int, threads: int) -> None:
        self.stop = threading.Event()
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.size, self.block = size, POPULATE_BLOCK_BYTES
        self.rows = [f.nbytes // max(len(f), 1) for f in flats]
        counts = [-(-f.nbytes // self.block) if threads > 0 else 0 for f in flats]
        self.ready = [[threading.Event() for _ in range(c)] for c in counts]
        order = sorted(
            ((b / c, j, b) for j, c in enumerate(counts) for b in range(c)), key=lambda t: t[:2]
        )
        if not order:
            return
        pages = [f.reshape(-1).view(np.uint8) for f in flats]
        taken, lock = iter(order), threading.Lock()

        def run() -> None:
            while True:
                with lock:
                    item = next(taken, None)
                if item is None:
                    return
                _, j, b = item
                try:
                    if not self.stop.is_set():
                        pages[j][b * self.block : (b + 1) * self.block : mmap.PAGESIZE] = 0
                except Exception:  # noqa: BLE001 - the landing touches the pages instead
                    self.stop.set()
                finally:
                    self.ready[j][b].set()

        workers = min(threads, len(order))
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, "chunkpost-populate")
        try:
            for _ in range(workers):
                self.pool.submit(run)
        except BaseException:  # a thread that could not start: none is left running
            self.close()
            raise

    def wait(self, k: int, n: int) -> None:
        """Block until every block that rows `[k * size, min((k + 1) * size, n))` of the
        outputs overlap is populated (or skipped)."""
        first, last = k * self.size, min((k + 1) * self.size, n)
        for events, row in zip(self.ready, self.rows):
            if events and last > first and row:
                for b in range(first * row // self.block, (last * row - 1) // self.block + 1):
                    events[b].wait()

    def close(self) -> None:
        """Stop populating (the blocks not begun are skipped) and wait for the threads."""
        self.stop.set()
        if self.pool is not None:
            self.pool.shutdown()


class _Writers:
    """Host threads that write a landed chunk into its place, in slices along its first axis
    (numpy releases the GIL for the copy), on cores that an accelerator leaves idle: the
    copy, and the first touch of any page that no populating thread reached first. One
    thread: a plain assignment."""

    def __init__(self, threads: int) -> None:
        self.threads = max(int(threads), 1)
        self.pool = (
            concurrent.futures.ThreadPoolExecutor(self.threads - 1, "chunkpost-land")
            if self.threads > 1
            else None
        )

    def copy(self, target: np.ndarray, source: np.ndarray) -> None:
        slices = min(self.threads, len(target), target.nbytes // current().land_slice_bytes)
        if self.pool is None or slices < 2:
            target[...] = source
            return
        bounds = [len(target) * i // slices for i in range(slices + 1)]

        def write(i: int) -> None:
            target[bounds[i] : bounds[i + 1]] = source[bounds[i] : bounds[i + 1]]

        futures = [self.pool.submit(write, i) for i in range(1, slices)]
        write(0)
        for future in futures:
            future.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _in_lanes(dispatch, land, n_chunks: int, lanes: int, size: int, n: int, on_progress) -> None:
    """Every chunk dispatched and landed, in `lanes` contiguous runs of chunks, each on a host
    thread of its own (the calling thread where there is one run). In each run chunk `k + 1`
    is dispatched before chunk `k` is landed; once a run fails, the others dispatch nothing
    more, and the first error is raised when every run has stopped."""
    done, lock, failed = [0], threading.Lock(), threading.Event()

    def stream(ks: range) -> None:
        pending = nxt = None
        try:
            pending = dispatch(ks[0])
            for k in ks:
                if failed.is_set():
                    return
                nxt = dispatch(k + 1) if k + 1 < ks.stop else None
                land(k, pending)
                pending, nxt = nxt, None  # chunk k released: only chunk k + 1 is in flight
                if on_progress is not None:
                    with lock:  # runs land in any order: report the items landed so far
                        done[0] += min((k + 1) * size, n) - k * size
                        on_progress(done[0], n)
        except BaseException as error:
            # Release the chunks in flight now, not when the caller drops the traceback: the
            # frames below this one (dispatch, land) still hold chunk outputs.
            failed.set()
            pending = nxt = None
            if error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__.tb_next)
            raise

    runs = _lane_runs(n_chunks, lanes)
    if len(runs) == 1:
        stream(runs[0])
        return
    with concurrent.futures.ThreadPoolExecutor(len(runs), "chunkpost-lane") as pool:
        futures = [pool.submit(stream, ks) for ks in runs]
        errors = [f.exception() for f in futures]  # waits for every run
    for error in errors:
        if error is not None:
            raise error


def _lane_runs(n_chunks: int, lanes: int) -> list[range]:
    """The chunk indices cut into at most `lanes` contiguous runs of near-equal length."""
    lanes = max(1, min(lanes, n_chunks))
    bounds = [n_chunks * i // lanes for i in range(lanes + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


#: Host outputs start at this alignment: jax places a numpy array so aligned on a CPU device
#: without a copy (`jax.device_put` aliases its memory; a less aligned one is copied).
ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialised array of `shape` and `dtype` whose data start at a page boundary (so
    at an `ALIGNMENT`-byte one), in anonymous memory mapped for it alone.

    Invariant: the memory takes the system's policy for transparent huge pages. numpy asks
    huge pages of its own large arrays (`madvise(MADV_HUGEPAGE)`), and where the kernel
    compacts memory to find them at the first touch (`defrag=madvise`), writing lanes'
    predictions into a fresh numpy array ran 2x slower (docs/numpyro.md). The mapping is
    freed with the last array that views it.
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    memory = mmap.mmap(-1, max(nbytes, 1), **({"flags": private} if private else {}))
    raw = np.frombuffer(memory, np.uint8, count=nbytes)
    assert raw.ctypes.data % ALIGNMENT == 0  # mmap returns whole pages
    return raw.view(dtype).reshape(tuple(shape))
