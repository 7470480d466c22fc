"""A batch item keeps the stored view and what differs from it (issue 14): its ``workload``,
its fields and what the policies decide on a batch of such items are those of the copied view
(``policy_view``), and nothing makes the copies a batch does not need."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from m2g.k8s import build as kb
from m2g.model.cluster import ClusterSnapshot, Phase
from m2g.model.inputs import WorkloadItem, WorkloadView
from m2g.planner.inputs import InputBuilder, policy_view
from m2g.policy import Evaluator
from m2g.testing.scale import LABELS, NOW, generate
from tests.unit.policy_helpers import evaluator, policy

POLICIES = {
    "shed.yaml": policy("shed", "Preemption", """
        - {name: stale, when: "workload.checkpoint.lastAgeSeconds >= 900",
           score: "double(workload.checkpoint.lastAgeSeconds)"}
        - {name: heavy, when: "workload.estimatedKw >= 30.0", score: "1.0"}
    """),
    "pace.yaml": policy("pace", "Admission", """
        - {name: waited, when: "workload.waitSeconds >= 600 || workload.estimatedKw >= 30.0",
           decision: Defer, requeueAfter: "workload.waitSeconds % 97 + 1"}
    """),
}


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def later_snapshot(seconds: int) -> ClusterSnapshot:
    """A 4-rack factory's snapshot ``seconds`` after its first (the memo's states: their
    ages moved, their stored views did not)."""
    objs, readings = generate(4, 120)
    memo = kb.SnapshotMemo()
    kb.build_snapshot(objs, readings, NOW, memo=memo, labels=LABELS)
    return kb.build_snapshot(objs, readings, NOW + timedelta(seconds=seconds), memo=memo,
                             labels=LABELS)


@pytest.mark.parametrize("floor", [0.0, 0.9])
def test_an_item_is_the_policy_view_field_by_field(floor: float) -> None:
    snap = later_snapshot(1500)
    b = InputBuilder(snap)
    b.kw_floor = floor
    items = b.items(snap.workloads)
    moved = 0
    for w, item in zip(snap.workloads, items, strict=True):
        want = policy_view(w, snap.now, floor)
        for name in WorkloadView.model_fields:
            assert item.field(name) == getattr(want, name), (w.key, name)
        moved += item.updates is not None
        assert (item.updates is None) == (want is w.view) and item.stored is w.view
        got = item.workload
        assert got == want and vars(got) == vars(want)
        assert got.__pydantic_fields_set__ == want.__pydantic_fields_set__
        assert item.workload is got  # made once
    assert moved > len(items) // 2


def test_a_batch_of_items_decides_as_one_of_copied_views(ev: Evaluator) -> None:
    snap = later_snapshot(1500)
    b = InputBuilder(snap)
    b.kw_floor = 0.9  # raises some declared kW
    running = [w for w in snap.workloads if w.phase is Phase.ADMITTED]
    waiting = [w for w in snap.workloads if w.phase is not Phase.ADMITTED]
    assert len(running) > 40 and len(waiting) > 30
    for ws, decide in ((running, ev.preemption_items), (waiting, ev.admission_items)):
        items = b.items(ws)
        copied = [WorkloadItem(i.workload, i.queue) for i in b.items(ws)]
        stale = [WorkloadItem(i.stored, i.queue) for i in items]  # ages and kW not moved
        got = decide(b.base(), items)
        assert got == decide(b.base(), copied)
        assert got == [decide(b.base(), [c])[0] for c in copied]  # one by one
        assert got != decide(b.base(), stale)  # the policies read what moved
        assert sum(i._workload is not None and i.updates is not None for i in items) <= 1
