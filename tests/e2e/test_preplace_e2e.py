"""An elastic Job placed in one NVLink domain before Kueue reserves it, on the local control
plane (real Kueue 0.19 with the factory's TAS flavor; m2g.planner.preplace).

Kueue refuses a topology request on an elastic Job and places one unconstrained at quota
reservation, the fullest hosts first: with rack 0 full but for two trays, a 4-tray job would be
split over both racks. While the job waits for quota, m2g answers its check Ready with the
nodeSelector of the NVLink domain (``nvidia.com/gpu.clique``) that has its pods free; when the
quota comes, Kueue's TAS places it inside that domain and admits it at once. The selector is
merged into the Job's pod template, which a grow's new workload slice is built from."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import KUEUE, Cluster, Obj, condition
from test_controller_e2e import (
    CHECK,
    RACK_LABEL,
    factory_flavor,
    make_queue,
    modelled_power,
    running_m2g,
    site_with_budget,
    until,
    workload_of,
)
from test_resize_e2e import elastic_job

from m2g.model import labels as L
from m2g.planner.config import PlannerConfig
from m2g.planner.preplace import RULE
from m2g.testing.kit import job, standard_policies

pytestmark = pytest.mark.e2e
CFG = PlannerConfig(check_name=CHECK, cap_levels=(), nvlink_preplace=True)  # (off by default)


def entry(wl: Obj | None) -> Obj:
    return next((e for e in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                 if e.get("name") == CHECK), {})


def holds_quota(wl: Obj | None) -> bool:
    c = condition(wl or {}, "QuotaReserved")
    return bool(c and c["status"] == "True")


def bound_nodes(cluster: Cluster, namespace: str, job_name: str) -> list[str]:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}")
    return [p.spec.node_name for p in pods.items if p.spec.node_name]


async def test_a_waiting_elastic_job_is_placed_in_one_nvlink_domain(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None) -> None:
    # the admission policies only: no Capacity policy, so the queue's quota stays as set here
    (tmp_path / "dr.yaml").write_text(standard_policies("e2e")["dr.yaml"])
    cq = make_queue(cluster, namespace, factory_flavor(cluster), 64)
    racks = site_with_budget(cluster, 1000.0)
    nodes = cluster.core.list_node(label_selector="m2g.io/factory=small").items
    clique_of = {n.metadata.name: n.metadata.labels[L.GPU_CLIQUE] for n in nodes}
    rack0 = next(n.metadata.labels[L.GPU_CLIQUE] for n in nodes
                 if n.metadata.labels[RACK_LABEL].endswith("0"))
    async with running_m2g(kubeconfig, tmp_path, modelled_power(racks), CFG):
        # 16 of rack 0's 18 trays taken, and the queue's 64 GPUs with them
        filler = job("filler", 0, 16, 4)
        filler["spec"]["template"]["spec"]["nodeSelector"] = {L.GPU_CLIQUE: rack0}
        cluster.batch.create_namespaced_job(namespace, filler)
        await until("the filler's 16 pods bound", lambda: len(
            bound_nodes(cluster, namespace, "filler")) == 16, timeout=90)
        cluster.batch.create_namespaced_job(namespace, elastic_job("flex", 4, minimum=2))
        placed = await until("m2g's Ready with a domain while the job waits for quota", lambda: (
            w if entry(w := workload_of(cluster, namespace, "flex")).get("state") == "Ready"
            else None), timeout=60)
        assert not holds_quota(placed)  # answered before Kueue reserved it
        check = entry(placed)
        (update,) = check["podSetUpdates"]
        other = update["nodeSelector"][L.GPU_CLIQUE]
        assert other != rack0 and other in clique_of.values()
        assert check["message"].startswith("placed in NVLink domain " + other)
        # the quota comes: Kueue reserves it inside that domain and admits it at once
        cluster.custom.patch_cluster_custom_object(*KUEUE, "clusterqueues", cq, {"spec": {
            "resourceGroups": [{
            "coveredResources": ["cpu", "memory", L.GPU_RESOURCE],
            "flavors": [{"name": factory_flavor(cluster), "resources": [
                {"name": "cpu", "nominalQuota": "1000"},
                {"name": "memory", "nominalQuota": "10000Gi"},
                {"name": L.GPU_RESOURCE, "nominalQuota": "144"}]}]}]}})
        await until("the elastic job admitted", lambda: (
            (c := condition(workload_of(cluster, namespace, "flex") or {}, "Admitted"))
            and c["status"] == "True"), timeout=60)
        hosts = await until("its 4 pods bound", lambda: (
            h if len(h := bound_nodes(cluster, namespace, "flex")) == 4 else None), timeout=60)
        assert {clique_of[h] for h in hosts} == {other}, hosts
        # merged into the Job's pod template (a grow's new slice is built from it)
        spec = cluster.batch.read_namespaced_job("flex", namespace).spec.template.spec
        assert (spec.node_selector or {}).get(L.GPU_CLIQUE) == other
        assert RULE == "nvlink-preplace"
