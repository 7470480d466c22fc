"""KAI Scheduler objects → the planner's ``KaiState`` (pure: no I/O).

* Topologies (``kai.scheduler/v1alpha1``): name, ``spec.levels[].nodeLabel``, and whether m2g
  created it (label ``app.kubernetes.io/managed-by: m2g``).
* Queues (``scheduling.run.ai/v2``): only those annotated ``m2g.io/power-domain``; their
  ``spec.resources.gpu.{quota,limit}`` (unset reads as 0, KAI's Go zero value), the platform
  team's limit (``limit_base``) and the time m2g last changed it
  (``m2g.io/gpu-limit-changed-at``).
* Node label keys: the union over GPU nodes (``convert.is_gpu_node``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from m2g.k8s.annotations import GPU_LIMIT, MANAGED_BY, MANAGER
from m2g.k8s.convert import is_gpu_node
from m2g.k8s.parse import parse_time, quantity
from m2g.model import labels as L
from m2g.model.cluster import KaiQueueState, KaiState, KaiTopologyState

Obj = Mapping[str, Any]



def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def topology(obj: Obj) -> KaiTopologyState:
    levels = tuple(str(level.get("nodeLabel", ""))
                   for level in (obj.get("spec") or {}).get("levels") or [])
    labels = _meta(obj).get("labels") or {}
    return KaiTopologyState(name=str(_meta(obj).get("name", "")), levels=levels,
                            managed_by_m2g=labels.get(MANAGED_BY) == MANAGER)


def limit_base(annotations: Mapping[str, Any], limit: float) -> float:
    """The platform team's GPU limit: the recorded ``m2g.io/base-gpu-limit`` while the live
    limit is still the one m2g wrote (``m2g.io/gpu-limit-set``); the live limit when nothing is
    recorded or someone else (a GitOps sync) has changed it since — their value is the new base."""
    return GPU_LIMIT.base(annotations, limit)


def gpu_resources(obj: Obj) -> Mapping[str, Any]:
    return ((obj.get("spec") or {}).get("resources") or {}).get("gpu") or {}


def queue(obj: Obj) -> KaiQueueState | None:
    """A budgeted Queue, or None when it names no power domain."""
    annotations = _meta(obj).get("annotations") or {}
    domain = str(annotations.get(L.POWER_DOMAIN) or "").strip()
    if not domain:
        return None
    gpu = gpu_resources(obj)
    limit = quantity(gpu.get("limit", 0))
    return KaiQueueState(
        name=str(_meta(obj).get("name", "")), power_domain=domain,
        quota=quantity(gpu.get("quota", 0)), limit=limit,
        base_limit=limit_base(annotations, limit),
        last_change=parse_time(annotations.get(GPU_LIMIT.changed_at_key)))


def node_label_keys(nodes: Iterable[Obj]) -> frozenset[str]:
    return frozenset(str(key) for n in nodes if is_gpu_node(n)
                     for key in (_meta(n).get("labels") or {}))


def kai_state(nodes: Iterable[Obj], topologies: Iterable[Obj],
              queues: Iterable[Obj]) -> KaiState:
    budgeted = (queue(o) for o in queues)
    return KaiState(
        node_label_keys=node_label_keys(nodes),
        topologies=tuple(sorted((topology(o) for o in topologies), key=lambda t: t.name)),
        queues=tuple(sorted((q for q in budgeted if q is not None), key=lambda q: q.name)))


def kai_snapshot(label_keys: frozenset[str], topologies: Iterable[Obj] | None,
                 queues: Iterable[Obj] | None) -> KaiState | None:
    """The KAI part of a snapshot (watch caches or one-shot lists alike): None when neither
    KAI CRD is served; ``topologies`` None: KAI without its Topology CRD (Queues only)."""
    if topologies is None and queues is None:
        return None
    state = kai_state((), topologies or (), queues or ())
    return replace(state, node_label_keys=label_keys, topology_served=topologies is not None)
