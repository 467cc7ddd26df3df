"""`postprocess_samples`: the drop-in for `pymc.sampling.jax._postprocess_samples`."""

from __future__ import annotations

import inspect
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ._chunked import check_chunking, resolve_chunk_size
from ._executable import HOST_CHUNKED, Problem, analyse, executable, execute, is_out_of_memory
from ._memory import free_bytes, resolve_device
from ._planner import (
    Plan,
    check_budget,
    check_budget_value,
    make_plan,
    plan_problem,
    resolve_budget,
    wants_host_loop,
)
from ._progress import progress_bar
from ._strategies import STRATEGIES

__all__ = ["postprocess_samples"]

_CHUNK_OPTIONS = ("chunked", "auto")


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
) -> list[jax.Array]:
    """Constrain raw NUTS draws and compute deterministics, draw by draw.

    A drop-in for `pymc.sampling.jax._postprocess_samples`, with the same positional
    arguments and the same outputs. Every strategy is one jitted computation with no copies
    of whole sample arrays; a second call with the same shapes compiles nothing.

    Args:
        jax_fn: the per-draw function, from `pymc.sampling.jax.get_jaxified_graph(
            inputs=model.value_vars, outputs=...)`.
        raw_mcmc_samples: one array (numpy or jax) per input of `jax_fn`, each of shape
            `(chains, draws, ...)`.
        postprocessing_backend: None (the default device), "cpu" or "gpu".
        postprocessing_vectorize: the strategy, one of `STRATEGIES`:

            - "vmap": both axes vmapped (pymc's default). Fastest to compile; temporaries
              scale with chains x draws, which can run out of memory.
            - "scan" / "vmap_scan": chains vmapped, draws looped (pymc's "scan" without its
              swapaxes copies). Temporaries scale with chains.
            - "scan_vmap": chains looped, draws vmapped. Temporaries scale with draws.
            - "nested_scan": one draw at a time. Least memory, slowest.
            - "chunked": the flattened chain x draw axis in chunks of `chunk_size` (or
              `n_chunks` chunks); the planner picks the size if neither is given.
            - "auto" (default): the planner's choice under `memory_budget`; see `plan`.
        donate_samples: let XLA reuse the raw samples' buffers for the outputs (as pymc does
            after sampling). They are donated only after all validation has passed, and an
            out-of-memory retry never loses them.
        chunk_size: draws per chunk, for "chunked" and "auto".
        n_chunks: alternatively, the number of chunks, for "chunked" and "auto".
        memory_budget: bytes the outputs and temporaries may take. None means the device's
            free memory for "auto"/"chunked", and no check for the other strategies.
        progressbar: show a tqdm bar over chunks while a loop runs.

    Returns:
        One `jax.Array` per output of `jax_fn`, of shape `(chains, draws, ...)`.

    Raises:
        ValueError: bad input, raised before any work; the caller's arrays are untouched.
        MemoryError: a budget too small for the outputs (before any work), or an
            out-of-memory failure that persists down to one draw per chunk (the draws are
            then still intact).
    """
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
    )[0]


def check_options(
    strategy: Any,
    chunk_size: Any,
    n_chunks: Any,
    memory_budget: Any,
    names: dict[str, str] | None = None,
) -> None:
    """The checks on the options alone, before any work; `patch` makes them before sampling.

    Args:
        strategy: `postprocessing_vectorize`.
        chunk_size: the chunk size option.
        n_chunks: the number-of-chunks option.
        memory_budget: the memory budget option.
        names: what the caller calls "chunk_size", "n_chunks" and "memory_budget", for the
            messages (pymc's sampler calls them `postprocessing_chunk_size`, ...).

    Raises:
        ValueError: naming the option, the value, and what to pass instead.
    """
    names = {
        "chunk_size": "chunk_size",
        "n_chunks": "n_chunks",
        "memory_budget": "memory_budget",
    } | (names or {})
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown `postprocessing_vectorize={strategy!r}`. Valid strategies: "
            f"{', '.join(STRATEGIES)}."
        )
    chunk_names = (names["chunk_size"], names["n_chunks"])
    check_chunking(chunk_size, n_chunks, chunk_names, "to let the planner choose")
    if strategy not in _CHUNK_OPTIONS and (chunk_size is not None or n_chunks is not None):
        raise ValueError(
            f"`{chunk_names[0]}`/`{chunk_names[1]}` apply to the strategies {_CHUNK_OPTIONS}, "
            f"not to {strategy!r}. Pass `postprocessing_vectorize='chunked'` to set the chunk "
            "size."
        )
    check_budget_value(memory_budget, names["memory_budget"])


