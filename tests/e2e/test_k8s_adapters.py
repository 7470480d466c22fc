"""m2g.k8s against the real control plane (kube-apiserver 1.36, Kueue v0.19.2, KWOK): m2g's CRDs,
the watch cache (follow, re-watch, 410 → relist), the snapshot from live caches, plan apply
through Kueue's admission-check protocol, and Lease leader election.

Every test cleans up: its namespace (fixture ``namespace``), the Kueue objects it created
(fixture ``cluster``), its m2g objects, and the m2g CRDs if this module installed them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, Cluster, Obj, condition, unique, wait_until
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from m2g.k8s import client as k
from m2g.k8s.apply import Applier
from m2g.k8s.build import ClusterObjects, build_snapshot
from m2g.k8s.cache import WatchCache
from m2g.k8s.leader import LeaderElector
from m2g.model.cluster import CheckState, Phase
from m2g.model.plan import CheckUpdate, Plan, QuotaUpdate, ShedAction

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:Kubernetes version")]

GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA-GB200"  # kind-e2e/factories/small.yaml
CRD_DIR = REPO / "deploy" / "crds"
M2G = ("m2g.io", "v1alpha1")


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def m2g_crds(api: client.ApiClient) -> Iterator[None]:
    """m2g's CRDs, server-side applied from deploy/crds; removed afterwards if we added them."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    added = []
    for path in sorted(CRD_DIR.glob("m2g.io_*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        try:
            ext.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            added.append(name)
        ext.api_client.call_api(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", "PATCH",
            query_params=[("fieldManager", "m2g-e2e"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml"},
            body=body, auth_settings=["BearerToken"], _return_http_data_only=True)

    def established() -> bool:
        for name in names:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") != "True":
                return False
        return True

    wait_until("m2g CRDs to be Established", established, timeout=30)
    yield
    for name in added:
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(name)


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[k.Kube]:
    kb = await k.connect(kubeconfig)
    yield kb
    await kb.close()


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """Poll an async check until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Exception | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            result = await check()
            if result:
                return result
        except k.KubeError as exc:
            last = exc
        await asyncio.sleep(0.3)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last})" if last else ""), pytrace=False)


def delete_m2g(cluster: Cluster, plural: str, name: str) -> Callable[[], None]:
    def undo() -> None:
        try:
            cluster.custom.delete_cluster_custom_object(*M2G, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return undo


def gpu_job(name: str, pods: int, gpus: int) -> Obj:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"labels": {"m2g.io/flex-tier": "2",
                                    "m2g.io/workload-kind": "training"},
                         "annotations": {"m2g.io/sim-duration": "600s"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.invalid/fake:1",
                "resources": {"requests": {"cpu": "1", GPU: str(gpus)},
                              "limits": {GPU: str(gpus)}}}]}}},
    }


def queues_with_check(cluster: Cluster, namespace: str, check: str, gpus: int) -> tuple[str,
                                                                                         str]:
    """ResourceFlavor + ClusterQueue naming AdmissionCheck ``check`` + LocalQueue ``default``."""
    flavor, cq = unique("e2e-flavor"), unique("e2e-cq")
    cluster.create_kueue("resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": flavor}, "spec": {"nodeLabels": {"nvidia.com/gpu.product": PRODUCT}}})
    cluster.create_kueue("clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
            "resourceGroups": [{"coveredResources": ["cpu", GPU], "flavors": [
                {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "100"},
                                               {"name": GPU, "nominalQuota": str(gpus)}]}]}]}})
    cluster.create_kueue("localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"clusterQueue": cq}}, namespace=namespace)
    cluster.cleanup.append(lambda: cluster._delete_cluster("admissionchecks", check))
    return flavor, cq


def first_workload(cluster: Cluster, namespace: str) -> Obj | None:
    items = cluster.workloads(namespace)
    return items[0] if items else None


def check_state(wl: Obj | None, check: str) -> str | None:
    for entry in (wl or {}).get("status", {}).get("admissionChecks", []) or []:
        if entry["name"] == check:
            return str(entry["state"])
    return None


def is_true(wl: Obj | None, kind: str) -> bool:
    cond = condition(wl or {}, kind)
    return bool(cond and cond["status"] == "True")


async def admitted_workload(kube: k.Kube, cluster: Cluster, namespace: str, check: str,
                            ap: Applier, pod_set_updates: tuple[Obj, ...] = ()) -> Obj:
    """Create a Job, wait for its Workload to reserve quota with m2g's check Pending, set the
    check Ready and wait for Kueue to admit it."""
    cluster.batch.create_namespaced_job(namespace, gpu_job("train", pods=2, gpus=4))

    async def reserved() -> Obj | None:
        wl = first_workload(cluster, namespace)
        ok = is_true(wl, "QuotaReserved") and check_state(wl, check) == "Pending"
        return wl if ok else None

    wl = await until("quota reserved with m2g's check Pending", reserved)
    name = wl["metadata"]["name"]
    ready = CheckUpdate(namespace, name, check, CheckState.READY, "power ok",
                        pod_set_updates=pod_set_updates)
    assert await ap.apply_check(ready)
    assert not await ap.apply_check(ready)  # the server's copy equals ours: nothing to write

    async def admitted() -> Obj | None:
        w = await kube.get(k.WORKLOADS, name, namespace)
        return w if is_true(w, "Admitted") else None

    result: Obj = await until("Kueue to admit the workload", admitted)
    return result


# ---- CRDs ---------------------------------------------------------------------------------


def test_crds_validate(cluster: Cluster, m2g_crds: None) -> None:
    """The CRDs accept the shipped policies and reject bad objects."""
    for path in sorted((REPO / "policies").glob("*/policy.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Policy":
                doc["metadata"]["name"] = unique("e2e-dry")  # dry run: nothing is created
                cluster.custom.create_cluster_custom_object(  # unknown fields are errors
                    *M2G, "policies", doc, dry_run="All", field_validation="Strict")
    bad: list[tuple[str, Obj]] = [
        ("policies", {"apiVersion": "m2g.io/v1alpha1", "kind": "Policy",
                      "metadata": {"name": "bad-stage"},
                      "spec": {"stage": "Admision", "rules": [{"name": "r"}]}}),
        ("gridevents", {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                        "metadata": {"name": "bad-level"},
                        "spec": {"eventID": "e", "intervals": [{
                            "start": "2026-11-30T00:00:00Z", "duration": "PT1H",
                            "payload": {"type": "SIMPLE", "value": 7}}]}}),
        ("gridevents", {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                        "metadata": {"name": "bad-duration"},
                        "spec": {"eventID": "e", "intervals": [{
                            "start": "2026-11-30T00:00:00Z", "duration": "1h",
                            "payload": {"type": "SIMPLE", "value": 1}}]}}),
        ("maintenancewindows", {"apiVersion": "m2g.io/v1alpha1", "kind": "MaintenanceWindow",
                                "metadata": {"name": "bad-window"},
                                "spec": {"start": "2026-11-30T02:00:00Z",
                                         "end": "2026-11-30T01:00:00Z",
                                         "scope": {"racks": ["rack-000"]}}}),
        ("policies", {"apiVersion": "m2g.io/v1alpha1", "kind": "Policy",
                      "metadata": {"name": "unknown-field"},
                      "spec": {"stage": "Admission", "rulez": [], "rules": [{"name": "r"}]}}),
        ("powerdomains", {"apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain",
                          "metadata": {"name": "bad-budget"},
                          "spec": {"level": "Site", "budgetKw": -1}}),
    ]
    for plural, body in bad:
        with pytest.raises(ApiException) as info:
            cluster.custom.create_cluster_custom_object(*M2G, plural, body, dry_run="All",
                                                        field_validation="Strict")
        assert info.value.status in (400, 422), body["metadata"]["name"]  # 400: unknown field


# ---- the watch cache ---------------------------------------------------------------------


async def test_cache_follows_rewatches_and_relists(kube: k.Kube, cluster: Cluster,
                                                   m2g_crds: None) -> None:
    cache = WatchCache(kube, k.GRID_EVENTS, watch_timeout=2, backoff=0.1)
    changes: list[tuple[str, str]] = []
    cache.subscribe(lambda kind, key, _o: changes.append((kind, key)))
    name = unique("e2e-ge")
    cluster.cleanup.append(delete_m2g(cluster, "gridevents", name))
    cache.start()
    try:
        await cache.wait_synced()
        body = {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                "metadata": {"name": name},
                "spec": {"programName": "e2e", "eventID": "ev-1", "intervals": [{
                    "start": "2026-11-30T00:00:00Z", "duration": "PT1H",
                    "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 900}}]}}
        await kube.create(k.GRID_EVENTS, body)

        async def seen(value: float) -> bool:
            obj = cache.get(name)
            return bool(obj and obj["spec"]["intervals"][0]["payload"]["value"] == value)

        await until("the cache to see the new GridEvent", lambda: seen(900))
        await kube.patch(k.GRID_EVENTS, name, {"spec": {"targetReductionPercent": 10}})
        await until("the cache to see the change", lambda: until_true(
            (cache.get(name) or {}).get("spec", {}).get("targetReductionPercent") == 10))
        # the server ends each watch after 2 s: the cache watches again without listing
        await until("a re-watch", lambda: until_true(cache.watches >= 2))
        assert cache.lists == 1
        # a version long compacted away: 410 Gone, so the cache lists again
        cache.resource_version = "1"
        await until("a relist after 410", lambda: until_true(cache.lists >= 2), timeout=30)
        await kube.delete(k.GRID_EVENTS, name)
        await until("the cache to drop the deleted GridEvent",
                    lambda: until_true(cache.get(name) is None))
    finally:
        await cache.stop()
    assert ("ADDED", name) in changes and ("MODIFIED", name) in changes
    assert changes[-1] == ("DELETED", name)


async def until_true(value: bool) -> bool:
    return value


async def test_missing_crd_is_a_permanent_error(kube: k.Kube) -> None:
    missing = k.Resource("nothing.m2g.io", "v1", "things", "Thing", False)
    with pytest.raises(k.ResourceMissing, match="CRDs not installed"):
        await kube.list(missing)
    with pytest.raises(k.NotFound):
        await kube.get(k.CLUSTER_QUEUES, unique("absent"))


# ---- the snapshot from live caches ------------------------------------------------------


async def test_snapshot_from_live_caches(kube: k.Kube, cluster: Cluster, namespace: str,
                                         m2g_crds: None) -> None:
    check = unique("m2g-e2e")
    _, cq = queues_with_check(cluster, namespace, check, gpus=16)
    site = unique("e2e-site")
    cluster.custom.create_cluster_custom_object(*M2G, "powerdomains", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain", "metadata": {"name": site},
        "spec": {"level": "Site", "budgetKw": 500}})
    cluster.cleanup.append(delete_m2g(cluster, "powerdomains", site))
    ap = Applier(kube)
    await ap.ensure_admission_check_active(check)
    cluster.batch.create_namespaced_job(namespace, gpu_job("snap", pods=1, gpus=4))
    caches = {name: WatchCache(kube, res) for name, res in [
        ("nodes", k.NODES), ("pods", k.PODS), ("workloads", k.WORKLOADS),
        ("local_queues", k.LOCAL_QUEUES), ("cluster_queues", k.CLUSTER_QUEUES),
        ("resource_flavors", k.RESOURCE_FLAVORS), ("admission_checks", k.ADMISSION_CHECKS),
        ("power_domains", k.POWER_DOMAINS)]}
    for c in caches.values():
        c.start()
    try:
        await asyncio.gather(*(c.wait_synced() for c in caches.values()))

        async def with_check() -> Any:
            snap = build_snapshot(ClusterObjects(**{n: c.view() for n, c in caches.items()}),
                                  None, datetime.now(UTC))
            mine = [w for w in snap.workloads if w.namespace == namespace]
            # Kueue may list the check (Pending) a moment before it reserves quota: wait for
            # both (CI once took the snapshot in between)
            return snap if mine and mine[0].check_state is CheckState.PENDING and (
                mine[0].phase is Phase.RESERVED) else None

        snap = await until("the workload reserved, m2g's check Pending, in the snapshot",
                           with_check)
    finally:
        for c in caches.values():
            await c.stop()
    f = snap.factory
    factory_nodes = [n for n in f.nodes if n.name.startswith("small-")]
    assert len(factory_nodes) == 36 and {n.gpus for n in factory_nodes} == {4}
    assert {r.name for r in f.racks} >= {"rack-000", "rack-001"}
    assert f.site == site and f.site_budget_kw == 500
    assert all(r.power_kw.stale for r in f.racks)  # no readings given: never a number
    (wl,) = [w for w in snap.workloads if w.namespace == namespace]
    assert wl.phase is Phase.RESERVED and wl.check == check and wl.cluster_queue == cq
    assert wl.view.gpus == 4 and wl.view.flex_tier == 2 and wl.view.kind == "training"
    (q,) = [q for q in snap.queues if q.name == cq]
    assert q.quotas[0].nominal == 16


# ---- apply through Kueue --------------------------------------------------------------------


async def test_check_ready_admits_and_quota_patch(kube: k.Kube, cluster: Cluster,
                                                  namespace: str) -> None:
    check = unique("m2g-e2e")
    flavor, cq = queues_with_check(cluster, namespace, check, gpus=16)
    ap = Applier(kube)
    assert await ap.ensure_admission_check_active(check)
    assert not await ap.ensure_admission_check_active(check)  # already Active

    async def cq_active() -> bool:
        obj = await kube.get(k.CLUSTER_QUEUES, cq)
        return is_true(obj, "Active")

    await until("the ClusterQueue to be Active (the check is Active)", cq_active)
    updates = ({"name": "main", "labels": {"m2g.io/admitted-by": "m2g"},
                "nodeSelector": {"network.topology.nvidia.com/accelerator": "rack-001"}, "annotations": {}},)
    wl = await admitted_workload(kube, cluster, namespace, check, ap, updates)
    entry = next(e for e in wl["status"]["admissionChecks"] if e["name"] == check)
    assert entry["state"] == "Ready" and entry["message"] == "power ok"

    def pods_placed() -> list[Any] | None:  # Kueue merged m2g's podSetUpdates into the pods
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=train")
        ok = len(pods.items) == 2 and all(
            p.metadata.labels.get("m2g.io/admitted-by") == "m2g"
            and (p.spec.node_selector or {}).get("network.topology.nvidia.com/accelerator") == "rack-001"
            for p in pods.items)
        return list(pods.items) if ok else None

    pods = wait_until("pods with m2g's label and node selector", pods_placed, timeout=30)
    bound = wait_until("pods bound", lambda: all(
        cluster.core.read_namespaced_pod(p.metadata.name, namespace).spec.node_name
        for p in pods), timeout=30)
    assert bound
    for p in pods:
        node = cluster.core.read_namespaced_pod(p.metadata.name, namespace).spec.node_name
        assert node.startswith("small-r001-")

    result = await ap.apply_core(Plan(quotas=(QuotaUpdate(cq, flavor, GPU, 8, 16, "derate"),)))
    assert not result.errors and result.written == 1
    obj = await kube.get(k.CLUSTER_QUEUES, cq)
    res = obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert [r["nominalQuota"] for r in res] == ["100", "8"]
    assert obj["metadata"]["annotations"][f"m2g.io/base-quota.{flavor}"] == "16"
    again = await ap.apply_core(Plan(quotas=(QuotaUpdate(cq, flavor, GPU, 8, 16, "derate"),)))
    assert again.written == 0
    await ap.apply_quota(QuotaUpdate(cq, flavor, GPU, 16, 16, "restore"))
    obj = await kube.get(k.CLUSTER_QUEUES, cq)
    assert f"m2g.io/base-quota.{flavor}" not in obj["metadata"].get("annotations", {})
    assert obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] \
        == "16"


async def test_retry_requeues_a_reserved_workload(kube: k.Kube, cluster: Cluster,
                                                  namespace: str) -> None:
    check = unique("m2g-e2e")
    queues_with_check(cluster, namespace, check, gpus=16)
    ap = Applier(kube)
    await ap.ensure_admission_check_active(check)
    cluster.batch.create_namespaced_job(namespace, gpu_job("retry", pods=1, gpus=4))

    async def reserved() -> Obj | None:
        wl = first_workload(cluster, namespace)
        return wl if check_state(wl, check) == "Pending" and is_true(wl, "QuotaReserved") \
            else None

    wl = await until("quota reserved with the check Pending", reserved)
    name = wl["metadata"]["name"]
    await ap.apply_check(CheckUpdate(namespace, name, check, CheckState.RETRY,
                                     "grid event ev-1 active", requeue_after_seconds=8))
    # Kueue v0.19.2 first records requeueAt = lastTransitionTime + requeueAfterSeconds and
    # keeps the reservation until then; only afterwards does it evict (reason AdmissionCheck),
    # release the quota, reset the check to Pending and queue the workload again.
    w = await until("Kueue to record the retry time", lambda: _requeue_at(kube, name, namespace))
    assert w["status"]["requeueState"]["requeueAt"]

    async def evicted() -> Obj | None:
        w = await kube.get(k.WORKLOADS, name, namespace)
        cond = condition(w, "Evicted") or {}
        entry = next(e for e in w["status"]["admissionChecks"] if e["name"] == check)
        ok = cond.get("reason") == "AdmissionCheck" or "Previously: Retry" in entry["message"]
        return w if ok else None

    w = await until("Kueue to evict and requeue after the retry time", evicted)
    entry = next(e for e in w["status"]["admissionChecks"] if e["name"] == check)
    assert entry["state"] == "Pending"  # Kueue reset it: m2g decides again


async def _requeue_at(kube: k.Kube, name: str, namespace: str) -> Obj | None:
    w = await kube.get(k.WORKLOADS, name, namespace)
    return w if (w["status"].get("requeueState") or {}).get("requeueAt") else None


async def test_shed_evicts_and_restore_readmits(kube: k.Kube, cluster: Cluster,
                                                namespace: str) -> None:
    check = unique("m2g-e2e")
    queues_with_check(cluster, namespace, check, gpus=16)
    ap = Applier(kube)
    await ap.ensure_admission_check_active(check)
    wl = await admitted_workload(kube, cluster, namespace, check, ap)
    name = wl["metadata"]["name"]
    shed = Plan(sheds=(ShedAction(namespace, name, False, 14.0, "grid event ev-1"),))
    assert (await ap.apply_core(shed)).written == 1

    async def evicted() -> Obj | None:
        w = await kube.get(k.WORKLOADS, name, namespace)
        return w if not is_true(w, "Admitted") and not is_true(w, "QuotaReserved") else None

    w = await until("Kueue to evict the deactivated workload", evicted)
    assert w["spec"]["active"] is False
    assert "m2g.io/shed-at" in w["metadata"]["annotations"]
    events = await kube.list(k.EVENTS, namespace)
    assert any(e["reason"] == "Shed" and e["reportingController"] == "m2g.io/policy"
               and e["regarding"]["name"] == name for e in events["items"])
    assert (await ap.apply_core(shed)).written == 0  # idempotent

    await ap.apply_shed(ShedAction(namespace, name, True, 14.0, "event over"))

    async def pending_again() -> Obj | None:
        w = await kube.get(k.WORKLOADS, name, namespace)
        ok = is_true(w, "QuotaReserved") and check_state(w, check) == "Pending"
        return w if ok else None

    w = await until("quota reserved again with the check reset to Pending", pending_again)
    assert "m2g.io/shed-at" not in (w["metadata"].get("annotations") or {})
    await ap.apply_check(CheckUpdate(namespace, name, check, CheckState.READY, "ok again"))
    await until("re-admission", lambda: _admitted(kube, name, namespace))


async def _admitted(kube: k.Kube, name: str, namespace: str) -> bool:
    return is_true(await kube.get(k.WORKLOADS, name, namespace), "Admitted")


async def test_dry_run_writes_only_events(kube: k.Kube, cluster: Cluster,
                                          namespace: str) -> None:
    check = unique("m2g-e2e")
    flavor, cq = queues_with_check(cluster, namespace, check, gpus=16)
    await Applier(kube).ensure_admission_check_active(check)
    cluster.batch.create_namespaced_job(namespace, gpu_job("shadow", pods=1, gpus=4))
    wl = await until("the workload with the check Pending", lambda: until_true(
        check_state(first_workload(cluster, namespace), check) == "Pending"))
    assert wl
    wl_obj = first_workload(cluster, namespace)
    assert wl_obj is not None
    name = wl_obj["metadata"]["name"]
    before_cq = await kube.get(k.CLUSTER_QUEUES, cq)
    shadow = Applier(kube, dry_run=True)
    result = await shadow.apply_core(Plan(
        checks=(CheckUpdate(namespace, name, check, CheckState.READY, "would admit"),),
        quotas=(QuotaUpdate(cq, flavor, GPU, 4, 16, "would derate"),),
        sheds=(ShedAction(namespace, name, False, 7.0, "would shed"),)))
    assert not result.errors and len(result.records) == 3 and result.written == 0
    await shadow.emit_event(wl_obj, "WouldAdmit", "shadow mode: would set the check Ready")
    after_cq = await kube.get(k.CLUSTER_QUEUES, cq)
    assert after_cq["metadata"]["resourceVersion"] == before_cq["metadata"]["resourceVersion"]
    w = await kube.get(k.WORKLOADS, name, namespace)
    assert check_state(w, check) == "Pending" and w["spec"]["active"] is True
    events = await kube.list(k.EVENTS, namespace)
    assert any(e["reason"] == "WouldAdmit" for e in events["items"])


async def test_policy_status(kube: k.Kube, cluster: Cluster, m2g_crds: None) -> None:
    doc = yaml.safe_load((REPO / "policies" / "power-budget" / "policy.yaml").read_text())
    name = unique("e2e-policy")
    doc["metadata"] = {"name": name}
    await kube.create(k.POLICIES, doc)
    cluster.cleanup.append(delete_m2g(cluster, "policies", name))
    ap = Applier(kube)
    assert await ap.set_policy_status(name, accepted=True, ready=False, reason="Compiled",
                                      message="waiting for leadership")
    assert not await ap.set_policy_status(name, accepted=True, ready=False, reason="Compiled",
                                          message="waiting for leadership")
    obj = await kube.get(k.POLICIES, name)
    conds = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conds == {"Accepted": "True", "Ready": "False"}


# ---- leader election ---------------------------------------------------------------------


async def test_two_electors_one_leader_and_takeover(kube: k.Kube, namespace: str) -> None:
    a, b = (LeaderElector(kube, "m2g-e2e", namespace, ident, lease_duration=6,
                          renew_deadline=4, retry_period=0.5) for ident in ("a", "b"))
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))]
    try:
        await until("a leader", lambda: until_true(a.is_leader or b.is_leader), timeout=15)
        await asyncio.sleep(1.0)
        assert a.is_leader != b.is_leader  # exactly one
        leader, follower, stop = (a, b, stop_a) if a.is_leader else (b, a, stop_b)
        lease = await kube.get(k.LEASES, "m2g-e2e", namespace)
        assert lease["spec"]["holderIdentity"] == leader.identity
        transitions = int(lease["spec"].get("leaseTransitions") or 0)
        stop.set()  # the leader stops renewing (no release): the lease must expire
        await until("the follower to take over", lambda: until_true(follower.is_leader),
                    timeout=20)
        lease = await kube.get(k.LEASES, "m2g-e2e", namespace)
        assert lease["spec"]["holderIdentity"] == follower.identity
        assert int(lease["spec"]["leaseTransitions"]) == transitions + 1
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*tasks)
        await follower.release()  # on shutdown: the next one need not wait for expiry
        lease = await kube.get(k.LEASES, "m2g-e2e", namespace)
        assert lease["spec"].get("holderIdentity", "") == "" and not follower.is_leader
        assert await leader.step()  # the old leader comes back at once
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*tasks)


# ---- errors and conflicts against the real server ----------------------------------------


async def test_quota_patch_conflict_is_retried(kube: k.Kube, cluster: Cluster,
                                               namespace: str) -> None:
    """Someone else writes the ClusterQueue between m2g's read and its patch: the
    resourceVersion precondition makes the API server answer 409, and m2g re-reads and wins."""
    check = unique("m2g-e2e")
    flavor, cq = queues_with_check(cluster, namespace, check, gpus=16)
    real_get = kube.get
    interfered = []

    async def get_then_interfere(res: k.Resource, name: str, namespace: str | None = None,
                                 subresource: str | None = None) -> Obj:
        obj = await real_get(res, name, namespace, subresource)
        if res is k.CLUSTER_QUEUES and not interfered:
            interfered.append(name)
            await kube.patch(k.CLUSTER_QUEUES, name,
                             {"metadata": {"labels": {"someone": "else"}}})
        return obj

    kube.get = get_then_interfere  # type: ignore[method-assign]
    try:
        assert await Applier(kube).apply_quota(QuotaUpdate(cq, flavor, GPU, 12, 16, "derate"))
    finally:
        kube.get = real_get  # type: ignore[method-assign]
    assert interfered == [cq]
    obj = await kube.get(k.CLUSTER_QUEUES, cq)
    assert obj["metadata"]["labels"]["someone"] == "else"  # their write survived
    assert obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] \
        == "12"
    stale = {"metadata": {"resourceVersion": "1"}, "spec": {"stopPolicy": "Hold"}}
    with pytest.raises(k.Conflict):
        await kube.patch(k.CLUSTER_QUEUES, cq, stale)


async def test_reject_deactivates_the_workload(kube: k.Kube, cluster: Cluster,
                                               namespace: str) -> None:
    check = unique("m2g-e2e")
    queues_with_check(cluster, namespace, check, gpus=16)
    ap = Applier(kube)
    await ap.ensure_admission_check_active(check)
    cluster.batch.create_namespaced_job(namespace, gpu_job("reject", pods=1, gpus=4))
    wl = await until("the check Pending", lambda: until_true(
        check_state(first_workload(cluster, namespace), check) == "Pending"))
    assert wl
    name = (first_workload(cluster, namespace) or {})["metadata"]["name"]
    await ap.apply_check(CheckUpdate(namespace, name, check, CheckState.REJECTED,
                                     "needs more than the whole site budget"))

    async def deactivated() -> Obj | None:
        w = await kube.get(k.WORKLOADS, name, namespace)
        return w if w["spec"].get("active") is False and not is_true(w, "QuotaReserved") \
            else None

    w = await until("Kueue to deactivate the rejected workload", deactivated)
    assert "m2g.io/shed-at" not in (w["metadata"].get("annotations") or {})  # not m2g's shed


async def test_unreachable_server_is_retryable(kubeconfig: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens on port 1
    closed = tmp_path / "kubeconfig"
    closed.write_text(yaml.safe_dump(config))
    with pytest.raises(k.RetryableError) as info:  # kr8s asks for /version on connect
        await k.connect(closed, timeout=5)
    assert "ConnectError" in str(info.value) and "\n" not in str(info.value)


async def test_context_is_honoured(kubeconfig: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubeconfig whose current context points nowhere: ``context=`` picks the good one, and
    ``$KUBECONFIG`` is found like kubectl finds it."""
    config = yaml.safe_load(kubeconfig.read_text())
    good = config["current-context"]
    broken = {"name": "broken", "cluster": {**config["clusters"][0]["cluster"],
                                            "server": "https://127.0.0.1:1"}}
    config["clusters"].append(broken)
    config["contexts"].append({"name": "broken", "context": {
        **config["contexts"][0]["context"], "cluster": "broken"}})
    config["current-context"] = "broken"
    path = tmp_path / "two-contexts"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    kb = await k.connect(context=good)
    try:
        nodes = await kb.list(k.NODES)
        assert any(n["metadata"]["name"].startswith("small-") for n in nodes["items"])
    finally:
        await kb.close()
    with pytest.raises(k.RetryableError):
        await k.connect()  # the current context: unreachable
