"""The CPU library-fusion trial: does the chunk run faster without XLA's kernel library?

XLA's CPU compiler hands some fusions to a kernel library (YNNPACK). Its reductions write out
their operands, which is far faster on a long reduction and far slower on a short one inside a
chunk loop (a row-indexed model's sum over 3 slopes per row ran 2.5x slower with them:
docs/strategies.md, "Library fusions"). The trial times the rule's chunk compiled both ways on
the real draws and keeps the faster. The compiler option and the reading of the compiled HLO
are `_compat`'s (they are XLA's, version by version); this module is the policy, with its
state explicit: `LibraryTrial`. The tuner (`_tuner.Tuner`) drives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from ..._support.compat import LIBRARY_FUSION_MARK, library_reductions
from ..._support.config import PlannerConfig
from ..data.types import Loop, Origin
from ..execute.executor import Executable, hlo_text, release

__all__ = ["LibraryTrial", "has_library_fusions", "short_library_reductions"]


def has_library_fusions(exe: Executable) -> bool:
    """Whether XLA handed any of `exe`'s fusions to a kernel library."""
    return LIBRARY_FUSION_MARK in hlo_text(exe)


def short_library_reductions(exe: Executable, config: PlannerConfig) -> bool:
    """Whether one of the library's reductions in `exe` sums at most
    `library_short_reduction` elements into each result (read from the compiled HLO)."""
    return any(k <= config.library_short_reduction for k in library_reductions(hlo_text(exe)))


@dataclasses.dataclass
class LibraryTrial:
    """The trial's state, from undecided to decided.

    Attributes:
        config: the heuristics (`library_*`).
        decided: whether the trial is over, or was never wanted.
        fusions: whether the steps are compiled with library fusions (what the run uses).
        variant: the chunk compiled without library fusions, while it is timed.
        times: the variant's (seconds, draws) per timed call.
        warm: whether the variant's untimed first call has run.
        seconds: seconds per draw with library fusions (True) and without (False), once
            both were timed.
    """

    config: PlannerConfig
    decided: bool
    fusions: bool = True
    variant: Executable | None = None
    times: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    warm: bool = False
    seconds: dict[bool, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_step(cls, exe: Executable, config: PlannerConfig) -> LibraryTrial:
        """A trial for the run that starts with `exe`: possible only in an XLA loop on a CPU
        compiled with library fusions."""
        possible = exe.library_fusions and exe.loop is Loop.XLA
        possible = possible and exe.problem.device.platform == "cpu"
        return cls(config, decided=not possible, fusions=exe.library_fusions)

    def worth_trying(self, first: Executable, left_seconds: float) -> bool:
        """Decided once, after the first chunks: whether the work left would take at least
        `library_try_compiles` times the first compile (a step loaded from disk did not pay
        the compile that the trial would)."""
        self.decided = True
        compiled = first.origin is Origin.COMPILED
        return compiled and left_seconds >= self.config.library_try_compiles * first.compile_seconds

    def candidate(
        self, step: Executable, compile_without: Callable[[], Executable | None]
    ) -> Executable | None:
        """`step` compiled without library fusions (by `compile_without`); None where the
        library has no short reduction in it (nothing is compiled), this XLA does not know
        the option, it does not fit the budget, or XLA's own fusions need as many
        temporaries: what the library costs where it is the wrong choice is the operand it
        writes out, which its absence then does not save."""
        if not short_library_reductions(step, self.config):
            return None
        try:
            exe = compile_without()
        except jax.errors.JaxRuntimeError:
            return None
        if exe is not None and exe.temp_bytes >= step.temp_bytes:
            release(exe)
            return None
        return exe

    def start(self, variant: Executable | None) -> None:
        """The candidate is ready: time it, or, without one, the trial is over."""
        if variant is None:
            self.decided = True
        self.variant = variant

    def record(self, seconds: float, draws: int) -> None:
        """A call of the variant took `seconds` for `draws` draws (its first warms up)."""
        if not self.warm:
            self.warm = True
            return
        self.times.append((seconds, draws))

    def judge(self, with_library: float, without: float) -> Executable | None:
        """Both compiles timed (seconds per draw): the variant if it runs at least
        `library_min_gain` times faster (then the steps are compiled without library fusions
        from now on), else None (and it is released)."""
        variant, self.variant = self.variant, None
        self.seconds = {True: with_library, False: without}
        if self.config.library_min_gain * without < with_library:
            self.fusions = False
            return variant
        release(variant)
        return None

    def why(self) -> str:
        """What the trial measured, for the tuning cache's entry; empty without a trial."""
        if not self.seconds:
            return ""
        if not self.fusions:
            return "; measured faster without XLA's library fusions"
        return (
            f"; measured not {self.config.library_min_gain}x faster without XLA's library fusions"
        )

    def reason(self) -> str:
        """What the trial measured, for the plan's reason; empty without a trial."""
        if not self.seconds:
            return ""
        on, off = self.seconds[True], self.seconds[False]
        return (
            f"{'without' if not self.fusions else 'with'} XLA's library fusions "
            f"(measured {on * 1e6:.1f} us per draw with them, {off * 1e6:.1f} us without)"
        )