def _validate(jax_fn, raw_mcmc_samples, backend, strategy, chunk_size, n_chunks, memory_budget):
    """All input checks, before any work. Returns the problem and the samples as arrays."""
    check_options(strategy, chunk_size, n_chunks, memory_budget)
    if not callable(jax_fn):
        raise ValueError(f"`jax_fn` must be callable, got {type(jax_fn).__name__}.")
    if isinstance(raw_mcmc_samples, dict) or not isinstance(raw_mcmc_samples, list | tuple):
        raise ValueError(
            "`raw_mcmc_samples` must be a list of arrays, one per input of `jax_fn`, got "
            f"{type(raw_mcmc_samples).__name__}."
        )
    if not raw_mcmc_samples:
        raise ValueError("`raw_mcmc_samples` is empty: pass one array per input of `jax_fn`.")
    n_inputs = _n_inputs(jax_fn)
    if n_inputs is not None and n_inputs != len(raw_mcmc_samples):
        raise ValueError(
            f"`jax_fn` takes {n_inputs} inputs but {len(raw_mcmc_samples)} arrays were given in "
            "`raw_mcmc_samples`; pass one array per model value variable, in order."
        )
    samples = []
    for i, x in enumerate(raw_mcmc_samples):
        if isinstance(x, jax.Array) and x.is_deleted():
            raise ValueError(f"`raw_mcmc_samples[{i}]` has been deleted (donated before?).")
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            x = np.asarray(x)
        if len(x.shape) < 2:
            raise ValueError(
                f"`raw_mcmc_samples[{i}]` has shape {tuple(x.shape)}; every array needs at "
                "least 2 dimensions, (chains, draws, ...)."
            )
        samples.append(x)
    lead = tuple(samples[0].shape[:2])
    for i, x in enumerate(samples):
        if tuple(x.shape[:2]) != lead:
            raise ValueError(
                f"`raw_mcmc_samples[{i}]` has (chains, draws) = {tuple(x.shape[:2])}, but "
                f"`raw_mcmc_samples[0]` has {lead}. All arrays must share them."
            )
    if 0 in lead:
        raise ValueError(f"No draws to post-process: (chains, draws) = {lead}.")
    device = resolve_device(backend)
    in_specs = [
        jax.ShapeDtypeStruct(tuple(x.shape), jax.dtypes.canonicalize_dtype(x.dtype))
        for x in samples
    ]
    return analyse(jax_fn, in_specs, device), samples


