"""The Kubernetes API client of m2g: kr8s (async) underneath, raw JSON objects on top.

``connect`` finds credentials the way kubectl does (an explicit path, else ``$KUBECONFIG``, else
``~/.kube/config``, else the in-cluster service account) and honours a context name. ``Kube``
offers get/list/create/patch/delete/watch on raw paths built from a ``Resource``.

Every error is translated here, once, into m2g's one error family (m2g.errors), one line each:

* ``RetryableError``: connection refused, timeouts, 429, 5xx, 409 Conflict (stale
  resourceVersion), 410 Gone (an expired watch: relist) — try again later;
* ``PermanentError``: 400/422 invalid, 401/403 forbidden, 404 (``NotFound`` for a missing object,
  ``ResourceMissing`` for a kind the server does not serve, e.g. "Kueue CRDs not installed"),
  409 AlreadyExists — retrying cannot help.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kr8s
import kr8s.asyncio
import yaml

from m2g import yamlbounds
from m2g.errors import M2gError
from m2g.errors import PermanentError as PermanentError  # re-exported: one family
from m2g.errors import RetryableError as RetryableError
from m2g.k8s import execplugin
from m2g.k8s.kubeconfig import merged_kubeconfig
from m2g.k8s.kubeconfig import resolve_kubeconfig as resolve_kubeconfig  # re-exported

Obj = dict[str, Any]

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "m2g"
DEFAULT_TIMEOUT = 30.0

_GROUP_NAMES = {"kueue.x-k8s.io": "Kueue", "m2g.io": "m2g", "scheduling.run.ai": "KAI"}


#: The errors of this client are m2g's one family (m2g.errors): KubeError is its base here.
KubeError = M2gError


class Conflict(RetryableError):
    """409 Conflict: the resourceVersion precondition failed; re-read and retry."""


class Gone(RetryableError):
    """410 Gone / Expired: the watch's resourceVersion was compacted; relist."""


class NotFound(PermanentError):
    """404 for an object."""


class ResourceMissing(PermanentError):
    """404 for a whole kind: its CRD is not installed (or the API group is not served)."""


class AlreadyExists(PermanentError):
    """409 AlreadyExists on create."""


