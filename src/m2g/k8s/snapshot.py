"""The one snapshot assembler: which kinds a snapshot reads, and raw objects → ``ClusterSnapshot``.

``WATCHED`` is the one table of the kinds a snapshot is built from (``ClusterObjects`` field →
resource). The controller keeps a watch cache of each (m2g_controllers.wiring) and of KAI's
CRDs (``KaiSync``); the CLI lists them once (``list_objects``, KAI included when served). Both
then call ``assemble``, so the CLI's snapshot is the controller's: same kinds, same pod
selector, same KAI part.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from m2g.k8s import client as k
from m2g.k8s.build import ClusterObjects, SnapshotMemo, build_snapshot
from m2g.k8s.cache import object_key
from m2g.k8s.kai import KAI_QUEUES, KAI_TOPOLOGIES, served
from m2g.k8s.kai_convert import kai_snapshot, node_label_keys
from m2g.model.cluster import ClusterSnapshot, KaiState
from m2g.model.factory import Reading
from m2g.model.labels import DEFAULT_TOPOLOGY_LABELS, TopologyLabels
from m2g.signals.readings import Readings

#: ClusterObjects field → the resource it is read from.
WATCHED: dict[str, k.Resource] = {
    "nodes": k.NODES, "pods": k.PODS, "workloads": k.WORKLOADS,
    "local_queues": k.LOCAL_QUEUES, "cluster_queues": k.CLUSTER_QUEUES,
    "resource_flavors": k.RESOURCE_FLAVORS, "admission_checks": k.ADMISSION_CHECKS,
    "power_domains": k.POWER_DOMAINS, "grid_events": k.GRID_EVENTS,
    "maintenance_windows": k.MAINTENANCE_WINDOWS, "gpu_power_limits": k.GPU_POWER_LIMITS,
    "reservations": k.RESERVATIONS, "capacity_plans": k.CAPACITY_PLANS,
}
#: m2g's own CRDs: a snapshot without them is still a snapshot (no budgets, events, windows).
OPTIONAL = frozenset({"power_domains", "grid_events", "maintenance_windows",
                      "gpu_power_limits", "reservations", "capacity_plans"})
#: Pods that hold GPUs: not finished. (A field selector keeps the pod watch small.)
POD_SELECTOR = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}


def params(field_name: str) -> Mapping[str, str] | None:
    """The list/watch parameters of a WATCHED kind."""
    return POD_SELECTOR if field_name == "pods" else None


class DrawHistory:
    """The fresh site-draw readings of the last ``keep_seconds``, one per snapshot (followers
    keep it too, so a new leader measures a baseline with the samples it saw). The controller
    keeps one; a one-shot CLI snapshot has none."""

    def __init__(self, keep_seconds: float = 900.0) -> None:
        self.keep_seconds = keep_seconds
        self._samples: deque[tuple[datetime, float]] = deque()

    def add(self, now: datetime, draw: Reading) -> tuple[tuple[datetime, float], ...]:
        if not draw.stale and draw.value is not None:
            self._samples.append((now, draw.value))
        while self._samples and (now - self._samples[0][0]).total_seconds() > self.keep_seconds:
            self._samples.popleft()
        return tuple(self._samples)


def assemble(objs: ClusterObjects, readings: Readings | None, now: datetime, *,
             kai: KaiState | None = None, memo: SnapshotMemo | None = None,
             history: DrawHistory | None = None,
             labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS,
             elastic_placements: bool = False) -> ClusterSnapshot:
    """Everything one reconcile (or one CLI call) decides on: the converted objects and
    readings, with KAI's part (None: KAI's CRDs are not served) and, given a ``history``, this
    snapshot's site draw added to it and the samples kept (``draw_history``); ``labels``: the
    site's topology label mapping; ``elastic_placements``: see ``build_snapshot``."""
    snap = build_snapshot(objs, readings, now, memo=memo, labels=labels,
                          elastic_placements=elastic_placements)
    draws = history.add(now, snap.factory.site_draw_kw()) if history is not None else ()
    return replace(snap, kai=kai, draw_history=draws)