def _n_inputs(jax_fn) -> int | None:
    try:
        params = inspect.signature(jax_fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _place(samples, device, donate_samples: bool, problem: Problem):
    """Put the samples on `device`; the indices that may be donated.

    A caller's numpy array is never donated when the device array shares its memory, and a
    passed-through input is returned as an output, so it is never donated either.
    """
    placed, donate = [], []
    passed_through = {k for k in problem.forwarded if k is not None}
    for i, x in enumerate(samples):
        on_device = isinstance(x, jax.Array) and x.devices() == {device}
        y = x if on_device else jax.device_put(x, device)
        placed.append(y)
        if not donate_samples or i in passed_through:
            continue
        if isinstance(x, np.ndarray) and _shares_memory(x, y):
            continue
        donate.append(i)
    return placed, tuple(donate)


def _shares_memory(x: np.ndarray, y: jax.Array) -> bool:
    try:
        return x.__array_interface__["data"][0] == y.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001 - any failure to tell means "assume shared".
        return True


def _choose(problem, strategy, chunk_size, n_chunks, memory_budget, donate, progress):
    """The plan and executable for a call: the planner's for "auto"/"chunked", else fixed."""
    size = None
    if chunk_size is not None or n_chunks is not None:
        size = resolve_chunk_size(problem.n_items, chunk_size, n_chunks)
    if strategy in _CHUNK_OPTIONS:
        budget = resolve_budget(problem, memory_budget)
        return plan_problem(
            problem,
            budget,
            donate=donate,
            progress=progress,
            force_chunked=strategy == "chunked",
            chunk_size=size,
        )
    budget = None
    if memory_budget is not None:
        budget = resolve_budget(problem, memory_budget)
        check_budget(problem, budget)
    exe = executable(problem, strategy, None, donate, progress)
    reason = f"Strategy {strategy!r} was requested."
    return make_plan(problem, budget, exe, strategy, None, reason), exe


def run(
    jax_fn,
    raw_mcmc_samples,
    postprocessing_backend=None,
    postprocessing_vectorize="auto",
    donate_samples=False,
    *,
    chunk_size=None,
    n_chunks=None,
    memory_budget=None,
    progressbar=False,
) -> tuple[list[jax.Array], Plan]:
    """`postprocess_samples`, also returning the plan that ran."""
    problem, samples = _validate(
        jax_fn,
        raw_mcmc_samples,
        postprocessing_backend,
        postprocessing_vectorize,
        chunk_size,
        n_chunks,
        memory_budget,
    )
    placed, donate = _place(samples, problem.device, donate_samples, problem)
    # What XLA may take: see `xla_may_donate`. The rest of `donate` is deleted after success.
    xla_donate = donate if xla_may_donate(problem.device) else ()
    strategy = postprocessing_vectorize
    plan, retry = None, None  # `retry`: the chunk size to try after running out of memory
    while True:
        try:
            if retry is None:
                plan, exe = _choose(
                    problem, strategy, chunk_size, n_chunks, memory_budget, xla_donate, progressbar
                )
            else:
                # Compiling can run out of memory too (XLA's GPU autotuner), so the retry's
                # compile sits inside the same `try`.
                if plan is not None and plan.loop is not None:  # the loop it had
                    host = plan.loop == "host"
                else:  # no loop yet: the planner's rule (many buffers: a host loop)
                    host = wants_host_loop(problem)
                loop = HOST_CHUNKED if host else "chunked"
                exe = executable(problem, loop, retry, xla_donate, progressbar)
                reason = f"Retried at {retry} draws per chunk after running out of memory."
                if plan is not None:
                    budget = plan.budget_bytes
                else:
                    budget = None if memory_budget is None else int(memory_budget)
                plan = make_plan(problem, budget, exe, "chunked", retry, reason)
            with progress_bar(problem.n_items, "Transforming variables", progressbar):
                computed = execute(exe, placed)
                jax.block_until_ready(computed)
            break
        except jax.errors.JaxRuntimeError as error:
            if not is_out_of_memory(error):
                raise
            # Release what the failed attempt still holds (its outputs, here and in the
            # frames it failed in), so that the free memory read below is what a retry has.
            computed = None
            traceback.clear_frames(error.__traceback__)
            lost = [i for i in donate if placed[i].is_deleted()]
            if retry is None and plan is not None:  # the first plan ran out while running
                strategy = plan.strategy
                current = plan.chunk_size or _effective_chunk(problem, strategy)
            else:  # a retry, or a fixed strategy that ran out while compiling
                current = retry or _effective_chunk(problem, strategy)
            free = free_bytes(problem.device)
            if not lost and free is not None and free < problem.output_bytes:
                raise MemoryError(
                    f"Post-processing ran out of memory with {strategy!r} at {current} draw(s) "
                    f"per chunk, and smaller chunks cannot help: the outputs alone need "
                    f"{problem.output_bytes / 2**20:,.1f} MiB and {problem.device} has "
                    f"{free / 2**20:,.1f} MiB free. The raw draws are intact: free device "
                    "memory (delete arrays you no longer need), or post-process on the CPU "
                    "(`postprocessing_backend='cpu'`)."
                ) from error
            if lost or current <= 1:
                raise MemoryError(
                    f"Post-processing ran out of memory with {strategy!r} at "
                    f"{current} draw(s) per chunk ({error}). "
                    + (
                        f"Inputs {lost} were donated and are lost."
                        if lost
                        else "The raw draws are intact: pass a larger `memory_budget` after "
                        "freeing memory, or post-process on the CPU "
                        "(`postprocessing_backend='cpu'`)."
                    )
                ) from error
            retry = max(1, current // 2)
            warnings.warn(
                f"Post-processing ran out of memory with {strategy!r} at {current} "
                f"draw(s) per chunk; retrying with chunks of {retry}. The draws are intact.",
                RuntimeWarning,
                stacklevel=2,
            )
            strategy = "chunked"
    for i in donate:  # what donation frees, once nothing can fail any more
        if not placed[i].is_deleted():
            placed[i].delete()
    outputs = []
    it = iter(computed)
    for k in problem.forwarded:
        outputs.append(next(it) if k is None else placed[k])
    return outputs, plan


def xla_may_donate(device: jax.Device) -> bool:
    """Whether donated draws may be handed to XLA itself (else: deleted after success).

    On a GPU, XLA deletes donated buffers even when the execution then fails to allocate its
    outputs (seen on an H200, jax 0.11: a RESOURCE_EXHAUSTED at run time took a donated
    input with it), which would lose the draws that an out-of-memory retry needs. There the
    draws are deleted only after success: the same memory is freed, later, and no output
    can reuse an input's buffer (the planner's compiled peak counts that). On the CPU,
    running out of memory means the kernel's OOM killer, not an error to retry, so XLA
    takes the donation and outputs reuse the draws' buffers.
    """
    return device.platform == "cpu"


def _effective_chunk(problem: Problem, strategy: str) -> int:
    """Draws evaluated together by a strategy without an explicit chunk size."""
    return {
        "scan": problem.chains,
        "vmap_scan": problem.chains,
        "scan_vmap": problem.draws,
        "nested_scan": 1,
    }.get(strategy, problem.n_items)
