"""Create rendered manifests on a cluster through m2g.k8s's client (kubectl-like config).

``--kubeconfig`` / ``--context`` behave as in kubectl: the default is ``$KUBECONFIG`` or
``~/.kube/config``, then the in-cluster service account. Every failure becomes a
``ClusterError`` with one line for the user: no cluster, API (CRD) not served, forbidden,
already exists, rejected by validation or a webhook.

The CLI is synchronous; a ``Submitter`` runs m2g.k8s's async client on an event loop of its own
(one connection for all the objects of a submission).
"""

from __future__ import annotations

import asyncio
import http
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from m2g.k8s import client as k

Obj = dict[str, Any]
T = TypeVar("T")

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


class Submitter:
    """A connection to one cluster for synchronous callers; ``close()`` when done."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        if k.resolve_kubeconfig(kubeconfig) is None and \
                not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ClusterError("no cluster: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not "
                               "running in a pod; pass --kubeconfig")
        self._loop = asyncio.new_event_loop()
        try:
            self.kube = self._run(k.connect(kubeconfig, context))
        except k.RetryableError as exc:
            self._loop.close()
            raise ClusterError(f"no cluster: {exc}") from None
        except k.KubeError as exc:
            self._loop.close()
            raise ClusterError(f"no cluster: kubeconfig: {exc}") from None

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(work)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self.kube.close())
            self._loop.close()


def connect(kubeconfig: str | None = None, context: str | None = None) -> Submitter:
    """A ``Submitter`` from a kubeconfig (like kubectl), else in-cluster config."""
    return Submitter(kubeconfig, context)


def _split(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def serves(api: Submitter, api_version: str, kind: str) -> bool:
    """Whether the API server serves ``kind`` at ``api_version`` (i.e. its CRD is installed)."""
    group, version = _split(api_version)
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    try:
        data = api._run(api.kube.request("GET", path))
    except (k.NotFound, k.ResourceMissing):
        return False
    except k.RetryableError as exc:
        raise ClusterError(f"no cluster: {exc}") from None
    except k.KubeError as exc:
        raise ClusterError(_explain(exc, kind, api_version)) from None
    return any(r.get("kind") == kind for r in data.get("resources") or [])


def create(api: Submitter, obj: Obj, dry_run: bool = False) -> Obj:
    """Create one namespaced object; ``dry_run`` asks the server to validate only (All)."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    namespace = obj["metadata"].get("namespace", "default")
    group, version = _split(api_version)
    plural = PLURALS.get(kind)
    if plural is None or (not group and kind != "Service"):
        raise ClusterError(f"do not know how to create {kind} ({api_version})")
    res = k.Resource(group, version, plural, kind, True)
    try:
        return api._run(api.kube.create(res, obj, namespace=namespace, dry_run=dry_run))
    except k.RetryableError as exc:
        if exc.status:
            raise ClusterError(_explain(exc, kind, api_version, namespace)) from None
        raise ClusterError(f"no cluster: {exc}") from None
    except k.KubeError as exc:
        raise ClusterError(_explain(exc, kind, api_version, namespace)) from None


def _explain(exc: k.KubeError, kind: str, api_version: str, namespace: str = "") -> str:
    """One line for an API error."""
    message = exc.api_message or exc.reason or _phrase(exc.status)
    if exc.status == 404 and exc.details.get("kind") == "namespaces":
        return f"namespace {namespace!r} not found"
    if exc.status == 404:
        return (f"the API server does not serve {kind} ({api_version}); is its CRD "
                "installed?")
    if exc.status in (401, 403):
        return f"forbidden: {message}"
    if exc.status == 409:
        return f"already exists: {message}"
    return f"rejected ({exc.status}): {message}"


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "unknown error"
