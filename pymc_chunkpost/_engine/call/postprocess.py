"""`postprocess_samples`: the drop-in for `pymc.sampling.jax._postprocess_samples`.

`run` reads: check the options, validate the draws, place them, then try the planner's
attempts until one succeeds (the planner decides what follows an out-of-memory failure),
free what was donated, and assemble the outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._store import zarr as _zarr_store
from ..._support.memory import one_reading, output_path_setting, read_again
from ..._support.progress import progress_bar
from ..data.problem import Problem
from ..data.types import Plan
from ..execute import disk_sink as _disk_sink
from ..execute.executor import CompileOutOfMemory, execute
from ..kernels.chunked import resolve_chunk_size
from ..plan import planner as _planner
from ..plan import resources as _resources
from ..plan.attempt import Attempt
from ..plan.facts import CallFacts, gather, where_it_runs
from . import draws
from .options import check_options

__all__ = ["StoreLayout", "postprocess_samples", "plan", "run"]


def postprocess_samples(
    jax_fn: Callable,
    raw_mcmc_samples: Sequence,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    donate_samples: bool = False,
    *,
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: int | None = None,
    progressbar: bool = False,
    output_memory: str = "auto",
    matmul_precision: str | None = None,
    output_path: str | os.PathLike | None = None,
    resume: bool = False,
) -> list[Any]:
    """Constrain raw NUTS draws and compute deterministics, draw by draw.

    A drop-in for `pymc.sampling.jax._postprocess_samples`, with the same positional
    arguments and the same outputs. Every strategy is one jitted computation with no copies
    of whole sample arrays; a second call with the same shapes compiles nothing. Draws split
    over several devices (as `pm.sample`'s parallel chains leave them) are post-processed
    where they are, each device its own shard, and the outputs keep that split.

    Args:
        jax_fn: the per-draw function, from `pymc.sampling.jax.get_jaxified_graph(
            inputs=model.value_vars, outputs=...)`.
        raw_mcmc_samples: one array (numpy or jax) per input of `jax_fn`, each of shape
            `(chains, draws, ...)`.
        postprocessing_backend: None (where the draws are, else the default device), "cpu"
            or "gpu".
        postprocessing_vectorize: the strategy, one of `STRATEGIES`:

            - "vmap": both axes vmapped (pymc's default). Fastest to compile; temporaries
              scale with chains x draws, which can run out of memory.
            - "scan" / "vmap_scan": chains vmapped, draws looped (pymc's "scan" without its
              swapaxes copies). Temporaries scale with chains.
            - "scan_vmap": chains looped, draws vmapped. Temporaries scale with draws.
            - "nested_scan": one draw at a time. Least memory, slowest.
            - "chunked": the flattened chain x draw axis in chunks of `chunk_size` (or
              `n_chunks` chunks), in one XLA loop; the planner picks the size if neither is
              given.
            - "auto" (default): the fastest plan within `memory_budget`, from XLA's compiled
              analysis and, on long runs, timings of the first chunks; see `plan`.
        donate_samples: let XLA reuse the raw samples' buffers for the outputs (as pymc does
            after sampling). They are donated only after all validation has passed, and an
            out-of-memory retry never loses them.
        chunk_size: draws per chunk (per device), for "chunked" and "auto". Smaller chunks
            use less memory and take longer.
        n_chunks: alternatively, the number of chunks, for "chunked" and "auto".
        memory_budget: bytes the outputs and temporaries may take, on all devices together.
            None means the free memory for "auto"/"chunked", and no check for the other
            strategies; with a fixed strategy, a compiled peak over it raises `MemoryError`
            before anything runs.
        progressbar: show a tqdm bar over chunks while a loop runs (costs one host round
            trip per chunk or segment, not measurable on the benchmarks).
        output_memory: where the outputs live, for "chunked" and "auto". "device" (the
            draws' device); "host": the device computes chunk by chunk and each chunk lands
            in a numpy array in host memory, so the device holds only the draws and two
            chunks (for outputs larger than an accelerator; on a CPU it costs one extra copy
            of every output byte); "auto" (default): "device" when the outputs fit its free
            memory, else "host" on an accelerator that has host memory, else "disk" where
            an output path is set (docs/memory.md). "disk": each chunk lands in host memory
            and a writer thread writes it into a Zarr store at `output_path`, while the
            device computes the next: host memory holds a few chunks, never the outputs
            (for outputs larger than host memory; costs the disk's write time, overlapped
            with compute). Needs zarr (`pip install "pymc-chunkpost[disk]"`).
        output_path: the folder of the Zarr store for "disk" (and for "auto", which may
            then choose it); it must be empty or absent, unless `resume`. Defaults to
            `configure_memory(output_path=...)`'s setting. The outputs are in its group
            `posterior`, named `output_0`, ...; `open_outputs(path)` reopens it.
        resume: continue the store at `output_path` that a run of the same outputs did not
            finish: the chunks it wrote whole are kept, the others computed (the same
            values as a run never interrupted). A complete store is returned as it is.
        matmul_precision: the precision of float32 products (dots, convolutions), one of
            `MATMUL_PRECISIONS`: None (default) is JAX's, as pymc's own JAX post-processing
            has it; on a TPU that is one bfloat16 pass, whose error can reach 1e-2 of a
            log-likelihood. "highest" gives float32's own products there (six passes: the
            products cost more to compile and run); on a CPU or GPU every setting
            computes float32 products in float32.

    Returns:
        One array per output of `jax_fn`, of shape `(chains, draws, ...)`: `jax.Array`s on
        the draws' devices, numpy arrays with the outputs in host memory, or read-only Zarr
        arrays backed by the store on disk (slicing one reads that slice alone).

    Raises:
        ValueError: bad input, raised before any work; the caller's arrays are untouched.
        MemoryError: a budget too small for the outputs (before any work), or an
            out-of-memory failure that persists down to one draw per chunk (the draws are
            then still intact).
    """
    if output_path is None:  # `configure_memory`'s default, for this public entry
        output_path = output_path_setting()
    return run(
        jax_fn,
        raw_mcmc_samples,
        postprocessing_backend,
        postprocessing_vectorize,
        donate_samples,
        chunk_size=chunk_size,
        n_chunks=n_chunks,
        memory_budget=memory_budget,
        progressbar=progressbar,
        output_memory=output_memory,
        matmul_precision=matmul_precision,
        output_path=output_path,
        resume=resume,
    )[0]


def plan(
    jax_fn: Callable,
    raw_mcmc_samples: Sequence,
    postprocessing_backend: str | None = None,
    *,
    memory_budget: int | None = None,
) -> Plan:
    """The plan that `postprocess_samples(..., "auto")` would start with; runs nothing.

    It compiles the candidates the planner reads (kept in the cache, so running the plan
    without donation compiles nothing more), but cannot know what the online tuner of a
    long run would measure: `Plan.source` is "rule" or "cache" here.

    Args:
        jax_fn: as for `postprocess_samples`.
        raw_mcmc_samples: as for `postprocess_samples` (only shapes, dtypes and where the
            arrays are, are read).
        postprocessing_backend: None, "cpu" or "gpu".
        memory_budget: bytes for outputs and temporaries; None means the free memory
            (available RAM on a CPU, the pool left after preallocation on a GPU).

    Raises:
        ValueError: for bad input (see `postprocess_samples`).
        MemoryError: if the budget cannot hold the outputs.
    """
    check_options("auto", None, None, memory_budget)
    with one_reading():  # as `run` reads the machine
        problem, samples = draws.validate(jax_fn, raw_mcmc_samples, postprocessing_backend)
        one_by_one = _resources.shard_by_shard(problem)
        if one_by_one is not None:  # as `run` would: each device's shard planned on its own
            shards = _shards(samples, problem)
            budget = _shard_budget(memory_budget, len(shards))
            plans = [plan(jax_fn, x, None, memory_budget=budget) for x in shards.values()]
            return _shard_by_shard_plan(plans, one_by_one)
        facts = gather(where_it_runs(problem, "auto"), "auto", memory_budget=memory_budget)
        return _planner.first_attempt(jax_fn, facts, "auto").plan


def run(
    jax_fn: Callable,
    raw_mcmc_samples: Sequence,
    postprocessing_backend: str | None = None,
    postprocessing_vectorize: str = "auto",
    donate_samples: bool = False,
    *,
    chunk_size: int | None = None,
    n_chunks: int | None = None,
    memory_budget: float | None = None,
    progressbar: bool = False,
    output_memory: str = "auto",
    output_path: str | os.PathLike | None = None,
    resume: bool = False,
    store: StoreLayout | None = None,
    progress_label: str = "Transforming variables",
    one_draw_programs: bool = False,
    random: bool = False,
    matmul_precision: str | None = None,
    small_on_host: bool = False,
) -> tuple[list[Any], Plan]:
    """`postprocess_samples`, also returning the plan that ran; `progress_label` names the
    progress bar (each route says what it computes). `one_draw_programs`: `jax_fn`,
    mapped, computes one draw at a time (`Problem.one_draw_programs`); `random`: it draws
    random numbers (`Problem.random`); `small_on_host`: on an accelerator, small work runs
    on the host CPU (`facts.where_it_runs`: a route whose caller named no device, whose
    outputs come back to the host). `output_path`: the disk tier's store, as the route
    resolved it (a route that passes none never writes to disk). `store`: the names, group,
    dims and coords of the outputs on disk (by default `posterior/output_<j>`)."""
    strategy = postprocessing_vectorize
    options = (chunk_size, n_chunks, memory_budget, output_memory, matmul_precision)
    check_options(strategy, *options, output_path=output_path, resume=resume)
    with one_reading():  # the machine's free memory, read once for the whole call
        # Invariant: `jax_fn` is traced here only (`analyse`), and its products keep the
        # precision they were traced with.
        with _matmul_precision(matmul_precision):
            problem, samples = draws.validate(jax_fn, raw_mcmc_samples, postprocessing_backend)
        problem = dataclasses.replace(problem, one_draw_programs=one_draw_programs, random=random)
        target = _DiskTarget.of(problem, samples, output_memory, output_path, resume, store)
        if target is not None and (arrays := target.complete_arrays()) is not None:
            return arrays, _planner.stored_plan(problem)
        one_by_one = _resources.shard_by_shard(problem)
        if one_by_one is not None:
            _DiskTarget.refuse(target, one_by_one)
            return _run_shard_by_shard(
                jax_fn,
                samples,
                problem,
                one_by_one,
                strategy,
                donate_samples,
                chunk_size=chunk_size,
                n_chunks=n_chunks,
                memory_budget=memory_budget,
                progressbar=progressbar,
                output_memory=output_memory,
                progress_label=progress_label,
                matmul_precision=matmul_precision,
            )
        # A disk target's store records the problem it was opened for: the call stays there.
        problem = where_it_runs(problem, strategy, small_on_host=small_on_host and target is None)
        placed, donate = draws.place(samples, donate_samples, problem)
        # Invariant: free memory is read with the draws where they run (`one_reading`).
        facts = gather(
            problem,
            strategy,
            memory_budget=memory_budget,
            output_memory=output_memory,
            disk=target is not None,
        )
        size = None
        if chunk_size is not None or n_chunks is not None:
            size = resolve_chunk_size(facts.problem.n_local, chunk_size, n_chunks)
        request = _Request(strategy, size, progressbar, progress_label)
        attempt, computed = _attempts(jax_fn, facts, placed, donate, request, target)
    outputs = _assemble(computed, attempt, placed, donate, facts, target)
    return outputs, _planner.finished(attempt)


@dataclasses.dataclass(frozen=True)
class _Request:
    """What the caller of `run` asked for, as the attempts read it."""

    strategy: str
    chunk_size: int | None  # resolved; None: the planner's
    progressbar: bool
    progress_label: str


def _attempts(
    jax_fn: Callable,
    facts: CallFacts,
    placed: list,
    donate: Sequence[int],
    request: _Request,
    target: _DiskTarget | None,
) -> tuple[Attempt, list[Any]]:
    """The planner's attempts run until one succeeds (the planner decides what follows an
    out-of-memory failure, or raises); the one that ran and its computed outputs (where
    they go to disk, into `target`'s store).

    Invariant: after a failure the call's facts are read again (`CallFacts.read_again`), once
    what the failed attempt held is released.
    """
    # What XLA may take (`facts.donation`); the rest of `donate` is deleted after success.
    xla_donate = tuple(donate) if facts.donation.value else ()
    problem = facts.problem
    attempt: Attempt | None = None
    failed_strategy = request.strategy
    while True:
        try:
            if attempt is None:
                attempt = _planner.first_attempt(
                    jax_fn,
                    facts,
                    request.strategy,
                    chunk_size=request.chunk_size,
                    donate=xla_donate,
                    progress=request.progressbar,
                )
            with progress_bar(problem.n_items, request.progress_label, request.progressbar):
                computed = _execute(attempt, placed, target, problem)
                jax.block_until_ready(computed)
            return attempt, computed
        except (jax.errors.JaxRuntimeError, CompileOutOfMemory) as error:
            if not _planner.retries(attempt, error):
                raise
            # Release what the failed attempt still holds (its outputs, here and in the
            # frames it failed in), so that the free memory the planner reads is real.
            computed = None
            traceback.clear_frames(error.__traceback__)
            read_again()
            facts = facts.read_again()
            if attempt is not None:
                failed_strategy = attempt.plan.strategy
            attempt = _planner.next_attempt(
                jax_fn,
                facts,
                attempt,
                failed_strategy,
                error,
                lost=[i for i in donate if placed[i].is_deleted()],
                donate=xla_donate,
                progress=request.progressbar,
            )


def _matmul_precision(precision: str | None) -> contextlib.AbstractContextManager:
    """JAX's default precision of float32 products set to `precision`; None leaves it."""
    if precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision)


