"""Builders shared by the tests, the benches and the demo: the standard policies, Kueue queues,
Jobs, grid events, and modelled rack power (fresh readings from the pods on each rack).

Plain dicts and YAML text (no client): the caller creates them with its own client. The fake
API server for unit tests is m2g.testing.kube.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from m2g.k8s.convert import allocated_gpus
from m2g.k8s.parse import format_time
from m2g.model import labels as L
from m2g.model.inputs import WorkloadKind
from m2g.model.powerlimit import node_limit_state
from m2g.planner.curves import kind_curve
from m2g.signals.readings import RackReadings, Readings, SignalReading

Obj = dict[str, Any]

IDLE_KW = 20.0  # a GB300 NVL72 rack's draw with its GPUs idle
KW_PER_GPU = 1.3  # a busy GPU's share of its rack's draw
CHECK = "m2g-policy"


_DR_MESSAGE = ("'grid event ' + grid.event.id + ' is active: flex tier ' + "
               "string(workload.flexTier) + ' waits'")


def standard_policies(prefix: str) -> dict[str, str]:
    """File name → Policy YAML: defer flex tier ≥ 2 during a grid event (Admission), quota =
    healthy GPUs (Capacity), shed flexible work first (Preemption). Names ``<prefix>-dr`` …"""
    return {
        "dr.yaml": f"""
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {{name: {prefix}-dr}}
spec:
  stage: Admission
  rules:
    - name: defer-flexible
      when: "grid.event.active && workload.flexTier >= 2"
      decision: Defer
      requeueAfter: "30"
      messageExpression: "{_DR_MESSAGE}"
""",
        "capacity.yaml": f"""
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {{name: {prefix}-capacity}}
spec:
  stage: Capacity
  rules:
    - {{name: healthy, when: "true", quota: "flavor.healthyGpus", message: "healthy GPUs"}}
""",
        "shed.yaml": f"""
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {{name: {prefix}-shed}}
spec:
  stage: Preemption
  rules:
    - {{name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}}
""",
    }


def job(name: str, tier: int, pods: int, gpus_per_pod: int, *, namespace: str | None = None,
        kind: str = "training", queue: str = "default") -> Obj:
    """A Job in LocalQueue ``queue``: ``pods`` pods of ``gpus_per_pod`` GPUs, flex tier
    ``tier``, its estimated kW at KW_PER_GPU."""
    meta: Obj = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}}
    if namespace is not None:
        meta["namespace"] = namespace
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            "metadata": {"labels": {L.FLEX_TIER: str(tier), L.WORKLOAD_KIND: kind},
                         "annotations": {L.ESTIMATED_KW: str(
                             round(pods * gpus_per_pod * KW_PER_GPU, 1))}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.invalid/fake:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi",
                                           L.GPU_RESOURCE: str(gpus_per_pod)},
                              "limits": {L.GPU_RESOURCE: str(gpus_per_pod)}}}]}}},
    }


def cluster_queue(name: str, namespace: str, flavor: str, gpus: int,
                  check: str = CHECK) -> Obj:
    """A ClusterQueue for one namespace, behind AdmissionCheck ``check``, ``gpus`` GPUs."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", L.GPU_RESOURCE],
                                "flavors": [{"name": flavor, "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "10000Gi"},
                                    {"name": L.GPU_RESOURCE, "nominalQuota": str(gpus)}]}]}],
        },
    }


def local_queue(namespace: str, cluster_queue_name: str, name: str = "default") -> Obj:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}


def grid_event(name: str, start: datetime, minutes: int, target_kw: float,
               program: str = "e2e") -> Obj:
    """A GridEvent of one interval: an import-capacity limit of ``target_kw``."""
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent", "metadata": {"name": name},
            "spec": {"programName": program, "eventID": name, "intervals": [{
                "start": format_time(start), "duration": f"PT{minutes}M",
                "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": target_kw}}]}}


class _View(Protocol):
    generation: int

    def view(self) -> Mapping[str, Obj]: ...


class HasCaches(Protocol):
    """What modelled power reads: the controller's watch caches (m2g_controllers.wiring)."""

    caches: Mapping[str, _View]


def _applied_caps(cluster: HasCaches) -> dict[str, float]:
    limits = cluster.caches.get("gpu_power_limits")
    if limits is None:
        return {}
    out = {}
    for obj in limits.view().values():
        state = node_limit_state(obj)
        if state is not None and state.applied_fraction is not None:
            out[state.node] = state.applied_fraction
    return out


def _power_at(cap: float) -> float:
    return kind_curve(WorkloadKind.TRAINING).power(cap) if cap < 1.0 else 1.0


def modelled_power(rack_of_node: Mapping[str, str] | None = None,
                   inlet: Mapping[str, float] | None = None
                   ) -> Callable[[Any], Awaitable[Readings]]:
    """A signal source for the controller (``K8sCluster(readings=...)``): rack kW = IDLE_KW +
    KW_PER_GPU per GPU of the pods bound to the rack — on a node whose GPUPowerLimit status
    reports a limit in force (m2g's node agent), times the pre-training curve's power at that
    cap — inlet 24 °C unless ``inlet`` says otherwise, all fresh. ``rack_of_node``: node →
    rack; by default from the nodes' labels."""
    racks_of: dict[str, str] = dict(rack_of_node or {})
    seen_generation = -1

    async def read(cluster: HasCaches) -> Readings:
        nonlocal seen_generation
        nodes = cluster.caches["nodes"]
        if rack_of_node is None and nodes.generation != seen_generation:  # labels rarely change
            seen_generation = nodes.generation
            racks_of.clear()
            for name, obj in nodes.view().items():
                rack = ((obj.get("metadata") or {}).get("labels") or {}).get(L.RACK)
                if rack:
                    racks_of[name] = str(rack)
        racks = dict.fromkeys(set(racks_of.values()), IDLE_KW)
        caps = _applied_caps(cluster)
        for node, gpus in allocated_gpus(cluster.caches["pods"].view().values()).items():
            if node in racks_of:
                racks[racks_of[node]] += gpus * KW_PER_GPU * _power_at(caps.get(node, 1.0))
        fresh = {r: RackReadings(r, SignalReading.of(kw, 1.0, 120.0),
                                 SignalReading.of((inlet or {}).get(r, 24.0), 1.0, 120.0),
                                 SignalReading.missing(120.0)) for r, kw in racks.items()}
        return Readings(time.time(), {}, fresh, {}, {})
    return read
