"""What the planner tells the user: sizes in MiB, the budget in words, warnings that point at
the user's own call."""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["budget_text", "mib", "warn"]


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def budget_text(budget: int | None) -> str:
    return "no known memory limit" if budget is None else f"the budget of {mib(budget)}"


def _user_stacklevel() -> int:
    """The `stacklevel`, for a `warnings.warn` made by the caller of this function, that
    points at the first frame outside this package and pymc (the user's own call)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("pymc_chunkpost", "pymc.", "pytensor", "contextlib")
    ):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """A warning (default `RuntimeWarning`) pointed at the user's own call, however many of
    this package's frames (a routed subclass, a patch's wrapper) stand between."""
    warnings.warn(message, category, stacklevel=_user_stacklevel())
