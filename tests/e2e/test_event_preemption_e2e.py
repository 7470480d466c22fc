"""During a grid event Kueue does not preempt running work for new work m2g holds anyway
(m2g.planner.eventhold), on the real control plane (Kueue v0.19).

A ClusterQueue of flexible work (``m2g.io/min-flex-tier: 2``, ``withinClusterQueue:
LowerPriority``) is full with a running low-priority job. During an event whose limit leaves
no room for more, a higher-priority job arrives: without m2g's hold Kueue would preempt the
running job for it, and m2g's gate would then hold it (the twin's restored jobs were lost
that way). With it Kueue finds no quota and leaves the running job alone; after the event
the site's policy is back and Kueue preempts as configured.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Cluster, Obj, condition, unique
from test_controller_e2e import (
    CHECK,
    _delete,
    factory_flavor,
    grid_event,
    modelled_power,
    running_m2g,
    site_with_budget,
    until,
    workload_of,
)

from m2g.model import labels as L
from m2g.planner.config import PlannerConfig
from m2g.testing import kit

pytestmark = pytest.mark.e2e

BASE = "m2g.io/base-within-preemption"


def flexible_queue(cluster: Cluster, namespace: str, flavor: str, gpus: int) -> str:
    cq = unique("e2e-flex-cq")
    body = kit.cluster_queue(cq, namespace, flavor, gpus, CHECK)
    body["metadata"]["annotations"] = {L.MIN_FLEX_TIER: "2"}
    body["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    cluster.create_kueue("clusterqueues", body)
    cluster.create_kueue("localqueues", kit.local_queue(namespace, cq), namespace=namespace)
    return cq


def priority_class(cluster: Cluster, value: int) -> str:
    name = unique("e2e-prio")
    cluster.create_kueue("workloadpriorityclasses", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": name}, "value": value})
    return name


def job(name: str, gpus: int, tier: int, priority: str) -> Obj:
    body = kit.job(name, tier, gpus // 4, 4, kind="batch")
    body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    return body


def within(cluster: Cluster, cq: str) -> tuple[str, str | None]:
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", cq)
    return (str((obj["spec"].get("preemption") or {}).get("withinClusterQueue")),
            (obj["metadata"].get("annotations") or {}).get(BASE))


def is_true(wl: Obj | None, kind: str) -> bool:
    cond = condition(wl or {}, kind)
    return cond is not None and cond.get("status") == "True"


async def test_no_preemption_for_work_held_during_an_event(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    cq = flexible_queue(cluster, namespace, factory_flavor(cluster), 16)
    low, high = priority_class(cluster, 100), priority_class(cluster, 1000)
    racks = site_with_budget(cluster, 1000.0)
    cfg = PlannerConfig(check_name=CHECK, ramp_kw_per_second=1000.0, settle_seconds=5.0,
                        shed_saving_fraction=1.0, min_shed_seconds=5.0)
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), cfg):
        cluster.batch.create_namespaced_job(namespace, job("running", 16, 3, low))
        await until("the low-priority job to be admitted", lambda: is_true(
            workload_of(cluster, namespace, "running"), "Admitted"))
        assert within(cluster, cq) == ("LowerPriority", None)  # no event: the site's value
        # 2 racks idle ~40 kW + 16 GPUs x 1.3 kW = ~61 kW: a 75 kW limit sheds nothing and
        # leaves no room (75 x 0.95 - 61) for another 16-GPU job (20.8 kW)
        event = grid_event(cluster, target_kw=75.0)
        await until("m2g to turn off preemption in the queue for the event", lambda: (
            within(cluster, cq) == ("Never", "LowerPriority")))
        cluster.batch.create_namespaced_job(namespace, job("arriving", 16, 2, high))

        def considered() -> Obj | None:
            wl = workload_of(cluster, namespace, "arriving")
            cond = condition(wl or {}, "QuotaReserved")
            return cond if cond is not None and cond.get("status") == "False" \
                and "insufficient" in str(cond.get("message")).lower() else None
        await until("Kueue to find no quota for the arriving job", considered)
        running = workload_of(cluster, namespace, "running")
        assert is_true(running, "Admitted") and not is_true(running, "Evicted")
        assert not is_true(running, "Preempted")
        # the event ends: the site's policy is back, and Kueue preempts as it was configured
        _delete(cluster, "gridevents", event)
        await until("m2g to hand the queue's preemption back", lambda: (
            within(cluster, cq) == ("LowerPriority", None)))
        await until("Kueue to preempt the low-priority job once the event is over", lambda: (
            is_true(workload_of(cluster, namespace, "running"), "Preempted")), timeout=90)
