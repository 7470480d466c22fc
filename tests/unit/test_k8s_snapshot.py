"""m2g.k8s.snapshot (the one assembler: CLI lists = controller caches) and m2g.k8s.writer (the
one apply_plan entry: core writes, KAI writes, check Events) against in-memory fakes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from m2g.k8s.apply import Applier
from m2g.k8s.client import (
    PODS,
    WORKLOADS,
    Kube,
    Obj,
    PermanentError,
    Resource,
    ResourceMissing,
)
from m2g.k8s.kai import KAI_QUEUES, KAI_TOPOLOGIES
from m2g.k8s.kai_convert import kai_state
from m2g.k8s.snapshot import (
    POD_SELECTOR,
    WATCHED,
    RequiredKindMissing,
    assemble,
    list_objects,
)
from m2g.k8s.writer import apply_plan
from m2g.model.cluster import CheckState
from m2g.model.plan import CheckUpdate, KaiQueueUpdate, Plan
from m2g.testing.kube import FakeKube

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
NODE = {"metadata": {"name": "n1", "labels": {"network.topology.nvidia.com/accelerator": "r0"}},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
QUEUE = {"metadata": {"name": "team-a", "annotations": {"m2g.io/power-domain": "pd"}},
         "spec": {"resources": {"gpu": {"quota": 8, "limit": 16}}}}


class ListingKube(FakeKube):
    """FakeKube with LIST (by plural; ``missing`` plurals are not served) and API discovery."""

    def __init__(self, missing: set[str] = frozenset(), denied: set[str] = frozenset(),
                 kai: tuple[str, ...] = ("topologies", "queues")) -> None:
        super().__init__()
        self.missing, self.denied, self.kai = missing, denied, kai
        self.params: dict[str, Any] = {}

    async def list(self, res: Resource, namespace: str | None = None,
                   params: Any = None) -> Obj:
        self.params[res.plural] = params
        if res.plural in self.missing:
            raise ResourceMissing(f"{res.plural} not served", 404, "NotFound")
        if res.plural in self.denied:
            raise PermanentError(f"{res.plural} is forbidden", 403, "Forbidden")
        return {"items": [o for (plural, _, _), o in self.objects.items()
                          if plural == res.plural]}

    async def request(self, method: str, path: str, **_: Any) -> Obj:
        served = {f"/apis/{r.group}/{r.version}": r.plural for r in (KAI_TOPOLOGIES, KAI_QUEUES)
                  if r.plural in self.kai}
        if path not in served:
            raise ResourceMissing(f"{path} not served", 404, "NotFound")
        return {"resources": [{"name": served[path]}]}


async def test_the_cli_lists_the_watched_kinds_and_kai_as_the_controller_watches_them() -> None:
    kube = ListingKube(missing={"gridevents"})
    kube.put(WATCHED["nodes"], NODE)
    kube.put(KAI_QUEUES, QUEUE)
    listed = await list_objects(cast(Kube, kube))
    assert set(kube.params) == {r.plural for r in WATCHED.values()} | {"topologies", "queues"}
    assert kube.params[PODS.plural] == POD_SELECTOR  # the controller's pod watch selector
    assert [r.kind for r in listed.missing] == ["GridEvent"] and listed.warnings == []
    assert listed.kai == kai_state([NODE], [], [QUEUE])  # KaiSync's state of the same objects
    snap = assemble(listed.objects, None, NOW, kai=listed.kai)
    assert snap.kai is listed.kai and [n.name for n in snap.factory.nodes] == ["n1"]
    assert assemble(listed.objects, None, NOW).kai is None


async def test_without_kai_or_with_kai_unreadable() -> None:
    listed = await list_objects(cast(Kube, ListingKube(kai=())))
    assert listed.kai is None
    listed = await list_objects(cast(Kube, ListingKube(kai=("queues",), denied={"queues"})))
    assert listed.kai is None and listed.warnings == [
        "KAI Queue not read: queues is forbidden"]
    listed = await list_objects(cast(Kube, ListingKube(kai=("queues",))))
    assert listed.kai is not None and not listed.kai.topology_served


async def test_a_missing_kueue_kind_is_an_error_naming_it() -> None:
    with pytest.raises(RequiredKindMissing) as err:
        await list_objects(cast(Kube, ListingKube(missing={"workloads"})))
    assert err.value.resource is WORKLOADS


async def test_apply_plan_writes_the_core_and_kai_parts_and_explains_each_check() -> None:
    kube = FakeKube()
    kube.put(WORKLOADS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                         "metadata": {"name": "w", "namespace": "ns", "uid": "u1"},
                         "status": {"admissionChecks": [{"name": "m2g", "state": "Pending"}]}})
    kube.put(KAI_QUEUES, QUEUE)
    applier = Applier(cast(Kube, kube), clock=lambda: NOW)
    plan = Plan(checks=(CheckUpdate("ns", "w", "m2g", CheckState.READY, "fits"),),
                kai_queues=(KaiQueueUpdate("team-a", 8, 16, "grid event"),))
    result = await apply_plan(applier, plan)
    assert result.errors == []
    assert [(r.action, r.written) for r in result.records] == [("check", True),
                                                                ("kai-queue", True)]
    assert kube.stored(KAI_QUEUES, "team-a")["spec"]["resources"]["gpu"]["limit"] == 8
    notes = {o["reason"]: o["note"] for (plural, _, _), o in kube.objects.items()
             if plural == "events"}
    assert notes["Admitted"] == "fits" and "GpuLimitLowered" in notes
    again = await apply_plan(applier, plan)  # idempotent: nothing written, no new Event
    assert [r.written for r in again.records] == [False, False]
    assert sum(1 for (plural, _, _) in kube.objects if plural == "events") == len(notes)
