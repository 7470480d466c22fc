"""The controller reads its own writes: a shed the applier made shows in the watch cache before
the watch delivers it, so the next reconcile neither sheds it again (a second ``shed-at``) nor
sheds a further workload for a shortfall already covered (tests/e2e/test_chaos_*)."""

from __future__ import annotations

from typing import Any

from m2g.k8s.client import PODS, WORKLOADS
from m2g.model.plan import ShedAction
from m2g.testing.kube import FakeKube
from m2g_controllers.wiring import K8sCluster


def workload() -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u1"}, "spec": {"active": True}}


async def test_a_shed_is_in_the_cache_before_its_watch_event() -> None:
    kube = FakeKube()
    kube.put(WORKLOADS, workload())
    cluster = K8sCluster(kube)  # type: ignore[arg-type]
    cache = cluster.caches["workloads"]
    cache.apply_event({"type": "ADDED", "object": kube.stored(WORKLOADS, "w", "ns")})
    assert await cluster.applier.apply_shed(ShedAction("ns", "w", False, 5.0, "grid"),
                                            current=cache.get("ns/w"))
    cached = cache.get("ns/w")
    assert cached is not None and cached["spec"]["active"] is False
    stamp = cached["metadata"]["annotations"]["m2g.io/shed-at"]
    # the next reconcile, on the cache: nothing to write, the stamp stays
    assert not await cluster.applier.apply_shed(ShedAction("ns", "w", False, 5.0, "grid"),
                                                current=cache.get("ns/w"))
    assert kube.stored(WORKLOADS, "w", "ns")["metadata"]["annotations"][
        "m2g.io/shed-at"] == stamp


def test_a_cache_behind_a_selector_is_not_fed_objects_outside_it() -> None:
    cluster = K8sCluster(FakeKube())  # type: ignore[arg-type]
    pods = cluster.caches["pods"]
    pods.apply_event({"type": "ADDED", "object": {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1"},
        "status": {"phase": "Running"}}})
    cluster._observe(PODS, {"metadata": {"name": "p", "namespace": "ns",
                                         "resourceVersion": "2"},
                            "status": {"phase": "Succeeded"}})
    assert pods.get("ns/p")["status"]["phase"] == "Running"  # type: ignore[index]