@dataclass
class Listed:
    """What ``list_objects`` found: the objects, KAI's part, the optional kinds missing, and
    why KAI's part is incomplete (a KAI kind served but not readable)."""

    objects: ClusterObjects
    kai: KaiState | None = None
    missing: list[k.Resource] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: WATCHED kinds read in one namespace only / not readable at all (``list_objects``'s
    #: ``namespace``: a reader with namespace rights only)
    namespace_only: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()


class RequiredKindMissing(k.ResourceMissing):
    """A kind a snapshot cannot do without (core or Kueue) is not served."""

    def __init__(self, res: k.Resource) -> None:
        super().__init__(f"{res.kind} ({res.group or 'core'}) is not served")
        self.resource = res


async def _items(kube: k.Kube, res: k.Resource, query: Mapping[str, str] | None = None,
                 namespace: str | None = None) -> dict[str, Any]:
    data = await kube.list(res, namespace, params=query)
    return {object_key(o): o for o in data.get("items") or []}


def _plurals(names: list[str]) -> str:
    return ", ".join(WATCHED[n].plural + (f".{WATCHED[n].group}" if WATCHED[n].group else "")
                     for n in names)


async def list_objects(kube: k.Kube, namespace: str | None = None) -> Listed:
    """Every WATCHED kind listed once, and KAI's Topologies and Queues when served. Raises
    ``RequiredKindMissing`` for a missing core or Kueue kind; other KubeErrors pass through.

    ``namespace``: a reader who may have rights in that namespace only (an ML engineer with
    ``edit`` bound there: ``m2g explain``, ``m2g submit --dry-run``). A kind the API server
    forbids listing (403) in every namespace is then listed in ``namespace`` when namespaced
    (``Listed.namespace_only``), else left empty (``Listed.forbidden``), each said in
    ``Listed.warnings``. None (the default): a 403 passes through. Workloads the reader may
    not list even in ``namespace``: their 403 is raised (a user with no rights at all)."""
    found: dict[str, dict[str, Any]] = {}
    missing: list[k.Resource] = []
    narrowed: list[str] = []
    forbidden: list[str] = []
    denied: dict[str, k.PermanentError] = {}
    for name, res in WATCHED.items():
        try:
            found[name] = await _items(kube, res, params(name))
        except k.ResourceMissing:
            if name not in OPTIONAL:
                raise RequiredKindMissing(res) from None
            missing.append(res)
            found[name] = {}
        except k.PermanentError as exc:
            if namespace is None or exc.status != 403:
                raise
            denied.setdefault(name, exc)
            found[name] = {}
            if res.namespaced:
                try:
                    found[name] = await _items(kube, res, params(name), namespace)
                    narrowed.append(name)
                    continue
                except k.PermanentError as again:
                    if again.status not in (403, 404):
                        raise
            forbidden.append(name)
    if "workloads" in forbidden:  # not even the namespace's own: nothing to show, say why
        raise denied["workloads"]
    listed = Listed(ClusterObjects(**found), missing=missing,
                    namespace_only=frozenset(narrowed), forbidden=frozenset(forbidden))
    if narrowed:
        listed.warnings.append(
            f"no rights to list {_plurals(narrowed)} in every namespace: read in namespace "
            f"{namespace} only")
    if forbidden:
        listed.warnings.append(
            f"no rights to read {_plurals(forbidden)}: decided without them (docs/deploy.md, "
            "\"Roles for people\")")
    listed.kai = await _list_kai(kube, listed)
    return listed


async def _list_kai(kube: k.Kube, listed: Listed) -> KaiState | None:
    """KAI's part, as KaiSync gives it the controller: a kind not served (or not readable:
    KAI is optional, a warning) counts as absent."""
    kinds: dict[str, list[Any] | None] = {}
    for res in (KAI_TOPOLOGIES, KAI_QUEUES):
        kinds[res.plural] = None
        try:
            if await served(kube, res):
                kinds[res.plural] = list((await _items(kube, res)).values())
        except k.PermanentError as exc:
            listed.warnings.append(f"KAI {res.kind} not read: {exc}")
    return kai_snapshot(node_label_keys(listed.objects.nodes.values()),
                        kinds[KAI_TOPOLOGIES.plural], kinds[KAI_QUEUES.plural])
