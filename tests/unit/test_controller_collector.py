"""The controller's collector policy (m2g_controllers.collector): what is alive is frozen after
each snapshot, and everything is unfrozen every ``unfreeze_every`` snapshots, so reference
cycles frozen meanwhile are collected after all."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from m2g.model import collector
from m2g_controllers.collector import CollectorFreezer, HeapTrimmer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    collector.unfreeze()


def test_freezes_after_each_snapshot_and_unfreezes_every_n() -> None:
    collector.unfreeze()
    freezer = CollectorFreezer(unfreeze_every=3)
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    ref = weakref.ref(a)
    freezer.after_snapshot()
    assert gc.get_freeze_count() > 0
    del a, b
    gc.collect()
    assert ref() is not None  # frozen: a full collection skips it
    freezer.after_snapshot()
    assert ref() is not None
    freezer.after_snapshot()  # the third: everything unfrozen
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


async def test_the_manager_freezes_after_its_snapshot_only_when_asked() -> None:
    from tests.unit.test_manager import FakeCluster, manager

    collector.unfreeze()
    assert manager(FakeCluster()).collector is None  # tests share one process: off
    m = manager(FakeCluster(), freeze_collector=True)
    assert m.collector is not None
    await m.reconcile()
    assert m.collector.snapshots == 1 and gc.get_freeze_count() > 0


def test_the_heap_is_trimmed_at_most_once_a_period() -> None:
    now, calls = [100.0], []
    trimmer = HeapTrimmer(every_seconds=10.0, trim=lambda pad: calls.append(pad) or 1,
                          clock=lambda: now[0])
    assert trimmer.after_reconcile()  # the first reconcile trims
    for t in (101.0, 105.0, 109.9):
        now[0] = t
        assert not trimmer.after_reconcile()
    now[0] = 110.0
    assert trimmer.after_reconcile()
    assert calls == [0, 0] and trimmer.trims == 2
    assert not HeapTrimmer(glibc=False).after_reconcile()  # no glibc: nothing to call


async def test_the_manager_trims_the_heap_after_a_reconcile_only_when_asked() -> None:
    from tests.unit.test_manager import FakeCluster, manager

    collector.unfreeze()
    assert manager(FakeCluster()).trimmer is None
    m = manager(FakeCluster(), freeze_collector=True)
    assert m.trimmer is not None
    calls: list[int] = []
    m.trimmer = HeapTrimmer(trim=lambda pad: calls.append(pad) or 1)
    await m.reconcile()
    await m.reconcile()
    assert calls == [0]  # the second is within the period
