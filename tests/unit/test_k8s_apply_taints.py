"""Applying m2g's node taints and maintenance drains against the in-memory FakeKube."""

from __future__ import annotations

from typing import cast

from m2g.k8s.apply import Applier
from m2g.k8s.client import EVENTS, NODES, WORKLOADS, Conflict, Kube
from m2g.model.plan import NodeTaintUpdate, Plan, ShedAction, TaintEffect
from m2g.testing.kube import FakeKube

FOREIGN = {"key": "nvidia.com/gpu-xid", "value": "79", "effect": "NoSchedule"}


def setup(dry_run: bool = False) -> tuple[FakeKube, Applier]:
    kube = FakeKube()
    kube.put(NODES, {"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": "n1", "uid": "u-n1"},
                     "spec": {"taints": [dict(FOREIGN)]}})
    return kube, Applier(cast(Kube, kube), dry_run=dry_run)


def taint(add: bool = True, value: str = "mw-1") -> NodeTaintUpdate:
    return NodeTaintUpdate("n1", "m2g.io/maintenance", value, TaintEffect.NO_SCHEDULE, add,
                           "window mw-1")


def events(kube: FakeKube) -> list[str]:
    return [o["reason"] for (plural, _, _), o in kube.objects.items() if plural == EVENTS.plural]


async def test_taint_keeps_other_taints_is_idempotent_and_removes_only_its_own() -> None:
    kube, applier = setup()
    assert await applier.apply_taint(taint())
    assert kube.stored(NODES, "n1")["spec"]["taints"] == [
        FOREIGN, {"key": "m2g.io/maintenance", "value": "mw-1", "effect": "NoSchedule"}]
    assert not await applier.apply_taint(taint())  # already there: no write
    assert await applier.apply_taint(taint(value="mw-2"))  # another window: value changes
    assert [t.get("value") for t in kube.stored(NODES, "n1")["spec"]["taints"]] == ["79", "mw-2"]
    assert await applier.apply_taint(taint(add=False))
    assert kube.stored(NODES, "n1")["spec"]["taints"] == [FOREIGN]
    assert events(kube) == ["Tainted", "Tainted", "Untainted"]


async def test_taint_retries_a_conflict_and_writes_nothing_in_shadow_mode() -> None:
    kube, applier = setup()
    kube.fail_next = [None, Conflict("changed", 409, "Conflict")]  # the GET passes, the PATCH not
    assert await applier.apply_taint(taint())
    assert len(kube.stored(NODES, "n1")["spec"]["taints"]) == 2
    kube, applier = setup(dry_run=True)
    result = await applier.apply_core(Plan(taints=(taint(),)))
    assert kube.stored(NODES, "n1")["spec"]["taints"] == [FOREIGN]
    assert [r.written for r in result.records] == [False] and events(kube) == []


async def test_a_drain_marks_the_workload_and_its_restore_clears_the_mark() -> None:
    kube, applier = setup()
    kube.put(WORKLOADS, {"metadata": {"name": "w", "namespace": "t"}, "spec": {"active": True}})
    await applier.apply_shed(ShedAction("t", "w", False, 10.0, "drain", "maintenance/mw-1"))
    stored = kube.stored(WORKLOADS, "w", "t")
    assert stored["spec"]["active"] is False
    assert stored["metadata"]["annotations"]["m2g.io/drained-for"] == "maintenance/mw-1"
    await applier.apply_shed(ShedAction("t", "w", True, 10.0, "back", "maintenance/mw-1"))
    assert "annotations" not in kube.stored(WORKLOADS, "w", "t")["metadata"] or \
        "m2g.io/drained-for" not in kube.stored(WORKLOADS, "w", "t")["metadata"]["annotations"]
    assert events(kube) == ["Drained", "Restored"]
