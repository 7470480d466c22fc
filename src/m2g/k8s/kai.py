"""KAI Scheduler adapter: discover KAI's CRDs, watch them when served, apply KAI changes.

m2g runs fine without KAI. ``KaiSync.probe`` asks API discovery whether
``kai.scheduler/v1alpha1`` (Topology) and ``scheduling.run.ai/v2`` (Queue) are served; only
then are Topology and Queue watch caches started (a cluster that installs KAI later is picked
up by a later probe); each CRD is found on its own. Until a cache has synced, and while its CRD
is gone again (KAI uninstalled), the planner plans nothing for that kind. The node label keys are
recomputed only when the node cache has changed (its ``generation``): on a 1,800-node factory
the scan costs 5–12 ms.

Writes (``KaiApplier``):

* ``KaiTopologyUpdate`` → server-side apply of the Topology (field manager ``m2g``, label
  ``app.kubernetes.io/managed-by: m2g``). KAI makes the levels' nodeLabels immutable, so a
  replacement first deletes the current object with a uid/resourceVersion precondition (a
  Topology that changed meanwhile is not deleted; the next reconcile decides again).
* ``KaiQueueUpdate`` → a JSON merge patch of ``spec.resources.gpu.limit`` alone, with a
  ``metadata.resourceVersion`` precondition (409: re-read and retry). A change records the
  platform team's limit in ``m2g.io/base-gpu-limit`` and what m2g wrote in
  ``m2g.io/gpu-limit-set``; a live limit that differs from the latter was changed by someone
  else (a GitOps sync) and becomes the new base. Setting the base back removes both.
  ``m2g.io/gpu-limit-changed-at`` records when m2g last changed it.

Each write is idempotent (a value already in place is not written) and explained by an Event
on the object (``TopologySynced``, ``TopologyReplaced``, ``GpuLimitLowered``,
``GpuLimitRaised``). In dry-run (shadow) mode only the Events and records are made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from m2g.k8s.annotations import GPU_LIMIT, MANAGED_BY, MANAGER
from m2g.k8s.apply import Applier, ApplyResult, retry_on_conflict
from m2g.k8s.cache import WatchCache
from m2g.k8s.client import (
    Kube,
    KubeError,
    NotFound,
    Obj,
    PermanentError,
    Resource,
    ResourceMissing,
)
from m2g.k8s.kai_convert import (
    gpu_resources,
    kai_snapshot,
    limit_base,
    node_label_keys,
)
from m2g.k8s.parse import quantity
from m2g.model.cluster import KaiState
from m2g.model.plan import KaiQueueUpdate, KaiTopologyUpdate, Plan

log = logging.getLogger(__name__)

KAI_TOPOLOGIES = Resource("kai.scheduler", "v1alpha1", "topologies", "Topology", False)
KAI_QUEUES = Resource("scheduling.run.ai", "v2", "queues", "Queue", False)
PROBE_SECONDS = 60.0


async def served(kube: Kube, res: Resource) -> bool:
    """Does API discovery list ``res`` (group/version and plural)?"""
    try:
        found = await kube.request("GET", f"/apis/{res.group}/{res.version}")
    except (NotFound, ResourceMissing):  # the group/version is not served
        return False
    return any(r.get("name") == res.plural for r in found.get("resources") or [])


def _number(value: float) -> int | float:
    """KAI's GPU values are numbers; whole ones are written as integers."""
    return int(value) if float(value).is_integer() else value


