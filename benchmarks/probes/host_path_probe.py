"""Where the time of outputs landing in host memory goes, on an accelerator, in one process.

    python benchmarks/probes/host_path_probe.py --gib 4 --out OUT_DIR [--sections ...]

The cases of `host_budget.py` are whole calls in fresh processes; this probe takes the host
path apart, on the `matvec` case's chunk step (one wide output, `X @ beta`, as issue 49's
deterministic), so that each candidate for the landing can be priced in one run:

- `bound`: `np.asarray` of a fresh device array of 2 GiB, and of chunk-sized ones (the
  device-to-host copy into new host memory, the rate `host_budget.py` reports against);
- `touch`: the first touch of fresh host memory (`np.empty` written by 1 and by
  `land_threads` threads; an anonymous mapping populated by the kernel, `MAP_POPULATE`), and
  a copy into memory already touched;
- `stream`: the chunk step streamed to host outputs as `stream_to_host` does (`DIRECT`) at
  several chunk sizes, into fresh outputs and into outputs touched beforehand, each chunk's
  wait for its host copy and its write into place summed apart; and `stream_to_host`
  itself (`library`);
- `pinned`: the step compiled with its outputs in `pinned_host` memory, landed as views.

Every record is written to `OUT_DIR/host_path_probe.json` as it comes. A watchdog ends the
process, the records kept, when the host's available memory falls under 4 GiB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GiB, MiB = 2**30, 2**20
ROWS = 1_181_116  # 17.6 GiB over 4 x 1000 draws of float32, as issue 49's case


MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable, their contents kept


def _mapped(nbytes: int, populate: bool):
    """Anonymous private memory of `nbytes`, its pages populated by `mmap` where asked."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
    return mmap.mmap(-1, nbytes, flags=flags)


