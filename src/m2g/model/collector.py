"""Python's cyclic garbage collector around the pure core's big passes.

A snapshot build and a plan allocate many short-lived, acyclic objects; each collection they
trigger walks every object alive — at 1,400 racks the watch caches and the snapshot, millions —
which was about half of their CPU (docs/benchmarks.md, "Scale"). Reference counting still
frees everything acyclic while the collector is paused; cycles made meanwhile are collected by
the next collection after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; nested uses keep the outer state."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
