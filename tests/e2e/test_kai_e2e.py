"""m2g keeps KAI Scheduler in step, against a real API server serving KAI's real CRDs
(kind-e2e/manifests/kai-crds.yaml, copied from KAI): the Topology follows node labels (and is
replaced, since KAI makes its levels immutable), and a budgeted Queue's GPU limit goes down
under a GridEvent and back after it. No KAI scheduler runs: these are the objects it reads.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from e2e_helpers import Cluster, Obj, install_crds, unique
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_controller_e2e import grid_event, running_m2g, until

from m2g.model import labels as L
from m2g.planner.config import PlannerConfig

pytestmark = pytest.mark.e2e

KAI, TOPO_V, QUEUE_V = "kai.scheduler", "v1alpha1", "v2"
ZONE = "m2g.io/e2e-zone"  # a topology label no factory node carries until the test adds it
CAPACITY = """
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {name: e2e-kai-capacity}
spec:
  stage: Capacity
  rules:
    - {name: healthy, when: "true", quota: "flavor.healthyGpus", message: "healthy GPUs"}
"""


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    (tmp_path / "capacity.yaml").write_text(CAPACITY)
    return tmp_path


@pytest.fixture
def m2g_crds(api: client.ApiClient) -> None:
    install_crds(api)


def topology(cluster: Cluster, name: str) -> Obj | None:
    try:
        obj: Obj = cluster.custom.get_cluster_custom_object(KAI, TOPO_V, "topologies", name)
        return obj
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def levels(obj: Obj | None) -> tuple[str, ...]:
    return tuple(lv["nodeLabel"] for lv in ((obj or {}).get("spec") or {}).get("levels") or [])


def queue(cluster: Cluster, name: str) -> Obj:
    obj: Obj = cluster.custom.get_cluster_custom_object("scheduling.run.ai", QUEUE_V, "queues",
                                                        name)
    return obj


def events_about(cluster: Cluster, name: str) -> list[str]:
    items = cluster.custom.list_namespaced_custom_object("events.k8s.io", "v1", "default",
                                                         "events")["items"]
    return [e["reason"] for e in items if (e.get("regarding") or {}).get("name") == name]


def _delete(cluster: Cluster, group: str, version: str, plural: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        cluster.custom.delete_cluster_custom_object(group, version, plural, name)


async def test_topology_follows_node_labels(kubeconfig: Path, cluster: Cluster,
                                            policy_dir: Path, m2g_crds: None) -> None:
    name = unique("e2e-kai-topo")
    cluster.cleanup.append(lambda: _delete(cluster, KAI, TOPO_V, "topologies", name))
    cfg = PlannerConfig(check_name="m2g-e2e-kai", kai_topology_name=name,
                        kai_topology_levels=(ZONE, L.BLOCK, L.RACK, L.HOSTNAME))
    node = cluster.core.list_node(label_selector="m2g.io/factory=small").items[0].metadata.name
    async with running_m2g(kubeconfig, policy_dir, config=cfg):
        first = await until("m2g to create the KAI Topology",
                            lambda: topology(cluster, name), timeout=60)
        assert levels(first) == (L.BLOCK, L.RACK, L.HOSTNAME)
        assert first["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "m2g"
        cluster.core.patch_node(node, {"metadata": {"labels": {ZONE: "zone-a"}}})
        try:
            second = await until("the Topology to gain the new level", lambda: (
                (t := topology(cluster, name)) and levels(t)[0] == ZONE and t), timeout=60)
            assert levels(second) == (ZONE, L.BLOCK, L.RACK, L.HOSTNAME)
            # KAI's CEL rule makes nodeLabels immutable: this is a new object, not an edit
            assert second["metadata"]["uid"] != first["metadata"]["uid"]
        finally:
            cluster.core.patch_node(node, {"metadata": {"labels": {ZONE: None}}})
        third = await until("the Topology to drop the level again", lambda: (
            (t := topology(cluster, name)) and levels(t)[0] == L.BLOCK and t), timeout=60)
        assert levels(third) == (L.BLOCK, L.RACK, L.HOSTNAME)
    reasons = await until("the Events", lambda: events_about(cluster, name))
    assert "TopologySynced" in reasons


def test_kai_rejects_editing_levels_in_place(cluster: Cluster) -> None:
    """The fact the replace-not-edit design rests on, checked against KAI's real CRD."""
    name = unique("e2e-kai-immutable")
    cluster.custom.create_cluster_custom_object(KAI, TOPO_V, "topologies", {
        "apiVersion": f"{KAI}/{TOPO_V}", "kind": "Topology", "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": L.RACK}, {"nodeLabel": L.HOSTNAME}]}})
    cluster.cleanup.append(lambda: _delete(cluster, KAI, TOPO_V, "topologies", name))
    with pytest.raises(ApiException) as err:
        cluster.custom.patch_cluster_custom_object(KAI, TOPO_V, "topologies", name, {
            "spec": {"levels": [{"nodeLabel": L.BLOCK}, {"nodeLabel": L.HOSTNAME}]}})
    assert err.value.status == 422 and "immutable" in str(err.value.body)


