"""In-memory caches keyed weakly on the user's function, and `clear_caches`.

A cache entry keyed on a model's `jax_fn` must not keep that function alive: it closes over
the model's data (docs/memory.md has what that cost when they were held strongly). Entries
here live as long as the function does, as `jax.jit`'s own caches do, and each function
keeps at most a few.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["FunctionCache", "LruCache", "clear_caches"]

_ALL: list[FunctionCache | LruCache] = []


class FunctionCache:
    """Values keyed on `(fn, key)`, held only while `fn` is alive.

    Each function keeps its `per_function` most recently used entries. A function that cannot
    be weakly referenced is cached strongly in a small LRU of `strong_functions` functions.
    A value must not refer to `fn` strongly, or `fn` would never be freed.
    """

    def __init__(self, per_function: int, strong_functions: int = 4):
        self.per_function = per_function
        self.strong_functions = strong_functions
        self._weak: weakref.WeakKeyDictionary[Callable, OrderedDict] = weakref.WeakKeyDictionary()
        self._strong: OrderedDict[Callable, OrderedDict] = OrderedDict()
        _ALL.append(self)

    def _entries(self, fn: Callable, create: bool) -> OrderedDict | None:
        try:
            entries = self._weak.get(fn)
            if entries is None and create:
                entries = self._weak[fn] = OrderedDict()
            return entries
        except TypeError:  # not weakly referenceable (or not hashable: no cache at all)
            try:
                entries = self._strong.get(fn)
            except TypeError:
                return None
            if entries is None and create:
                entries = self._strong[fn] = OrderedDict()
                if len(self._strong) > self.strong_functions:
                    self._strong.popitem(last=False)
            elif entries is not None:
                self._strong.move_to_end(fn)
            return entries

    def get(self, fn: Callable, key: Hashable) -> Any:
        """The cached value, or None."""
        entries = self._entries(fn, create=False)
        if entries is None or key not in entries:
            return None
        entries.move_to_end(key)
        return entries[key]

    def put(self, fn: Callable, key: Hashable, value: Any) -> None:
        entries = self._entries(fn, create=True)
        if entries is None:
            return
        entries[key] = value
        if len(entries) > self.per_function:
            entries.popitem(last=False)

    def discard(self, drop: Callable[[Any], bool]) -> None:
        """Drop every entry whose value `drop` accepts."""
        for entries in [*self._weak.values(), *self._strong.values()]:
            for key in [k for k, v in entries.items() if drop(v)]:
                del entries[key]

    def clear(self) -> None:
        self._weak = weakref.WeakKeyDictionary()
        self._strong.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self._weak.values()) + sum(map(len, self._strong.values()))


class LruCache:
    """Values keyed on `key` alone, the `size` most recently used kept strongly.

    For what holds no user data and serves every function alike (executables whose data
    are arguments, named by their program): a value must not refer to a model's data.
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        _ALL.append(self)

    def get(self, key: Hashable) -> Any:
        """The cached value, or None."""
        value = self._entries.get(key)
        if value is not None:
            with contextlib.suppress(KeyError):  # another thread's `put` evicted it
                self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        self._entries[key] = value
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def discard(self, drop: Callable[[Any], bool]) -> None:
        """Drop every entry whose value `drop` accepts."""
        for key in [k for k, v in self._entries.items() if drop(v)]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def clear_caches() -> None:
    """Drop every analysis and compiled executable that `pymc_chunkpost` holds in memory.

    Entries already go when their model's function is garbage-collected; this frees them
    at once (for example, before a large run on an accelerator, so that old constants do not
    count against free memory). The on-disk tuning cache and stored executables are not
    touched (delete the folder `PYMC_CHUNKPOST_CACHE_DIR`, or `~/.cache/pymc_chunkpost`).
    """
    for cache in _ALL:
        cache.clear()
