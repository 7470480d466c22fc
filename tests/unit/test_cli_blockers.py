"""m2g explain's blockers: Kueue's own reasons (no such topology level, no quota, a check not
Active, a missing queue) and missing power readings, each with the change that fixes it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from m2g.model.factory import MISSING, FactorySnapshot, Rack, Reading
from m2g_cli.blockers import kueue_blockers, power_blockers
from m2g_cli.views import Output, render_explanation

Obj = dict[str, Any]
NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


def workload(level: str = "", gpus: int = 4, count: int = 1, admitted: bool = False) -> Obj:
    ann = {"kueue.x-k8s.io/podset-required-topology": level} if level else {}
    return {"metadata": {"name": "wl", "namespace": "research",
                         "labels": {"kueue.x-k8s.io/queue-name": "default"}},
            "spec": {"queueName": "default", "podSets": [{
                "name": "main", "count": count, "template": {
                    "metadata": {"annotations": ann},
                    "spec": {"containers": [{"resources": {"requests": {
                        "nvidia.com/gpu": str(gpus)}}}]}}}]},
            "status": {"conditions": [{"type": "Admitted",
                                       "status": "True" if admitted else "False"}]}}


def cluster(quota: int = 64, check_active: bool = True, cohort: str = "") -> dict[str, Any]:
    cq = {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "gb200", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota}]}]}],
        "admissionChecksStrategy": {"admissionChecks": [{"name": "m2g-policy"}]},
        **({"cohortName": cohort} if cohort else {})}}
    active = {"type": "Active", "status": "True" if check_active else "False",
              "reason": "Active" if check_active else "BadParametersRef",
              "message": "ok" if check_active else "no admissionChecks.configs entry 'x'"}
    return {
        "local_queues": {"research/default": {"spec": {"clusterQueue": "research"}}},
        "cluster_queues": {"research": cq},
        "flavors": {"gb200": {"spec": {"topologyName": "nvl72"}}},
        "checks": {"m2g-policy": {"spec": {"controllerName": "m2g.io/policy"},
                                  "status": {"conditions": [active]}}},
        "topologies": {"nvl72": {"spec": {"levels": [
            {"nodeLabel": "network.topology.nvidia.com/block"}, {"nodeLabel": "network.topology.nvidia.com/accelerator"},
            {"nodeLabel": "kubernetes.io/hostname"}]}}},
    }


def blockers(wl: Obj, c: dict[str, Any]) -> list[Any]:
    return kueue_blockers(wl, c["local_queues"], c["cluster_queues"], c["flavors"],
                          c["checks"], c["topologies"])


def test_a_level_the_topology_lacks_is_named_with_its_fix() -> None:
    (b,) = blockers(workload("nvidia.com/gpu.clique"), cluster())
    assert "asks for topology level nvidia.com/gpu.clique" in b.what
    assert "Topology nvl72 (levels network.topology.nvidia.com/block, network.topology.nvidia.com/accelerator, kubernetes.io/hostname)" in b.what
    assert "--set nvlink_level=" in b.fix and "topologyName" in b.fix
    assert blockers(workload("network.topology.nvidia.com/accelerator"), cluster()) == []


def test_no_quota_and_too_much_asked_and_cohort_borrowing() -> None:
    (b,) = blockers(workload(gpus=4, count=50), cluster())
    assert "asks for 200 GPUs" in b.what and "at most 64" in b.what
    assert "raise nominalQuota" in b.fix
    (b,) = blockers(workload(), cluster(quota=0))
    assert "has no nvidia.com/gpu quota" in b.what
    assert blockers(workload(gpus=4, count=50), cluster(cohort="org")) == []  # may borrow


def test_a_check_not_active_and_missing_queues() -> None:
    (b,) = blockers(workload(), cluster(check_active=False))
    assert "AdmissionCheck m2g-policy is not Active (BadParametersRef" in b.what
    assert "admissionChecks.configs" in b.fix
    c = cluster()
    c["local_queues"] = {}
    (b,) = blockers(workload(), c)
    assert "LocalQueue research/default does not exist" in b.what
    assert blockers(workload(admitted=True, gpus=4, count=50), cluster()) == []


def test_missing_power_readings_are_said_instead_of_a_shortfall() -> None:
    racks = (Rack("rack-000", "b", "pd", power_kw=MISSING), Rack("rack-001", "b", "pd",
                                                                  power_kw=MISSING))
    (b,) = power_blockers(FactorySnapshot(now=NOW, racks=racks), ["short by 38 kW"])
    assert b.what.startswith("power readings are missing for 2 of 2 racks (rack-000, rack-001)")
    assert "not measured" in b.what and "--prometheus" in b.fix
    fresh = tuple(Rack(r.name, "b", "pd", power_kw=Reading(60.0, 5.0)) for r in racks)
    assert power_blockers(FactorySnapshot(now=NOW, racks=fresh), ["short by 38 kW"]) == []


def test_the_blockers_are_rendered_and_in_json() -> None:
    from m2g.model.cluster import Phase, WorkloadState
    from m2g.model.inputs import WorkloadView
    from m2g.planner.explain import Explanation
    from m2g.policy import Decision
    from m2g.policy.results import AdmissionResult

    w = WorkloadState("research", "wl", WorkloadView(name="wl", gpus=4), Phase.PENDING)
    ex = Explanation(w, AdmissionResult(Decision.ADMIT, None, ()), ())
    (b,) = blockers(workload("nvidia.com/gpu.clique"), cluster())
    text = render_explanation(ex, Output.TABLE, (), [b])
    assert "In the way, and what fixes it:\n  - pod set main asks" in text
    assert "No single change" not in text
    assert '"blockers": [' in render_explanation(ex, Output.JSON, (), [b])
