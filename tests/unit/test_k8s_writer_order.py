"""m2g.k8s.writer.apply_plan writes a plan's GPU caps before its admission answers when it
lowers power (a shortfall), and after them otherwise — against the in-memory FakeKube."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import cast

from m2g.k8s.apply import Applier
from m2g.k8s.client import CLUSTER_QUEUES, GPU_POWER_LIMITS, WORKLOADS, Kube
from m2g.k8s.writer import NEVER, apply_plan, lowers_power
from m2g.model.cluster import CheckState
from m2g.model.plan import CapAction, CheckUpdate, NodeLimitUpdate, Plan, PreemptionUpdate
from m2g.planner import eventhold
from m2g.testing.kube import FakeKube

T0 = datetime(2026, 12, 1, 23, 0, tzinfo=UTC)


def kube() -> FakeKube:
    k = FakeKube()
    k.put(GPU_POWER_LIMITS, {"metadata": {"name": "n0"}, "spec": {"nodeName": "n0",
                                                                   "fraction": 0.75}})
    for name in ("capped", "waiting"):
        k.put(WORKLOADS, {"metadata": {"name": name, "namespace": "ns", "uid": name,
                                       "annotations": {"m2g.io/power-cap": "0.75"}},
                          "spec": {"active": True},
                          "status": {"admissionChecks": [{"name": "m2g", "state": "Pending",
                                                          "message": ""}]}})
    return k


def plan(fraction: float) -> Plan:
    return Plan(checks=(CheckUpdate("ns", "waiting", "m2g", CheckState.RETRY, "grid event"),),
                caps=(CapAction("ns", "capped", fraction, 5.0, "dr"),),
                node_limits=(NodeLimitUpdate("n0", fraction if fraction < 1 else None,
                                             T0 + timedelta(seconds=120), ("ns/capped",), "dr"),))


async def order(p: Plan) -> list[str]:
    k = kube()
    await apply_plan(Applier(cast(Kube, k), clock=lambda: T0), p)
    return [f"{verb} {plural}/{name}" for verb, plural, name in k.writes()
            if plural in (WORKLOADS.plural, GPU_POWER_LIMITS.plural)]


async def test_caps_go_before_the_answers_when_power_comes_down() -> None:
    got = await order(plan(0.5))
    assert lowers_power(plan(0.5))
    cap = next(i for i, w in enumerate(got) if w.endswith("/capped"))
    limit = next(i for i, w in enumerate(got) if w.endswith("/n0"))
    answer = next(i for i, w in enumerate(got) if w.endswith("/waiting"))
    assert cap < answer and limit < answer


async def test_answers_go_first_when_caps_are_only_lifted() -> None:
    p = plan(1.0)
    assert not lowers_power(p)
    got = await order(p)
    answer = next(i for i, w in enumerate(got) if w.endswith("/waiting"))
    lifts = [i for i, w in enumerate(got) if w.endswith(("/capped", "/n0"))]
    assert len(lifts) == 2 and all(answer < i for i in lifts)


async def test_a_preemption_hold_goes_before_the_caps() -> None:
    """At a grid event's start the plan caps many jobs (one write per node) and holds
    Kueue's preemption within a queue of held work; the hold is written first: Kueue
    preempts in every scheduling cycle (a 16-rack twin event's hold reached the API server
    3.5 s after the caps' writes began, and Kueue preempted a flex-2 job meanwhile)."""
    k = kube()
    k.put(CLUSTER_QUEUES, {"metadata": {"name": "research"},
                           "spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}})
    assert NEVER == eventhold.NEVER  # the planner's hold is what the writer puts first
    hold = PreemptionUpdate("research", eventhold.NEVER, "LowerPriority", "grid event")
    p = replace(plan(0.5), preemptions=(hold,))
    result = await apply_plan(Applier(cast(Kube, k), clock=lambda: T0), p)
    got = [f"{plural}/{name}" for _, plural, name in k.writes()]
    queue = got.index(f"{CLUSTER_QUEUES.plural}/research")
    first_cap = min(i for i, w in enumerate(got) if w.endswith(("/capped", "/n0")))
    assert queue < first_cap
    assert [r.target for r in result.records if r.action == "preemption"] == ["research"]
    cq = k.stored(CLUSTER_QUEUES, "research")
    assert cq["spec"]["preemption"]["withinClusterQueue"] == "Never"


async def test_a_hold_handed_back_keeps_its_place() -> None:
    """Handing the site's value back (no event) is no hurry: it goes with the other queue
    writes, after the caps of a plan that lowers power."""
    k = kube()
    k.put(CLUSTER_QUEUES, {"metadata": {"name": "research", "annotations": {
        "m2g.io/base-within-preemption": "LowerPriority"}},
        "spec": {"preemption": {"withinClusterQueue": "Never"}}})
    back = PreemptionUpdate("research", "LowerPriority", "", "no grid event")
    await apply_plan(Applier(cast(Kube, k), clock=lambda: T0),
                     replace(plan(0.5), preemptions=(back,)))
    got = [f"{plural}/{name}" for _, plural, name in k.writes()]
    queue = got.index(f"{CLUSTER_QUEUES.plural}/research")
    assert queue > min(i for i, w in enumerate(got) if w.endswith(("/capped", "/n0")))
