"""Every heuristic of the planner and the executor, named once: `PlannerConfig`.

Each field says what it decides and why it has its value; `EVIDENCE` says where the
measurements behind it are (a heading of docs/, checked by tests/test_docs_links.py). The
planner, the tuner and the executor read the one configuration in force (`current`); tests and
benchmarks run under another with `configured`, instead of reassigning module globals. Nothing
here reads the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["EVIDENCE", "PlannerConfig", "configured", "current"]

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class PlannerConfig:
    """The planner's and the executor's heuristics, each with its reason (`EVIDENCE`: where
    the measurements behind it are).

    Loop-free or chunked:

    Attributes:
        vmap_temp_bytes: the loop-free vmap runs when its compiled temporaries (on a CPU,
            those of all its devices: they share one memory) stay under this; below it a
            loop's extra compiles and per-chunk costs outweigh what the temporaries cost in
            memory traffic, far above it they go to DRAM and cost more than any loop.
        comfort_fraction: ...and when its compiled peak is at most this fraction of the
            budget, leaving room for whatever else the process allocates meanwhile.
        vmap_bound_slack: the vmap candidate is compiled only when the jaxpr's bound on its
            temporaries is at most this many times `vmap_temp_bytes` (XLA fuses gathers and
            transposes that the bound counts).
        vmap_bound_per_output: ...and, above `vmap_temp_bytes`, at most this many times the
            outputs: temporaries that large beside small outputs are reduced into them and
            stay in memory (big_data), while fusion writes temporaries no larger than the
            outputs straight into them (wide, big_det).

    The chunk size:
        target_chunk_bytes: one chunk's working set on a CPU: smaller chunks lose to XLA's
            per-kernel dispatch on every chunk, larger ones to cache misses (within 1.08x of
            the best chunk on machines with 512 KiB and 1 MiB of L2 per core, where a target
            tied to the cache lost up to 1.32x).
        round_down_within: the rule's size goes down to a divisor of the draws within this
            fraction below it, rather than up past the target.
        overhead_bytes_per_buffer: a loop's cost per chunk, per buffer it slices or
            updates, in bytes of work that take as long: a chunk does at least that much
            work per buffer (lkj's XLA loop measured 10-71 KiB, its host loop 1-20 KiB, over
            three quiet runs of `benchmarks/probes/heuristics_evidence.py overhead`: the order of
            magnitude, not the value).
        jump_factor: a compiled chunk whose temporaries exceed this many times the expected
            (plus `jump_slack_bytes`) is a "jump": XLA changed its layout or fusion at that
            size, and a smaller chunk is tried.
        jump_slack_bytes: temporaries this far over `jump_factor` times the expected are
            still no jump: a jaxpr bound that counts short by a constant factor is not a
            layout change (demo_basis_grid compiles to 8.5x its bound at every size, 4.4 MiB
            over 4x at the rule's 16 draws: without the slack it would run one draw per
            chunk; `benchmarks/probes/heuristics_evidence.py jump`).
        refine_ratio: on a CPU the size is computed again from the first chunk's compiled
            temporaries, and compiled again only if that moves it this many times or more:
            within it, a second compile costs more than the better size saves.
        accelerator_room_fraction: an accelerator's chunk takes this fraction of the memory
            left after the outputs; the rest leaves room for XLA's GPU autotuner, which
            allocates while compiling.

    The loop:
        host_loop_many_buffers: a model whose loop slices or updates more buffers than this
            runs a host-driven loop: XLA's loops over many buffers compile for minutes.
        host_loop_max_chunks: a host-driven loop runs at most this many chunks (each call
            costs a dispatch that grows with the buffers).
        random_max_chunks: ...and of random draws (`Problem.random`) at most this many:
            their chunks stream bits into outputs and gain nothing from fitting a cache,
            while each call costs a dispatch (the 20,000-row predictive regression: 64
            chunks 7% behind the best fixed plan, 16 within its spread).
        random_vmap_product_bytes: random draws on a CPU run in chunks, not in the
            loop-free vmap, where the results of their products (`X @ b`) over all draws
            exceed this: the vmap writes them to memory and reads them back, where a chunk
            keeps them in the cache (a 5,000-row logistic regression's 153 MiB of products:
            the vmap 26-63% slower than chunks of 250; docs/predictive.md).
        random_vector_width: random draws on a CPU compile with this preferred vector width,
            in bits (`xla_cpu_prefer_vector_width`; 0: XLA's default, 256). Where the CPU
            has AVX-512, 80M float64 normals ran 1.30x faster at 512 on jaxlib 0.12.1
            (median of 3 fresh processes; 1.04x on 0.10.2, within the spread), the same
            numbers bit for bit; where it has not, LLVM keeps the widths the CPU has.
        first_segment_fraction: with a progress bar or while tuning, an XLA loop runs in
            host-dispatched segments; the first runs this fraction of the draws, to time
            them.
        segment_seconds: ...and every later one about this many seconds' worth (tqdm
            redraws every 0.1 s).
        host_zeros_max_bytes: a host-driven run on a CPU starts from zero outputs placed from
            the host below this; larger ones are filled by a compiled program, which writes
            faster per byte but costs a fixed compile.
        flatten_min_gathered_bytes: the "vmap" strategy runs over the flattened chain x draw
            axis when the results of gathers and scatters of the draws' values come to at
            least this much: under two batch dimensions XLA lays them out transposed and
            copies them into the outputs.
        host_output_chunk_fraction: with outputs in host memory, an accelerator's chunk takes
            this fraction of the device budget: two chunks in flight, one chunk's
            temporaries, the autotuner.
        host_staging_bytes: with outputs in host memory, the chunks in flight to them (an
            accelerator's pinned copies and their landing, a CPU's chunk buffers: three
            chunks' outputs per lane) take at most this much host memory beside the outputs,
            so that the host's peak is the outputs plus this, not plus two device-sized
            chunks (on a 16 GiB TPU, 2 x 4 GiB). Chunks this size still move at the copy's
            full rate.
        host_margin_bytes: host memory kept free beyond the outputs and the staging: the
            process's other allocations while it runs (compiles, Python, the caller's
            arrays, an accelerator runtime's own host buffers: 1.6 GiB beside 16.4 GiB of
            outputs on a TPU v5e, where a margin of 256 MiB let the kernel kill the process),
            where the host's available memory is the limit (not under a user's host
            budget). A call that cannot keep it raises `MemoryError` before any work.

    The online tuner:
        tune_min_seconds: other chunk sizes are tried only when at least this much work is
            left after the first chunks: below it, the compiles cannot pay for themselves.
        tune_payback: ...and at least this many times the seconds that the rule's step took
            to compile (or to load): a size within the search's reach runs 10-30% faster at
            best, and a compile costs tenths of a second on a CPU, seconds on an accelerator
            (a Poisson predictive's 1.4 s on 2 cores, beside 2.7 s of work, cost its cold
            call 50%).
        tune_chunks: each candidate size is timed over at least this many calls...
        tune_window_seconds: ...and this many seconds, after one untimed warm-up call of
            each: shorter windows are lost in the noise of a busy machine.
        tune_trust_fraction: a tuned run that took less than this fraction of
            `tune_min_seconds` in all was projected long by first chunks that ran far slower
            than the rest (a stall): what it measured is not kept.
        background_compiles: candidates compile on a second thread while the best size so
            far goes on running (XLA compiles without the GIL); False compiles them on the
            calling thread, so that the next chunk always has them.

    XLA's CPU library fusions (the trial, `_library_fusions`):
        library_short_reduction: the chunk compiled without library fusions is tried where
            one of them reduces at most this many elements into each result: shorter than
            two AVX-512 vectors of float64 gains nothing from a vectorised kernel, and the
            library writes out its operand.
        library_try_compiles: ...and where the work left after the first chunks would take
            at least this many times the first compile.
        library_min_gain: the chunk without library fusions replaces the library's when it
            runs at least this many times faster: a stall while the first was timed would
            favour the second (the gains measured are 8-14x).

    Devices:
        spread_platforms: platforms whose single-device draws are spread over the other
            local devices. Not the CPU: XLA already runs one device's work on every core,
            and splitting it over host devices measured slower.
        spread_min_bytes: ...when the outputs and temporaries of the whole run come to at
            least this much work.
        max_lanes: a problem of one-draw programs on a CPU (each draw computed by a
            program of one draw, in a loop that XLA runs on one thread) streams its chunks
            into host memory from one host thread per core, up to this many: the same
            compiled step, called concurrently on other draws (numpyro's 2,000- and
            30,000-row regressions ran 1.6-2x faster on 2 cores).
        lane_chunks: ...each lane streaming at least this many chunks, so that a lane's
            next chunk computes while its last one is written into place.
        land_threads: an accelerator's chunk, landed in host memory, is written into its
            place by up to this many host threads, slices of at least `land_slice_bytes`
            each: the write into fresh output pages (their first touch) is the host's part
            of the transfer, and one thread left a TPU v5e's 17.6 GB at 20% of the
            device-to-host copy's rate. On a CPU the cores compute instead: one thread.
        land_slice_bytes: ...so that a small chunk is written by one thread.
        land_chunk_bytes: on a TPU, while threads populate the outputs, a chunk landed in
            host memory holds at most this many bytes of any one output (where one draw's
            fits): the runtime's host copy of a buffer this small comes from memory the
            allocator reuses, where a larger one comes as fresh pages every chunk (on a TPU
            v5e, chunks of 13.5 MiB streamed at 5.4-5.8 GB/s into touched outputs, chunks of
            167 MiB at 2.6 GB/s). 0: no such limit.
        psis_parts: `loo` smooths each block of observations in one part per core, each
            in a thread of its own, up to this many: the parts share the host's memory
            bandwidth, and on a TPU v5e's 13-core host 8 parts smoothed a value in
            10.3-11.0 ns where 13 took 14.1-15.2 ns (12.3 ns against 15.0 ns before PSIS
            read each row once; 4 parts: 15.0 ns).
        psis_rows_per_pass: each part reads its observations this many at a time, into a
            workspace of that many rows x draws (2 x 8 bytes a draw and row) made once a
            call: on a 2-core CPU 10% faster than a pass over a whole part, on a TPU v5e's
            host the same from 64 rows up (32 rows: 25% slower), and a block's smoothing
            no longer holds buffers of the whole block.
        populate_threads: host threads that fault in the pages of an accelerator's outputs
            in host memory ahead of the landing, a zero into each page of a block before
            the block lands: a TPU v5e's host touches fresh pages at 1 GB/s per thread
            (2.8 GB/s with 8), slower than the device-to-host copy; its 17.6 GiB took 6.6 s
            with 8 threads, 7.2 s with 4. 0: the landing touches them.

    Memory and the on-disk store:
        trim_min_bytes: outputs of at least this many bytes that land in host memory are
            written after the compiler's freed heap went back to the OS.
        store_max_bytes: the most bytes the executable store's folder holds; past it the
            least recently used files go until it holds three quarters (the zoo's 16 models
            store 7.5 MiB, so it holds some 34 zoos' worth;
            `benchmarks/probes/heuristics_evidence.py store`).

    Precision:
        exact_product_terms: on `exact_product_platforms`, a float32 product at "highest"
            precision that sums at most this many terms per result is computed as
            multiplies and adds: float32's own rounding, and compiled as fast as JAX's
            default precision, where "highest" (bfloat16 passes on a TPU) cost XLA 3.8 s
            more to compile `loo`'s block program (a product of 3 terms).
        exact_product_platforms: the platforms where that pays: a TPU's "highest" is
            bfloat16 passes; a CPU's and a GPU's is float32's own product already.

    Small work on an accelerator:
        host_values_per_core: on an accelerator, a route whose caller named no device
            (`loo`'s blocks, the post-hoc and predictive routes, NumPyro's) computes on the
            host CPU where its output values (draws x observations for `loo`) are at most
            this many per host core (`resources.small_work_on_host`): there the device's
            compiles (seconds each on a TPU) cost more than its run saves. On a TPU v5e's
            13-core host, at 4,000 draws x 20,000 observations (6.2 million a core), the
            host was 1.5-1.9x faster than the chip on five GLM families' `loo`, and its
            float32 numbers are the host's.

    Tracing:
        eqns_per_run: the draws' tail mapped by `jax.vmap` costs about as much tracing as
            binding this many elementwise equations directly saves.
    """

    vmap_temp_bytes: int = 256 * MiB
    comfort_fraction: float = 0.5
    vmap_bound_slack: float = 4
    vmap_bound_per_output: float = 4
    target_chunk_bytes: int = 8 * MiB
    round_down_within: float = 0.25
    overhead_bytes_per_buffer: int = 64 * 2**10
    jump_factor: float = 4
    jump_slack_bytes: int = 16 * MiB
    refine_ratio: float = 4
    accelerator_room_fraction: float = 0.5
    host_loop_many_buffers: int = 48
    host_loop_max_chunks: int = 64
    random_max_chunks: int = 16
    random_vmap_product_bytes: int = 32 * MiB
    random_vector_width: int = 512
    first_segment_fraction: float = 1 / 64
    segment_seconds: float = 0.25
    host_zeros_max_bytes: int = 48 * MiB
    flatten_min_gathered_bytes: int = 8 * MiB
    host_output_chunk_fraction: float = 0.25
    host_staging_bytes: int = 512 * MiB
    host_margin_bytes: int = 2 * 2**30
    tune_min_seconds: float = 3.0
    tune_payback: float = 10.0
    tune_chunks: int = 2
    tune_window_seconds: float = 0.05
    tune_trust_fraction: float = 0.5
    background_compiles: bool = True
    library_short_reduction: int = 16
    library_try_compiles: float = 2
    library_min_gain: float = 1.25
    spread_platforms: tuple[str, ...] = ("gpu", "cuda", "rocm", "tpu")
    spread_min_bytes: int = 64 * MiB
    max_lanes: int = 8
    lane_chunks: int = 4
    land_threads: int = 8
    land_slice_bytes: int = 16 * MiB
    land_chunk_bytes: int = 16 * MiB
    populate_threads: int = 8
    psis_parts: int = 8
    psis_rows_per_pass: int = 128
    trim_min_bytes: int = 32 * MiB
    store_max_bytes: int = 256 * MiB
    exact_product_terms: int = 16
    exact_product_platforms: tuple[str, ...] = ("tpu",)
    host_values_per_core: int = 8_000_000
    eqns_per_run: int = 4

    @property
    def tune_segment_seconds(self) -> float:
        """Seconds a timed segment should take while tuning: a window over its calls."""
        return self.tune_window_seconds / self.tune_chunks


_STRATEGIES = "docs/strategies.md"
#: Where the measurements behind each field are (the rule, why, and the evidence).
EVIDENCE: dict[str, str] = {
    "vmap_temp_bytes": f"{_STRATEGIES}#vmap-temporaries-threshold",
    "comfort_fraction": f"{_STRATEGIES}#comfort-fraction",
    "vmap_bound_slack": f"{_STRATEGIES}#vmap-bound-slack",
    "vmap_bound_per_output": f"{_STRATEGIES}#vmap-bound-slack",
    "target_chunk_bytes": f"{_STRATEGIES}#chunk-target-bytes",
    "round_down_within": f"{_STRATEGIES}#rounding-to-a-divisor",
    "overhead_bytes_per_buffer": f"{_STRATEGIES}#loop-overhead-per-buffer",
    "jump_factor": f"{_STRATEGIES}#compiled-temporaries-jump",
    "jump_slack_bytes": f"{_STRATEGIES}#compiled-temporaries-jump",
    "refine_ratio": f"{_STRATEGIES}#refine-factor",
    "accelerator_room_fraction": f"{_STRATEGIES}#accelerator-chunk-size",
    "host_loop_many_buffers": f"{_STRATEGIES}#host-loop-for-many-buffers",
    "host_loop_max_chunks": f"{_STRATEGIES}#host-loop-for-many-buffers",
    "random_max_chunks": "docs/predictive.md#chunks-of-random-draws-on-a-cpu",
    "random_vmap_product_bytes": "docs/predictive.md#chunks-of-random-draws-on-a-cpu",
    "random_vector_width": "docs/predictive.md#random-numbers",
    "first_segment_fraction": f"{_STRATEGIES}#progress-segments",
    "segment_seconds": f"{_STRATEGIES}#progress-segments",
    "host_zeros_max_bytes": f"{_STRATEGIES}#host-zeros",
    "flatten_min_gathered_bytes": f"{_STRATEGIES}#flattened-vmap",
    "host_output_chunk_fraction": "docs/memory.md#outputs-in-host-memory-output_memory",
    "host_staging_bytes": "docs/memory.md#the-host-memory-budget",
    "host_margin_bytes": "docs/memory.md#the-host-memory-budget",
    "tune_min_seconds": f"{_STRATEGIES}#tuning-threshold",
    "tune_payback": f"{_STRATEGIES}#tuning-threshold",
    "tune_chunks": f"{_STRATEGIES}#tuning-windows",
    "tune_window_seconds": f"{_STRATEGIES}#tuning-windows",
    "tune_trust_fraction": f"{_STRATEGIES}#tuning-trust-fraction",
    "background_compiles": f"{_STRATEGIES}#tuning-threshold",
    "library_short_reduction": f"{_STRATEGIES}#library-short-reduction",
    "library_try_compiles": f"{_STRATEGIES}#library-trial-compiles",
    "library_min_gain": f"{_STRATEGIES}#library-minimum-gain",
    "spread_platforms": f"{_STRATEGIES}#spreading-over-accelerators",
    "spread_min_bytes": f"{_STRATEGIES}#spreading-over-accelerators",
    "max_lanes": "docs/numpyro.md#lanes-a-loop-of-one-draw-programs-on-every-core",
    "lane_chunks": "docs/numpyro.md#lanes-a-loop-of-one-draw-programs-on-every-core",
    "land_threads": "docs/host_output.md#the-transfers-and-which-one-runs-where",
    "psis_parts": "docs/loo.md#measured",
    "psis_rows_per_pass": "docs/loo.md#measured",
    "land_slice_bytes": "docs/host_output.md#the-transfers-and-which-one-runs-where",
    "land_chunk_bytes": "docs/host_output.md#fresh-host-pages",
    "populate_threads": "docs/host_output.md#fresh-host-pages",
    "trim_min_bytes": f"{_STRATEGIES}#heap-trim",
    "store_max_bytes": f"{_STRATEGIES}#executable-store-size",
    "exact_product_terms": f"{_STRATEGIES}#small-float32-products-on-a-tpu",
    "exact_product_platforms": f"{_STRATEGIES}#small-float32-products-on-a-tpu",
    "host_values_per_core": "docs/loo.md#on-an-accelerator",
    "eqns_per_run": f"{_STRATEGIES}#elementwise-equations-per-run",
}


_lock = threading.Lock()
_current = PlannerConfig()


def current() -> PlannerConfig:
    """The configuration in force (the defaults, unless under `configured`)."""
    return _current


@contextlib.contextmanager
def configured(config: PlannerConfig | None = None, **changes: Any) -> Iterator[PlannerConfig]:
    """Run the body under `config` (default: the one in force), with `changes` to its fields.

    The configuration is the process's, not the thread's: the tuner's compiles on a second
    thread and the background writer read it too. Not for concurrent use with different
    configurations.
    """
    global _current
    new = dataclasses.replace(config or _current, **changes)
    with _lock:
        old, _current = _current, new
    try:
        yield new
    finally:
        with _lock:
            _current = old