@dataclass(frozen=True)
class Resource:
    """A kind's REST coordinates."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


KUEUE = "kueue.x-k8s.io"
M2G = "m2g.io"
NODES = Resource("", "v1", "nodes", "Node", False)
PODS = Resource("", "v1", "pods", "Pod", True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
WORKLOADS = Resource(KUEUE, "v1beta2", "workloads", "Workload", True)
LOCAL_QUEUES = Resource(KUEUE, "v1beta2", "localqueues", "LocalQueue", True)
CLUSTER_QUEUES = Resource(KUEUE, "v1beta2", "clusterqueues", "ClusterQueue", False)
RESOURCE_FLAVORS = Resource(KUEUE, "v1beta2", "resourceflavors", "ResourceFlavor", False)
ADMISSION_CHECKS = Resource(KUEUE, "v1beta2", "admissionchecks", "AdmissionCheck", False)
POWER_DOMAINS = Resource(M2G, "v1alpha1", "powerdomains", "PowerDomain", False)
GRID_EVENTS = Resource(M2G, "v1alpha1", "gridevents", "GridEvent", False)
MAINTENANCE_WINDOWS = Resource(M2G, "v1alpha1", "maintenancewindows", "MaintenanceWindow",
                               False)
RESERVATIONS = Resource(M2G, "v1alpha1", "reservations", "Reservation", False)
CAPACITY_PLANS = Resource(M2G, "v1alpha1", "capacityplans", "CapacityPlan", False)
POLICIES = Resource(M2G, "v1alpha1", "policies", "Policy", False)
TENANT_POLICIES = Resource(M2G, "v1alpha1", "tenantpolicies", "TenantPolicy", True)
GPU_POWER_LIMITS = Resource(M2G, "v1alpha1", "gpupowerlimits", "GPUPowerLimit", False)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", True)


def error_from_response(method: str, path: str, status: int, body: Any) -> KubeError:
    """Classify an HTTP error response (``body`` a decoded Status or text)."""
    status_obj: Obj = body if isinstance(body, dict) else {}
    reason = str(status_obj.get("reason", ""))
    message = str(status_obj.get("message", body if isinstance(body, str) else ""))[:300]
    where = f"{method} {path}: {status}" + (f" {reason}" if reason else "")
    text = f"{where}: {message}" if message else where
    details = status_obj.get("details") if isinstance(status_obj.get("details"), dict) else {}
    extra: dict[str, Any] = {"api_message": str(status_obj.get("message") or ""),
                             "details": details}
    if status == 404:
        if (details or {}).get("name"):
            return NotFound(text, status, reason, **extra)
        group = path.split("/")[2] if path.startswith("/apis/") else ""
        product = _GROUP_NAMES.get(group, group or "core")
        return ResourceMissing(f"{product} CRDs not installed ({path} is not served)",
                               status, reason, **extra)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(text, status, reason, **extra)
        return Conflict(text, status, reason, **extra)
    if status == 410:
        return Gone(text, status, reason or "Expired", **extra)
    if status == 429 or status >= 500:
        return RetryableError(text, status, reason, **extra)
    return PermanentError(text, status, reason, **extra)


@contextlib.contextmanager
def _translated(method: str, path: str) -> Iterator[None]:
    try:
        yield
    except KubeError:
        raise
    except kr8s.ServerError as exc:
        resp = exc.response
        if resp is None:
            raise RetryableError(f"{method} {path}: {exc}") from exc
        try:
            body: Any = resp.json()
        except (ValueError, httpx.ResponseNotRead):
            body = getattr(resp, "text", "")
        raise error_from_response(method, path, resp.status_code, body) from exc
    except kr8s.APITimeoutError as exc:
        raise RetryableError(f"{method} {path}: timed out") from exc
    except httpx.HTTPStatusError as exc:
        raise error_from_response(method, path, exc.response.status_code,
                                  exc.response.text) from exc
    except (httpx.TransportError, OSError) as exc:
        raise RetryableError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, OverflowError) as exc:
        # a kubeconfig server such as http://[::1, https://host:99999, a newline or a
        # non-IDNA host: nothing to retry
        raise PermanentError(f"{method} {path}: the server URL cannot be used: "
                             f"{str(exc)[:200]}") from None
    except ExceptionGroup as group:  # anyio's connect raises inside a task group
        first = group.exceptions[0]
        while isinstance(first, ExceptionGroup):
            first = first.exceptions[0]
        if isinstance(first, OverflowError | ValueError):  # connect(): port must be 0-65535
            raise PermanentError(f"{method} {path}: the server URL cannot be used: "
                                 f"{first}") from None
        if isinstance(first, OSError | httpx.TransportError):
            raise RetryableError(f"{method} {path}: {type(first).__name__}: {first}") from None
        raise


def _json_object(content: bytes | str, method: str, path: str,
                 error: type[KubeError] = PermanentError) -> Obj:
    """The body as a JSON object; a body that is not one is ``error`` with one line (a proxy's
    HTML page, a truncated stream), never a ValueError out of the client."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        head = content[:60] if isinstance(content, str) else content[:60].decode("utf-8",
                                                                                  "replace")
        raise error(f"{method} {path}: the answer is not JSON ({' '.join(head.split())!r}"
                    "...)") from None
    if not isinstance(data, dict):
        raise error(f"{method} {path}: the answer is a JSON {type(data).__name__}, not an "
                    "object")
    return data