def _assemble(
    computed: list[Any],
    attempt: Attempt,
    placed: list,
    donate: Sequence[int],
    facts: CallFacts,
    target: _DiskTarget | None,
) -> list[Any]:
    """Once every chunk has succeeded: free the donated draws, and return every output,
    the passed-through draws included (on disk: the store's arrays)."""
    problem = facts.problem
    stored = None
    if target is not None and target.sink is not None:  # may fail: before any donation
        stored = target.finish(attempt.exe, placed, problem)
    for i in donate:  # what donation frees, once nothing can fail any more
        if not placed[i].is_deleted():
            placed[i].delete()
    if stored is not None:
        return stored
    it = iter(computed)
    outputs: list[Any] = [next(it) if k is None else placed[k] for k in problem.forwarded]
    if attempt.exe.output_memory == "host":
        outputs = _from_host(outputs, facts)
    return outputs


@dataclasses.dataclass(frozen=True)
class StoreLayout:
    """How a route names its outputs in the disk tier's store.

    Attributes:
        names: one name per output (None: `output_0`, ...).
        group: the store's group (an InferenceData group: `posterior`, `log_likelihood`).
        dims: each output's dims after the sample dims, by name (the rest
            `<name>_dim_<i>`).
        coords: coordinate values by dim name (the sample dims default to `0..n-1`).
        dtypes: each output's dtype in the store (None: the computed ones).
        sample_shape: the outputs' leading sample dims as the route returns them, whose
            items are the draws' `(a * b)` in C order (numpyro's batch shape: `(n,)`, or
            `(a, b)`); None: the draws' `(chains, draws)`. `_zarr_store.sample_dims`
            names them (`draw`; `chain`, `draw`; ...).
        option: the caller's name for the store's path, which a refused place names.
        refused: what a refused place leaves the caller (the message's last sentence).
    """

    names: Sequence[str] | None = None
    group: str = "posterior"
    dims: Mapping[str, Sequence[str]] | None = None
    coords: Mapping[str, Any] | None = None
    dtypes: Sequence[Any] | None = None
    sample_shape: Sequence[int] | None = None
    option: str = "output_path"
    refused: str = "Nothing was run."


