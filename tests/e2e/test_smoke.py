"""Smoke tests of the real chain: Kueue webhook → admission → Job controller → scheduler →
KWOK GPU nodes → Workload Finished; and a workload that does not fit its quota."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_helpers import Cluster, Obj, condition, unique, wait_until

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA-GB200"  # kind-e2e/factories/small.yaml


def make_queues(cluster: Cluster, namespace: str, gpu_quota: int) -> str:
    """ResourceFlavor + ClusterQueue (scoped to ``namespace``) + LocalQueue ``default``."""
    flavor = unique("e2e-flavor")
    cq = unique("e2e-cq")
    cluster.create_kueue("resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": flavor},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": PRODUCT}},
    })
    cluster.create_kueue("clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", GPU],
                "flavors": [{"name": flavor, "resources": [
                    {"name": "cpu", "nominalQuota": "100"},
                    {"name": "memory", "nominalQuota": "1000Gi"},
                    {"name": GPU, "nominalQuota": str(gpu_quota)},
                ]}],
            }],
        },
    })
    cluster.create_kueue("localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }, namespace=namespace)

    def active() -> bool:
        obj = cluster.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)
        cond = condition(obj, "Active")
        return bool(cond and cond["status"] == "True")

    wait_until(f"ClusterQueue {cq} to be Active", active, timeout=30)
    return cq


def gpu_job(name: str, pods: int, gpus_per_pod: int, duration: str | None) -> Obj:
    """A batch/v1 Job for LocalQueue ``default``, deliberately *without* ``suspend``."""
    annotations = {"m2g.io/sim-duration": duration} if duration else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {
            "parallelism": pods, "completions": pods, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "main", "image": "registry.invalid/fake:1",  # never pulled
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi", GPU: str(gpus_per_pod)},
                            "limits": {GPU: str(gpus_per_pod)},
                        },
                    }],
                },
            },
        },
    }


def workload_of(cluster: Cluster, namespace: str, job: str) -> Obj | None:
    for wl in cluster.workloads(namespace):
        owners = wl["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Job" and o["name"] == job for o in owners):
            return wl
    return None


def test_job_runs_end_to_end(cluster: Cluster, namespace: str) -> None:
    make_queues(cluster, namespace, gpu_quota=16)
    created = cluster.batch.create_namespaced_job(
        namespace, gpu_job("smoke", pods=2, gpus_per_pod=4, duration="3s"))
    # Kueue's mutating webhook suspended the Job on create (we did not set suspend).
    assert created.spec.suspend is True

    def admitted() -> Obj | None:
        wl = workload_of(cluster, namespace, "smoke")
        if wl is None:
            return None
        ok = all((c := condition(wl, t)) and c["status"] == "True"
                 for t in ("QuotaReserved", "Admitted"))
        return wl if ok else None

    wl = wait_until("the Workload to be admitted", admitted, timeout=60)
    assert wl["status"]["admission"]["clusterQueue"].startswith("e2e-cq-")

    def pods_succeeded() -> list[Any] | None:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=smoke")
        if len(pods.items) == 2 and all(p.status.phase == "Succeeded" for p in pods.items):
            return list(pods.items)
        return None

    pods = wait_until("both pods to run and succeed", pods_succeeded, timeout=90)
    for pod in pods:
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels["type"] == "kwok"
        assert node.metadata.labels["nvidia.com/gpu.product"] == PRODUCT
        # Kueue injected the flavor's node labels into the admitted pod template.
        assert pod.spec.node_selector.get("nvidia.com/gpu.product") == PRODUCT

    def job_complete() -> bool:
        job = cluster.batch.read_namespaced_job("smoke", namespace)
        return any(c.type == "Complete" and c.status == "True"
                   for c in (job.status.conditions or []))

    wait_until("the Job to complete", job_complete, timeout=60)

    def finished() -> bool:
        wl = workload_of(cluster, namespace, "smoke")
        cond = condition(wl or {}, "Finished")
        return bool(cond and cond["status"] == "True")

    wait_until("the Workload to be Finished", finished, timeout=60)


def test_workload_over_quota_stays_pending(cluster: Cluster, namespace: str) -> None:
    cq = make_queues(cluster, namespace, gpu_quota=4)
    cluster.batch.create_namespaced_job(
        namespace, gpu_job("too-big", pods=2, gpus_per_pod=4, duration="3s"))

    def pending() -> Obj | None:
        wl = workload_of(cluster, namespace, "too-big")
        cond = condition(wl or {}, "QuotaReserved")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_until("the Workload to report why it is pending", pending, timeout=60)
    assert cond["reason"] == "Pending"
    assert "insufficient quota" in cond["message"]
    assert GPU in cond["message"]
    job = cluster.batch.read_namespaced_job("too-big", namespace)
    assert job.spec.suspend is True
    pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=too-big")
    assert pods.items == []
    # Kueue's visibility API (an aggregated API on the local control plane) lists it.
    pending = cluster.api.call_api(
        f"/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/{cq}/pendingworkloads", "GET",
        response_type="object", auth_settings=["BearerToken"], _return_http_data_only=True)
    assert [w["metadata"]["namespace"] for w in pending["items"]] == [namespace]