def _madvise_populate(array, threads: int) -> float:
    """Populate `array`'s pages with `MADV_POPULATE_WRITE` in `threads` slices; seconds."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base, nbytes = array.ctypes.data, array.nbytes
    page = mmap.PAGESIZE
    bounds = [(nbytes * i // threads) // page * page for i in range(threads)] + [nbytes]

    def one(i):
        if libc.madvise(base + bounds[i], bounds[i + 1] - bounds[i], MADV_POPULATE_WRITE):
            raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")

    tic = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    return time.perf_counter() - tic


def _touch(array, threads: int) -> None:
    """Write zeros over `array`'s first axis in `threads` slices at once."""
    flat = array.reshape(-1)
    bounds = [len(flat) * i // threads for i in range(threads + 1)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: flat[bounds[i] : bounds[i + 1]].fill(0), range(threads)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--chunk-mib", default="16,64,170")
    parser.add_argument("--pinned-mib", default="64")
    parser.add_argument("--outputs", default="empty,touched,populate,ahead,library")
    parser.add_argument("--sections", default="bound,touch,stream,pinned")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []

    def keep(record: dict) -> None:
        records.append(record)
        print(json.dumps(record), flush=True)
        (out_dir / "host_path_probe.json").write_text(json.dumps(records, indent=1))

    import jax
    import numpy as np

    from pymc_chunkpost._engine.execute.host_output import (
        Transfer,
        _Writers,
        chunk_starts,
        compile_host_chunks,
        stream_to_host,
    )
    from pymc_chunkpost._support.config import current
    from pymc_chunkpost._support.memory import _host_available_bytes

    def watchdog() -> None:
        while True:
            if _host_available_bytes() < 4 * GiB:
                keep({"watchdog": "host available under 4 GiB: stopped"})
                os._exit(3)
            time.sleep(0.1)

    threading.Thread(target=watchdog, daemon=True).start()
    device = jax.devices()[0]
    threads = current().land_threads
    keep({"device": str(device.device_kind), "platform": device.platform, "jax": jax.__version__})
    sections = args.sections.split(",")

    if "bound" in sections:
        for nbytes in [2 * GiB] + [int(m) * MiB for m in args.chunk_mib.split(",")]:
            x = jax.device_put(np.ones(nbytes // 4, np.float32), device)
            reps = max(3, min(24, (2 * GiB) // nbytes))
            times = []
            for _ in range(reps):
                y = (x + 1).block_until_ready()  # fresh: no cached host copy
                tic = time.perf_counter()
                host = np.asarray(y)
                times.append(time.perf_counter() - tic)
                del host, y
            keep(
                {
                    "section": "bound",
                    "mib": nbytes // MiB,
                    "best_gb_s": nbytes / min(times) / 1e9,
                    "median_gb_s": nbytes / sorted(times)[len(times) // 2] / 1e9,
                }
            )
            del x

    if "touch" in sections:
        nbytes = int(min(args.gib, 4.0) * GiB) // mmap.PAGESIZE * mmap.PAGESIZE
        for t in (1, threads):
            a = np.empty(nbytes // 4, np.float32)
            tic = time.perf_counter()
            _touch(a, t)
            first = time.perf_counter() - tic
            tic = time.perf_counter()
            _touch(a, t)
            again = time.perf_counter() - tic
            keep(
                {
                    "section": "touch",
                    "how": f"np.empty, {t} threads",
                    "first_gb_s": nbytes / first / 1e9,
                    "again_gb_s": nbytes / again / 1e9,
                }
            )
            del a
        # Memory the kernel is asked to populate, by MAP_POPULATE or by t threads' madvise;
        # then written by `threads` threads: its rate says whether the pages were there.
        asks = [("MAP_POPULATE", 0)] + [("MADV_POPULATE_WRITE", t) for t in (1, threads, 12)]
        for how, t in asks:
            tic = time.perf_counter()
            m = _mapped(nbytes, populate=t == 0)
            a = np.frombuffer(m, np.float32)
            record = {"section": "touch", "how": f"{how}, {t or 'no'} threads, then written"}
            try:
                populated = _madvise_populate(a, t) if t else time.perf_counter() - tic
                tic = time.perf_counter()
                _touch(a, threads)
                record |= {
                    "populate_gb_s": nbytes / populated / 1e9,
                    "write_gb_s": nbytes / (time.perf_counter() - tic) / 1e9,
                }
            except OSError as error:
                record["error"] = str(error)
            keep(record)
            del a
            m.close()
        a = np.empty(nbytes // 4, np.float32)
        tic = time.perf_counter()
        _touch(a, 12)
        keep(
            {
                "section": "touch",
                "how": "np.empty, 12 threads",
                "first_gb_s": nbytes / (time.perf_counter() - tic) / 1e9,
            }
        )
        del a
        source = np.ones(170 * MiB // 4, np.float32)
        target = np.zeros_like(source)
        writers = _Writers(threads)
        tic = time.perf_counter()
        for _ in range(10):
            writers.copy(target, source)
        keep(
            {
                "section": "touch",
                "how": f"copy 170 MiB into touched memory, {threads} threads",
                "gb_s": 10 * source.nbytes / (time.perf_counter() - tic) / 1e9,
            }
        )
        writers.close()
        del source, target

    n = max(int(args.gib * GiB / (ROWS * 4)), 1)
    rng = np.random.default_rng(0)
    xj = jax.device_put(rng.normal(size=(ROWS, 8)).astype(np.float32), device)
    beta = jax.device_put(rng.normal(size=(1, n, 8)).astype(np.float32), device)
    spec = [jax.ShapeDtypeStruct(beta.shape, beta.dtype)]
    out_spec = jax.ShapeDtypeStruct((1, n, ROWS), np.float32)
    total = n * ROWS * 4

    def per_draw(b):
        return [xj @ b]

    def stream(step, size, *, pinned: bool, prefault, depth: int, land_threads: int):
        """`prefault`: False (np.empty), True (touched first), "populate" (`MAP_POPULATE`),
        "ahead" (`MADV_POPULATE_WRITE` by threads beside the stream), "library"
        (`stream_to_host` itself, its populating threads and writers as configured)."""
        if prefault == "library":
            tic = time.perf_counter()
            (out,) = stream_to_host(step, [beta], n, size, [out_spec], transfer=Transfer.DIRECT)
            seconds = time.perf_counter() - tic
            want = np.asarray(xj) @ np.asarray(beta)[0, n // 2]
            worst = float(np.max(np.abs(out[0, n // 2] - want)) / np.max(np.abs(want)))
            return {
                "seconds": seconds,
                "gb_s": total / seconds / 1e9,
                "largest_relative_difference": worst,
            }
        tic = time.perf_counter()
        ahead = None
        if prefault in ("populate", "ahead"):
            memory = _mapped(total, populate=prefault == "populate")
            out = np.frombuffer(memory, np.float32).reshape(out_spec.shape)
            if prefault == "ahead":
                ahead = threading.Thread(target=_madvise_populate, args=(out, 4), daemon=True)
                ahead.start()
        else:
            out = np.empty(out_spec.shape, out_spec.dtype)
            if prefault:
                _touch(out, land_threads)
        touched = time.perf_counter() - tic
        flat = out.reshape(n, ROWS)
        starts = chunk_starts(n, size)
        writers = _Writers(land_threads)
        wait = write = 0.0
        inflight: list = []

        def dispatch(k):
            (y,) = step([beta], np.int32(starts[k]))
            if not pinned:
                y.copy_to_host_async()
            return k, y

        nxt = 0
        while nxt < min(depth, len(starts)):
            inflight.append(dispatch(nxt))
            nxt += 1
        while inflight:
            k, y = inflight.pop(0)
            t0 = time.perf_counter()
            view = np.asarray(y)
            t1 = time.perf_counter()
            written = k * size
            writers.copy(flat[written : starts[k] + size], view[written - starts[k] :])
            t2 = time.perf_counter()
            wait, write = wait + t1 - t0, write + t2 - t1
            del view, y
            if nxt < len(starts):
                inflight.append(dispatch(nxt))
                nxt += 1
        seconds = time.perf_counter() - tic
        writers.close()
        if ahead is not None:
            ahead.join()
        want = np.asarray(xj) @ np.asarray(beta)[0, n // 2]
        worst = float(np.max(np.abs(flat[n // 2] - want)) / np.max(np.abs(want)))
        del out, flat
        return {
            "seconds": seconds,
            "gb_s": total / seconds / 1e9,
            "prefault_s": touched,
            "wait_s": wait,
            "write_s": write,
            "largest_relative_difference": worst,
        }

    if "stream" in sections:
        for mib in map(int, args.chunk_mib.split(",")):
            size = max(mib * MiB // (ROWS * 4), 1)
            tic = time.perf_counter()
            step = compile_host_chunks(per_draw, spec, size, device=device)
            compile_s = time.perf_counter() - tic
            variants = [(v, 2, threads) for v in args.outputs.split(",")]
            for prefault, depth, t in variants:
                prefault = {"empty": False, "touched": True}.get(prefault, prefault)
                r = stream(step, size, pinned=False, prefault=prefault, depth=depth, land_threads=t)
                keep(
                    {
                        "section": "stream",
                        "transfer": Transfer.DIRECT.value,
                        "chunk_mib": mib,
                        "draws_per_chunk": size,
                        "prefault": prefault,
                        "depth": depth,
                        "land_threads": t,
                        "compile_s": compile_s,
                        "outputs_gib": total / GiB,
                    }
                    | r
                )
            del step

    if "pinned" in sections:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_host_output import compile_pinned_output

        for mib in map(int, args.pinned_mib.split(",")):
            size = max(mib * MiB // (ROWS * 4), 1)
            try:
                step = compile_pinned_output(per_draw, spec, size)
                r = stream(step, size, pinned=True, prefault=False, depth=2, land_threads=threads)
            except Exception as error:  # noqa: BLE001 - a probe records what fails
                r = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            keep({"section": "pinned", "chunk_mib": mib, "draws_per_chunk": size} | r)


if __name__ == "__main__":
    main()