def _execute(
    attempt: Attempt, placed: list, target: _DiskTarget | None, problem: Problem
) -> list[Any]:
    """`execute` the attempt; where it writes to disk, into the target's store (chunks of
    the computed outputs to its sink), which a failure abandons."""
    on_disk = {} if target is None else target.sink_for(attempt.exe, problem)
    try:
        return execute(attempt.exe, placed, attempt.tuner, **on_disk)
    except BaseException:
        if target is not None:
            target.abandon()
        raise


@dataclasses.dataclass
class _DiskTarget:
    """A call's store on disk, where its outputs may go: checked, opened once the planner
    has chosen it, finished or abandoned (`_disk_sink`)."""

    path: Path
    stored: list[Any]
    resume: bool
    layout: StoreLayout
    samples: Sequence[Any]  # the call's draws, read for the digest of its inputs
    checked: bool = False
    inputs: str | None = None  # the digest, once `check` has taken it
    sink: _disk_sink.DiskSink | None = None

    @classmethod
    def of(
        cls,
        problem: Problem,
        samples: Sequence[Any],
        output_memory: str,
        output_path: Any,
        resume: bool,
        store: StoreLayout | None,
    ) -> _DiskTarget | None:
        """The target where outputs may go to disk (a path, "disk" or "auto"), else None;
        for "disk", the place is checked now, before any work ("auto" checks it once it
        has chosen it)."""
        if output_path is None or output_memory not in ("auto", "disk"):
            return None
        layout = store or StoreLayout()
        stored = _disk_sink.outputs_for(
            problem.out_specs,
            layout.names,
            layout.group,
            layout.dims,
            layout.dtypes,
            layout.sample_shape,
        )
        target = cls(Path(os.fspath(output_path)), stored, resume, layout, samples)
        if output_memory == "disk":
            target.check(problem)
        return target

    def check(self, problem: Problem) -> None:
        """Check the place for `problem`'s outputs, once disk is chosen, before the attempt
        that writes runs (and may donate the draws): then the digest of the call's inputs
        (`_disk_sink.inputs_digest`) is taken, which a resumed store must have."""
        self.inputs = _disk_sink.inputs_digest(
            self.samples,
            [spec.dtype for spec in problem.in_specs],
            problem.every_const(),
            f"{problem.fingerprint}|{problem.device.platform}",
        )
        _disk_sink.check_place(
            self.path,
            self.stored,
            problem.output_bytes,
            resume=self.resume,
            name=self.layout.option,
            inputs=self.inputs,
            refused=self.layout.refused,
        )
        self.checked = True

    def complete_arrays(self) -> list[Any] | None:
        """Resumed on a complete store (checked): its arrays, with nothing to compute."""
        if not (self.checked and self.resume and self.path.is_dir()):
            return None
        if not any(self.path.iterdir()) or not _zarr_store.open_outputs(self.path).complete:
            return None
        return _zarr_store.stored_arrays(self.path, self.stored)

    def sink_for(self, exe: Any, problem: Problem) -> dict[str, Any]:
        """`execute`'s keywords for `exe`: the sink of its computed outputs where it writes
        to disk (the store made, or reopened, at the first such executable)."""
        if exe.output_memory != "disk":
            return {}
        if self.sink is None:
            if not self.checked:
                self.check(problem)
            self.sink = _disk_sink.create_or_resume(
                self.path,
                self.stored,
                resume=self.resume,
                coords=self.layout.coords,
                draws_per_chunk=exe.chunk_size,
                inputs=self.inputs,
            )
        return {"sink": self.sink.with_computed(problem.computed)}

    def abandon(self) -> None:
        """Stop the writer after a failure: what it wrote whole stays marked, and a retry
        reopens the store and keeps it."""
        if self.sink is not None:
            self.sink.abandon()
            self.sink, self.resume = None, True

    @staticmethod
    def refuse(target: _DiskTarget | None, one_by_one: str) -> None:
        """Raise `ValueError` for outputs that may go to disk from draws run shard by shard."""
        if target is not None:
            raise ValueError(
                "The disk tier streams the draws of one device, or of devices split on the "
                f"chain axis; these draws must run shard by shard ({one_by_one}). Pass "
                "`postprocessing_backend='cpu'` with draws on one device, or another "
                "`output_memory`."
            )

    def finish(self, exe: Any, placed: list, problem: Problem) -> list[Any]:
        """The store completed, the passed-through draws written to it too; its arrays."""
        assert self.sink is not None
        passed = {j: placed[k] for j, k in enumerate(problem.forwarded) if k is not None}
        return self.sink.finish(passed, int(exe.chunk_size or problem.n_local))


