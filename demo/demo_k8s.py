"""The demo's Kubernetes side: its workloads as plain batch/v1 Jobs, the site budget, the grid
event, and reading back Workloads and m2g's Events (official ``kubernetes`` client)."""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
M2G = ("m2g.io", "v1alpha1")
DEMO_LABEL = "m2g.io/demo"
NAMESPACES = ("prod-training", "inference", "research")
CHECK = "m2g-policy"
CONTROLLER = "m2g.io/policy"


@dataclass(frozen=True)
class Spec:
    """One demo workload: a Job of ``gpus // 4`` pods of 4 GPUs (one GB300 tray each)."""

    name: str
    namespace: str
    kind: str  # m2g.io/workload-kind
    tier: int  # m2g.io/flex-tier
    gpus: int
    kw_per_gpu: float  # the estimate a user would put in m2g.io/estimated-kw
    priority: str  # Kueue WorkloadPriorityClass (kueue-config/base)
    what: str  # one line for the story

    @property
    def estimated_kw(self) -> float:
        return round(self.gpus * self.kw_per_gpu, 1)


def job_manifest(s: Spec) -> Obj:
    pods = s.gpus // 4
    labels = {"m2g.io/flex-tier": str(s.tier), "m2g.io/workload-kind": s.kind, DEMO_LABEL: "true"}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": {
            **labels, "kueue.x-k8s.io/queue-name": "default",
            "kueue.x-k8s.io/priority-class": s.priority}},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
            # m2g reads these from the pod template (Kueue copies it into the Workload)
            "metadata": {"labels": labels,
                         "annotations": {"m2g.io/estimated-kw": str(s.estimated_kw)}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.invalid/m2g-demo:1",
                "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                              "limits": {"nvidia.com/gpu": "4"}}}]}}},
    }


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    """The few reads and writes the demo makes."""

    def __init__(self, kubeconfig: Path) -> None:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.events = client.EventsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    # ---- writes ------------------------------------------------------------------------
    def submit(self, s: Spec) -> None:
        self.batch.create_namespaced_job(s.namespace, job_manifest(s))

    def set_site_budget(self, name: str, kw: float) -> None:
        body = {"apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain",
                "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
                "spec": {"level": "Site", "budgetKw": kw}}
        self._create_or_replace("powerdomains", name, body)

    def grid_event(self, name: str, start: datetime, duration: str, limit_kw: float) -> None:
        body = {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
                "spec": {"programName": "m2g-demo", "eventID": name, "intervals": [{
                    "start": rfc3339(start), "duration": duration,
                    "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": limit_kw}}]}}
        self._create_or_replace("gridevents", name, body)

    def _create_or_replace(self, plural: str, name: str, body: Obj) -> None:
        try:
            self.custom.create_cluster_custom_object(*M2G, plural, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            old = self.custom.get_cluster_custom_object(*M2G, plural, name)
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            self.custom.replace_cluster_custom_object(*M2G, plural, name, body)

    def clean(self) -> int:
        """Delete what an earlier demo run left (Jobs, their pods, grid events); returns the
        number of Jobs deleted."""
        count = 0
        for ns in NAMESPACES:
            jobs = self.batch.list_namespaced_job(ns, label_selector=f"{DEMO_LABEL}=true")
            for j in jobs.items:
                with contextlib.suppress(ApiException):
                    self.batch.delete_namespaced_job(j.metadata.name, ns,
                                                     propagation_policy="Background")
                    count += 1
        for ev in self.custom.list_cluster_custom_object(
                *M2G, "gridevents", label_selector=f"{DEMO_LABEL}=true")["items"]:
            with contextlib.suppress(ApiException):
                self.custom.delete_cluster_custom_object(*M2G, "gridevents",
                                                         ev["metadata"]["name"])
        return count

    def leftovers(self) -> int:
        """Workloads and pods still present in the demo namespaces."""
        n = sum(len(self.workloads(ns)) for ns in NAMESPACES)
        return n + sum(len(self.core.list_namespaced_pod(ns).items) for ns in NAMESPACES)

    # ---- reads -------------------------------------------------------------------------
    def workloads(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.custom.list_namespaced_custom_object(
            *KUEUE, namespace, "workloads")["items"]
        return items

    def cluster_queues_active(self) -> list[str]:
        """Names of ClusterQueues whose Active condition is not True."""
        cqs = self.custom.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]
        return [cq["metadata"]["name"] for cq in cqs
                if not any(c.get("type") == "Active" and c.get("status") == "True"
                           for c in (cq.get("status") or {}).get("conditions") or [])]

    def m2g_events(self, since: datetime) -> list[Obj]:
        """m2g's Events (events.k8s.io/v1) in the demo namespaces, oldest first. Read raw: the
        client's model rejects the null eventTime of core Events."""
        out: list[Obj] = []
        for ns in NAMESPACES:
            resp = self.events.list_namespaced_event(ns, _preload_content=False)
            for e in json.loads(resp.data).get("items") or []:
                when = parse_time(e.get("eventTime") or e["metadata"].get("creationTimestamp"))
                if e.get("reportingController") != CONTROLLER or when is None or when < since:
                    continue
                out.append({"name": e["metadata"]["name"], "time": when,
                            "reason": e.get("reason", ""), "note": e.get("note") or "",
                            "namespace": ns,
                            "workload": (e.get("regarding") or {}).get("name", "")})
        return sorted(out, key=lambda x: x["time"])

    def running_pods(self) -> int:
        n = 0
        for ns in NAMESPACES:
            n += sum(1 for p in self.core.list_namespaced_pod(
                ns, label_selector=f"{DEMO_LABEL}=true").items if p.status.phase == "Running")
        return n


def job_of(wl: Obj) -> str:
    for o in wl["metadata"].get("ownerReferences") or []:
        if o.get("kind") == "Job":
            return str(o.get("name", ""))
    return ""


def condition_true(wl: Obj, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (wl.get("status") or {}).get("conditions") or [])


def check_state(wl: Obj) -> tuple[str, str]:
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == CHECK:
            return str(entry.get("state", "")), str(entry.get("message", ""))
    return "", ""


def is_running(wl: Obj) -> bool:
    """Admitted, active and not finished: it holds GPUs."""
    return (condition_true(wl, "Admitted") and not condition_true(wl, "Finished")
            and (wl.get("spec") or {}).get("active", True) is not False)
