"""A tqdm bar over chunks, fed from inside the compiled loop by `jax.debug.callback`.

The compiled function is cached and reused across calls, so the callback cannot close over one
bar: it updates whichever bar is active now. Updates are absolute (`items_done`), so callbacks
that arrive out of order cannot make the bar go backwards.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["counter", "progress_bar", "on_chunk"]

_lock = threading.Lock()
_active: list[Any] = []  # the tqdm bars open now, innermost last


def on_chunk(items_done: Any, n_items: Any) -> None:
    """Host callback: `items_done` of `n_items` draws are post-processed."""
    done = int(np.asarray(items_done))
    with _lock:
        if _active:
            bar = _active[-1]
            if done > bar.n:
                bar.update(done - bar.n)


@contextlib.contextmanager
def counter(total: int, desc: str, unit: str, enable: bool) -> Iterator[Callable[[int], None]]:
    """A tqdm bar of `total` `unit`s while the body runs, if `enable`: the body moves it by
    calling what it is given with the count done so far. No compiled loop's callback feeds
    it (it is not among the active bars)."""
    if not enable:
        yield lambda done: None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True) as bar:

        def moved(done: int) -> None:
            if done > bar.n:
                bar.update(done - bar.n)

        yield moved


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enable: bool) -> Iterator[None]:
    """Show a tqdm bar of `total` draws while the body runs, if `enable`."""
    if not enable:
        yield
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="draw", dynamic_ncols=True)
    with _lock:
        _active.append(bar)
    try:
        yield
        bar.update(total - bar.n)
    finally:
        with _lock:
            _active.remove(bar)
        bar.close()
