"""During a grid event no preemption within a ClusterQueue whose new work m2g holds anyway
(m2g.planner.eventhold), read from and written to ClusterQueue objects (m2g.k8s)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import m2g.k8s.convert as cv
from m2g.k8s.apply import Applier
from m2g.k8s.client import CLUSTER_QUEUES, Conflict, Kube
from m2g.model.cluster import ClusterSnapshot, QueueState
from m2g.model.plan import Plan, PreemptionUpdate
from m2g.planner.eventhold import preemption_updates
from m2g.planner.plan import make_plan
from m2g.testing.kube import FakeKube
from tests.unit.policy_helpers import evaluator
from tests.unit.test_curtail import CFG, NOW, POLICIES, factory

BASE = "m2g.io/base-within-preemption"


def cq(name: str, floor: int | None, within: str | None = "LowerPriority",
       base: str | None = None) -> dict[str, Any]:
    notes = {} if floor is None else {"m2g.io/min-flex-tier": str(floor)}
    if base is not None:
        notes[BASE] = base
    spec: dict[str, Any] = {"cohortName": "training"}
    if within is not None:
        spec["preemption"] = {"withinClusterQueue": within, "reclaimWithinCohort": "Any"}
    return {"metadata": {"name": name, "annotations": notes}, "spec": spec}


def queues(*objs: dict[str, Any]) -> tuple[QueueState, ...]:
    return tuple(cv.cluster_queue(o) for o in objs)


def in_event(*qs: QueueState) -> ClusterSnapshot:
    return ClusterSnapshot(factory(100.0), queues=qs)


def after_event(*qs: QueueState) -> ClusterSnapshot:
    f = factory(100.0)
    over = tuple(replace(e, start=NOW - timedelta(hours=2), end=NOW - timedelta(seconds=1))
                 for e in f.grid_events)
    return ClusterSnapshot(replace(f, grid_events=over), queues=qs)


def test_the_queue_read_from_its_object() -> None:
    q = cv.cluster_queue(cq("research", 2, base="Any"))
    assert (q.within_preemption, q.within_preemption_base, q.min_flex_tier) == \
        ("LowerPriority", "Any", 2)
    q = cv.cluster_queue(cq("x", None, within=None))
    assert (q.within_preemption, q.within_preemption_base, q.min_flex_tier) == ("", "", 0)
    bad = cq("y", 9)
    bad["spec"]["preemption"] = "LowerPriority"  # not an object: read as unset, no traceback
    assert cv.cluster_queue(bad).within_preemption == "" and \
        cv.cluster_queue(bad).min_flex_tier == 0


def test_an_event_turns_off_preemption_in_queues_whose_new_work_it_holds() -> None:
    qs = queues(cq("research", 2), cq("inference", 0), cq("unset", 3, within=None),
                cq("never", 3, within="Never"), cq("nofloor", None))
    out = preemption_updates(in_event(*qs), CFG)
    # flex >= 1 is held during an event (headroom_event_min_tier): only research's work is
    # all of it; a queue without preemption (unset: Kueue's Never) has nothing to turn off
    assert [(u.cluster_queue, u.within, u.base) for u in out] == \
        [("research", "Never", "LowerPriority")]
    assert "grid event is active" in out[0].reason
    # 0: firm work is held too, so every queue's preemption is
    zero = replace(CFG, headroom_event_min_tier=0)
    assert [u.cluster_queue for u in preemption_updates(in_event(*qs), zero)] == \
        ["inference", "nofloor", "research"]


def test_no_hold_outside_an_event_or_when_turned_off() -> None:
    qs = queues(cq("research", 2))
    assert preemption_updates(after_event(*qs), CFG) == []
    assert preemption_updates(ClusterSnapshot(replace(factory(100.0), grid_events=()),
                                              queues=qs), CFG) == []
    assert preemption_updates(in_event(*qs), replace(
        CFG, hold_preemption_during_events=False)) == []
    assert preemption_updates(in_event(*qs), replace(CFG, share_headroom=False)) == []
    f = factory(100.0)
    ahead = tuple(replace(e, start=NOW + timedelta(minutes=5)) for e in f.grid_events)
    assert preemption_updates(ClusterSnapshot(replace(f, grid_events=ahead), queues=qs),
                              CFG) == []  # notified, not active yet


def test_the_site_value_comes_back_after_the_event() -> None:
    held = queues(cq("research", 2, within="Never", base="LowerPriority"))
    assert preemption_updates(in_event(*held), CFG) == []  # held: nothing more to write
    back = preemption_updates(after_event(*held), CFG)
    assert [(u.cluster_queue, u.within, u.base) for u in back] == \
        [("research", "LowerPriority", "")]
    # turned off meanwhile: a hold m2g set is still handed back
    off = replace(CFG, hold_preemption_during_events=False)
    assert preemption_updates(in_event(*held), off) == back
    # someone (a GitOps sync) wrote another value meanwhile: theirs stays, the record goes
    synced = queues(cq("research", 2, within="Any", base="LowerPriority"))
    assert [(u.within, u.base) for u in preemption_updates(after_event(*synced), CFG)] == \
        [("Any", "")]
    # ... and during the event m2g holds again, keeping the site's recorded value
    assert [(u.within, u.base) for u in preemption_updates(in_event(*synced), CFG)] == \
        [("Never", "LowerPriority")]


def test_make_plan_carries_the_hold(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", POLICIES)
    qs = queues(cq("research", 2), cq("inference", 0))
    plan = make_plan(in_event(*qs), ev, CFG)
    assert [(u.cluster_queue, u.within) for u in plan.preemptions] == [("research", "Never")]
    assert not plan.empty()
    held = queues(cq("research", 2, within="Never", base="LowerPriority"))
    assert make_plan(in_event(*held), ev, CFG).preemptions == ()
    assert [u.within for u in make_plan(after_event(*held), ev, CFG).preemptions] == \
        ["LowerPriority"]


def test_apply_holds_and_hands_back_through_the_object() -> None:
    kube = FakeKube()
    kube.put(CLUSTER_QUEUES, cq("research", 2))
    ap = Applier(cast(Kube, kube))

    async def run() -> None:
        hold = PreemptionUpdate("research", "Never", "LowerPriority", "event")
        kube.fail_next = [None, Conflict("modified", 409, "Conflict")]  # the patch, once
        result = await ap.apply_core(Plan(preemptions=(hold,)))
        assert not result.errors and result.written == 1
        stored = kube.stored(CLUSTER_QUEUES, "research")
        assert stored["spec"]["preemption"] == {"withinClusterQueue": "Never",
                                                "reclaimWithinCohort": "Any"}
        assert stored["metadata"]["annotations"][BASE] == "LowerPriority"
        q = cv.cluster_queue(stored)
        assert (q.within_preemption, q.within_preemption_base) == ("Never", "LowerPriority")
        assert (await ap.apply_core(Plan(preemptions=(hold,)))).written == 0  # idempotent
        back = PreemptionUpdate("research", "LowerPriority", "", "event over")
        assert (await ap.apply_core(Plan(preemptions=(back,)))).written == 1
        stored = kube.stored(CLUSTER_QUEUES, "research")
        assert stored["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
        assert BASE not in stored["metadata"]["annotations"]
        assert stored["metadata"]["annotations"]["m2g.io/min-flex-tier"] == "2"
        assert (await ap.apply_core(Plan(preemptions=(back,)))).written == 0
        dry = Applier(cast(Kube, kube), dry_run=True)
        assert (await dry.apply_core(Plan(preemptions=(hold,)))).written == 0
        assert kube.stored(CLUSTER_QUEUES, "research")["spec"]["preemption"][
            "withinClusterQueue"] == "LowerPriority"

    asyncio.run(run())


def test_the_decision_log_names_the_hold_and_its_end() -> None:
    from m2g_controllers.decisionlog import decision_rows
    plan = Plan(preemptions=(PreemptionUpdate("research", "Never", "LowerPriority", "event"),
                             PreemptionUpdate("other", "LowerPriority", "", "over")))
    rows = decision_rows(ClusterSnapshot(factory(100.0)), plan)
    assert [(r["stage"], r["kind"], r["target"], r["outcome"], r["message"]) for r in rows
            if r["kind"] == "ClusterQueue"] == [
        ("Capacity", "ClusterQueue", "research", "PreemptionNever", "event"),
        ("Capacity", "ClusterQueue", "other", "PreemptionLowerPriority", "over")]
