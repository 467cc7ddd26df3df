"""The online tuner of a host-driven `auto` run: the chunk size, measured on the real draws.

Two policies with their state explicit, and the driver that the executor's loop consults:

- `SizeSearch`: from the rule's size, double while that is faster, else halve while that is
  faster; each size timed over a window (`tune_chunks` calls and `tune_window_seconds`,
  after one untimed warm-up call), and only while the work left exceeds `tune_min_seconds`
  and `tune_payback` times what the rule's step took to compile (or to load, where it was
  loaded from the store).
- `_library_fusions.LibraryTrial`: before any size, on a CPU, the same chunk compiled without
  XLA's library fusions, kept where it runs faster.
- `Tuner`: hands the executor each next step (`next_step`), takes each call's time
  (`record`), compiles candidates on a second thread while the best so far runs (XLA compiles
  without the GIL; `background_compiles`), and writes what it measured to the tuning cache
  (`close`). Every chunk writes its real outputs, so tuning computes nothing twice; each
  candidate's compiled peak is checked against the budget before it runs (by the
  `compile_candidate` the planner hands it).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from ..._support.config import PlannerConfig, current
from ..execute.executor import Executable, release
from . import tuning as _tuning
from .library_fusions import LibraryTrial

__all__ = ["SizeSearch", "Tuner"]

#: Compile a candidate of a chunk size, with library fusions on or off; None where it does not
#: fit the budget (the planner's, bound to the run).
CompileCandidate = Callable[[int, bool], Executable | None]


@dataclasses.dataclass
class SizeSearch:
    """The chunk-size search: a policy over measured times.

    Attributes:
        config: the heuristics (`tune_*`).
        tried: the sizes tried, in order (the rule's first).
        up: whether the search still doubles (else it halves).
        times: (seconds, draws) per timed call, by size.
        warm: the sizes whose untimed warm-up call has run.
    """

    config: PlannerConfig
    tried: list[int]
    up: bool = True
    times: dict[int, list[tuple[float, int]]] = dataclasses.field(default_factory=dict)
    warm: set[int] = dataclasses.field(default_factory=set)

    def rate(self, times: list[tuple[float, int]]) -> float | None:
        """The median call's seconds per draw, once timed over a full window; else None."""
        config = self.config
        if len(times) < config.tune_chunks or sum(t for t, _ in times) < config.tune_window_seconds:
            return None
        return float(np.median([t / k for t, k in times]))

    @property
    def rates(self) -> dict[int, float]:
        """Seconds per draw, for each size timed over a full window."""
        rates = {size: self.rate(times) for size, times in self.times.items()}
        return {size: rate for size, rate in rates.items() if rate is not None}

    def fastest(self) -> int:
        rates = self.rates
        return min(rates, key=rates.__getitem__)

    def record(self, size: int, seconds: float, draws: int) -> bool:
        """A call of `size` took `seconds` for `draws` draws; True when that completes the
        size's window (each size's first call warms up)."""
        if size not in self.warm:
            self.warm.add(size)
            return False
        complete = size in self.rates
        self.times.setdefault(size, []).append((seconds, draws))
        return not complete and size in self.rates

    def next_size(
        self, best: int, left_seconds: float, n: int, compile_seconds: float = 0.0
    ) -> int | None:
        """The next size to try, given the fastest so far, the work left and what a compile
        costs here; None: the search is over (too little left to repay a compile, or no
        faster way to go)."""
        config = self.config
        if left_seconds < max(config.tune_min_seconds, config.tune_payback * compile_seconds):
            return None
        newest = self.tried[-1]
        if newest == best:  # the newest size is the fastest so far: go on that way
            target = newest * 2 if self.up else newest // 2
        elif self.up and best == self.tried[0]:  # a larger chunk was slower: try smaller
            self.up = False
            target = best // 2
        else:
            return None
        if not 1 <= target <= n or target in self.tried:
            return None
        self.tried.append(target)
        return target


class Tuner:
    """The online tuner's driver (module docstring): policy for the executor's chunk loop.

    Args:
        exe: the rule's step, which the run starts with.
        compile_candidate: compiles a candidate (the planner's, bound to the run's budget).
        key: the tuning cache's key of the run.
        config: the heuristics; the configuration in force by default.
    """

    def __init__(
        self,
        exe: Executable,
        compile_candidate: CompileCandidate,
        key: str,
        config: PlannerConfig | None = None,
    ):
        self.config = config = config or current()
        self._compile, self._key, self._n = compile_candidate, key, exe.problem.n_local
        size = int(exe.chunk_size or 1)
        self.steps: dict[int, Executable] = {size: exe}
        self.search = SizeSearch(config, [size])
        self.library = LibraryTrial.for_step(exe, config)
        self.best = size
        self._current = exe
        self._start = 0
        self._began: float | None = None  # when the run asked for its first chunk
        self._trusted = True
        self._pending: concurrent.futures.Future | None = None
        self._pending_library = False  # the compile in flight is the library trial's
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # On a CPU a compile in flight takes a core from the chunks that run beside it.
        self._compiles_share_cores = exe.problem.device.platform == "cpu"
        #: The executor times calls while this is set.
        self.timing = True
        #: The largest compiled peak of any step that ran.
        self.peak_bytes = exe.peak_bytes

    @property
    def segment_seconds(self) -> float:
        """Seconds a timed segment should take while tuning."""
        return self.config.tune_segment_seconds

    @property
    def seconds_per_draw(self) -> dict[int, float]:
        """Seconds per draw, for each size timed over a full window."""
        return self.search.rates

    @property
    def measured(self) -> bool:
        """More than one size was timed, over a run that bears the measurement out."""
        return len(self.seconds_per_draw) > 1 and self._trusted

    @property
    def library_fusions(self) -> bool:
        """Whether the steps are compiled with XLA's library fusions."""
        return self.library.fusions

    @property
    def ran(self) -> list[Executable]:
        """Every step that ran (a library trial's candidate included)."""
        variant = self.library.variant
        return [*self.steps.values(), *([variant] if variant else [])]

    def next_step(self, start: int) -> Executable:
        """The compiled step for the chunk at item `start`."""
        if self._began is None:
            self._began = time.perf_counter()
        self._start = start
        if self._pending is not None and self._pending.done():
            candidate, library = self._pending.result(), self._pending_library
            self._pending = None
            if library:
                self.library.start(candidate)
                if candidate is None:  # no library fusion to remove, or no such option
                    self._decide()
                else:
                    self._run(candidate)
            elif candidate is None:  # over the budget, or out of memory while compiling
                self._finish()
            else:
                self.steps[int(candidate.chunk_size or 1)] = candidate
                self._run(candidate)
        return self._current

    def record(self, step: Executable, seconds: float, draws: int) -> None:
        """A call of `step` took `seconds` for `draws` draws (each step's first warms up).

        Invariant: no call that ran beside a compile in flight on a CPU is timed. It ran on
        fewer cores: on 2 cores a Poisson predictive's chunks of 250 timed 1.44 ms a draw
        while chunks of 500 compiled, and the tuner kept 500, 10% slower than 250 alone."""
        if self._pending is not None and self._compiles_share_cores:
            return
        library = self.library
        if step is library.variant:
            library.record(seconds, draws)
            if self.search.rate(library.times) is not None and self.timing:
                self._judge_library()
            return
        if self.search.record(int(step.chunk_size or 1), seconds, draws) and self.timing:
            self._decide()

    def _run(self, step: Executable) -> None:
        self._current = step
        self.peak_bytes = max(self.peak_bytes, step.peak_bytes)

    def _decide(self) -> None:
        """What to run and compile next, once a window completed."""
        if self._pending is not None or self.library.variant is not None:
            return
        search = self.search
        self.best = best = search.fastest()
        left = (self._n - self._start) * search.rates[best]
        if not self.library.decided:
            if self.library.worth_trying(self.steps[search.tried[0]], left):
                self._current = step = self.steps[best]
                without = functools.partial(self._compile, best, False)
                self._submit(lambda: self.library.candidate(step, without), True)
                return
        first = self.steps[search.tried[0]]
        target = search.next_size(best, left, self._n, first.compile_seconds)
        if target is None:
            return self._finish()
        self._current = self.steps[best]  # the fastest so far runs while the next compiles
        fusions = self.library.fusions
        self._submit(lambda: self._compile(target, fusions), False)

    def _submit(self, compile_: Callable[[], Executable | None], library: bool) -> None:
        self._pending_library = library
        if not self.config.background_compiles:
            self._pending = concurrent.futures.Future()
            self._pending.set_result(compile_())
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._pending = self._pool.submit(compile_)

    def _judge_library(self) -> None:
        """Keep the faster of the trial's two compiles of one chunk size, then go on."""
        variant = self.library.variant
        assert variant is not None
        size = int(variant.chunk_size or 1)
        without = self.search.rate(self.library.times)
        assert without is not None
        kept = self.library.judge(self.seconds_per_draw[size], without)
        if kept is not None:
            release(self.steps[size])
            self.steps[size] = kept
            self.search.times[size] = self.library.times
        self._current = self.steps[self.best]
        self._decide()

    def _finish(self) -> None:
        self.timing = False
        self._current = self.steps[self.best]

    def _wait(self) -> None:
        """Wait for a compile in flight; a candidate that never ran stores nothing."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._pending is not None and self._pending.done():
            release(self._pending.result())
        self._pending = None

    def abandon(self) -> None:
        """End tuning after a failed run: wait for a compile in flight; nothing is stored."""
        self._wait()
        for step in self.ran:
            release(step)

    def close(self) -> None:
        """End tuning (waiting for a compile in flight) and store what was measured, unless
        sizes were tried and the whole run took under `tune_trust_fraction` of
        `tune_min_seconds`: then its first chunks, which started the tuning, were not the
        run's speed, and the rule's size is stored instead. The library trial's choice is
        kept either way (`library_min_gain` guards it; a run it sped up 9x ends far sooner
        than its first chunks projected)."""
        self._wait()
        release(self.library.variant)  # a trial that the run ended before it was judged
        self.library.variant = None
        rates, tried = self.seconds_per_draw, self.search.tried
        elapsed = 0.0 if self._began is None else time.perf_counter() - self._began
        # Only a run that tried other sizes was projected long by its first chunks.
        trust = self.config.tune_trust_fraction * self.config.tune_min_seconds
        self._trusted = len(tried) == 1 or elapsed >= trust
        self.best = min(rates, key=rates.__getitem__) if rates and self._trusted else tried[0]
        why = (
            f"measured fastest of {sorted(rates)} draws per chunk"
            if self.measured
            else "the compiled-analysis rule; the run was too short to tune"
            if self._trusted
            else "the compiled-analysis rule; the run was far shorter than its first chunks "
            "projected, so what they measured is not kept"
        )
        entry = {
            "loop": self.steps[self.best].loop.value,
            "chunk_size": self.best,
            "library_fusions": self.library.fusions,  # every step since the trial is so
            "why": why + self.library.why(),
            "seconds_per_draw": {str(k): v for k, v in rates.items()},
        }
        _tuning.store(self._key, entry)
