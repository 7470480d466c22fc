"""Create rendered manifests on a cluster with the official client (kubectl-like config).

``--kubeconfig`` / ``--context`` behave as in kubectl: the default is ``$KUBECONFIG`` or
``~/.kube/config``, then the in-cluster service account. Every failure becomes a
``ClusterError`` with one line for the user: no cluster, API (CRD) not served, forbidden,
already exists, rejected by validation or a webhook.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

Obj = dict[str, Any]

PLURALS = {
    "Service": "services",
    "Job": "jobs",
    "JobSet": "jobsets",
    "PyTorchJob": "pytorchjobs",
    "TrainJob": "trainjobs",
    "LeaderWorkerSet": "leaderworkersets",
}


class ClusterError(RuntimeError):
    """A cluster-side failure, worded for the user in one line."""


def connect(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig (like kubectl), else in-cluster config."""
    try:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as exc:
        if kubeconfig or context:
            raise ClusterError(f"no cluster: kubeconfig: {_first_line(exc)}") from None
    try:
        config.load_incluster_config()
    except ConfigException:
        raise ClusterError("no cluster: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not "
                           "running in a pod; pass --kubeconfig") from None
    return client.ApiClient()


def _split(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def serves(api: client.ApiClient, api_version: str, kind: str) -> bool:
    """Whether the API server serves ``kind`` at ``api_version`` (i.e. its CRD is installed)."""
    group, version = _split(api_version)
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    try:
        data = api.call_api(path, "GET", response_type="object", auth_settings=["BearerToken"],
                            _return_http_data_only=True)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise ClusterError(_explain(exc, kind, api_version)) from None
    except HTTPError as exc:
        raise ClusterError(f"no cluster: {_first_line(exc)}") from None
    return any(r.get("kind") == kind for r in (data or {}).get("resources", []))


def create(api: client.ApiClient, obj: Obj, dry_run: bool = False) -> Obj:
    """Create one namespaced object; ``dry_run`` asks the server to validate only (All)."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    namespace = obj["metadata"].get("namespace", "default")
    group, version = _split(api_version)
    flag = "All" if dry_run else None
    try:
        if not group:
            created = client.CoreV1Api(api).create_namespaced_service(namespace, obj, dry_run=flag)
            out: Obj = api.sanitize_for_serialization(created)
            return out
        plural = PLURALS.get(kind)
        if plural is None:
            raise ClusterError(f"do not know how to create {kind} ({api_version})")
        result: Obj = client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, version, namespace, plural, obj, dry_run=flag)
        return result
    except ApiException as exc:
        raise ClusterError(_explain(exc, kind, api_version, namespace)) from None
    except HTTPError as exc:
        raise ClusterError(f"no cluster: {_first_line(exc)}") from None


def _explain(exc: ApiException, kind: str, api_version: str, namespace: str = "") -> str:
    """One line for an API error."""
    message, details = _status(exc)
    if exc.status == 404 and details.get("kind") == "namespaces":
        return f"namespace {namespace!r} not found"
    if exc.status == 404:
        return (f"the API server does not serve {kind} ({api_version}); is its CRD "
                "installed?")
    if exc.status in (401, 403):
        return f"forbidden: {message}"
    if exc.status == 409:
        return f"already exists: {message}"
    return f"rejected ({exc.status}): {message}"


def _status(exc: ApiException) -> tuple[str, dict[str, Any]]:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    message = str(body.get("message") or exc.reason or "unknown error")
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    return " ".join(message.split()), details or {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
