"""Python's cyclic garbage collector around the pure core's big passes.

A snapshot build and a plan allocate many short-lived, acyclic objects; each collection they
trigger walks every object alive — at 1,400 racks the watch caches and the snapshot, millions —
which was about half of their CPU (docs/benchmarks.md, "Scale"). Reference counting still
frees everything acyclic while the collector is paused.

What the block leaves alive goes to the collector's oldest generation, unexamined: given back
as it was, the first allocation after the pause started a collection of the youngest
generation over everything the block allocated and kept (the new snapshot: 0.33–0.50 s CPU
at 1,400 racks, a fifth of a warm snapshot; "Twenty-third session"), and a collection of the
middle one walked it again a few thousand allocations later. ``gc.freeze()`` then
``gc.unfreeze()`` moves every tracked object into the oldest generation in constant time
(CPython's list splices); cycles made meanwhile are freed by the next full collection. When
objects are frozen already (``m2g run`` freezes what is alive after each snapshot:
``m2g_controllers.collector``), the unfreeze would thaw them too, so what the block kept is
frozen with them instead and thawed when they are. Whether objects are frozen is what this
module's ``freeze`` and ``unfreeze`` recorded (``gc.get_freeze_count()`` walks the frozen
objects: ~50 ms for 3 million): freeze through them, not ``gc`` directly.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; nested uses keep the outer state. On leaving
    the outermost one, what is alive moves to the oldest generation (``settle``)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            settle()
            gc.enable()


_frozen = False  # objects frozen by ``freeze`` and not thawed by ``unfreeze`` since


def freeze() -> None:
    """``gc.freeze()``: what is alive moves to the permanent generation, which collections
    skip; ``settle`` then freezes what a block kept as well."""
    global _frozen
    gc.freeze()
    _frozen = True


def unfreeze() -> None:
    """``gc.unfreeze()``: the frozen objects back into the oldest generation."""
    global _frozen
    gc.unfreeze()
    _frozen = False


def settle() -> None:
    """Every object the collector tracks into its oldest generation without examining them
    (into the permanent one while ``freeze`` froze objects: those stay frozen)."""
    gc.freeze()
    if not _frozen:
        gc.unfreeze()
