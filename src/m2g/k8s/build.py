"""Raw objects and signal readings → a ``ClusterSnapshot`` (pure: no I/O, no clock; ``now`` is
passed in). The per-object conversions are m2g.k8s.convert's; this module puts them together.

* **Nodes**: the GPU nodes (``convert.is_gpu_node``) with a rack, sorted by name; the GPUs that
  pods hold and the fresh XID readings are folded in.
* **Racks** from their nodes' labels: the most common block, clique and power domain (else the
  PowerDomain CR that selects the rack); the rack cap and inlet limit are that CR's
  ``rackCapKw``/``inletLimitC``, else the defaults (m2g.k8s.convert).
* **The site**: the PowerDomain CR with ``spec.level: Site`` gives its name, budget and inlet
  limit; grid events and maintenance windows come from their CRs.
* **Workloads, queues, flavors** from Kueue's objects (a workload's checkpoint age from its
  pods' reports too), GridEvent statuses; **placements** only while a
  MaintenanceWindow exists or a workload is drained (drains alone use them).

``SnapshotMemo`` keeps conversions between snapshots; the result is the same with or without it.

**Isolation** (m2g.k8s.isolate): an object whose conversion raises, or whose times lie outside
1970-2200, is left out and listed in ``ClusterSnapshot.rejected``; everything else is built.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from m2g.k8s.convert import (
    DEFAULT_INLET_LIMIT_C,
    DEFAULT_RACK_CAP_KW,
    SITE_LEVEL,
    DomainSpec,
    Obj,
    PodFacts,
    WorkloadLinks,
    allocated_gpus,
    allocated_of,
    check_names,
    cluster_queue,
    invalid_min_flex_tiers,
    is_gpu_node,
    live_pods,
    live_pods_of,
    min_flex_tiers,
    node,
    placements,
    placements_of,
    pod_checkpoints,
    pod_checkpoints_of,
    pod_facts,
    resource_flavor,
    with_pod_report,
    workload,
    workload_links,
)
from m2g.k8s.convert_schedule import capacity_plan, reservation
from m2g.k8s.isolate import (
    Isolator,
    checked_domain,
    checked_event_state,
    checked_events,
    checked_window,
)
from m2g.model import labels as L
from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, Rejected, WorkloadState
from m2g.model.collector import collector_paused
from m2g.model.factory import MISSING, FactorySnapshot, Node, PowerDomain, Rack, Reading
from m2g.model.powerlimit import node_limit_state
from m2g.signals.readings import Readings, SignalReading


@dataclass(frozen=True)
class ClusterObjects:
    """The raw objects a snapshot is built from (each a cache view: key → object)."""

    nodes: Mapping[str, Obj] = field(default_factory=dict)
    pods: Mapping[str, Obj] = field(default_factory=dict)
    workloads: Mapping[str, Obj] = field(default_factory=dict)
    local_queues: Mapping[str, Obj] = field(default_factory=dict)
    cluster_queues: Mapping[str, Obj] = field(default_factory=dict)
    resource_flavors: Mapping[str, Obj] = field(default_factory=dict)
    admission_checks: Mapping[str, Obj] = field(default_factory=dict)
    power_domains: Mapping[str, Obj] = field(default_factory=dict)
    grid_events: Mapping[str, Obj] = field(default_factory=dict)
    maintenance_windows: Mapping[str, Obj] = field(default_factory=dict)
    gpu_power_limits: Mapping[str, Obj] = field(default_factory=dict)
    reservations: Mapping[str, Obj] = field(default_factory=dict)
    capacity_plans: Mapping[str, Obj] = field(default_factory=dict)


def reading(sig: SignalReading | None) -> Reading:
    """A signal reading → model Reading (missing → ``MISSING``)."""
    if sig is None:
        return MISSING
    return Reading(sig.value, sig.age_seconds, sig.max_age_seconds)


#: A workload's entry in the snapshot memo: (resourceVersion, its conversion, its pods'
#: checkpoint report, the state the snapshot has — the conversion with that report —, its
#: key, the rejection of its ``resize_note`` or None).
_Kept = tuple[str, WorkloadState, datetime | None, WorkloadState, str, Rejected | None]


@dataclass
class SnapshotMemo:
    """Conversions kept between snapshots (the caller keeps one): a node whose
    resourceVersion, allocated and XID GPUs are unchanged, and a Workload whose
    resourceVersion, LocalQueues and check names are unchanged are not converted again, and
    while its pods' checkpoint report is unchanged too its state is the one the last
    snapshot had, as it is (its wait time and checkpoint age are derived at use from ``now``:
    ``WorkloadState.view_at``). On a 100-rack factory with 2,000 workloads these conversions
    were most of a snapshot (docs/benchmarks.md, "Controller latency")."""

    #: name → (key, node, its labels as strings).
    nodes: dict[str, tuple[tuple[str, int, int], Node, dict[str, str]]] = field(
        default_factory=dict)
    #: The topology label mapping ``nodes`` were converted under (another one: none kept).
    node_labels: L.TopologyLabels | None = None
    #: name → its entry (``_Kept``: resourceVersion, its conversion, its pods' checkpoint
    #: report, the state the last snapshot had — the conversion with that report —, its key
    #: and rejection), for the LocalQueues, tier floors and check names of
    #: ``workload_context`` (the entries were converted under those).
    workloads: dict[str, _Kept] = field(default_factory=dict)
    workload_context: tuple[int, frozenset[str]] | None = None
    #: rack name → (its nodes, its labels, the spec that owns it, its power domain, block and
    #: clique) for the specs and power-domain label of ``rack_context`` (``_racks``).
    racks: dict[str, tuple[list[Node], Mapping[str, str], DomainSpec | None, str, str, str]] = \
        field(default_factory=dict)
    rack_context: tuple[list[DomainSpec], str] | None = None
    #: pod key → (resourceVersion, what the snapshot reads of it).
    pods: dict[str, tuple[str, PodFacts]] = field(default_factory=dict)
    #: Workload key → (resourceVersion, its owners and TAS hosts).
    links: dict[str, tuple[str, WorkloadLinks]] = field(default_factory=dict)
    #: What the last snapshot worked out from its pods' facts and workloads' links (``_Pods``:
    #: placements, live pods, checkpoint reports, allocated GPUs): name → (the pods' facts,
    #: the links — or None —, the other argument, the result). Kept while every fact and link
    #: is the same object (none changed: ``_facts`` keeps them), worked out anew otherwise.
    derived: dict[str, tuple[list[PodFacts], list[WorkloadLinks] | None, Any, Any]] = field(
        default_factory=dict)
    #: The Workloads' names as the last snapshot read them, and in sorted order
    #: (``sorted_names``).
    workload_order: tuple[list[str], list[str]] = ([], [])


T = TypeVar("T")


def _facts(objs: Mapping[str, Obj], convert: Any, kept: dict[str, tuple[str, Any]] | None,
           keep_equal: bool = False) -> list[Any] | None:
    """``convert`` of every object in the mapping's order, an object whose resourceVersion
    is unchanged from ``kept`` (updated in place) not converted again — nor, with
    ``keep_equal``, one whose new conversion equals the kept one (the kept object is used:
    what is derived from the list can be kept while its objects are the same); None when any
    object raises (the caller then reads the objects as before: the same result, rejections
    included)."""
    out: list[Any] = []
    fresh: dict[str, tuple[str, Any]] = {}  # the entries that change (a hit's stays as it is)
    old = kept if kept is not None else {}
    get, append = old.get, out.append
    hits = 0
    try:
        for key, o in objs.items():
            rv = str((o.get("metadata") or {}).get("resourceVersion") or "")
            hit = get(key) if rv else None
            if hit is not None and hit[0] == rv:
                hits += 1
                append(hit[1])
                continue
            got = convert(o)
            if keep_equal and hit is not None and got == hit[1]:
                got = hit[1]
            if rv:
                fresh[key] = (rv, got)
            append(got)
    except Exception:
        return None
    if kept is not None:  # updated in place (160,000 entries were rebuilt every snapshot)
        kept.update(fresh)
        # the hits' keys and the fresh ones are all kept; anything more is an object gone,
        # or read now without a resourceVersion
        if len(kept) != hits + len(fresh):
            versioned = {k for k, o in objs.items()
                         if str((o.get("metadata") or {}).get("resourceVersion") or "")}
            for k in [k for k in kept if k not in versioned]:
                del kept[k]
    return out


class _Pods:
    """The pods' and workloads' facts of one snapshot (m2g.k8s.convert.PodFacts), memoised
    per resourceVersion; each None when an object cannot be read that way (then the plain
    functions run over the raw objects, as before)."""

    def __init__(self, objs: ClusterObjects, memo: SnapshotMemo | None) -> None:
        self.objs, self.memo = objs, memo
        self.pods: list[PodFacts] | None = _facts(objs.pods, pod_facts,
                                                  memo.pods if memo is not None else None)
        self._links: list[WorkloadLinks] | None = None
        self._linked = False

    def links(self) -> list[WorkloadLinks] | None:
        if not self._linked:
            self._linked = True
            self._links = _facts(self.objs.workloads, workload_links,
                                 self.memo.links if self.memo is not None else None,
                                 keep_equal=True)
        return self._links

    def _derived(self, name: str, pods: list[PodFacts], links: list[WorkloadLinks] | None,
                 arg: Any, work: Callable[[], T]) -> T:
        """``work()``, or what the last snapshot's memo kept of it when every pod's facts and
        workload's links are the objects it had (none changed) and ``arg`` is equal. The
        result is shared between the snapshots: they only read it."""
        if self.memo is None:
            return work()
        was = self.memo.derived.get(name)
        if was is not None and was[2] == arg and _same_objects(was[0], pods) and (
                links is None or (was[1] is not None and _same_objects(was[1], links))):
            return cast(T, was[3])
        got = work()
        self.memo.derived[name] = (pods, links, arg, got)
        return got

    def allocated(self, iso: Isolator) -> dict[str, int]:
        if self.pods is not None:
            facts = self.pods
            return self._derived("allocated", facts, None, None, lambda: allocated_of(facts))
        return _allocated(self.objs.pods.values(), iso)

    def placements(self, hosts: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
        links = self.links() if self.pods is not None else None
        if self.pods is None or links is None:
            return placements(self.objs.pods.values(), self.objs.workloads.values(), hosts)
        facts = self.pods
        return self._derived("placements", facts, links, dict(hosts),
                             lambda: placements_of(facts, links, hosts))

    def live(self) -> dict[str, LivePods]:
        links = self.links() if self.pods is not None else None
        if self.pods is None or links is None:
            return live_pods(self.objs.pods.values(), self.objs.workloads.values())
        facts = self.pods
        return self._derived("live", facts, links, None, lambda: live_pods_of(facts, links))

    def checkpoints(self) -> dict[str, datetime]:
        if self.pods is not None and not any(p.checkpoint for p in self.pods):
            return {}
        links = self.links() if self.pods is not None else None
        if self.pods is None or links is None:
            return pod_checkpoints(self.objs.pods.values(), self.objs.workloads.values())
        facts = self.pods
        return self._derived("checkpoints", facts, links, None,
                             lambda: pod_checkpoints_of(facts, links))


def sorted_names(objs: Mapping[str, Any], kept: tuple[list[str], list[str]]
                 ) -> tuple[list[str], tuple[list[str], list[str]]]:
    """``sorted(objs)``, and what to keep for the next call (``kept``: the last call's). The
    same names in the same order as last time: the order kept (the watch cache's dict keeps
    its order while objects only change); otherwise the names kept in order that are still
    there, then the new ones, sorted (a sorted run and a short tail: linear for the sort).
    Sorting 100,000 names in the order they arrived cost ~0.25 s CPU (2026-12-06)."""
    names = list(objs)
    last, order = kept
    if names == last:
        return order, kept
    if last:
        present = set(names)
        old = set(last)
        order = sorted([n for n in order if n in present] + [n for n in names if n not in old])
    else:
        order = sorted(names)
    return order, (names, order)


def _same_objects(a: list[Any], b: list[Any]) -> bool:
    """The same objects in the same order (identity, not equality: cheap, and the memo's
    ``_facts`` keeps an unchanged object)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def host_names(nodes: Iterable[Obj]) -> dict[str, str]:
    """``kubernetes.io/hostname`` → node name, for the nodes where the two differ."""
    out: dict[str, str] = {}
    for o in nodes:
        host = ((o.get("metadata") or {}).get("labels") or {}).get(L.HOSTNAME)
        if host and host != _name(o):
            out[str(host)] = _name(o)
    return out


def build_snapshot(objs: ClusterObjects, readings: Readings | None, now: datetime, *,
                   site: str = "site", rack_cap_kw: float = DEFAULT_RACK_CAP_KW,
                   inlet_limit_c: float = DEFAULT_INLET_LIMIT_C,
                   memo: SnapshotMemo | None = None,
                   labels: L.TopologyLabels = L.DEFAULT_TOPOLOGY_LABELS,
                   elastic_placements: bool = False) -> ClusterSnapshot:
    """Everything one reconcile decides on, from cache views and signal readings; ``memo``:
    see ``SnapshotMemo`` (the result is the same with or without it); ``labels``: the site's
    topology label mapping; ``elastic_placements``: read the placements while an elastic
    workload waits with an m2g check (the planner's ``nvlink_preplace`` needs them). Runs
    with the cyclic garbage collector paused (m2g.model.collector)."""
    with collector_paused():
        return _build_snapshot(objs, readings, now, site=site, rack_cap_kw=rack_cap_kw,
                               inlet_limit_c=inlet_limit_c, memo=memo, labels=labels,
                               elastic_placements=elastic_placements)


def _build_snapshot(objs: ClusterObjects, readings: Readings | None, now: datetime, *,
                    site: str, rack_cap_kw: float, inlet_limit_c: float,
                    memo: SnapshotMemo | None, labels: L.TopologyLabels,
                    elastic_placements: bool = False) -> ClusterSnapshot:
    iso = Isolator()
    pods = _Pods(objs, memo)
    nodes, rack_labels = _nodes(objs, readings, memo, iso, labels, pods)
    specs = sorted((d for d in (iso.one("PowerDomain", o, checked_domain)
                                for o in objs.power_domains.values()) if d is not None),
                   key=lambda d: d.domain.name)
    site_spec = _one_site([d for d in specs if d.level == SITE_LEVEL], iso)
    domain_specs = [d for d in specs if d.level != SITE_LEVEL]
    racks = _racks(nodes, rack_labels, domain_specs, readings, rack_cap_kw, inlet_limit_c,
                   labels.power_domain, memo)
    factory = replace(
        _factory(objs, readings, now, nodes, racks, site_spec, domain_specs, site, iso),
        labels=effective_labels(labels, rack_labels.values()))
    workloads = _workloads(objs, now, memo, iso, pods)
    # placements serve maintenance drains only: skipped (a quarter of a 100-rack snapshot,
    # bench/node_levers.py) while there is no window and no drained workload
    # ... and power caps: while any cap or node limit exists, or the site is near its limit
    # (a cap goes only to a job alone on its nodes), the work admitted within the last
    # minute counted on top of the draw (the headroom gate's in-flight kW); and reservations
    limits = {n: x for n, x in ((s.node, s) for s in _each(
        iso, "GPUPowerLimit", objs.gpu_power_limits, node_limit_state) if s is not None)}
    reservations = _each(iso, "Reservation", objs.reservations, reservation)
    # ... and an elastic workload waiting with m2g's check (m2g.planner.preplace: Kueue's TAS
    # view of each NVLink domain counts the hosts of the work it reserved)
    pending = Phase.PENDING if elastic_placements else None
    needed = bool(factory.maintenance or reservations) or any(
        w.drained_for or w.power_cap < 1.0 or (w.phase is pending and w.check != ""
                                                and w.kueue_elastic)
        for w in workloads) or bool(limits) \
        or _near_limit(factory, _admitted_kw(workloads, now))
    return ClusterSnapshot(
        factory=factory, workloads=workloads,
        grid_event_states=_each(iso, "GridEvent", objs.grid_events, checked_event_state),
        queues=_each(iso, "ClusterQueue", objs.cluster_queues, cluster_queue),
        flavors=_each(iso, "ResourceFlavor", objs.resource_flavors,
                      lambda o: resource_flavor(o, labels)),
        placements=(iso.one("Pod", {"metadata": {"name": "*"}}, lambda _: pods.placements(
            _hosts(objs.nodes.values(), iso))) or {}) if needed else {},
        live_pods=iso.one("Pod", {"metadata": {"name": "*"}}, lambda _: pods.live())
        if needed else None,
        reservations=reservations,
        capacity_plans=_each(iso, "CapacityPlan", objs.capacity_plans, capacity_plan),
        rejected=iso.unique(), node_limits=limits)


#: A limit starting this soon counts for ``_near_limit`` (more than any planner's
#: ``shed_lead_seconds`` is likely to be: the pods are read before they are needed).
NEAR_LIMIT_LEAD_SECONDS = 300.0


#: Work admitted this recently may not be in the site reading yet (the planner's default
#: ``settle_seconds``): ``_near_limit`` counts its kW on top of the draw.
IN_FLIGHT_SECONDS = 60.0
#: kW per GPU of a workload without an estimate (the planner's ``default_kw_per_gpu``).
KW_PER_GPU = 1.34


def _admitted_kw(workloads: Iterable[WorkloadState], now: datetime) -> float:
    """The kW of the work admitted within ``IN_FLIGHT_SECONDS``: the most the planner may
    count as admitted and not drawing yet when it cannot see the pods."""
    since = now - timedelta(seconds=IN_FLIGHT_SECONDS)
    return sum(w.view.estimated_kw or w.view.gpus * KW_PER_GPU for w in workloads
               if w.phase is Phase.ADMITTED and w.admitted_at is not None
               and w.admitted_at > since)


def _near_limit(factory: FactorySnapshot, admitted_kw: float = 0.0) -> bool:
    """The site draw within 10 % of its limit, or of one starting within
    ``NEAR_LIMIT_LEAD_SECONDS`` (or no fresh reading): a shortfall is near. ``admitted_kw``
    (the work admitted within ``IN_FLIGHT_SECONDS``) counts on top of the draw: without the
    pods the planner takes all of it for not drawing yet (m2g.planner.shedding.
    not_drawing_share), and the headroom gate subtracts it from the room. Before, a 16-rack
    twin's warm start read 1,469 kW "admitted and not drawing yet" — every workload admitted
    in the last 60 s, most of them running for 15–30 s — beside a 1,788 kW reading under a
    3,200 kW budget (not near: the pods were not read), and held its new flexible work."""
    draw, limit = factory.site_draw_kw(), factory.limit_ahead_kw(NEAR_LIMIT_LEAD_SECONDS)
    if limit <= 0:
        return False
    return draw.stale or draw.value is None or draw.value + admitted_kw > 0.9 * limit


def _hosts(nodes: Iterable[Obj], iso: Isolator) -> dict[str, str]:
    """``host_names`` node by node: a node whose labels cannot be read is left out."""
    out: dict[str, str] = {}
    for o in nodes:
        out.update(iso.one("Node", o, lambda x: host_names([x])) or {})
    return out


def _each(iso: Isolator, kind: str, objs: Mapping[str, Obj], convert: Any) -> tuple[Any, ...]:
    """``convert`` of every object, by key; those that cannot be converted are left out."""
    out = (iso.one(kind, o, convert) for _, o in sorted(objs.items()))
    return tuple(x for x in out if x is not None)


def effective_labels(labels: L.TopologyLabels,
                     rack_labels: Iterable[Mapping[str, str]]) -> L.TopologyLabels:
    """The mapping as the nodes bear it out: when no GPU node carries the rack label, racks
    are named by their clique, so the label that selects a rack is the clique's."""
    if labels.rack and any(labels.rack in lab for lab in rack_labels):
        return labels
    return labels.model_copy(update={"rack": labels.clique})


def _nodes(objs: ClusterObjects, readings: Readings | None, memo: SnapshotMemo | None,
           iso: Isolator | None = None,
           labels: L.TopologyLabels = L.DEFAULT_TOPOLOGY_LABELS,
           pods: _Pods | None = None,
           ) -> tuple[list[Node], dict[str, dict[str, str]]]:
    """The GPU nodes that have a rack, by name, and each rack's first node's labels (a node
    that cannot be converted is left out: ``iso``)."""
    iso = iso or Isolator()
    allocated = (pods or _Pods(objs, None)).allocated(iso)
    nodes: list[Node] = []
    rack_labels: dict[str, dict[str, str]] = {}
    fresh: dict[str, tuple[tuple[str, int, int], Node, dict[str, str]]] = {}
    if memo is not None and memo.node_labels != labels:  # converted under another mapping
        memo.nodes, memo.node_labels = {}, labels
    for o in sorted(objs.nodes.values(), key=_name):
        got = iso.one("Node", o, _one_node, readings, memo, allocated, labels)
        if not got:
            continue
        name, key, n, node_labels = got
        fresh[name] = (key, n, node_labels)
        if not n.rack:
            continue
        nodes.append(n)
        if n.rack not in rack_labels:
            rack_labels[n.rack] = node_labels
    if memo is not None:
        memo.nodes = fresh
    return nodes, rack_labels


def _one_node(o: Obj, readings: Readings | None, memo: SnapshotMemo | None,
              allocated: Mapping[str, int], labels: L.TopologyLabels
              ) -> tuple[str, tuple[str, int, int], Node, dict[str, str]] | tuple[()]:
    """One node's conversion; ``()`` for a node without GPUs. A node the memo has at this
    resourceVersion was a GPU node then (the memo keeps only those, for these ``labels``:
    ``_nodes``), so it is one now: its labels are not looked at again."""
    name, meta = _name(o), o.get("metadata") or {}
    rv = str(meta.get("resourceVersion") or "")
    hit = memo.nodes.get(name) if memo is not None and rv else None
    if (hit is None or hit[0][0] != rv) and not is_gpu_node(o, labels):
        return ()
    xid = len(readings.nodes[name].xid_gpus) if readings and name in readings.nodes else 0
    key = (rv, allocated.get(name, 0), xid)
    if hit is not None and hit[0] == key:  # the same resourceVersion: the same labels
        return name, key, hit[1], hit[2]
    return name, key, node(o, key[1], xid, labels), {
        str(k): str(v) for k, v in (meta.get("labels") or {}).items()}


def _allocated(pods: Iterable[Obj], iso: Isolator) -> dict[str, int]:
    """GPUs held per node; a pod that cannot be read is left out (and reported)."""
    pods = list(pods)
    try:
        return allocated_gpus(pods)
    except Exception:
        total: Counter[str] = Counter()
        for p in pods:
            total.update(iso.one("Pod", p, lambda x: allocated_gpus([x])) or {})
        return dict(total)


def _racks(nodes: list[Node], rack_labels: Mapping[str, Mapping[str, str]],
           domain_specs: list[DomainSpec], readings: Readings | None, rack_cap_kw: float,
           inlet_limit_c: float, power_domain_label: str = "",
           memo: SnapshotMemo | None = None) -> list[Rack]:
    """The racks of ``nodes``, each with its readings. What a rack is made of — its owning
    PowerDomain spec, power domain, block and clique — is kept in ``memo`` while its nodes are
    the objects the last snapshot had (the node memo keeps an unchanged node), its labels
    the same object and the specs equal: only its readings are read anew (1,400 racks: a
    scan of the specs per rack and three counts of its 18 nodes, every snapshot)."""
    members_of: dict[str, list[Node]] = {}
    for n in nodes:
        members_of.setdefault(n.rack, []).append(n)
    kept: dict[str, tuple[list[Node], Mapping[str, str], DomainSpec | None, str, str, str]]
    kept = {}
    if memo is not None:
        if memo.rack_context == (domain_specs, power_domain_label):
            kept = memo.racks
        else:
            memo.racks, memo.rack_context = kept, (domain_specs, power_domain_label)
    racks: list[Rack] = []
    for rack_name in sorted(members_of):
        members = members_of[rack_name]
        labels = rack_labels[rack_name]
        had = kept.get(rack_name)
        if had is not None and had[1] is labels and _same_objects(had[0], members):
            _, _, owner, pd_name, block_name, clique_name = had
        else:
            owner = next((d for d in domain_specs
                          if d.selects(rack_name, labels, power_domain_label)), None)
            pd = Counter(n.power_domain for n in members if n.power_domain).most_common(1)
            block = Counter(n.block for n in members if n.block).most_common(1)
            clique = Counter(n.clique for n in members if n.clique).most_common(1)
            pd_name = pd[0][0] if pd else (owner.domain.name if owner else "")
            block_name = block[0][0] if block else ""
            clique_name = clique[0][0] if clique else ""
            kept[rack_name] = (members, labels, owner, pd_name, block_name, clique_name)
        rr = readings.racks.get(rack_name) if readings else None
        racks.append(Rack(
            name=rack_name, block=block_name, power_domain=pd_name, clique=clique_name,
            power_kw=reading(rr.power_kw if rr else None),
            cap_kw=(owner.rack_cap_kw if owner and owner.rack_cap_kw else rack_cap_kw),
            inlet_c=reading(rr.inlet_c if rr else None),
            limit_c=(owner.inlet_limit_c if owner and owner.inlet_limit_c else inlet_limit_c),
        ))
    if len(kept) != len(members_of):  # a rack gone
        for k in [k for k in kept if k not in members_of]:
            del kept[k]
    return racks


def _one_site(sites: list[DomainSpec], iso: Isolator) -> DomainSpec | None:
    """The Site PowerDomain. Two or more are a mistake m2g cannot resolve: the first by name
    was used, so a second one named before it (a copy with a larger ``budgetKw``) lifted the
    site's limit without a word and admitted work the real budget holds back. Now the one with
    the smallest budget is used (the safe value; 0 is "no budget", so it counts only when
    every one says 0) and the others are left out and reported."""
    if len(sites) <= 1:
        return sites[0] if sites else None
    limited = [d for d in sites if d.domain.budget_kw > 0]
    chosen = min(limited or sites, key=lambda d: (d.domain.budget_kw, d.domain.name))
    for d in sites:
        if d is not chosen:
            iso.reject("PowerDomain", {"metadata": {"name": d.domain.name}},
                       f"{len(sites)} PowerDomains have level Site: m2g uses the smallest "
                       f"budget, {chosen.domain.name}'s {chosen.domain.budget_kw:g} kW")
    return chosen


def _factory(objs: ClusterObjects, readings: Readings | None, now: datetime,
             nodes: list[Node], racks: list[Rack], site_spec: DomainSpec | None,
             domain_specs: list[DomainSpec], site: str,
             iso: Isolator | None = None) -> FactorySnapshot:
    iso = iso or Isolator()
    domains = tuple(
        PowerDomain(d.domain.name, d.domain.budget_kw,
                    reading(readings.domains[d.domain.name].power_kw)
                    if readings and d.domain.name in readings.domains else MISSING)
        for d in domain_specs)
    windows = (w for w in (iso.one("MaintenanceWindow", o, checked_window)
                           for o in objs.maintenance_windows.values()) if w is not None)
    events = (e for o in objs.grid_events.values()
              for e in (iso.one("GridEvent", o, checked_events) or ()))
    return FactorySnapshot(
        now=now, site=site_spec.domain.name if site_spec else site,
        site_budget_kw=site_spec.domain.budget_kw if site_spec else 0.0,
        site_limit_c=site_spec.inlet_limit_c if site_spec else 0.0,
        power_domains=domains, racks=tuple(racks), nodes=tuple(nodes),
        maintenance=tuple(sorted(windows, key=lambda w: w.name)),
        grid_events=tuple(sorted(events, key=lambda e: (e.start, e.id))))


def _entry(rv: str, got: WorkloadState, report: datetime | None) -> _Kept:
    ws = with_pod_report(got, report)
    note = Rejected("Workload", ws.key, ws.resize_note, part=f"annotation {L.MIN_PARALLELISM}") \
        if ws.resize_note else None
    return rv, got, report, ws, got.key, note


def _workloads(objs: ClusterObjects, now: datetime, memo: SnapshotMemo | None,
               iso: Isolator | None = None, pods: _Pods | None = None,
               ) -> tuple[WorkloadState, ...]:
    iso = iso or Isolator()
    lq_map = {key: str(spec.get("clusterQueue", "")) for key, o in objs.local_queues.items()
              if isinstance(spec := o.get("spec") or {}, dict)}
    checks = check_names(objs.admission_checks.values())
    floors = iso.one("ClusterQueue", {"metadata": {"name": "*"}}, lambda _: min_flex_tiers(
        o for o in objs.cluster_queues.values() if isinstance(o, dict))) or {}
    bad_floors = iso.one("ClusterQueue", {"metadata": {"name": "*"}},
                         lambda _: invalid_min_flex_tiers(
                             o for o in objs.cluster_queues.values() if isinstance(o, dict))) or {}
    for cq, raw in sorted(bad_floors.items()):
        iso.rejected.append(Rejected(
            "ClusterQueue", cq, f"annotation {L.MIN_FLEX_TIER} {raw!r} is not 0-3: ignored, "
            "every flex tier is allowed in this queue", part=f"annotation {L.MIN_FLEX_TIER}"))
    lq_key = hash((frozenset(lq_map.items()), frozenset(floors.items())))
    states: list[WorkloadState] = []
    pod_reports = iso.one("Pod", {"metadata": {"name": "*"}},
                          lambda _: (pods or _Pods(objs, None)).checkpoints()) or {}
    order, kept_order = sorted_names(objs.workloads,
                                     memo.workload_order if memo is not None else ([], []))
    # The memo's entries, updated in place: an unchanged workload's entry stays as it is (a
    # new dict of 100,000 new entries per snapshot was a third of the loop, 2026-12-07).
    # Its entries hold for the LocalQueues, tier floors and check names they were converted
    # under (``workload_context``): other ones, and none is kept.
    kept: dict[str, _Kept] = {}
    if memo is not None:
        memo.workload_order = kept_order
        if memo.workload_context == (lq_key, checks):
            kept = memo.workloads
        else:
            memo.workloads, memo.workload_context = kept, (lq_key, checks)
    get, report_of, by_name, append = kept.get, pod_reports.get, objs.workloads, states.append
    reject = iso.rejected.append
    seen = 0  # the names kept now (a name gone from the objects is dropped below)
    for wname in order:
        o = by_name[wname]
        rv = (o.get("metadata") or {}).get("resourceVersion")
        rv = rv if type(rv) is str else str(rv or "")
        whit = get(wname) if rv else None
        if whit is not None and whit[0] == rv:
            # its conversion kept (the time fields are derived at use); its key and its
            # rejection kept beside it: an unchanged state is not read here at all
            report = report_of(whit[4])
            if report == whit[2]:
                entry = whit
            else:
                entry = kept[wname] = _entry(rv, whit[1], report)
        else:
            fresh = iso.one("Workload", o, workload, now, local_queues=lq_map, checks=checks,
                            tier_floors=floors)
            if fresh is None:
                kept.pop(wname, None)
                continue
            entry = _entry(rv, fresh, report_of(fresh.key))
            if rv:
                kept[wname] = entry
            else:  # not kept: nothing tells its next version from this one
                kept.pop(wname, None)
        if rv:
            seen += 1
        if entry[5] is not None:  # a tenant's m2g.io/min-parallelism m2g cannot honour
            reject(entry[5])
        append(entry[3])
    if len(kept) != seen:  # a name gone from the objects
        present = set(order)
        for k in [k for k in kept if k not in present]:
            del kept[k]
    return tuple(states)
