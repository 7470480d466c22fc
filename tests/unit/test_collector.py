"""collector_paused (make_plan, build_snapshot) pauses the cyclic garbage collector and gives it back
as it found it."""

from __future__ import annotations

import gc
import weakref

from m2g.model import collector
from m2g.model.collector import collector_paused


def test_collector_paused_and_restored() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one keeps the outer state
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_restored_after_an_error() -> None:
    try:
        with collector_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _in_generation(gen: int, obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(gen))


def test_what_the_block_keeps_skips_the_young_collections() -> None:
    """Given back as it was, the collector's first young collection walked everything the
    block kept (a new snapshot: 0.3–0.5 s at 1,400 racks); it goes to the oldest generation
    unexamined instead, and nothing is left frozen."""
    gc.collect()
    assert gc.get_freeze_count() == 0
    with collector_paused():
        kept = [_Node() for _ in range(1000)]
    assert gc.get_count()[0] < 10  # no young collection is due for the block's objects
    assert not _in_generation(0, kept) and not _in_generation(1, kept)
    assert _in_generation(2, kept)
    assert gc.get_freeze_count() == 0


def test_cycles_made_in_the_block_are_still_collected() -> None:
    with collector_paused():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
    assert ref() is not None  # a cycle: reference counting alone cannot free it
    gc.collect()
    assert ref() is None


def test_frozen_objects_stay_frozen() -> None:
    """``m2g run`` freezes what is alive after each snapshot: a block must not thaw it; what
    the block keeps joins it (thawed with it: m2g_controllers.collector)."""
    gc.collect()
    frozen = _Node()
    collector.freeze()
    try:
        before = gc.get_freeze_count()
        with collector_paused():
            kept = _Node()
        assert gc.get_freeze_count() > before
        assert not any(_in_generation(g, frozen) or _in_generation(g, kept) for g in range(3))
    finally:
        collector.unfreeze()
    assert _in_generation(2, frozen) and _in_generation(2, kept)
    with collector_paused():  # thawed: the next block moves what it keeps to the oldest
        later = _Node()
    assert gc.get_freeze_count() == 0 and _in_generation(2, later)


def test_an_inner_block_leaves_the_settling_to_the_outer_one() -> None:
    gc.collect()
    with collector_paused():
        with collector_paused():
            inner = _Node()
        assert _in_generation(0, inner)  # the outer block still runs: nothing moved yet
    assert _in_generation(2, inner)
