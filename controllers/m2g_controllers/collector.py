"""The controller's memory: what is alive frozen after each snapshot (the cyclic garbage
collector), and the C heap's free pages given back (``HeapTrimmer``).

A controller at scale keeps millions of long-lived objects (the watch caches, the snapshot
memo, the latest snapshot), and every full collection walks all of them: at 400 racks /
20,000 workloads about 1.1 s CPU every other reconcile (docs/benchmarks.md, "Scale").
``gc.freeze()`` after each snapshot moves what is alive into the permanent generation, which
collections skip; what becomes garbage later is still freed by reference counting. Reference
cycles among frozen objects are not collected, so every ``unfreeze_every`` snapshots everything
is unfrozen and the next full collection sees it all once.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import cast

from m2g.model import collector


class CollectorFreezer:
    """Call ``after_snapshot()`` once per reconcile, after the snapshot is built."""

    def __init__(self, unfreeze_every: int = 30) -> None:
        self.unfreeze_every = max(1, unfreeze_every)
        self.snapshots = 0

    def after_snapshot(self) -> None:
        self.snapshots += 1
        if self.snapshots % self.unfreeze_every == 0:
            collector.unfreeze()  # the next full collection walks everything once (cycles freed)
        else:
            collector.freeze()  # (through m2g.model.collector: its blocks then freeze too)


def _libc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], trim)


class HeapTrimmer:
    """Give the C heap's free pages back to the system, at most every ``every_seconds``.

    glibc returns freed memory to the system only from the top of a heap (and per-thread
    arenas rarely): what the HTTP/TLS client, the JSON decoder's large answers and the policy
    loader's worker thread free in the middle of a heap stays resident, and the controller's
    RSS only grows. ``malloc_trim(0)`` releases those pages (``madvise``); it takes about a
    millisecond on the controller's heap. Call ``after_reconcile()`` once per reconcile. A
    no-op where the C library is not glibc."""

    def __init__(self, every_seconds: float = 10.0,
                 trim: Callable[[int], int] | None = None,
                 clock: Callable[[], float] = time.monotonic, *, glibc: bool = True) -> None:
        self.every_seconds = every_seconds
        self._trim = trim if trim is not None else (_libc_trim() if glibc else None)
        self._clock = clock
        self._last: float | None = None
        self.trims = 0

    def after_reconcile(self) -> bool:
        """Trim if the last trim is ``every_seconds`` old (or there was none); True if so."""
        if self._trim is None:
            return False
        now = self._clock()
        if self._last is not None and now - self._last < self.every_seconds:
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