async def test_grid_event_lowers_a_budgeted_queues_gpu_limit_and_restores_it(
        kubeconfig: Path, cluster: Cluster, policy_dir: Path, m2g_crds: None) -> None:
    site, domain, name = unique("e2e-site"), unique("e2e-pd"), unique("e2e-kai-q")
    for pd, spec in ((site, {"level": "Site", "budgetKw": 1000.0}),
                     (domain, {"budgetKw": 67.0})):  # 67 kW / 1.34 kW per GPU = 50 GPUs
        cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "powerdomains", {
            "apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain", "metadata": {"name": pd},
            "spec": spec})
        cluster.cleanup.append(lambda pd=pd: _delete(cluster, "m2g.io", "v1alpha1",
                                                     "powerdomains", pd))
    cluster.custom.create_cluster_custom_object("scheduling.run.ai", QUEUE_V, "queues", {
        "apiVersion": f"scheduling.run.ai/{QUEUE_V}", "kind": "Queue",
        "metadata": {"name": name, "annotations": {L.POWER_DOMAIN: domain}},
        "spec": {"priority": 100, "resources": {
            "gpu": {"quota": 8, "limit": 40, "overQuotaWeight": 1},
            "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
            "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}})
    cluster.cleanup.append(lambda: _delete(cluster, "scheduling.run.ai", QUEUE_V, "queues", name))

    def limit() -> float:
        return float(queue(cluster, name)["spec"]["resources"]["gpu"]["limit"])

    cfg = PlannerConfig(check_name="m2g-e2e-kai", kai_topology_name=unique("e2e-kai-topo"),
                        quota_raise_dwell_seconds=2.0)
    cluster.cleanup.append(lambda: _delete(cluster, KAI, TOPO_V, "topologies",
                                           cfg.kai_topology_name))
    async with running_m2g(kubeconfig, policy_dir, config=cfg) as manager:
        await until("a reconcile", lambda: manager.state.reconciles > 1)
        assert limit() == 40  # 50 GPUs afforded: the platform's 40 stays
        # the site may draw half its budget: pd gets 33.5 kW -> 25 GPUs
        event = grid_event(cluster, target_kw=500.0)
        lowered = await until("the Queue's GPU limit to drop", lambda: limit() < 40 and limit())
        assert lowered == 25
        q = queue(cluster, name)
        assert q["metadata"]["annotations"]["m2g.io/base-gpu-limit"] == "40"
        assert q["spec"]["resources"]["cpu"] == {"quota": -1, "limit": -1, "overQuotaWeight": 1}
        # a GitOps sync sets the platform's new limit, 30, during the event: it becomes the base
        cluster.custom.patch_cluster_custom_object("scheduling.run.ai", QUEUE_V, "queues", name,
                                                   {"spec": {"resources": {"gpu": {"limit": 30}}}})
        await until("m2g to lower it again under the new base", lambda: (
            limit() == 25 and queue(cluster, name)["metadata"]["annotations"].get(
                "m2g.io/base-gpu-limit") == "30"))
        cluster.custom.delete_cluster_custom_object("m2g.io", "v1alpha1", "gridevents", event)
        await until("the limit to be restored", lambda: limit() == 30)
        assert "m2g.io/base-gpu-limit" not in queue(cluster, name)["metadata"]["annotations"]
        text = manager.metrics.registry.get_sample_value(
            "m2g_kai_queue_gpu_limit", {"queue": name})
        assert text == 30
    reasons = await until("the Events", lambda: (
        (r := events_about(cluster, name)) and "GpuLimitRaised" in r and r))
    assert "GpuLimitLowered" in reasons
