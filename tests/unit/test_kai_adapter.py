"""m2g.k8s.kai_convert and m2g.k8s.kai against in-memory fakes: reading KAI objects, writing
Topologies and Queue limits idempotently, discovery."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any, cast

from m2g.k8s.annotations import BASE_GPU_LIMIT, GPU_LIMIT_CHANGED_AT, GPU_LIMIT_SET
from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.cache import WatchCache
from m2g.k8s.client import NODES, Conflict, Kube, KubeError, Obj, ResourceMissing
from m2g.k8s.kai import KAI_QUEUES, KAI_TOPOLOGIES, KaiApplier, KaiSync
from m2g.k8s.kai_convert import kai_state, limit_base
from m2g.model.cluster import KaiQueueState
from m2g.model.plan import KaiQueueUpdate, KaiTopologyUpdate, Plan
from m2g.testing.kube import FakeKube, FakeWatchApi

T0 = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
LEVELS = ("network.topology.nvidia.com/block", "network.topology.nvidia.com/accelerator", "kubernetes.io/hostname")


class KaiFakeKube(FakeKube):
    """FakeKube plus what the KAI adapter uses beyond it: SSA that creates, DELETE with
    preconditions through ``request``."""

    async def apply(self, res: Any, name: str, body: Obj, *, namespace: str | None = None,
                    subresource: str | None = None, field_manager: str = "m2g",
                    force: bool = True) -> Obj:
        self._check("apply", res, name)
        key = self._key(res, name, namespace)
        if key in self.objects:
            old = self.objects[key]
            if [lv["nodeLabel"] for lv in old["spec"]["levels"]] != \
                    [lv["nodeLabel"] for lv in body["spec"]["levels"]]:
                raise AssertionError("KAI's CEL rule: nodeLabels are immutable")
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = f"uid-{self.rv}"
        self.objects[key] = self._bump(obj)
        return copy.deepcopy(obj)

    async def request(self, method: str, path: str, *, params: Any = None, body: Any = None,
                      content_type: str | None = None) -> Obj:
        name = path.rsplit("/", 1)[1]
        self._check(method.lower(), KAI_TOPOLOGIES, name)
        key = self._key(KAI_TOPOLOGIES, name, None)
        pre = body["preconditions"]
        meta = self.objects[key]["metadata"]
        if pre["uid"] != meta["uid"] or pre["resourceVersion"] != meta["resourceVersion"]:
            raise Conflict("precondition failed", 409, "Conflict")
        del self.objects[key]
        return {}


def setup(dry_run: bool = False) -> tuple[KaiFakeKube, KaiApplier]:
    kube = KaiFakeKube()
    applier = Applier(cast(Kube, kube), dry_run=dry_run, clock=lambda: T0)
    return kube, KaiApplier(applier)


def queue_obj(limit: Any = 16, annotations: dict[str, str] | None = None) -> Obj:
    gpu: dict[str, Any] = {"quota": 8, "overQuotaWeight": 1}
    if limit is not None:
        gpu["limit"] = limit
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": "team-a", "uid": "q1",
                         "annotations": {"m2g.io/power-domain": "pd-a", **(annotations or {})}},
            "spec": {"resources": {"gpu": gpu}}}


def events(kube: FakeKube) -> list[str]:
    return [o["reason"] for (plural, _, _), o in kube.objects.items() if plural == "events"]


# ---- reading -------------------------------------------------------------------------------

def test_kai_state_reads_budgeted_queues_topologies_and_gpu_node_labels() -> None:
    nodes = [{"metadata": {"name": "n1", "labels": {"network.topology.nvidia.com/accelerator": "r0", "network.topology.nvidia.com/block": "b0"}}},
             {"metadata": {"name": "cpu", "labels": {"cpu-only": "1"}}, "status": {}}]
    topo = {"metadata": {"name": "nvl72", "labels": {"app.kubernetes.io/managed-by": "m2g"}},
            "spec": {"levels": [{"nodeLabel": "network.topology.nvidia.com/accelerator"}]}}
    unbudgeted = {"metadata": {"name": "plain"}, "spec": {"resources": {"gpu": {"limit": 4}}}}
    recorded = queue_obj(8, {BASE_GPU_LIMIT: "-1", GPU_LIMIT_CHANGED_AT: "2026-11-30T00:00:00Z"})
    unset = {**queue_obj(None), "metadata": {"name": "z",
                                             "annotations": {"m2g.io/power-domain": "pd-b"}}}
    state = kai_state(nodes, [topo], [unbudgeted, recorded, unset])
    assert state.node_label_keys == {"network.topology.nvidia.com/accelerator", "network.topology.nvidia.com/block"}
    assert [(t.name, t.levels, t.managed_by_m2g) for t in state.topologies] == [
        ("nvl72", ("network.topology.nvidia.com/accelerator",), True)]
    assert state.queues == (
        KaiQueueState("team-a", "pd-a", 8.0, 8.0, -1.0, datetime(2026, 11, 30, tzinfo=UTC)),
        KaiQueueState("z", "pd-b", 8.0, 0.0, 0.0, None))  # unset limit reads as 0


# ---- Topology writes -----------------------------------------------------------------------

async def test_topology_created_then_left_alone() -> None:
    kube, kai = setup()
    u = KaiTopologyUpdate("nvl72", LEVELS, False, "levels from node labels")
    assert await kai.apply_topology(u)
    stored = kube.stored(KAI_TOPOLOGIES, "nvl72")
    assert [lv["nodeLabel"] for lv in stored["spec"]["levels"]] == list(LEVELS)
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "m2g"}
    assert not await kai.apply_topology(u)
    assert [c[0] for c in kube.writes() if c[1] != "events"] == ["apply"]
    assert events(kube) == ["TopologySynced"]


async def test_changed_levels_replace_m2gs_topology() -> None:
    kube, kai = setup()
    await kai.apply_topology(KaiTopologyUpdate("nvl72", LEVELS[1:], False, "first"))
    assert await kai.apply_topology(KaiTopologyUpdate("nvl72", LEVELS, True, "block added"))
    assert [c[0] for c in kube.writes() if c[1] != "events"] == ["apply", "delete", "apply"]
    assert len(kube.stored(KAI_TOPOLOGIES, "nvl72")["spec"]["levels"]) == 3
    assert events(kube) == ["TopologySynced", "TopologyReplaced"]


async def test_a_failed_topology_write_is_an_error_not_a_record() -> None:
    kube, kai = setup()
    kube.fail_next = [None, KubeError("apply: 422 Invalid", 422, "Invalid")]  # get, then apply
    result = ApplyResult()
    await kai.apply(Plan(kai_topologies=(KaiTopologyUpdate("nvl72", LEVELS, False, "r"),)), result)
    assert [what for what, _ in result.errors] == ["kai-topology nvl72"]
    assert result.records == [] and events(kube) == []


async def test_someone_elses_topology_is_not_deleted() -> None:
    kube, kai = setup()
    kube.put(KAI_TOPOLOGIES, {"metadata": {"name": "nvl72", "uid": "x"},
                              "spec": {"levels": [{"nodeLabel": "nvidia.com/gpu.clique"}]}})
    result = ApplyResult()
    await kai.apply(Plan(kai_topologies=(KaiTopologyUpdate("nvl72", LEVELS, True, "r"),)), result)
    assert "not created by m2g" in str(result.errors[0][1])
    assert kube.writes() == []


# ---- Queue writes --------------------------------------------------------------------------

async def test_queue_limit_lowered_records_base_and_restore_removes_it() -> None:
    kube, kai = setup()
    kube.put(KAI_QUEUES, queue_obj(16))
    assert await kai.apply_queue(KaiQueueUpdate("team-a", 8, 16, "grid event"))
    q = kube.stored(KAI_QUEUES, "team-a")
    assert q["spec"]["resources"]["gpu"] == {"quota": 8, "overQuotaWeight": 1, "limit": 8}
    assert q["metadata"]["annotations"][BASE_GPU_LIMIT] == "16"
    assert q["metadata"]["annotations"][GPU_LIMIT_SET] == "8"
    assert q["metadata"]["annotations"][GPU_LIMIT_CHANGED_AT] == "2026-11-30T01:00:00Z"
    assert not await kai.apply_queue(KaiQueueUpdate("team-a", 8, 16, "again"))
    assert await kai.apply_queue(KaiQueueUpdate("team-a", 16, 16, "event over"))
    q = kube.stored(KAI_QUEUES, "team-a")
    assert q["spec"]["resources"]["gpu"]["limit"] == 16
    assert BASE_GPU_LIMIT not in q["metadata"]["annotations"]
    assert GPU_LIMIT_SET not in q["metadata"]["annotations"]
    assert events(kube) == ["GpuLimitLowered", "GpuLimitRaised"]


def test_a_limit_changed_by_someone_else_becomes_the_base() -> None:
    recorded = {BASE_GPU_LIMIT: "16", GPU_LIMIT_SET: "8"}
    assert limit_base(recorded, 8) == 16  # still what m2g wrote
    assert limit_base(recorded, 24) == 24  # a GitOps sync set 24 since
    assert limit_base({BASE_GPU_LIMIT: "16"}, 8) == 16  # recorded before m2g tracked its writes
    assert limit_base({}, -1) == -1


async def test_lowering_after_a_gitops_change_records_the_new_base() -> None:
    kube, kai = setup()
    kube.put(KAI_QUEUES, queue_obj(24, {BASE_GPU_LIMIT: "16", GPU_LIMIT_SET: "8"}))
    assert await kai.apply_queue(KaiQueueUpdate("team-a", 12, 24, "budget"))
    annotations = kube.stored(KAI_QUEUES, "team-a")["metadata"]["annotations"]
    assert (annotations[BASE_GPU_LIMIT], annotations[GPU_LIMIT_SET]) == ("24", "12")


async def test_unlimited_base_is_recorded_as_minus_one() -> None:
    kube, kai = setup()
    kube.put(KAI_QUEUES, queue_obj(-1))
    await kai.apply_queue(KaiQueueUpdate("team-a", 50, -1, "budget"))
    q = kube.stored(KAI_QUEUES, "team-a")
    assert q["metadata"]["annotations"][BASE_GPU_LIMIT] == "-1"
    assert events(kube) == ["GpuLimitLowered"]


async def test_queue_patch_retries_on_conflict() -> None:
    kube, kai = setup()
    kube.put(KAI_QUEUES, queue_obj(16))
    kube.fail_next = [None, Conflict("modified", 409, "Conflict")]  # get ok, patch 409
    result = ApplyResult()
    assert await kai.apply_queue(KaiQueueUpdate("team-a", 8, 16, "r"), result)
    assert [r.action for r in result.records] == ["kai-queue"]
    assert kube.stored(KAI_QUEUES, "team-a")["spec"]["resources"]["gpu"]["limit"] == 8


async def test_shadow_mode_writes_only_events() -> None:
    kube, kai = setup(dry_run=True)
    kube.put(KAI_QUEUES, queue_obj(16))
    result = ApplyResult()
    await kai.apply(Plan(kai_topologies=(KaiTopologyUpdate("nvl72", LEVELS, False, "r"),),
                         kai_queues=(KaiQueueUpdate("team-a", 8, 16, "r"),)), result)
    assert [c for c in kube.writes() if c[1] != "events"] == []
    assert [(r.action, r.written) for r in result.records] == [("kai-topology", False),
                                                              ("kai-queue", False)]
    assert sorted(events(kube)) == ["GpuLimitLowered", "TopologySynced"]


# ---- discovery -----------------------------------------------------------------------------

class DiscoveryApi(FakeWatchApi):
    def __init__(self, groups: dict[str, list[str]]) -> None:
        super().__init__([{"metadata": {"resourceVersion": "1"}, "items": []}], [])
        self.groups = groups
        self.probes = 0

    async def request(self, method: str, path: str, **_: Any) -> Obj:
        self.probes += 1
        plurals = self.groups.get(path)
        if plurals is None:
            raise ResourceMissing(f"{path} is not served", 404, "NotFound")
        return {"resources": [{"name": p} for p in plurals]}


async def test_no_caches_without_kai_and_probes_are_rate_limited() -> None:
    api, clock = DiscoveryApi({}), [0.0]
    nodes = WatchCache(FakeWatchApi([{"metadata": {"resourceVersion": "1"}, "items": []}], []),
                       NODES)
    sync = KaiSync(cast(Kube, api), clock=lambda: clock[0], probe_seconds=60)
    assert not await sync.probe()
    assert not await sync.probe()
    assert api.probes == 2 and sync.caches() == [] and sync.state(nodes) is None  # one round
    clock[0] = 61
    api.groups = {"/apis/kai.scheduler/v1alpha1": ["topologies"],
                  "/apis/scheduling.run.ai/v2": ["queues", "queues/status"]}
    assert await sync.probe()
    await asyncio.wait_for(asyncio.gather(*(c.wait_synced() for c in sync.caches())), 5)
    state = sync.state(nodes)
    assert state is not None and state.topologies == () and state.queues == ()
    assert state.node_label_keys == frozenset()
    # a node event (the cache's generation moves) refreshes the label keys
    nodes.apply_event({"type": "ADDED", "object": {
        "metadata": {"name": "n1", "resourceVersion": "2", "labels": {"network.topology.nvidia.com/accelerator": "r0"}}}})
    state = sync.state(nodes)
    assert state is not None and state.node_label_keys == {"network.topology.nvidia.com/accelerator"}
    # KAI uninstalled: its caches fail with ResourceMissing and nothing is planned for them
    assert sync.topologies is not None and sync.queues is not None
    sync.topologies.last_error = ResourceMissing("KAI CRDs not installed", 404, "NotFound")
    state = sync.state(nodes)
    assert state is not None and not state.topology_served
    sync.queues.last_error = ResourceMissing("KAI CRDs not installed", 404, "NotFound")
    assert sync.state(nodes) is None
    await sync.stop()


async def test_queues_alone_when_kai_serves_no_topology_crd() -> None:
    api = DiscoveryApi({"/apis/scheduling.run.ai/v2": ["queues"]})
    nodes = WatchCache(FakeWatchApi([{"metadata": {"resourceVersion": "1"}, "items": []}], []),
                       NODES)
    sync = KaiSync(cast(Kube, api), clock=lambda: 0.0)
    assert await sync.probe()
    assert sync.topologies is None and sync.queues is not None
    await asyncio.wait_for(sync.queues.wait_synced(), 5)
    state = sync.state(nodes)
    assert state is not None and not state.topology_served
    await sync.stop()
