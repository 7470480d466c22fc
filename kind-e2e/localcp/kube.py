"""A small Kubernetes REST client on httpx for the bring-up (apply, delete, wait).

It only needs the admin kubeconfig's certificates; resources are found through discovery, so
any kind (built-in or CRD) can be applied with server-side apply.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from localcp import UserError

Obj = dict[str, Any]
FIELD_MANAGER = "m2g-localcp"


class Kube:
    """Admin client for the local API server (mutual TLS with the dev PKI)."""

    def __init__(self, server: str, pki: Path, timeout: float = 30.0) -> None:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        # Python 3.13's defaults, on any Python: proves the PKI passes strict X.509 checks.
        ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        self.http = httpx.Client(base_url=server, verify=ctx, timeout=timeout, limits=limits,
                                 trust_env=False)
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def close(self) -> None:
        self.http.close()

    # -- discovery -----------------------------------------------------------------------
    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of a kind, from discovery (cached; refreshed on a miss)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            resp = self.http.get(base)
            if resp.status_code == 404:
                raise UserError(f"API {api_version} is not served (are its CRDs installed?)")
            resp.raise_for_status()
            for r in resp.json()["resources"]:
                if "/" not in r["name"]:
                    self._resources[(api_version, r["kind"])] = (r["name"], r["namespaced"])
        if key not in self._resources:
            raise UserError(f"kind {kind} is not served in {api_version}")
        return self._resources[key]

    def path(self, api_version: str, kind: str, namespace: str | None = None,
             name: str | None = None) -> str:
        plural, namespaced = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            base += f"/namespaces/{namespace or 'default'}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base

    # -- verbs ---------------------------------------------------------------------------
    def apply(self, obj: Obj, subresource: str = "") -> Obj:
        """Server-side apply (PATCH application/apply-patch+yaml, force)."""
        meta = obj["metadata"]
        url = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if subresource:
            url += f"/{subresource}"
        resp = self.http.patch(
            url, content=json.dumps(obj),
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        if resp.status_code >= 400:
            raise UserError(f"apply {obj['kind']}/{meta['name']} failed: "
                            f"HTTP {resp.status_code} {_message(resp)}")
        result: Obj = resp.json()
        return result

    def create_with_status(self, obj: Obj) -> None:
        """POST ``obj`` including its status (allowed on create for Nodes); if it exists,
        server-side apply its spec/metadata and then its status subresource.

        Server-side apply alone would not do: it drops ``status`` on the main resource.
        """
        meta = obj["metadata"]
        url = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        resp = self.http.post(url, content=json.dumps(obj),
                              params={"fieldManager": FIELD_MANAGER},
                              headers={"Content-Type": "application/json"})
        if resp.status_code == 409:
            self.apply({k: v for k, v in obj.items() if k != "status"})
            status = {k: obj[k] for k in ("apiVersion", "kind")}
            status["metadata"] = {"name": meta["name"]}
            status["status"] = obj["status"]
            self.apply(status, subresource="status")
        elif resp.status_code >= 400:
            raise UserError(f"create {obj['kind']}/{meta['name']} failed: "
                            f"HTTP {resp.status_code} {_message(resp)}")

    def apply_many(self, objs: Iterable[Obj], workers: int = 8,
                   verb: Callable[[Obj], Any] | None = None) -> int:
        """Apply (or ``verb``) many objects concurrently; returns how many."""
        items = list(objs)
        for obj in items[:1]:  # warm the discovery cache before going parallel
            self.resource(obj["apiVersion"], obj["kind"])
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(verb or self.apply, items))
        return len(items)

    def get(self, url: str) -> Obj | None:
        resp = self.http.get(url)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        result: Obj = resp.json()
        return result

    def delete(self, url: str) -> bool:
        """Delete; True if it existed."""
        resp = self.http.delete(url)
        if resp.status_code == 404:
            return False
        if resp.status_code >= 400:
            raise UserError(f"delete {url} failed: HTTP {resp.status_code} {_message(resp)}")
        return True

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float,
                 interval: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(interval)
        raise UserError(f"timed out after {timeout:.0f}s waiting for {what}")

    def crd_established(self, name: str) -> bool:
        crd = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = (crd or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("message", resp.text))[:400]
    except ValueError:
        return resp.text[:400]


def on_localhost(obj: Obj, name: str, port: int, bundle: str) -> Obj:
    """A webhook configuration renamed ``name`` (labelled as ours) whose webhooks call the
    controller on 127.0.0.1:``port`` (its serving pair signed by ``bundle``), not a Service."""
    obj["metadata"] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "m2g-localcp"}}
    for hook in obj.get("webhooks", []):
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
    return obj