class KaiApplier:
    """Writes the KAI part of a plan through an ``Applier`` (its dry-run flag, records, Events)."""

    def __init__(self, applier: Applier) -> None:
        self.applier = applier
        self.kube = applier.kube

    async def apply(self, plan: Plan, result: ApplyResult) -> None:
        for t in plan.kai_topologies:
            await self._step(result, f"kai-topology {t.name}", self.apply_topology(t, result))
        for q in plan.kai_queues:
            await self._step(result, f"kai-queue {q.queue}", self.apply_queue(q, result))

    @staticmethod
    async def _step(result: ApplyResult, what: str, change: Any) -> None:
        try:
            await change
        except KubeError as exc:
            result.errors.append((what, exc))

    async def _event(self, obj: Obj, reason: str, message: str, kind: str = "Normal") -> None:
        prefix = "[shadow] " if self.applier.dry_run else ""
        try:  # best effort: the change itself is made
            await self.applier.emit_event(obj, reason, prefix + message, kind, action="KaiSync")
        except KubeError as exc:
            log.info("event %s not written: %s", reason, exc)

    async def apply_topology(self, u: KaiTopologyUpdate, result: ApplyResult | None = None
                             ) -> bool:
        current = await self.kube.get_or_none(KAI_TOPOLOGIES, u.name)
        levels = [{"nodeLabel": label} for label in u.levels]
        now = [{"nodeLabel": (lv or {}).get("nodeLabel")}
               for lv in ((current or {}).get("spec") or {}).get("levels") or []]
        labels = ((current or {}).get("metadata") or {}).get("labels") or {}
        if current is not None and now == levels:
            self.applier._record(result, "kai-topology", u.name, "in place", False)
            return False
        replace = current is not None  # levels differ: KAI refuses an in-place edit
        if replace and labels.get(MANAGED_BY) != MANAGER:
            raise PermanentError(f"KAI Topology {u.name} was not created by m2g; not replaced")
        detail = f"{'replace' if replace else 'apply'} levels {[x['nodeLabel'] for x in levels]}"
        body = {"apiVersion": KAI_TOPOLOGIES.api_version, "kind": KAI_TOPOLOGIES.kind,
                "metadata": {"name": u.name, "labels": {MANAGED_BY: MANAGER}},
                "spec": {"levels": levels}}
        if not self.applier.dry_run:  # write first: a failed write is not recorded as made
            if current is not None:
                meta = current.get("metadata") or {}
                await self.kube.request("DELETE", KAI_TOPOLOGIES.path(name=u.name), body={
                    "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {
                        "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}})
            current = await self.kube.apply(KAI_TOPOLOGIES, u.name, body,
                                            field_manager=self.applier.field_manager)
        written = self.applier._record(result, "kai-topology", u.name, f"{detail}: {u.reason}",
                                       True)
        await self._event(current or body, "TopologyReplaced" if replace else "TopologySynced",
                          u.reason)
        return written

    async def apply_queue(self, u: KaiQueueUpdate, result: ApplyResult | None = None) -> bool:
        return await retry_on_conflict(partial(self._apply_queue_once, u, result))

    async def _apply_queue_once(self, u: KaiQueueUpdate, result: ApplyResult | None) -> bool:
        q = await self.kube.get(KAI_QUEUES, u.queue)
        meta = q.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        current = quantity(gpu_resources(q).get("limit", 0))
        base = limit_base(annotations, current)
        changes = GPU_LIMIT.changes(annotations, f"{_number(base)}", f"{_number(u.limit)}")
        if current == u.limit and not changes:
            self.applier._record(result, "kai-queue", u.queue, f"gpu limit {u.limit:g}", False)
            return False
        detail = f"gpu limit {current:g} -> {u.limit:g} (base {base:g}): {u.reason}"
        if not self.applier.dry_run:  # write first: a 409 is retried and recorded once
            await self.kube.patch(KAI_QUEUES, u.queue, GPU_LIMIT.patch(
                q, changes, self.applier.clock(),
                {"resources": {"gpu": {"limit": _number(u.limit)}}}),
                field_manager=self.applier.field_manager)
        written = self.applier._record(result, "kai-queue", u.queue, detail, True)
        lower = u.limit >= 0 and (current < 0 or u.limit < current)
        await self._event(q, "GpuLimitLowered" if lower else "GpuLimitRaised", u.reason,
                          "Warning" if lower else "Normal")
        return written


class KaiSync:
    """KAI's watch caches, each started once discovery shows its CRD (a KAI release without the
    Topology CRD still gets Queue limits)."""

    def __init__(self, kube: Kube, *, clock: Callable[[], float] = time.monotonic,
                 probe_seconds: float = PROBE_SECONDS) -> None:
        self.kube = kube
        self.clock = clock
        self.probe_seconds = probe_seconds
        self._caches: dict[str, WatchCache] = {}  # plural -> cache
        self._last_probe: float | None = None
        self._on_change: Callable[..., None] | None = None
        self._label_keys: tuple[int, frozenset[str]] | None = None  # (node cache generation, keys)

    @property
    def topologies(self) -> WatchCache | None:
        return self._caches.get(KAI_TOPOLOGIES.plural)

    @property
    def queues(self) -> WatchCache | None:
        return self._caches.get(KAI_QUEUES.plural)

    def caches(self) -> list[WatchCache]:
        return list(self._caches.values())

    async def probe(self, on_change: Callable[..., None] | None = None) -> bool:
        """Start the cache of each KAI CRD that is served (at most one round of discovery calls
        per ``probe_seconds`` while one is missing). True when any is present."""
        if on_change is not None:
            self._on_change = on_change
        if len(self._caches) == 2:
            return True
        now = self.clock()
        if self._last_probe is not None and now - self._last_probe < self.probe_seconds:
            return bool(self._caches)
        self._last_probe = now
        for res in (KAI_TOPOLOGIES, KAI_QUEUES):
            if res.plural in self._caches:
                continue
            try:
                if not await served(self.kube, res):
                    continue
            except KubeError as exc:
                log.info("KAI discovery failed, retried later: %s", exc)
                continue
            cache = self._caches[res.plural] = WatchCache(self.kube, res)
            if self._on_change is not None:
                cache.subscribe(self._on_change)
            cache.start()
            log.info("KAI Scheduler's %s CRD found: keeping it in step", res.kind)
        return bool(self._caches)

    @staticmethod
    def _usable(cache: WatchCache | None) -> WatchCache | None:
        """The cache when synced and its CRD still served (KAI may be uninstalled)."""
        if cache is None or not cache.synced.is_set() or isinstance(cache.last_error,
                                                                    ResourceMissing):
            return None
        return cache

    def state(self, nodes: WatchCache) -> KaiState | None:
        """The KAI part of a snapshot; None while no KAI CRD is served and synced."""
        topologies, queues = self._usable(self.topologies), self._usable(self.queues)
        if topologies is None and queues is None:
            return None
        if self._label_keys is None or self._label_keys[0] != nodes.generation:
            self._label_keys = (nodes.generation, node_label_keys(nodes.view().values()))
        return kai_snapshot(self._label_keys[1],
                            topologies.view().values() if topologies is not None else None,
                            queues.view().values() if queues is not None else None)

    async def stop(self) -> None:
        for cache in self.caches():
            await cache.stop()
