"""The Cluster of the control loop, on m2g.k8s: watch caches in, Applier out.

Thin by design: caches are m2g.k8s.cache.WatchCache, the snapshot is m2g.k8s.convert's, the
writes are m2g.k8s.apply.Applier's. This module only connects them and adds the Events that
explain each decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx

from m2g.k8s import client as k
from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.cache import WatchCache
from m2g.k8s.convert import ClusterObjects, SnapshotMemo, build_snapshot, placements
from m2g.k8s.kai import KaiApplier, KaiSync
from m2g.model.cluster import CHECK_CONTROLLER, CheckState, ClusterSnapshot
from m2g.model.factory import Reading
from m2g.model.plan import CheckUpdate, Plan
from m2g.signals.config import SignalConfig
from m2g.signals.prometheus import PrometheusClient
from m2g.signals.reader import read_signals
from m2g.signals.readings import Readings
from m2g_controllers.policies import LoadResult

log = logging.getLogger("m2g.wiring")

#: ClusterObjects field → resource watched for it.
WATCHED: dict[str, k.Resource] = {
    "nodes": k.NODES, "pods": k.PODS, "workloads": k.WORKLOADS,
    "local_queues": k.LOCAL_QUEUES, "cluster_queues": k.CLUSTER_QUEUES,
    "resource_flavors": k.RESOURCE_FLAVORS, "admission_checks": k.ADMISSION_CHECKS,
    "power_domains": k.POWER_DOMAINS, "grid_events": k.GRID_EVENTS,
    "maintenance_windows": k.MAINTENANCE_WINDOWS,
}
#: Pods that hold GPUs: not finished. (A field selector keeps the pod watch small.)
POD_SELECTOR = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
_REASONS = {CheckState.READY: ("Admitted", "Normal"), CheckState.RETRY: ("Deferred", "Normal"),
            CheckState.REJECTED: ("Rejected", "Warning"), CheckState.PENDING: ("Pending", "Normal")}


class DrawHistory:
    """The fresh site-draw readings of the last ``keep_seconds``, one per snapshot (followers
    keep it too, so a new leader measures a baseline with the samples it saw)."""

    def __init__(self, keep_seconds: float = 900.0) -> None:
        self.keep_seconds = keep_seconds
        self._samples: deque[tuple[datetime, float]] = deque()

    def add(self, now: datetime, draw: Reading) -> tuple[tuple[datetime, float], ...]:
        if not draw.stale and draw.value is not None:
            self._samples.append((now, draw.value))
        while self._samples and (now - self._samples[0][0]).total_seconds() > self.keep_seconds:
            self._samples.popleft()
        return tuple(self._samples)


class ApplyFailed(Exception):
    """Some writes of a plan failed; the next reconcile retries (level-triggered)."""


class K8sCluster:
    """Watch caches + signal reader + applier behind the manager's Cluster protocol."""

    def __init__(self, kube: k.Kube, *, prometheus: str | None = None,
                 signal_config: SignalConfig | None = None, instance: str = "m2g",
                 http: httpx.AsyncClient | None = None,
                 readings: Callable[[K8sCluster], Awaitable[Readings | None]] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.kube = kube
        self.caches = {name: WatchCache(kube, res, params=POD_SELECTOR if name == "pods"
                                        else None) for name, res in WATCHED.items()}
        self.policies = WatchCache(kube, k.POLICIES)
        # the manager's clock: what m2g writes (shed-at, condition times) matches what it reads
        self.applier = Applier(kube, instance=instance, background_events=True, clock=clock)
        self.kai = KaiSync(kube)  # KAI Scheduler's caches, only when its CRDs are served
        self._prometheus = prometheus
        self._signal_config = signal_config or SignalConfig()
        self._http = http  # the site's auth, CA and headers (m2g.signals.http); closed by stop
        self._read_override = readings  # another signal source (tests, replay); else Prometheus
        self._memo = SnapshotMemo()  # unchanged nodes and workloads are not converted again
        self.draw_history = DrawHistory()  # site-draw samples: percentage events' baselines

    def all_caches(self) -> list[WatchCache]:
        return [*self.caches.values(), self.policies, *self.kai.caches()]

    async def start(self, on_change: Callable[..., None], timeout: float = 60.0) -> None:
        for cache in self.all_caches():
            cache.subscribe(on_change)
            cache.start()
        pending = [c.wait_synced(timeout) for c in self.all_caches()
                   if c.resource.group in ("", "kueue.x-k8s.io")]
        await asyncio.gather(*pending)  # m2g's own CRDs may be missing: they sync later
        await self.kai.probe(on_change)

    async def stop(self) -> None:
        await self.applier.drain(timeout=10)
        for cache in self.all_caches():
            await cache.stop()
        if self._http is not None:
            await self._http.aclose()

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        objs = ClusterObjects(**{name: c.view() for name, c in self.caches.items()})
        snap = build_snapshot(objs, await self._readings(), now, memo=self._memo)
        await self.kai.probe()  # KAI installed later is picked up (one discovery call a minute)
        kai = self.kai.state(self.caches["nodes"])
        history = self.draw_history.add(now, snap.factory.site_draw_kw())
        return dataclasses.replace(snap, kai=kai, draw_history=history)

    async def _readings(self) -> Readings | None:
        if self._read_override is not None:
            return await self._read_override(self)
        if not self._prometheus:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient()
        try:  # a failed read is stale data (fail-safe rules), never a failed reconcile
            return await asyncio.wait_for(read_signals(
                PrometheusClient(self._prometheus, self._http,
                                 self._signal_config.timeout_seconds),
                self._signal_config), 10)
        except Exception as exc:
            log.warning("signals unavailable, treated as stale: %s", exc)
            return None

    def placements_of(self, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Workload "ns/name" → the nodes its pods are bound to (or Kueue TAS assigned), for
        these workloads only (the decision log's "placed" records)."""
        wanted = set(keys)
        workloads = [o for key, o in self.caches["workloads"].view().items() if key in wanted]
        if not workloads:
            return {}
        return placements(self.caches["pods"].view().values(), workloads)

    def policy_objects(self) -> list[dict[str, Any]]:
        return list(self.policies.view().values())

    async def apply(self, plan: Plan, *, shadow: bool) -> list[str]:
        self.applier.dry_run = shadow
        workloads = self.caches["workloads"]
        result = await self.applier.apply_plan(
            plan, known=lambda ns, name: workloads.get(f"{ns}/{name}"))
        await KaiApplier(self.applier).apply(plan, result)
        await self._check_events(plan, result, shadow)
        lines = [f"{'would ' if not r.written else ''}{r.action} {r.target}: {r.detail}"
                 for r in result.records]
        if result.errors:
            first_what, first = result.errors[0]
            raise ApplyFailed(f"{len(result.errors)} write(s) failed; first: {first_what}: "
                              f"{first}")
        return lines

    async def _check_events(self, plan: Plan, result: ApplyResult, shadow: bool) -> None:
        """One Event per check written, up to ``applier.parallel`` at once (2,000 admissions
        one after the other would hold the reconcile for minutes), in the background: an Event
        took as long as the check's own write, and the next reconcile need not wait for it."""
        written = {r.target for r in result.records if r.action == "check" and (
            r.written or shadow)}

        async def one(c: CheckUpdate, wl: k.Obj) -> None:
            reason, kind = _REASONS[c.state]
            prefix = "[shadow] " if shadow else ""
            try:
                await self.applier.emit_event(wl, reason, prefix + c.message, kind,
                                              action="AdmissionCheck")
            except k.KubeError as exc:  # an Event is best effort
                log.info("event for %s/%s not written: %s", c.namespace, c.name, exc)

        for c in plan.checks:
            wl = self.caches["workloads"].get(f"{c.namespace}/{c.name}")
            if f"{c.namespace}/{c.name}" in written and wl is not None:
                self.applier.in_background(partial(one, c, wl))

    async def policy_status(self, result: LoadResult) -> None:
        bad = {p.file.removeprefix("Policy/") for p in result.problems}
        message = result.summary()
        for obj in self.policy_objects():
            name = str((obj.get("metadata") or {}).get("name", ""))
            mine = [p.render() for p in result.problems if p.file == f"Policy/{name}"]
            ok = result.accepted
            reason = "Accepted" if ok else ("Invalid" if name in bad else "SetRejected")
            text = "; ".join(mine) if mine else message
            try:
                await self.applier.set_policy_status(name, accepted=ok or name not in bad,
                                                     ready=ok, reason=reason, message=text)
                if not ok and name in bad:
                    await self.applier.emit_event(obj, "PolicyRejected", text, "Warning",
                                                  action="LoadPolicies")
            except k.KubeError as exc:
                log.warning("status of Policy %s not written: %s", name, exc)

    async def ensure_check_active(self, name: str) -> None:
        """Recreate the check or its Active condition if lost; the watch cache says whether it
        is in place, so a healthy check costs no request."""
        if not _active(self.caches["admission_checks"].get(name)):
            await self.applier.ensure_admission_check_active(name)


def _active(check: dict[str, Any] | None) -> bool:
    """An AdmissionCheck of m2g's whose Active condition is True for its current generation."""
    if check is None or (check.get("spec") or {}).get("controllerName") != CHECK_CONTROLLER:
        return False
    generation = (check.get("metadata") or {}).get("generation", 1)
    return any(c.get("type") == "Active" and c.get("status") == "True"
               and c.get("observedGeneration") == generation
               for c in (check.get("status") or {}).get("conditions") or [])
