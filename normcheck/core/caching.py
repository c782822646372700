"""A cache bounded by the bytes of the arrays it holds, not by its number of entries.

A judge computes each case's inputs, float64 reference, bounds and baseline once; implementations judged one after
another on the same case share them, and so do the sweeps that meet the same case again (every mutant of an op runs
its sweep from the first case until one fails). Small cases are the ones met again; a large one is a few hundred MB,
so the cache holds arrays up to a budget, evicting the least recently used, and always the latest entry.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import fields, is_dataclass
from typing import Any, Callable

import numpy as np


def nbytes(value: Any) -> int:
    """The bytes of the NumPy arrays in `value` (dicts, tuples, lists and dataclasses are looked into)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name)) for f in fields(value))
    return 0


def cache_by_bytes(budget: int) -> Callable[[Callable], Callable]:
    """A decorator: `fn(*args)` memoised by its (hashable) arguments while the arrays kept fit in `budget` bytes."""
    def wrap(fn: Callable) -> Callable:
        kept: OrderedDict = OrderedDict()  # args -> (value, bytes), least recently used first
        held = [0]
        lock = threading.Lock()  # (a judge's next case is computed in a thread of its own: engine.compare.ahead)

        @functools.wraps(fn)
        def cached(*args):
            with lock:
                if args in kept:
                    kept.move_to_end(args)
                    return kept[args][0]
            value = fn(*args)  # (outside the lock: the work may call other cached functions)
            size = nbytes(value)
            with lock:
                if args in kept:  # (computed meanwhile by another thread too)
                    held[0] -= kept[args][1]
                kept[args] = (value, size)
                held[0] += size
                while held[0] > budget and len(kept) > 1:
                    _, (_, freed) = kept.popitem(last=False)
                    held[0] -= freed
            return value

        def cache_clear() -> None:
            with lock:
                kept.clear()
                held[0] = 0

        cached.cache_clear = cache_clear
        return cached
    return wrap
