"""Helpers for the end-to-end tests (a module of its own so test files can import it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
Obj = dict[str, Any]


@dataclass
class Cluster:
    """Small helpers over the official client for the tests."""

    api: client.ApiClient
    core: client.CoreV1Api = field(init=False)
    batch: client.BatchV1Api = field(init=False)
    custom: client.CustomObjectsApi = field(init=False)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def create_kueue(self, plural: str, body: Obj, namespace: str | None = None) -> Obj:
        """Create a Kueue v1beta2 object; cluster-scoped ones are deleted at teardown."""
        if namespace:
            obj: Obj = self.custom.create_namespaced_custom_object(
                *KUEUE, namespace, plural, body)
        else:
            obj = self.custom.create_cluster_custom_object(*KUEUE, plural, body)
            name = body["metadata"]["name"]
            self.cleanup.append(lambda: self._delete_cluster(plural, name))
        return obj

    def _delete_cluster(self, plural: str, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(*KUEUE, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def workloads(self, namespace: str) -> list[Obj]:
        data = self.custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")
        items: list[Obj] = data["items"]
        return items


def condition(obj: Obj, kind: str) -> Obj | None:
    """The status condition of type ``kind``, if present."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            found: Obj = cond
            return found
    return None


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0,
               interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except ApiException as exc:
            last_exc = exc
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last_exc})" if last_exc else ""), pytrace=False)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"

def install_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for path in sorted((REPO / "deploy" / "crds").glob("m2g.io_*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # a reused control plane may hold an older schema: bring it up to date
            old = ext.read_custom_resource_definition(body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = old.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crds = [ext.read_custom_resource_definition(yaml.safe_load(p.read_text())["metadata"][
            "name"]) for p in (REPO / "deploy" / "crds").glob("m2g.io_*.yaml")]
        if all(any(c.type == "Established" and c.status == "True"
                   for c in (crd.status.conditions or [])) for crd in crds):
            return
        time.sleep(0.5)
    raise AssertionError("m2g CRDs not Established in 30 s")
