"""The twin's Kubernetes reads and writes (official client, raw JSON for the big lists).

Bench code, not product code: m2g itself talks to the API server only through m2g.k8s (kr8s).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from m2g.model import labels as L

Obj = dict[str, Any]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
M2G = ("m2g.io", "v1alpha1")
TWIN_LABEL = "m2g.io/twin"


class Kube:
    """The few calls the twin makes."""

    def __init__(self, kubeconfig: Path) -> None:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def close(self) -> None:
        self.api.close()

    # ---- reads (raw JSON: the client's models are slow for hundreds of objects) -------------
    def pods(self) -> list[Obj]:
        resp = self.core.list_pod_for_all_namespaces(label_selector=TWIN_LABEL,
                                                     _preload_content=False)
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def workloads(self) -> list[Obj]:
        resp = self.custom.list_cluster_custom_object(*KUEUE, "workloads",
                                                      _preload_content=False)
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def nodes(self) -> list[Obj]:
        resp = self.core.list_node(label_selector=L.RACK, _preload_content=False)
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def cluster_queues(self) -> list[Obj]:
        items: list[Obj] = self.custom.list_cluster_custom_object(
            *KUEUE, "clusterqueues")["items"]
        return items

    # ---- writes ---------------------------------------------------------------------------
    def create_job(self, body: Obj) -> None:
        self.batch.create_namespaced_job(body["metadata"]["namespace"], body)

    def delete_job(self, namespace: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod(name, namespace,
                                           {"metadata": {"annotations": annotations}})

    def annotate_workload(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        with contextlib.suppress(ApiException):
            self.custom.patch_namespaced_custom_object(
                *KUEUE, namespace, "workloads", name,
                {"metadata": {"annotations": annotations}})

    def create_cluster_object(self, plural: str, body: Obj) -> None:
        """Create an m2g.io object, replacing one of the same name."""
        try:
            self.custom.create_cluster_custom_object(*M2G, plural, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            old = self.custom.get_cluster_custom_object(*M2G, plural, body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            self.custom.replace_cluster_custom_object(*M2G, plural, body["metadata"]["name"],
                                                      body)

    def delete_cluster_object(self, plural: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.custom.delete_cluster_custom_object(*M2G, plural, name)

    def get_cluster_object(self, plural: str, name: str) -> Obj | None:
        try:
            obj: Obj = self.custom.get_cluster_custom_object(*M2G, plural, name)
        except ApiException:
            return None
        return obj


def condition(obj: Obj, kind: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            found: Obj = c
            return found
    return None


def job_of(obj: Obj) -> str:
    """The owning Job of a Workload, or the job-name label of a pod."""
    for o in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if o.get("kind") == "Job":
            return str(o.get("name", ""))
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")
