"""An in-memory stand-in for ``m2g.k8s.client.Kube`` (``FakeKube``) and a scripted LIST/WATCH
(``FakeWatchApi``), for unit tests and benches; the real API server is exercised by
tests/e2e/test_k8s_*.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

from m2g.k8s.client import (
    AlreadyExists,
    Conflict,
    Gone,
    KubeError,
    NotFound,
    Obj,
    Resource,
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKube:
    """Objects keyed by (plural, namespace, name); resourceVersions count up."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 100
        self.calls: list[tuple[str, str, str]] = []  # (verb, plural, name)
        self.fail_next: list[KubeError | None] = []  # raised by the next calls, in order

    def _key(self, res: Resource, name: str, namespace: str | None) -> tuple[str, str, str]:
        return (res.plural, namespace or "", name)

    def _bump(self, obj: Obj) -> Obj:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("generation", 1)
        return obj

    def _check(self, verb: str, res: Resource, name: str) -> None:
        self.calls.append((verb, res.plural, name))
        if self.fail_next:
            err = self.fail_next.pop(0)
            if err is not None:  # None: let this call through
                raise err

    def put(self, res: Resource, obj: Obj) -> Obj:
        meta = obj["metadata"]
        stored = self._bump(copy.deepcopy(obj))
        self.objects[self._key(res, meta["name"], meta.get("namespace"))] = stored
        return stored

    def stored(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return self.objects[self._key(res, name, namespace)]

    def writes(self) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[0] not in ("get", "list")]

    async def get(self, res: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> Obj:
        self._check("get", res, name)
        try:
            return copy.deepcopy(self.objects[self._key(res, name, namespace)])
        except KeyError:
            raise NotFound(f"{res.plural} {name} not found", 404, "NotFound") from None

    async def get_or_none(self, res: Resource, name: str,
                          namespace: str | None = None) -> Obj | None:
        try:
            return await self.get(res, name, namespace)
        except NotFound:
            return None

    async def create(self, res: Resource, body: Obj, namespace: str | None = None,
                     dry_run: bool = False) -> Obj:
        name = body["metadata"]["name"]
        self._check("create", res, name)
        key = self._key(res, name, namespace)
        if key in self.objects:
            raise AlreadyExists(f"{name} exists", 409, "AlreadyExists")
        obj = copy.deepcopy(body)
        if namespace:
            obj["metadata"]["namespace"] = namespace
        self.objects[key] = self._bump(obj)
        return copy.deepcopy(obj)

    async def replace(self, res: Resource, name: str, body: Obj,
                      namespace: str | None = None, subresource: str | None = None) -> Obj:
        self._check("replace", res, name)
        key = self._key(res, name, namespace)
        if key not in self.objects:
            raise NotFound(f"{name} not found", 404, "NotFound")
        want = body.get("metadata", {}).get("resourceVersion")
        if want and want != self.objects[key]["metadata"]["resourceVersion"]:
            raise Conflict(f"{name}: the object has been modified", 409, "Conflict")
        self.objects[key] = self._bump(copy.deepcopy(body))
        return copy.deepcopy(self.objects[key])

    async def patch(self, res: Resource, name: str, body: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    content_type: str = "", field_manager: str | None = None,
                    force: bool = False) -> Obj:
        self._check("patch", res, name)
        key = self._key(res, name, namespace)
        if key not in self.objects:
            raise NotFound(f"{name} not found", 404, "NotFound")
        want = body.get("metadata", {}).get("resourceVersion")
        if want and want != self.objects[key]["metadata"]["resourceVersion"]:
            raise Conflict(f"{name}: the object has been modified", 409, "Conflict")
        self.objects[key] = self._bump(merge_patch(self.objects[key], body))
        return copy.deepcopy(self.objects[key])

    async def apply(self, res: Resource, name: str, body: Obj, *,
                    namespace: str | None = None, subresource: str | None = None,
                    field_manager: str = "m2g", force: bool = True) -> Obj:
        """SSA, simplified: list-map entries (admissionChecks by name, conditions by type)
        are merged by key, everything else merge-patched."""
        self._check("apply", res, name)
        key = self._key(res, name, namespace)
        if key not in self.objects:
            raise NotFound(f"{name} not found", 404, "NotFound")
        obj = copy.deepcopy(self.objects[key])
        status = obj.setdefault("status", {})
        for field, by in (("admissionChecks", "name"), ("conditions", "type")):
            for entry in body.get("status", {}).get(field, []):
                entries = [e for e in status.get(field, []) if e.get(by) != entry[by]]
                status[field] = [*entries, copy.deepcopy(entry)]
        rest = {k: v for k, v in body.get("status", {}).items()
                if k not in ("admissionChecks", "conditions")}
        obj["status"] = merge_patch(status, rest)
        self.objects[key] = self._bump(obj)
        return copy.deepcopy(obj)

    async def delete(self, res: Resource, name: str, namespace: str | None = None,
                     missing_ok: bool = True) -> None:
        self._check("delete", res, name)
        self.objects.pop(self._key(res, name, namespace), None)


class FakeWatchApi:
    """Scripted LIST/WATCH: ``lists`` are returned in turn; each ``watches`` entry is a list
    of events (or an exception to raise after them) for one watch call."""

    def __init__(self, lists: list[Obj], watches: list[list[Any]]) -> None:
        self.lists = lists
        self.watches = watches
        self.list_calls = 0
        self.watch_versions: list[str] = []
        self.idle = asyncio.Event()  # set when the script has run out

    async def list(self, res: Resource, namespace: str | None = None,
                   params: Mapping[str, Any] | None = None) -> Obj:
        data = self.lists[min(self.list_calls, len(self.lists) - 1)]
        self.list_calls += 1
        return copy.deepcopy(data)

    async def watch(self, res: Resource, resource_version: str, *,
                    namespace: str | None = None, timeout_seconds: int = 300,
                    params: Mapping[str, Any] | None = None) -> AsyncIterator[Obj]:
        self.watch_versions.append(resource_version)
        if not self.watches:
            self.idle.set()
            await asyncio.sleep(3600)
            return
        for item in self.watches.pop(0):
            if isinstance(item, BaseException):
                raise item
            await asyncio.sleep(0)
            yield copy.deepcopy(item)


def gone() -> Gone:
    return Gone("WATCH: 410 Expired: too old resource version", 410, "Expired")
