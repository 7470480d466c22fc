"""The Kueue Workload that Kueue would create for a rendered template, before it exists.

``m2g submit --dry-run`` asks the policies what m2g would decide for a workload that is not on
the cluster yet. m2g reads Kueue Workloads, so this builds the one Kueue's job integration would
make from the rendered object: ``spec.queueName`` from the queue-name label, one pod set per
role with its count and pod template (Kueue copies only the pod template's metadata, which is
why the templates put m2g's facts there), and the object's labels. Pure: data in, data out.
"""

from __future__ import annotations

from typing import Any

from m2g.model import labels as L
from m2g.templates.render import Rendered

Obj = dict[str, Any]


def _pod_set(name: str, count: int, template: Obj) -> Obj:
    return {"name": name, "count": max(0, int(count)), "template": template}


def _job(spec: Obj) -> list[Obj]:
    return [_pod_set("main", spec.get("parallelism", 1), spec.get("template") or {})]


def _jobset(spec: Obj) -> list[Obj]:
    out = []
    for rj in spec.get("replicatedJobs") or []:
        child = (rj.get("template") or {}).get("spec") or {}
        out.append(_pod_set(str(rj.get("name", "")),
                            int(rj.get("replicas", 1)) * int(child.get("parallelism", 1)),
                            child.get("template") or {}))
    return out


def _pytorchjob(spec: Obj) -> list[Obj]:
    return [_pod_set(role.lower(), rs.get("replicas", 1), rs.get("template") or {})
            for role, rs in (spec.get("pytorchReplicaSpecs") or {}).items()]


def _trainjob(spec: Obj) -> list[Obj]:
    trainer = spec.get("trainer") or {}
    meta: Obj = {}
    for patch in spec.get("runtimePatches") or []:
        jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {})
                .get("spec") or {}).get("replicatedJobs") or []
        for rj in jobs:
            meta = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get(
                "metadata") or meta
    container = {"name": "node", "resources": trainer.get("resourcesPerNode") or {}}
    return [_pod_set("node", trainer.get("numNodes", 1),
                     {"metadata": meta, "spec": {"containers": [container]}})]


def _leaderworkerset(spec: Obj) -> list[Obj]:
    """One serving group (Kueue makes a Workload per group): the leader and its workers."""
    lwt = spec.get("leaderWorkerTemplate") or {}
    size = int(lwt.get("size", 1))
    if "leaderTemplate" not in lwt:
        return [_pod_set("main", size, lwt.get("workerTemplate") or {})]
    return [_pod_set("leader", 1, lwt["leaderTemplate"]),
            _pod_set("worker", size - 1, lwt.get("workerTemplate") or {})]


_POD_SETS = {"Job": _job, "JobSet": _jobset, "PyTorchJob": _pytorchjob, "TrainJob": _trainjob,
             "LeaderWorkerSet": _leaderworkerset}


def kueue_workload(rendered: Rendered) -> Obj:
    """The Kueue v1beta2 Workload (no status: it waits for quota) for ``rendered``."""
    obj = rendered.workload
    meta = obj.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    pod_sets = [ps for ps in _POD_SETS[obj["kind"]](obj.get("spec") or {}) if ps["count"]]
    spec: Obj = {"queueName": labels.get(L.QUEUE_NAME, ""), "podSets": pod_sets}
    if labels.get(L.PRIORITY_CLASS):
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                    "name": labels[L.PRIORITY_CLASS]}
    name = f"{obj['kind'].lower()}-{meta.get('name', '')}"
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": meta.get("namespace", "default"),
                         "labels": labels},
            "spec": spec}
