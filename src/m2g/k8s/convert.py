"""Raw Kubernetes objects → the model, one object at a time (pure: no I/O, no clock; ``now`` is
passed in). m2g.k8s.build puts a snapshot together from them; values are parsed by
m2g.k8s.parse; the annotations m2g writes are m2g.k8s.annotations'.

Nodes (``node``): a node is a GPU node when it has ``nvidia.com/gpu`` capacity/allocatable or the
site's rack or clique label (``TopologyLabels``, the site configuration's ``topology.labels``).
``gpus`` is the capacity (allocatable when no capacity is given) and ``unhealthy_gpus`` the
part the device plugin withheld (capacity − allocatable) or the GPUs
with a fresh non-zero XID reading, whichever is larger. Health reasons:

* ``NotReady``: the ``Ready`` condition is missing or not True;
* ``Cordoned``: ``spec.unschedulable``;
* ``Tainted``: a NoSchedule/NoExecute taint, except KWOK's (``kwok.x-k8s.io/*``), the
  cordon/not-ready taints already covered above and m2g's own (``m2g.io/*``: maintenance and
  thermal taints are not health; their capacity is the Capacity policies' business, and
  counting it here too would derate it twice). They are in ``Node.m2g_taints``;
* node-problem-detector / NVSentinel style conditions with status True: ``GpuXid`` for
  ``GpuXidError``/``GPUXidError``/``GpuXid``, ``NVLinkDown`` for
  ``NVLinkDown``/``NVLinkError``/``NvlinkError``, ``InfiniBandDown`` for
  ``InfiniBandDown``/``InfiniBandError``/``IBLinkDown``; ``NodeCondition`` for the kubelet's
  ``MemoryPressure``/``DiskPressure``/``PIDPressure``/``NetworkUnavailable`` and NPD's
  ``KernelDeadlock``/``ReadonlyFilesystem``/``GpuHealth``-style ``*Problem`` conditions.

Racks come from node labels through the site's mapping (``TopologyLabels``: by default
Topograph's ``network.topology.nvidia.com/accelerator``, else the node's GFD clique
``nvidia.com/gpu.clique``; block ``network.topology.nvidia.com/block``; no power-domain label).
A rack's cap is the ``rackCapKw`` of the PowerDomain CR it belongs to, else
``DEFAULT_RACK_CAP_KW`` (132 kW: a GB300 NVL72's power-shelf
output, field-notes §7); its inlet limit is the PowerDomain's ``inletLimitC``, else
``DEFAULT_INLET_LIMIT_C`` (32 °C: ASHRAE A1 allowable maximum). The site budget is the
``budgetKw`` of the PowerDomain CR with ``spec.level: Site`` (the site takes its name).

Placements (``placements``): workload → the nodes its unfinished pods are bound to, matching a
pod to a Workload by owner UID (the pod's owners, or the pod itself, own the Workload: Jobs and
plain pods; a JobSet's pods are a level further down and are not matched), plus the hostnames
Kueue TAS assigned it in ``status.admission`` (which covers pods not bound yet, and JobSets).
Built only while a MaintenanceWindow exists or a workload is drained: drains alone use them.

Workloads: labels/annotations are read from the pod templates of ``spec.podSets`` (Kueue copies
the job's pod template there) with the Workload's own metadata taking precedence. Bad values
never raise: an unknown kind reads as "", a bad flex tier as 0 (out of range: clamped to 0–3),
a bad number as 0.

Checkpoints (``checkpoint``): a job reports its last checkpoint as the RFC 3339 annotation
``m2g.io/last-checkpoint-time`` on one of its pods (its own process annotates itself) or on its
Workload; the newest report counts. ``checkpoint.lastAgeSeconds`` is the time since that report,
or since the workload was admitted when it reported none (or only one older than its admission):
what an eviction would lose.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from itertools import pairwise
from typing import Any, NamedTuple

from m2g.k8s.annotations import (
    BASE_WITHIN_PREEMPTION,
    DRAINED_FOR,
    FLEX_USED,
    POWER_CAP,
    POWER_CAP_AT,
    QUOTA_CHANGED_AT,
    RESIZED_AT,
    RESIZED_FROM,
    RESTORED_AT,
    SHED_AT,
    STOP_POLICY_SET,
    quota_base,
)
from m2g.k8s.parse import (
    int_of,
    nonneg_float,
    nonneg_int,
    parse_duration,
    parse_time,
    quantity,
)
from m2g.model import labels as L
from m2g.model.cluster import (
    CHECK_CONTROLLER,
    CheckState,
    FlavorQuota,
    FlavorState,
    GridEventState,
    LivePods,
    Phase,
    QueueState,
    WorkloadState,
)
from m2g.model.factory import (
    GridEvent,
    GridPayload,
    HealthReason,
    MaintenanceWindow,
    Node,
    PowerDomain,
)
from m2g.model.inputs import (
    Checkpoint,
    PodSetView,
    PowerCap,
    WorkloadKind,
    WorkloadView,
    aged_checkpoint,
    running_checkpoint,
    shallow_copy,
    shared_fields,
)

Obj = Mapping[str, Any]

DEFAULT_RACK_CAP_KW = 132.0
DEFAULT_INLET_LIMIT_C = 32.0
SITE_LEVEL = "Site"

GPU_CONDITIONS: Mapping[str, HealthReason] = {
    "GpuXidError": HealthReason.GPU_XID, "GPUXidError": HealthReason.GPU_XID,
    "GpuXid": HealthReason.GPU_XID,
    "NVLinkDown": HealthReason.NVLINK, "NVLinkError": HealthReason.NVLINK,
    "NvlinkError": HealthReason.NVLINK,
    "InfiniBandDown": HealthReason.INFINIBAND, "InfiniBandError": HealthReason.INFINIBAND,
    "IBLinkDown": HealthReason.INFINIBAND,
}
BAD_WHEN_TRUE = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable",
                           "KernelDeadlock", "ReadonlyFilesystem"})
COVERED_TAINTS = frozenset({"node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready",
                            "node.kubernetes.io/unreachable"})
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})

# ---- object access ------------------------------------------------------------------


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _spec(obj: Obj) -> Obj:
    spec: Obj = obj.get("spec") or {}
    return spec


def _status(obj: Obj) -> Obj:
    status: Obj = obj.get("status") or {}
    return status


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in _status(obj).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _true(obj: Obj, kind: str) -> bool:
    cond = condition(obj, kind)
    return bool(cond and cond.get("status") == "True")


def true_since(obj: Obj, kind: str) -> datetime | None:
    """When condition ``kind`` became True (None: not True, or no time)."""
    return _since(obj, kind, "True")


def false_since(obj: Obj, kind: str) -> datetime | None:
    """When condition ``kind`` became False (None: not False, absent, or no time)."""
    return _since(obj, kind, "False")


def _since(obj: Obj, kind: str, status: str) -> datetime | None:
    cond = condition(obj, kind)
    return parse_time(cond.get("lastTransitionTime")) \
        if cond and cond.get("status") == status else None


_PREEMPTOR = re.compile(r"\(UID: ([A-Za-z0-9-]{1,64})[,)]")


def preemptor(wl: Obj) -> str:
    """The UID of the workload Kueue preempted ``wl`` for, while its Preempted condition is
    True (Kueue's message: "Preempted to accommodate a workload (UID: <uid>, JobUID: …) due
    to …"); "" when there is none or the message does not name one."""
    cond = condition(wl, "Preempted")
    if not cond or cond.get("status") != "True":
        return ""
    found = _PREEMPTOR.search(str(cond.get("message", ""))[:1024])
    return found.group(1) if found and found.group(1) != "UNKNOWN" else ""


# ---- nodes and pods ----------------------------------------------------------------------


def container_gpus(pod_spec: Obj) -> int:
    """GPUs one pod asks for: its containers' requests (limits if no request), or the largest
    init container's if that is more."""
    def one(c: Obj) -> int:
        res = c.get("resources") or {}
        req = (res.get("requests") or {}).get(L.GPU_RESOURCE)
        if req is None:
            req = (res.get("limits") or {}).get(L.GPU_RESOURCE)
        return nonneg_int(req)

    main = sum(one(c) for c in pod_spec.get("containers") or [])
    init = max((one(c) for c in pod_spec.get("initContainers") or []), default=0)
    return max(main, init)


def allocated_gpus(pods: Iterable[Obj]) -> dict[str, int]:
    """Node name → GPUs requested by the non-terminal pods bound to it."""
    out: Counter[str] = Counter()
    for pod in pods:
        node = _spec(pod).get("nodeName")
        if not node or _status(pod).get("phase") in TERMINAL_POD_PHASES:
            continue
        out[str(node)] += container_gpus(_spec(pod))
    return dict(out)


def node_reasons(obj: Obj) -> tuple[str, ...]:
    """Why a node's capacity is not usable (empty: healthy), in a stable order."""
    reasons: list[str] = []
    if not _true(obj, "Ready"):
        reasons.append(HealthReason.NOT_READY)
    if _spec(obj).get("unschedulable"):
        reasons.append(HealthReason.CORDONED)
    for taint in _spec(obj).get("taints") or []:
        key = str(taint.get("key", ""))
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if key.startswith(("kwok.x-k8s.io/", L.M2G_TAINT_PREFIX)) or key in COVERED_TAINTS:
            continue
        reasons.append(HealthReason.TAINTED)
    for cond in _status(obj).get("conditions") or []:
        kind, status = str(cond.get("type", "")), cond.get("status")
        if status != "True":
            continue
        if kind in GPU_CONDITIONS:
            reasons.append(GPU_CONDITIONS[kind])
        elif kind in BAD_WHEN_TRUE or kind.endswith("Problem"):
            reasons.append(HealthReason.CONDITION)
    return tuple(dict.fromkeys(str(r) for r in reasons))


def is_gpu_node(obj: Obj, mapping: L.TopologyLabels = L.DEFAULT_TOPOLOGY_LABELS) -> bool:
    st = _status(obj)
    has_gpu = L.GPU_RESOURCE in (st.get("capacity") or {}) or \
        L.GPU_RESOURCE in (st.get("allocatable") or {})
    labels = _meta(obj).get("labels") or {}
    return has_gpu or bool(mapping.rack and mapping.rack in labels) or mapping.clique in labels


def node(obj: Obj, allocated: int = 0, xid_gpus: int = 0,
         mapping: L.TopologyLabels = L.DEFAULT_TOPOLOGY_LABELS) -> Node:
    """A Node object → model Node (see the module docstring)."""
    labels = _meta(obj).get("labels") or {}
    st = _status(obj)
    alloc_raw = (st.get("allocatable") or {}).get(L.GPU_RESOURCE)
    cap_raw = (st.get("capacity") or {}).get(L.GPU_RESOURCE, alloc_raw)
    allocatable, capacity = nonneg_int(alloc_raw), nonneg_int(cap_raw)
    gpus = max(capacity, allocatable)
    clique = str(labels.get(mapping.clique, ""))
    return Node(
        name=str(_meta(obj).get("name", "")),
        rack=str((labels.get(mapping.rack) if mapping.rack else "") or clique),
        gpus=gpus,
        gpus_allocated=max(0, allocated),
        unhealthy_gpus=min(gpus, max(gpus - allocatable, xid_gpus)),
        reasons=node_reasons(obj),
        clique=clique,
        block=str(labels.get(mapping.block, "")) if mapping.block else "",
        power_domain=str(labels.get(mapping.power_domain, "")) if mapping.power_domain else "",
        m2g_taints=m2g_taints(obj),
    )


def m2g_taints(obj: Obj) -> tuple[tuple[str, str], ...]:
    """m2g's own taints on a Node, (key, value), sorted."""
    return tuple(sorted((str(t.get("key", "")), str(t.get("value", "")))
                        for t in _spec(obj).get("taints") or []
                        if str(t.get("key", "")).startswith(L.M2G_TAINT_PREFIX)))


def tas_hosts(wl: Obj) -> set[str]:
    """The hostnames Kueue TAS assigned a Workload's pod sets (``status.admission.
    podSetAssignments[].topologyAssignment``, v1beta2's sliced form: per slice, the lowest
    level's value is ``universal`` or ``prefix + root + suffix`` for each of ``individual.roots``);
    empty when the lowest level is not ``kubernetes.io/hostname``."""
    hosts: set[str] = set()
    for psa in (_status(wl).get("admission") or {}).get("podSetAssignments") or []:
        ta = psa.get("topologyAssignment") or {}
        levels = ta.get("levels") or []
        if not levels or levels[-1] != L.HOSTNAME:
            continue
        for sl in ta.get("slices") or []:
            values = sl.get("valuesPerLevel") or []
            if len(values) != len(levels):
                continue
            last = values[-1] or {}
            if last.get("universal"):
                hosts.add(str(last["universal"]))
            ind = last.get("individual") or {}
            pre, suf = str(ind.get("prefix") or ""), str(ind.get("suffix") or "")
            hosts.update(f"{pre}{root}{suf}" for root in ind.get("roots") or [])
    return hosts


def _key(obj: Obj) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _owners(workloads: Iterable[Obj]) -> dict[str, str]:
    """Owner UID (the Job, or the plain pod) → the key of the Workload it owns."""
    return {str(ref["uid"]): _key(wl) for wl in workloads
            for ref in _meta(wl).get("ownerReferences") or [] if ref.get("uid")}


def placements(pods: Iterable[Obj], workloads: Iterable[Obj],
               host_to_node: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Workload "ns/name" → the nodes its unfinished pods are bound to, and the nodes Kueue TAS
    assigned it (pods not bound yet: gated, or held by a taint); sorted. ``host_to_node``: the
    ``kubernetes.io/hostname`` label → node name, where they differ."""
    owner_of: dict[str, str] = {}
    out: dict[str, set[str]] = {}
    hosts = host_to_node or {}
    for wl in workloads:
        key = _key(wl)
        owner_of.update(_owners([wl]))
        assigned = tas_hosts(wl)
        if assigned:
            out[key] = {hosts.get(h, h) for h in assigned}
    for pod in pods if owner_of else ():
        node_name = _spec(pod).get("nodeName")
        if not node_name or _status(pod).get("phase") in TERMINAL_POD_PHASES:
            continue
        meta = _meta(pod)
        uids = [str(r.get("uid", "")) for r in meta.get("ownerReferences") or []]
        uids.append(str(meta.get("uid", "")))
        owner = next((owner_of[u] for u in uids if u in owner_of), None)
        if owner is not None:
            out.setdefault(owner, set()).add(str(node_name))
    return {k: tuple(sorted(v)) for k, v in out.items()}


class PodFacts(NamedTuple):
    """What a snapshot reads of one Pod (``pod_facts``): the node of a bound, unfinished pod
    ("" otherwise) and its GPUs there, its owner UIDs then its own, and the checkpoint time an
    unfinished pod reports. A snapshot memo keeps them per resourceVersion: 56,000 pods at
    1,400 racks were read three times a snapshot (allocated GPUs, placements, checkpoints)."""

    node: str
    gpus: int
    uids: tuple[str, ...]
    checkpoint: datetime | None
    stopping: bool = False  # bound, unfinished and being deleted (deletionTimestamp set)
    #: a bound, unfinished pod's start (``started_at``; None: not running or not known) and
    #: whether it is bound but not running yet (phase Pending)
    started: datetime | None = None
    waiting: bool = False


def pod_facts(pod: Obj) -> PodFacts:
    """One pod's PodFacts; raises where ``allocated_gpus``, ``placements`` or
    ``pod_checkpoints`` could raise on it (and on some pods where they would not: the caller
    then uses those functions themselves)."""
    meta, spec, status = _meta(pod), _spec(pod), _status(pod)
    at = parse_time((meta.get("annotations") or {}).get(L.LAST_CHECKPOINT))
    phase = status.get("phase")
    terminal = phase in TERMINAL_POD_PHASES
    node_name = spec.get("nodeName")
    live = str(node_name) if node_name and not terminal else ""
    uids = (*(str(r.get("uid", "")) for r in meta.get("ownerReferences") or []),
            str(meta.get("uid", "")))
    return PodFacts(live, container_gpus(spec) if live else 0, uids,
                    None if terminal else at, bool(live and meta.get("deletionTimestamp")),
                    started_at(status) if live and phase == "Running" else None,
                    bool(live) and phase == "Pending")


def started_at(status: Obj) -> datetime | None:
    """When a Running pod started: the latest ``startedAt`` of its running containers, else
    its ``startTime`` (None: neither readable). Statuses of another shape are passed over, not
    raised on: one pod whose facts cannot be read sends every pod of the snapshot down the
    plain functions' path and out of ``live_pods``."""
    statuses = status.get("containerStatuses")
    starts: list[datetime] = []
    for c in statuses if isinstance(statuses, list) else ():
        state = c.get("state") if isinstance(c, dict) else None
        running = state.get("running") if isinstance(state, dict) else None
        t = parse_time(running.get("startedAt")) if isinstance(running, dict) else None
        if t is not None:
            starts.append(t)
    return max(starts) if starts else parse_time(status.get("startTime"))


class WorkloadLinks(NamedTuple):
    """What ``placements`` and ``pod_checkpoints`` read of one Workload: its "ns/name", the
    owner UIDs it claims, and the hosts Kueue TAS assigned it."""

    key: str
    owners: tuple[str, ...]
    tas: frozenset[str]


#: The TAS hosts of a Workload without any (one object, not one per Workload).
NO_HOSTS: frozenset[str] = frozenset()


def workload_links(wl: Obj) -> WorkloadLinks:
    """One Workload's WorkloadLinks (raises where ``placements`` would)."""
    hosts = tas_hosts(wl)
    return WorkloadLinks(_key(wl), tuple(_owners([wl])), frozenset(hosts) if hosts else NO_HOSTS)


def allocated_of(pods: Iterable[PodFacts]) -> dict[str, int]:
    """``allocated_gpus`` from the pods' facts."""
    out: Counter[str] = Counter()
    for p in pods:
        if p.node:
            out[p.node] += p.gpus
    return dict(out)


def placements_of(pods: Iterable[PodFacts], workloads: Iterable[WorkloadLinks],
                  host_to_node: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """``placements`` from the pods' facts and the workloads' links (in the same orders)."""
    owner_of: dict[str, str] = {}
    out: dict[str, set[str]] = {}
    hosts = host_to_node or {}
    for wl in workloads:
        owner_of.update(dict.fromkeys(wl.owners, wl.key))
        if wl.tas:
            out[wl.key] = {hosts.get(h, h) for h in wl.tas}
    for p in pods if owner_of else ():
        if not p.node:
            continue
        owner = next((owner_of[u] for u in p.uids if u in owner_of), None)
        if owner is not None:
            out.setdefault(owner, set()).add(p.node)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def live_pods_of(pods: Iterable[PodFacts], workloads: Iterable[WorkloadLinks]
                 ) -> dict[str, LivePods]:
    """Workload "ns/name" → its bound, unfinished pods (``ClusterSnapshot.live_pods``), from
    the pods' facts and the workloads' links, matched by owner UID as ``placements``."""
    owner_of = {u: wl.key for wl in workloads for u in wl.owners}
    counts: dict[str, list[int]] = {}
    starts: dict[str, datetime] = {}  # the latest start of each workload's pods
    for p in pods if owner_of else ():
        if not p.node:
            continue
        owner = next((owner_of[u] for u in p.uids if u in owner_of), None)
        if owner is not None:
            c = counts.setdefault(owner, [0, 0, 0])
            c[0] += 1
            c[1] += p.stopping
            c[2] += p.waiting
            if p.started is not None and (owner not in starts or p.started > starts[owner]):
                starts[owner] = p.started
    return {k: LivePods(n, s, starts.get(k), w) for k, (n, s, w) in counts.items()}


def live_pods(pods: Iterable[Obj], workloads: Iterable[Obj]) -> dict[str, LivePods]:
    """``live_pods_of`` over the raw objects (the path when an object cannot be read into
    facts: a pod that cannot be read is left out, as by ``placements``)."""
    facts: list[PodFacts] = []
    for pod in pods:
        try:
            facts.append(pod_facts(pod))
        except (AttributeError, TypeError, ValueError):
            continue
    links = [WorkloadLinks(_key(wl), tuple(_owners([wl])), frozenset()) for wl in workloads]
    return live_pods_of(facts, links)


def pod_checkpoints_of(pods: Iterable[PodFacts], workloads: Iterable[WorkloadLinks]
                       ) -> dict[str, datetime]:
    """``pod_checkpoints`` from the pods' facts and the workloads' links."""
    reports = [(p.uids, p.checkpoint) for p in pods if p.checkpoint is not None]
    if not reports:
        return {}
    return _newest_per_owner(reports, {u: wl.key for wl in workloads for u in wl.owners})


def _newest_per_owner(reports: Iterable[tuple[Sequence[str], datetime]],
                      owner_of: Mapping[str, str]) -> dict[str, datetime]:
    """Workload key → the newest of the reports whose UIDs (a pod's owners, then its own)
    name one of its objects in ``owner_of``."""
    out: dict[str, datetime] = {}
    for uids, at in reports:
        owner = next((owner_of[u] for u in uids if u in owner_of), None)
        if owner is not None and (owner not in out or at > out[owner]):
            out[owner] = at
    return out


# ---- m2g CRs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainSpec:
    """A PowerDomain CR as read: the model object plus what it says about racks."""

    domain: PowerDomain
    level: str = "PowerDomain"
    racks: tuple[str, ...] = ()
    rack_selector: Mapping[str, str] = field(default_factory=dict)
    rack_cap_kw: float = 0.0
    inlet_limit_c: float = 0.0

    def selects(self, rack: str, node_labels: Mapping[str, str],
                power_domain_label: str = "") -> bool:
        if rack in self.racks:
            return True
        if power_domain_label and node_labels.get(power_domain_label) == self.domain.name:
            return True
        sel = self.rack_selector
        return bool(sel) and all(node_labels.get(k) == v for k, v in sel.items())


def power_domain(obj: Obj) -> DomainSpec:
    """A PowerDomain CR → DomainSpec (``level: Site`` marks the site budget)."""
    spec = _spec(obj)
    selector = (spec.get("rackSelector") or {}).get("matchLabels") or {}
    return DomainSpec(
        domain=PowerDomain(name=str(_meta(obj).get("name", "")),
                           budget_kw=nonneg_float(spec.get("budgetKw"))),
        level=str(spec.get("level") or "PowerDomain"),
        racks=tuple(str(r) for r in spec.get("racks") or []),
        rack_selector={str(k): str(v) for k, v in selector.items()},
        rack_cap_kw=nonneg_float(spec.get("rackCapKw")),
        inlet_limit_c=nonneg_float(spec.get("inletLimitC")),
    )


def maintenance_window(obj: Obj) -> MaintenanceWindow | None:
    """A MaintenanceWindow CR → model; None when start/end are unreadable or end ≤ start."""
    spec = _spec(obj)
    start, end = parse_time(spec.get("start")), parse_time(spec.get("end"))
    if start is None or end is None or end <= start:
        return None
    scope = spec.get("scope") or {}
    lead = spec.get("drainLeadSeconds")
    return MaintenanceWindow(
        name=str(_meta(obj).get("name", "")), start=start, end=end,
        racks=tuple(str(x) for x in scope.get("racks") or []),
        nodes=tuple(str(x) for x in scope.get("nodes") or []),
        blocks=tuple(str(x) for x in scope.get("blocks") or []),
        drain_lead_seconds=None if lead is None else nonneg_float(lead),
    )


def grid_events(obj: Obj) -> tuple[GridEvent, ...]:
    """A GridEvent CR → one model event per readable interval (id ``eventID``, ``eventID/i``
    when there are several). Durations are ISO 8601 (OpenADR 3's ``intervalPeriod``)."""
    spec = _spec(obj)
    event_id = str(spec.get("eventID") or _meta(obj).get("name", ""))
    intervals = [i for i in spec.get("intervals") or [] if isinstance(i, Mapping)]
    baseline = nonneg_float(_status(obj).get("observedBaselineKw"))
    reduction = min(100.0, nonneg_float(spec.get("targetReductionPercent")))
    out: list[GridEvent] = []
    for i, interval in enumerate(intervals):
        start = parse_time(interval.get("start"))
        length = parse_duration(interval.get("duration"))
        if start is None or length is None:
            continue
        payload = interval.get("payload") or {}
        kind = str(payload.get("type", GridPayload.SIMPLE))
        value = quantity(payload.get("value", 0))
        if kind == GridPayload.IMPORT_CAPACITY_LIMIT:
            level, target, gp = 0, max(0.0, value), GridPayload.IMPORT_CAPACITY_LIMIT
        else:
            level, target, gp = min(3, max(0, int(value))), 0.0, GridPayload.SIMPLE
        out.append(GridEvent(
            id=event_id if len(intervals) == 1 else f"{event_id}/{i}",
            start=start, end=start + length, program=str(spec.get("programName", "")),
            payload=gp, level=level, target_kw=target, reduction_pct=reduction,
            baseline_kw=baseline, source=str(_meta(obj).get("name", "")),
        ))
    return tuple(out)


def grid_event_state(obj: Obj) -> GridEventState:
    """A GridEvent CR as a whole: first start, last end, reduction and status as read."""
    events = grid_events(obj)
    spec = _spec(obj)
    return GridEventState(
        name=str(_meta(obj).get("name", "")),
        event_id=str(spec.get("eventID") or _meta(obj).get("name", "")),
        start=min((e.start for e in events), default=None),
        end=max((e.end for e in events), default=None),
        reduction_pct=min(100.0, nonneg_float(spec.get("targetReductionPercent"))),
        status=dict(_status(obj)))


# ---- Kueue ------------------------------------------------------------------------------


def check_names(admission_checks: Iterable[Obj]) -> frozenset[str]:
    """Names of the AdmissionChecks m2g answers for (controllerName m2g.io/policy)."""
    return frozenset(str(_meta(a).get("name", "")) for a in admission_checks
                     if _spec(a).get("controllerName") == CHECK_CONTROLLER)


def _merged_metadata(wl: Obj, key: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for ps in reversed(_spec(wl).get("podSets") or []):  # the first pod set wins
        tmpl_meta = ((ps.get("template") or {}).get("metadata") or {}).get(key) or {}
        merged.update({str(k): str(v) for k, v in tmpl_meta.items()})
    merged.update({str(k): str(v) for k, v in (_meta(wl).get(key) or {}).items()})
    return merged


def own_annotations(wl: Obj) -> dict[str, str]:
    """The Workload's own annotations, where m2g writes its bookkeeping (``shed-at``,
    ``drained-for``). Never the pod templates' (``_merged_metadata``): those are the tenant's,
    and ``m2g.io/shed-at: 2099-…`` on one pending job's template stopped all grid shedding."""
    raw = _meta(wl).get("annotations")
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _kind(value: str | None) -> WorkloadKind:
    try:
        return WorkloadKind(value or "")
    except ValueError:
        return WorkloadKind.UNSPECIFIED


def _flex_tier(value: str | None) -> int:
    if value is None:
        return 0
    try:
        return min(3, max(0, int(str(value).strip())))
    except ValueError:
        return 0


def workload_phase(wl: Obj) -> Phase:
    if _true(wl, "Finished"):
        return Phase.FINISHED
    if _spec(wl).get("active") is False:
        return Phase.INACTIVE
    if _true(wl, "Admitted"):
        return Phase.ADMITTED
    if _true(wl, "QuotaReserved"):
        return Phase.RESERVED
    return Phase.PENDING


def min_flex_tiers(cluster_queues: Iterable[Obj]) -> dict[str, int]:
    """ClusterQueue name → the least flexible tier its workloads may claim
    (``m2g.io/min-flex-tier`` on the ClusterQueue: the platform's word, tenants cannot edit
    ClusterQueues). Queues without it, or with a value that is not 0–3, allow every tier."""
    out: dict[str, int] = {}
    for cq in cluster_queues:
        meta = _meta(cq)
        raw = (meta.get("annotations") or {}).get(L.MIN_FLEX_TIER) \
            if isinstance(meta.get("annotations"), dict) else None
        if raw is not None and str(raw).strip() in ("0", "1", "2", "3"):
            out[str(meta.get("name", ""))] = int(str(raw).strip())
    return out


def invalid_min_flex_tiers(cluster_queues: Iterable[Obj]) -> dict[str, str]:
    """ClusterQueue name → its ``m2g.io/min-flex-tier`` when set and not 0–3 (ignored by
    ``min_flex_tiers``: every tier allowed), to be reported rather than ignored silently."""
    out: dict[str, str] = {}
    for cq in cluster_queues:
        meta = _meta(cq)
        notes = meta.get("annotations")
        raw = notes.get(L.MIN_FLEX_TIER) if isinstance(notes, dict) else None
        if raw is not None and str(raw).strip() not in ("0", "1", "2", "3"):
            out[str(meta.get("name", ""))] = str(raw)[:64]
    return out


def workload(wl: Obj, now: datetime, *, local_queues: Mapping[str, str] | None = None,
             checks: frozenset[str] = frozenset(),
             tier_floors: Mapping[str, int] | None = None) -> WorkloadState:
    """A Kueue Workload → WorkloadState. ``local_queues``: "ns/name" → ClusterQueue;
    ``checks``: the names of m2g's AdmissionChecks (see ``check_names``); ``tier_floors``:
    ClusterQueue → least flexible tier allowed (``min_flex_tiers``): a tenant's lower
    ``m2g.io/flex-tier`` is raised to it, so a label cannot opt a job out of shedding."""
    meta, spec, st = _meta(wl), _spec(wl), _status(wl)
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    labels, annotations = _merged_metadata(wl, "labels"), _merged_metadata(wl, "annotations")
    queue = str(spec.get("queueName") or labels.get(L.QUEUE_NAME, ""))
    cq = str((st.get("admission") or {}).get("clusterQueue")
             or (local_queues or {}).get(f"{ns}/{queue}", ""))
    pod_sets = pod_set_views(tuple(
        (str(ps.get("name", "")), nonneg_int(ps.get("count", 1)),
         container_gpus((ps.get("template") or {}).get("spec") or {}))
        for ps in spec.get("podSets") or []))
    phase = workload_phase(wl)
    created = parse_time(meta.get("creationTimestamp"))
    waiting = phase in (Phase.PENDING, Phase.RESERVED) and created is not None
    reported = parse_time(annotations.get(L.LAST_CHECKPOINT) or labels.get(L.LAST_CHECKPOINT))
    admitted_at, reserved_at = (true_since(wl, kind) for kind in ("Admitted", "QuotaReserved"))

    def fact(key: str) -> str | None:
        return labels.get(key) if key in labels else annotations.get(key)

    # the time fields are derived at use (WorkloadState.view_at): an age 0 and its start
    ckpt, ckpt_since = checkpoint_anchor(nonneg_int(fact(L.CHECKPOINT_INTERVAL)), reported,
                                         admitted_at if phase is Phase.ADMITTED else None)

    view = shared_fields(WorkloadView(
        name=name, namespace=ns, queue=queue, cluster_queue=cq,
        priority=int_of(spec.get("priority")),
        priority_class=str((spec.get("priorityClassRef") or {}).get("name")
                           or labels.get(L.PRIORITY_CLASS, "")),
        kind=_kind(fact(L.WORKLOAD_KIND)),
        flex_tier=max(_flex_tier(fact(L.FLEX_TIER)), (tier_floors or {}).get(cq, 0)),
        pod_sets=pod_sets, labels=labels, annotations=annotations,
        expected_runtime_seconds=nonneg_int(fact(L.EXPECTED_RUNTIME)),
        wait_seconds=0,  # (set: the copies at use add no field, ``shallow_copy``)
        requeue_count=nonneg_int((st.get("requeueState") or {}).get("count")),
        estimated_kw=nonneg_float(fact(L.ESTIMATED_KW)),
        checkpoint=ckpt,
        topology_assigned=any(psa.get("topologyAssignment") for psa in (
            st.get("admission") or {}).get("podSetAssignments") or []),
    ))
    check, state, message = "", None, ""
    mine = [e for e in st.get("admissionChecks") or [] if e.get("name") in checks]
    # two checks of m2g's on one workload: the one waiting for an answer first, one a reconcile
    for entry in sorted(mine, key=lambda e: e.get("state") not in ("Pending", None)):
        check, message = str(entry["name"]), str(entry.get("message", ""))
        try:
            state = CheckState(entry.get("state", ""))
        except ValueError:
            state = None
        break
    own = own_annotations(wl)
    shed_at, restored_at = (parse_time(own.get(key)) for key in (SHED_AT, RESTORED_AT))
    if shed_at is not None and shed_at > now:  # a stamp from the future would pause pacing
        shed_at = now
    cap = power_cap(own.get(POWER_CAP))
    cap_at = parse_time(own.get(POWER_CAP_AT))  # with no cap: when it was lifted
    used = nonneg_float(own.get(FLEX_USED))
    if cap < 1.0 or used > 0:
        view = view.model_copy(update={"power_cap": PowerCap(
            capped=cap < 1.0, fraction=cap if cap < 1.0 else 0.0, flex_used_seconds=used)})
    return WorkloadState(
        namespace=ns, name=name, view=view, phase=phase, cluster_queue=cq, check=check,
        check_state=state, check_message=message, shed_by_m2g=SHED_AT in own,
        shed_at=shed_at, restored_at=min(restored_at, now) if restored_at else None,
        holds_quota=_true(wl, "QuotaReserved"), admitted_at=admitted_at,
        drained_for=own.get(DRAINED_FOR, ""), checkpoint_reported_at=reported,
        waiting_since=created if waiting else None, checkpoint_since=ckpt_since,
        power_cap=cap, power_cap_at=min(cap_at, now) if cap_at else None,
        flex_used_seconds=used,
        cap_curve=cap_curve(fact(L.POWER_CURVE)),
        owners=tuple(str(r.get("name")) for r in meta.get("ownerReferences") or []
                     if isinstance(r, Mapping) and r.get("name")),
        uid=str(meta.get("uid") or ""), reserved_at=reserved_at, preempted_by=preemptor(wl),
        released_at=_released(wl, now), **elastic_range(wl, own, fact(L.MIN_PARALLELISM), now))


def elastic_range(wl: Obj, own: Mapping[str, str], declared: str | None, now: datetime
                  ) -> dict[str, Any]:
    """The right-sizing fields of a Workload (``WorkloadState.elastic_job`` …): set when Kueue
    marks it elastic, a batch/v1 Job owns it, it has one pod set and the tenant's
    ``m2g.io/min-parallelism`` is an integer from 1 to its full parallelism; a declared
    minimum that is not says why in ``resize_note`` (reported, then ignored)."""
    if declared is None:
        return {}
    meta, pod_sets = _meta(wl), _spec(wl).get("podSets") or []
    job = next((r["name"] for r in meta.get("ownerReferences") or []
                if isinstance(r, Mapping) and r.get("kind") == "Job"
                and r.get("apiVersion") == "batch/v1" and isinstance(r.get("name"), str)), "")
    count = nonneg_int(pod_sets[0].get("count", 1)) if len(pod_sets) == 1 else 0
    # m2g writes str(int): anything else ("1e9", "٩") is no record
    recorded = int(own[RESIZED_FROM]) if _digits(own.get(RESIZED_FROM)) else 0
    full = recorded if count < recorded <= MAX_PARALLELISM else count
    raw = str(declared).strip()[:32]
    why = ""
    if own.get(L.ELASTIC_JOB) != "true" or not job:
        why = (f"{L.MIN_PARALLELISM} {raw!r} ignored: only an elastic batch/v1 Job "
               f"({L.ELASTIC_JOB}: \"true\") can be resized")
    elif len(pod_sets) != 1:
        why = f"{L.MIN_PARALLELISM} {raw!r} ignored: the workload has {len(pod_sets)} pod sets"
    elif not _digits(raw) or not 1 <= int(raw) <= full:
        why = f"{L.MIN_PARALLELISM} {raw!r} ignored: not an integer from 1 to {full}"
    if why:
        return {"resize_note": why}
    at = parse_time(own.get(RESIZED_AT)) if full > count else None
    return {"elastic_job": job, "parallelism": count, "min_parallelism": int(raw),
            "full_parallelism": full, "resized_at": min(at, now) if at else None}


#: A batch/v1 Job's parallelism is an int32: a bigger recorded full size is no record of m2g's
#: (a grow back to it could never be written)
MAX_PARALLELISM = 2**31 - 1


def _digits(value: str | None) -> bool:
    """An ASCII decimal integer: ``str.isdigit`` also takes "²" (which ``int`` refuses: the
    Workload was left out, so a tenant's annotation took a running job out of shedding) and
    "٥" or "８" (which it reads as 5 and 8); at most 32 digits (``int`` refuses 4,300)."""
    return value is not None and len(value) <= 32 and value.isascii() and value.isdigit()


def _released(wl: Obj, now: datetime) -> datetime | None:
    """When Kueue released the quota (QuotaReserved False), never after ``now``."""
    at = false_since(wl, "QuotaReserved")
    return min(at, now) if at is not None else None


def power_cap(value: str | None) -> float:
    """m2g's ``m2g.io/power-cap`` record: a fraction in [0.1, 1]; anything else reads 1 (none)."""
    try:
        f = float(value) if value is not None else 1.0
    except ValueError:
        return 1.0
    return f if 0.1 <= f <= 1.0 else 1.0


def cap_curve(value: str | None) -> tuple[tuple[float, float], ...]:
    """``m2g.io/power-curve`` ("cap:throughput,...") → points sorted by cap; a curve with a bad
    point, or with throughput rising as the cap falls, reads as none (its kind's curve)."""
    if not value:
        return ()
    try:
        pts = sorted((float(c), float(t)) for c, t in (
            p.split(":") for p in value.split(",")[:32] if p.strip()))
    except ValueError:
        return ()
    ok = len(pts) >= 2 and all(0 < c <= 1 and 0 <= t <= 1 for c, t in pts) and all(
        a[1] <= b[1] for a, b in pairwise(pts))
    return tuple(pts) if ok else ()


@lru_cache(maxsize=4_096)
def pod_set_views(pod_sets: tuple[tuple[str, int, int], ...]) -> tuple[PodSetView, ...]:
    """The PodSetViews of (name, count, GPUs per pod) triples, one tuple per distinct value
    (models are frozen): a site's 100,000 workloads have a few dozen shapes, and each view
    is ~500 bytes."""
    return tuple(shared_fields(PodSetView(name=n, count=c, gpus_per_pod=g))
                 for n, c, g in pod_sets)


@lru_cache(maxsize=16_384)
def _idle_checkpoint(interval: int, reported: bool) -> Checkpoint:
    """A not-running workload's Checkpoint, one per distinct value (as ``pod_set_views``)."""
    return shared_fields(Checkpoint(interval_seconds=interval, reported=reported))


def checkpoint(interval: int, reported: datetime | None, started: datetime | None,
               now: datetime) -> Checkpoint:
    """What an eviction at ``now`` would lose: the seconds since the newest of the reported
    checkpoint and the start of the current run (a report older than the start is of an
    earlier run, whose work the restart already lost or resumed). Not running: nothing."""
    had, since = checkpoint_anchor(interval, reported, started)
    return had if since is None else aged_checkpoint(
        had, max(0, int((now - since).total_seconds())))


def checkpoint_anchor(interval: int, reported: datetime | None, started: datetime | None
                      ) -> tuple[Checkpoint, datetime | None]:
    """``checkpoint`` derived at use: the Checkpoint at age 0 and the time its age counts
    from (None: not running, no age; the Checkpoint is the one at any time)."""
    if started is None:
        return _idle_checkpoint(interval, reported is not None), None
    fresh = reported is not None and reported >= started
    return running_checkpoint(interval, fresh, 0), (reported if reported is not None
                                                    and fresh else started)


def pod_checkpoints(pods: Iterable[Obj], workloads: Iterable[Obj]) -> dict[str, datetime]:
    """Workload "ns/name" → the newest ``m2g.io/last-checkpoint-time`` its unfinished pods
    report (matched by owner UID, as ``placements``). A job's process annotates its own pod
    (docs/policies.md, "Reporting checkpoints"); Kueue never copies that onto the Workload."""
    reports: list[tuple[list[str], datetime]] = []
    for pod in pods:
        meta = _meta(pod)
        at = parse_time((meta.get("annotations") or {}).get(L.LAST_CHECKPOINT))
        if at is None or _status(pod).get("phase") in TERMINAL_POD_PHASES:
            continue
        uids = [str(r.get("uid", "")) for r in meta.get("ownerReferences") or []]
        reports.append(([*uids, str(meta.get("uid", ""))], at))
    if not reports:
        return {}
    return _newest_per_owner(reports, _owners(workloads))


def with_pod_report(w: WorkloadState, pod_report: datetime | None) -> WorkloadState:
    """A converted ``w`` counting its pods' checkpoint report as well (the newer of the two);
    ``w`` itself when that changes nothing."""
    reported = w.checkpoint_reported_at
    if pod_report is None or (reported is not None and pod_report <= reported):
        return w  # (max: the first of equals)
    had = w.view.checkpoint
    running = w.phase is Phase.ADMITTED and w.admitted_at is not None
    ckpt, since = checkpoint_anchor(had.interval_seconds, pod_report,
                                    w.admitted_at if running else None)
    if since == w.checkpoint_since and ckpt == had:
        return w
    return w.with_view(shallow_copy(w.view, checkpoint=ckpt), checkpoint_since=since)


def cluster_queue(obj: Obj, resource: str = L.GPU_RESOURCE) -> QueueState:
    """A ClusterQueue → QueueState (the ``resource`` quota of each flavor)."""
    meta, spec, st = _meta(obj), _spec(obj), _status(obj)
    annotations = meta.get("annotations") or {}
    quotas: list[FlavorQuota] = []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            fname = str(flavor.get("name", ""))
            for res in flavor.get("resources") or []:
                if res.get("name") != resource:
                    continue
                nominal = nonneg_int(res.get("nominalQuota"))
                quotas.append(FlavorQuota(fname, resource, nominal,
                                          quota_base(annotations, fname, nominal)))
    used = sum(nonneg_int(r.get("total")) for f in st.get("flavorsUsage") or []
               for r in f.get("resources") or [] if r.get("name") == resource)
    weight_raw = (spec.get("fairSharing") or {}).get("weight")
    stop = str(spec.get("stopPolicy") or "None")
    return QueueState(
        name=str(meta.get("name", "")), quotas=tuple(quotas),
        stop_policy=stop, used_gpus=used,
        stop_set_by_m2g=stop != "None" and annotations.get(STOP_POLICY_SET) == stop,
        pending_workloads=nonneg_int(st.get("pendingWorkloads")),
        cohort=str(spec.get("cohortName") or ""),
        weight=quantity(weight_raw) if weight_raw is not None else None,
        last_quota_change=parse_time(annotations.get(QUOTA_CHANGED_AT)),
        within_preemption=str(preemption.get("withinClusterQueue") or "")
        if isinstance(preemption := spec.get("preemption"), dict) else "",
        within_preemption_base=str(annotations.get(BASE_WITHIN_PREEMPTION) or ""),
        min_flex_tier=min_flex_tiers([obj]).get(str(meta.get("name", "")), 0))


def resource_flavor(obj: Obj,
                    mapping: L.TopologyLabels = L.DEFAULT_TOPOLOGY_LABELS) -> FlavorState:
    """A ResourceFlavor → FlavorState; its domain is the rack, power domain or block its node
    labels pin it to (the site's mapping; "" = the whole site)."""
    node_labels = {str(k): str(v) for k, v in (_spec(obj).get("nodeLabels") or {}).items()}
    keys = (mapping.rack, mapping.power_domain, mapping.block)
    domain = next((node_labels[k] for k in keys if k and node_labels.get(k)), "")
    return FlavorState(name=str(_meta(obj).get("name", "")), domain=domain,
                       node_labels=node_labels)