class Kube:
    """Raw-JSON access to the API server through a kr8s async ``Api``."""

    def __init__(self, api: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api = api
        self.timeout = timeout

    async def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str | None = None) -> Obj:
        """One call; returns the decoded JSON object ({} for an empty body)."""
        base, _, tail = path.rpartition("/")
        kwargs: dict[str, Any] = {"timeout": httpx.Timeout(self.timeout)}
        if params:
            kwargs["params"] = {k: v for k, v in params.items() if v is not None}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"content-type": content_type or "application/json"}
        with _translated(method, path):
            async with self.api.call_api(method, version="", base=base, url=tail,
                                         **kwargs) as resp:
                if not resp.content:
                    return {}
                return _json_object(resp.content, method, path)

    async def get(self, res: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> Obj:
        return await self.request("GET", res.path(namespace, name, subresource))

    async def get_or_none(self, res: Resource, name: str,
                          namespace: str | None = None) -> Obj | None:
        try:
            return await self.get(res, name, namespace)
        except NotFound:
            return None

    async def list(self, res: Resource, namespace: str | None = None,
                   params: Mapping[str, Any] | None = None) -> Obj:
        """The List object (``items`` and ``metadata.resourceVersion``)."""
        return await self.request("GET", res.path(namespace), params=params)

    async def create(self, res: Resource, body: Obj, namespace: str | None = None,
                     dry_run: bool = False) -> Obj:
        params = {"dryRun": "All"} if dry_run else None
        return await self.request("POST", res.path(namespace), body=body, params=params)

    async def replace(self, res: Resource, name: str, body: Obj,
                      namespace: str | None = None, subresource: str | None = None) -> Obj:
        return await self.request("PUT", res.path(namespace, name, subresource), body=body)

    async def patch(self, res: Resource, name: str, body: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    content_type: str = MERGE_PATCH, field_manager: str | None = None,
                    force: bool = False) -> Obj:
        """PATCH with ``content_type`` (merge, json or apply); apply needs a field manager."""
        params: dict[str, Any] = {}
        if content_type == APPLY_PATCH:
            params["fieldManager"] = field_manager or FIELD_MANAGER
            if force:
                params["force"] = "true"
        elif field_manager:
            params["fieldManager"] = field_manager
        return await self.request("PATCH", res.path(namespace, name, subresource),
                                  params=params, body=body, content_type=content_type)

    async def apply(self, res: Resource, name: str, body: Obj, *,
                    namespace: str | None = None, subresource: str | None = None,
                    field_manager: str = FIELD_MANAGER, force: bool = True) -> Obj:
        """Server-side apply (JSON is valid YAML, so the body is sent as JSON)."""
        return await self.patch(res, name, body, namespace=namespace, subresource=subresource,
                                content_type=APPLY_PATCH, field_manager=field_manager,
                                force=force)

    async def delete(self, res: Resource, name: str, namespace: str | None = None,
                     missing_ok: bool = True) -> None:
        try:
            await self.request("DELETE", res.path(namespace, name))
        except NotFound:
            if not missing_ok:
                raise

    async def watch(self, res: Resource, resource_version: str, *,
                    namespace: str | None = None, timeout_seconds: int = 300,
                    params: Mapping[str, Any] | None = None) -> AsyncIterator[Obj]:
        """Watch events ({type, object}) from ``resource_version`` until the server ends the
        stream (after ``timeout_seconds``). An in-stream 410 raises ``Gone``."""
        path = res.path(namespace)
        base, _, tail = path.rpartition("/")
        query: dict[str, Any] = {"watch": "true", "resourceVersion": resource_version,
                                 "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(timeout_seconds), **(params or {})}
        timeout = httpx.Timeout(self.timeout, read=timeout_seconds + self.timeout)
        with _translated("WATCH", path):
            async with self.api.call_api("GET", version="", base=base, url=tail, stream=True,
                                         params=query, timeout=timeout) as resp:
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    event = _json_object(line, "WATCH", path, RetryableError)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise error_from_response("WATCH", path, int(status.get("code", 500)),
                                                  status)
                    yield event

    async def close(self) -> None:
        session = getattr(self.api, "_session", None)
        if session is not None:
            with contextlib.suppress(RuntimeError):
                await session.aclose()


def check_kubeconfig(path: str) -> None:
    """Refuse a kubeconfig kr8s would trip over with a traceback, in one line: unreadable, not
    a regular file, too large, empty, not a mapping, a ``clusters``/``users``/``contexts`` that
    is not a list of mappings, or a ``tokenFile`` that does not exist (kr8s would go on
    without it and send every request anonymously)."""
    where = f"{path} is not a kubeconfig"
    try:  # stat before open (a FIFO's open blocks), bounded size, nesting and aliases
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PermanentError(f"{where}: not a regular file")
        text = yamlbounds.read_bounded(Path(path), _MAX_KUBECONFIG)
    except OSError as exc:
        raise PermanentError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PermanentError(f"{where}: {exc}") from None
    try:
        docs = yamlbounds.load_all(text)
    except yaml.YAMLError as exc:  # its text spans lines: say where, in one
        line, problem = yamlbounds.problem_line(exc)
        raise PermanentError(f"{where}: unreadable YAML at line {line} ({problem})") from None
    if len(docs) > 1:
        raise PermanentError(f"{where}: {len(docs)} YAML documents, a kubeconfig is one")
    data = docs[0] if docs else None
    if data is None:
        raise PermanentError(f"{where}: the file is empty")
    if not isinstance(data, dict):
        raise PermanentError(f"{where}: a kubeconfig is a mapping, this is a "
                             f"{type(data).__name__}")
    for key in ("clusters", "users", "contexts"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, dict) for v in value)):
            raise PermanentError(f"{where}: {key} must be a list of mappings")
    base = Path(path).parent
    for key, field in (("clusters", "cluster"), ("users", "user")):
        for entry in data.get(key) or []:
            body = entry.get(field)
            for name in _FILE_FIELDS[field] if isinstance(body, dict) else ():
                why = _file_problem(base, body.get(name), must_exist=name == "tokenFile")
                if why:
                    extra = " (requests would go out anonymously)" if name == "tokenFile" else ""
                    raise PermanentError(f"{path}: {field} {entry.get('name', '')!r}: {name} "
                                         f"{body.get(name)} {why}{extra}")