def _from_host(outputs: list[Any], facts: CallFacts) -> list[Any]:
    """Outputs that landed in host memory, as asked: numpy arrays, except where the planner
    chose host memory on a CPU (lanes), the device's own memory: there `jax.Array`s on the
    device, placed without a copy (the lanes' host outputs are aligned for it)."""
    if facts.host_is_the_device:
        return [jax.device_put(x, facts.problem.device) for x in outputs]
    return [np.asarray(x) for x in outputs]


def _run_shard_by_shard(
    jax_fn: Callable,
    samples: list,
    problem: Problem,
    reason: str,
    strategy: str,
    donate_samples: bool,
    *,
    memory_budget: float | None,
    **options: Any,
) -> tuple[list[Any], Plan]:
    """`run` on each device's shard in turn, as a one-device run (`_resources.shard_by_shard`).

    Invariant: each shard has finished before the next is dispatched. One-device programs
    dispatched at once on every device hang as the one program over all of them does
    (docs/strategies.md). The outputs are assembled on the draws' sharding from the
    shards' own outputs (no copy; numpy outputs, in host memory, are filled block by
    block). An explicit `memory_budget` is shared out equally. Nothing is donated until
    every shard has succeeded.
    """
    sharding = problem.placement.sharding
    index = sharding.addressable_devices_indices_map(problem.in_specs[0].shape)
    shards = _shards(samples, problem)
    budget = _shard_budget(memory_budget, len(shards))
    # Whatever computes the draws (the sampler, on every device) has finished before the
    # first shard is dispatched: the deadlock needs only two devices' LAPACK kernels at once.
    jax.block_until_ready([x for x in samples if isinstance(x, jax.Array)])
    results: list[list[Any]] = []
    plans: list[Plan] = []
    for local in shards.values():
        read_again()  # what the shard before took is gone from the free memory
        outputs, shard_plan = run(
            jax_fn,
            local,
            None,
            strategy,
            False,
            memory_budget=budget,
            one_draw_programs=problem.one_draw_programs,
            random=problem.random,
            **options,
        )
        results.append(outputs)
        plans.append(shard_plan)
    assembled: list[Any] = []
    for j, (spec, k) in enumerate(zip(problem.out_specs, problem.forwarded)):
        parts = [r[j] for r in results]
        if k is not None:
            assembled.append(samples[k])
        elif isinstance(parts[0], np.ndarray):
            whole = np.empty(spec.shape, spec.dtype)
            for where, part in zip(index.values(), parts):
                whole[where] = part
            assembled.append(whole)
        else:
            assembled.append(jax.make_array_from_single_device_arrays(spec.shape, sharding, parts))
    if donate_samples:  # what donation frees, once nothing can fail any more
        passed_through = {k for k in problem.forwarded if k is not None}
        for i, x in enumerate(samples):
            if i not in passed_through and isinstance(x, jax.Array) and not x.is_deleted():
                x.delete()
    return assembled, _shard_by_shard_plan(plans, reason)


def _shards(samples: list, problem: Problem) -> dict[Any, list]:
    """Each addressable device's shard of every input, in the sharding's device order."""
    sharding = problem.placement.sharding
    index = sharding.addressable_devices_indices_map(problem.in_specs[0].shape)
    return {
        device: [next(s.data for s in x.addressable_shards if s.device == device) for x in samples]
        for device in index
    }


def _shard_budget(memory_budget: float | None, n_shards: int) -> int | None:
    """Each shard's part of an explicit budget, for shards run one after another."""
    return None if memory_budget is None else int(memory_budget // n_shards)


def _shard_by_shard_plan(plans: list[Plan], reason: str) -> Plan:
    """One plan for the one-device plans of a shard-by-shard run: the outputs and the costs
    of all shards, the peak of the largest, and the choices of the first, which planned (the
    others start from the plan it left in the tuning cache)."""
    return dataclasses.replace(
        plans[0],
        output_bytes=sum(p.output_bytes for p in plans),
        peak_bytes=max(p.peak_bytes for p in plans),
        compile_seconds=sum(p.compile_seconds for p in plans),
        planning_seconds=sum(p.planning_seconds for p in plans),
        n_devices=len(plans),
        devices_reason=reason,
    )