#: The files a kubeconfig names, which kr8s opens and reads as it loads the credentials.
_FILE_FIELDS = {"cluster": ("certificate-authority",),
                "user": ("client-certificate", "client-key", "tokenFile")}


def _file_problem(base: Path, value: object, *, must_exist: bool) -> str | None:
    """Why a file a kubeconfig names cannot be read as one, or None: a FIFO blocked kr8s's
    open for ever (no bound applies: it blocks the event loop), a device or a directory is no
    credential. A missing one is kr8s's to say (a ``tokenFile`` kr8s would skip in silence)."""
    if not value:
        return None
    try:
        mode = os.stat((base / str(value)).expanduser()).st_mode
    except (OSError, ValueError):
        return "does not exist" if must_exist else None
    return None if stat.S_ISREG(mode) else "is not a regular file"


_MAX_KUBECONFIG = 4 << 20


def _uses_exec(path: str) -> bool:
    """Whether a user of the kubeconfig (any of a ``$KUBECONFIG`` list) runs an exec plugin."""
    try:
        users = merged_kubeconfig(path)["users"]
    except (OSError, yaml.YAMLError, TypeError, AttributeError):
        return False
    return any(isinstance(u.get("user"), dict) and u["user"].get("exec") for u in users)


async def connect(kubeconfig: str | os.PathLike[str] | None = None,
                  context: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Kube:
    """A ``Kube`` for the cluster kubectl would talk to (see ``resolve_kubeconfig``). The
    first request (kr8s asks for ``/version``) is bounded by ``timeout`` like every other; a
    kubeconfig exec plugin has its own bound (m2g.k8s.execplugin) on top."""
    path = resolve_kubeconfig(kubeconfig)
    if path is not None:
        for part in path.split(os.pathsep):
            check_kubeconfig(part)
    # an exec plugin gets its own bound (m2g.k8s.execplugin), on top of the request's
    bound = timeout + (execplugin.exec_timeout() if path and _uses_exec(path) else 0.0)
    execplugin.install()
    try:  # kr8s reads the credentials and asks the server for its version here
        with warnings.catch_warnings(), _translated("GET", "/version"):
            warnings.filterwarnings("ignore", message="Kubernetes version", category=UserWarning)
            try:
                api = await asyncio.wait_for(
                    kr8s.asyncio.api(kubeconfig=path, context=context), bound)
            except TimeoutError:
                raise RetryableError(f"GET /version: no answer within {bound:g}s") from None
    except execplugin.ExecPluginError as exc:
        raise execplugin.ExecPluginError(
            f"cannot load Kubernetes credentials from {path}: {exc}") from None
    except KubeError:
        raise
    except yaml.YAMLError as exc:  # its text spans lines: say where, in one
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise PermanentError(f"{path} is not a kubeconfig: unreadable YAML{at} "
                             f"({getattr(exc, 'problem', None) or 'syntax error'})") from exc
    except (ValueError, KeyError, OSError, TypeError, AttributeError, IndexError,
            RuntimeError) as exc:
        where = path or "in-cluster service account"
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PermanentError(f"cannot load Kubernetes credentials from {where}: {why}") from exc
    return Kube(api, timeout=timeout)
