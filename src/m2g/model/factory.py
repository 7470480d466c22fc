"""The factory snapshot: site → power domains → blocks → racks (NVLink cliques) → nodes → GPUs.

Adapters fill a ``FactorySnapshot`` from the cluster and the signal sources; it is immutable and
carries the time it describes (``now``). The pure projection ``domain_views`` / ``site_view`` /
``grid_view`` turns it into the CEL inputs of m2g.model.inputs — what policies read.

Signals carry their age. A stale or missing power reading counts as *no headroom* (new work
waits) and is never a reason to shed; a stale thermal reading counts as *at the limit*. Both are
visible as ``stale`` in the snapshot and in metrics (docs/signals.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from m2g.model.inputs import (
    DomainKind,
    DomainMaintenance,
    DomainPower,
    DomainThermal,
    DomainView,
    GridEventView,
    GridView,
    SiteLabels,
    SitePower,
    SiteThermal,
    SiteView,
)
from m2g.model.labels import DEFAULT_TOPOLOGY_LABELS, TopologyLabels

GPUS_PER_NODE_NVL72 = 4
NODES_PER_RACK_NVL72 = 18


@dataclass(frozen=True, slots=True)
class Reading:
    """A measured value with its age; ``value`` is None when the signal is missing."""

    value: float | None
    age_seconds: float = 0.0
    max_age_seconds: float = 120.0

    @property
    def stale(self) -> bool:
        return self.value is None or self.age_seconds > self.max_age_seconds

    @property
    def missing(self) -> bool:
        """Never reported (no series at all), as opposed to reported and gone stale."""
        return self.value is None and self.age_seconds == float("inf")

    def or_else(self, fallback: float) -> float:
        """The value when fresh, else ``fallback`` (the caller's fail-safe)."""
        return fallback if self.stale or self.value is None else self.value


MISSING = Reading(None, float("inf"))


class HealthReason(StrEnum):
    """Why capacity is not usable."""

    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    TAINTED = "Tainted"
    GPU_XID = "GpuXid"
    NVLINK = "NVLinkDown"
    INFINIBAND = "InfiniBandDown"
    CONDITION = "NodeCondition"


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node (an NVL72 compute tray: 4 GPUs)."""

    name: str
    rack: str
    gpus: int = GPUS_PER_NODE_NVL72
    gpus_allocated: int = 0
    unhealthy_gpus: int = 0
    reasons: tuple[str, ...] = ()
    clique: str = ""
    block: str = ""
    power_domain: str = ""
    #: m2g's own taints on the node, (key, value): not health reasons (docs/controllers.md).
    m2g_taints: tuple[tuple[str, str], ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def healthy_gpus(self) -> int:
        return 0 if self.reasons else max(0, self.gpus - self.unhealthy_gpus)

    @property
    def free_gpus(self) -> int:
        return max(0, self.healthy_gpus - self.gpus_allocated)


@dataclass(frozen=True, slots=True)
class Rack:
    """A rack; on NVL72 one rack is one NVLink clique (``clique`` is its GFD label value)."""

    name: str
    block: str
    power_domain: str
    clique: str = ""
    power_kw: Reading = MISSING
    cap_kw: float = 0.0
    inlet_c: Reading = MISSING
    limit_c: float = 0.0
    thermal_alarm: bool = False


@dataclass(frozen=True, slots=True)
class PowerDomain:
    """A feed (PDU / busway / substation leg) and the racks it powers."""

    name: str
    budget_kw: float = 0.0
    draw_kw: Reading = MISSING


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
    """Planned maintenance on some racks / nodes / blocks, from ``start`` to ``end``."""

    name: str
    start: datetime
    end: datetime
    racks: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    drain_lead_seconds: float | None = None  # None: the planner's default

    def covers(self, node: Node) -> bool:
        return node.rack in self.racks or node.name in self.nodes or node.block in self.blocks


class GridPayload(StrEnum):
    """OpenADR 3 payload types m2g acts on."""

    IMPORT_CAPACITY_LIMIT = "IMPORT_CAPACITY_LIMIT"
    SIMPLE = "SIMPLE"


@dataclass(frozen=True, slots=True)
class GridEvent:
    """An OpenADR 3 shaped event: a capacity limit (kW) or a SIMPLE level, over an interval."""

    id: str
    start: datetime
    end: datetime
    program: str = ""
    payload: GridPayload = GridPayload.SIMPLE
    level: int = 0
    target_kw: float = 0.0
    reduction_pct: float = 0.0
    baseline_kw: float = 0.0  # status.observedBaselineKw: the pre-event draw, for reduction_pct
    source: str = ""  # the name of the GridEvent object the interval belongs to

    def active(self, now: datetime) -> bool:
        return self.start <= now < self.end

    def target(self) -> float:
        """The kW limit: explicit, or the baseline less the asked reduction (0: no limit)."""
        if self.target_kw > 0:
            return self.target_kw
        if self.reduction_pct > 0 and self.baseline_kw > 0:
            return self.baseline_kw * (1 - self.reduction_pct / 100)
        return 0.0


@dataclass(frozen=True)
class FactorySnapshot:
    """Everything m2g knows about the factory at ``now``."""

    now: datetime
    site: str = "site"
    site_budget_kw: float = 0.0
    site_limit_c: float = 0.0
    power_domains: tuple[PowerDomain, ...] = ()
    racks: tuple[Rack, ...] = ()
    nodes: tuple[Node, ...] = ()
    maintenance: tuple[MaintenanceWindow, ...] = ()
    grid_events: tuple[GridEvent, ...] = ()
    #: The site's topology label mapping as the nodes bear it out (m2g.k8s.build).
    labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS
    _by_rack: dict[str, list[Node]] = field(default_factory=dict, init=False, repr=False,
                                            compare=False)

    def __post_init__(self) -> None:
        for node in self.nodes:
            self._by_rack.setdefault(node.rack, []).append(node)

    def nodes_of(self, rack: str) -> list[Node]:
        return self._by_rack.get(rack, [])

    def room_under_rack_caps_kw(self) -> float:
        """The most the racks can still add to what they read: the sum over racks of their
        cap (``Rack.cap_kw``, the most a rack can draw) less their fresh reading, never below
        0; a rack without a fresh reading adds 0 (a bound on the draw counts it at its cap
        already). ``inf`` when a rack has no cap or there is no rack: no bound known."""
        room = 0.0
        for r in self.racks:
            if r.cap_kw <= 0:
                return math.inf
            if not r.power_kw.stale and r.power_kw.value is not None:
                room += max(0.0, r.cap_kw - r.power_kw.value)
        return room if self.racks else math.inf

    def site_draw_kw(self) -> Reading:
        """Site draw: the sum of rack readings; stale if any rack is stale."""
        readings = [r.power_kw for r in self.racks]
        if not readings or any(r.stale for r in readings):
            age = max((r.age_seconds for r in readings), default=float("inf"))
            return Reading(None, age)
        return Reading(sum(r.value or 0.0 for r in readings),
                       max(r.age_seconds for r in readings))

    def grid_event(self) -> GridEvent | None:
        """The active event, else the next one to start."""
        active = [e for e in self.grid_events if e.active(self.now)]
        if active:
            return min(active, key=lambda e: e.target() or float("inf"))
        upcoming = [e for e in self.grid_events if e.start > self.now]
        return min(upcoming, key=lambda e: e.start) if upcoming else None

    def effective_budget_kw(self) -> float:
        """The site budget, lowered by an active grid event's capacity limit or reduction."""
        event = self.grid_event()
        budget = self.site_budget_kw
        if event is None or not event.active(self.now):
            return budget
        target = event.target()
        if target > 0:
            return min(budget, target) if budget else target
        return budget


    def limit_ahead_kw(self, seconds: float) -> float:
        """The lowest limit in force from now to ``seconds`` from now: the effective budget,
        and the kW limit of every grid event interval that starts within that time (a ramp's
        later steps, a notified event). 0: no limit known. The curtailment planner plans
        against it, since a pause shows in the meter only once Kueue has stopped the pods."""
        limit = self.effective_budget_kw()
        if seconds <= 0:
            return limit
        horizon = self.now + timedelta(seconds=seconds)
        for e in self.grid_events:
            target = e.target() if self.now < e.start <= horizon and e.end > e.start else 0.0
            if target > 0:
                limit = min(limit, target) if limit > 0 else target
        return limit


def _seconds(a: datetime, b: datetime) -> int:
    return int((b - a).total_seconds())


def _seconds_up(a: datetime, b: datetime) -> int:
    """Whole seconds from ``a`` to ``b``, rounded up: an event ending in 0.4 s ends in 1 s,
    not in 0 (which policies read as "no end known")."""
    return math.ceil((b - a).total_seconds())


def _maintenance(snap: FactorySnapshot, nodes: Iterable[Node]) -> DomainMaintenance:
    """A domain is in (or heading for) maintenance when a window covers all its nodes. A window
    on part of it (one rack of the site, one node of a rack) does not take the whole domain
    down: m2g taints the covered nodes, so new pods go to the rest (docs/controllers.md)."""
    if not snap.maintenance:  # no window: no list of the domain's nodes to make
        return DomainMaintenance(active=False, starts_in_seconds=0)
    nodes = list(nodes)
    active, starts = False, 0
    for w in snap.maintenance:
        if not nodes or not all(w.covers(n) for n in nodes) or w.end <= snap.now:
            continue
        if w.start <= snap.now:
            active = True
        else:
            s = _seconds(snap.now, w.start)
            starts = s if starts == 0 else min(starts, s)
    return DomainMaintenance(active=active, starts_in_seconds=starts)


def _gpu_counts(nodes: Iterable[Node]) -> dict[str, Any]:
    nodes = list(nodes)
    return {"total_gpus": sum(n.gpus for n in nodes),
            "healthy_gpus": sum(n.healthy_gpus for n in nodes),
            "free_gpus": sum(n.free_gpus for n in nodes)}


def _summed(counts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``_gpu_counts`` of the nodes of several racks from each rack's counts (the same
    integers: every node's GPUs counted once, not once per domain above it)."""
    total = healthy = free = 0
    for c in counts:
        total += c["total_gpus"]
        healthy += c["healthy_gpus"]
        free += c["free_gpus"]
    return {"total_gpus": total, "healthy_gpus": healthy, "free_gpus": free}


def _racks_by(racks: Iterable[Rack], attr: str) -> dict[str, list[Rack]]:
    """The racks grouped by ``attr`` (power_domain, block), in the snapshot's order: one pass
    instead of a pass over every rack per domain (1,400 racks, 88 power domains, 175
    blocks)."""
    out: dict[str, list[Rack]] = {}
    for r in racks:
        out.setdefault(getattr(r, attr), []).append(r)
    return out


def rack_alarm(rack: Rack) -> bool:
    """The facility's alarm bit, or a fresh inlet reading at or over the rack's limit."""
    over = (not rack.inlet_c.stale and rack.inlet_c.value is not None and rack.limit_c > 0
            and rack.inlet_c.value >= rack.limit_c)
    return rack.thermal_alarm or over


def _thermal(rack: Rack) -> tuple[float, float]:
    """(inlet, limit) as policies see them. A reading that went stale counts as at the limit
    (fail-safe); a rack with no thermal series at all reads as unknown (0, 0), so a factory
    without thermal telemetry is not held up as if every rack were hot — the facility's own
    protection still trips."""
    if rack.inlet_c.missing:
        return 0.0, 0.0
    return rack.inlet_c.or_else(rack.limit_c), rack.limit_c


def _rack_view(snap: FactorySnapshot, rack: Rack, kind: DomainKind, name: str,
               counts: dict[str, Any] | None = None) -> DomainView:
    """The view of ``rack`` as a rack or as its clique; ``counts``: its nodes' _gpu_counts
    when known."""
    nodes = snap.nodes_of(rack.name)
    draw = rack.power_kw.or_else(rack.cap_kw)  # stale power: assume the rack is at its cap
    inlet, limit = _thermal(rack)
    return DomainView(
        name=name, parent=rack.block if kind is DomainKind.RACK else rack.name, kind=kind,
        power=DomainPower(draw_kw=draw, cap_kw=rack.cap_kw),
        thermal=DomainThermal(inlet_c=inlet, limit_c=limit, alarm=rack_alarm(rack)),
        maintenance=_maintenance(snap, nodes),
        **(_gpu_counts(nodes) if counts is None else counts),
    )


def domain_views(snap: FactorySnapshot, *, with_nodes: bool = False) -> dict[str, DomainView]:
    """The ``domains`` CEL input: site, power domains, blocks, racks, cliques (and nodes)."""
    views: dict[str, DomainView] = {}
    views[snap.site] = DomainView(
        name=snap.site, kind=DomainKind.SITE, **_gpu_counts(snap.nodes),
        power=DomainPower(draw_kw=snap.site_draw_kw().or_else(snap.site_budget_kw),
                          cap_kw=snap.site_budget_kw),
        maintenance=_maintenance(snap, snap.nodes),
    )
    counts = {r.name: _gpu_counts(snap.nodes_of(r.name)) for r in snap.racks}
    by_domain = _racks_by(snap.racks, "power_domain")
    for pd in snap.power_domains:
        racks = by_domain.get(pd.name, [])
        nodes = (n for r in racks for n in snap.nodes_of(r.name))
        rack_sum = Reading(sum(r.power_kw.value or 0.0 for r in racks),
                           max((r.power_kw.age_seconds for r in racks), default=0.0)) \
            if racks and not any(r.power_kw.stale for r in racks) else MISSING
        draw = pd.draw_kw if not pd.draw_kw.stale else rack_sum
        views[pd.name] = DomainView(
            name=pd.name, parent=snap.site, kind=DomainKind.POWER_DOMAIN,
            **_summed(counts[r.name] for r in racks),
            power=DomainPower(draw_kw=draw.or_else(pd.budget_kw), cap_kw=pd.budget_kw),
            maintenance=_maintenance(snap, nodes),
        )
    by_block = _racks_by(snap.racks, "block")
    for block in sorted(b for b in by_block if b):
        racks = by_block[block]
        views[block] = DomainView(
            name=block, parent=snap.site, kind=DomainKind.BLOCK,
            maintenance=_maintenance(snap, (n for r in racks for n in snap.nodes_of(r.name))),
            **_summed(counts[r.name] for r in racks))
    for rack in snap.racks:
        views[rack.name] = _rack_view(snap, rack, DomainKind.RACK, rack.name, counts[rack.name])
        if rack.clique and rack.clique != rack.name:
            views[rack.clique] = _rack_view(snap, rack, DomainKind.CLIQUE, rack.clique,
                                            counts[rack.name])
    if with_nodes:
        for node in snap.nodes:
            views[node.name] = DomainView(name=node.name, parent=node.rack, kind=DomainKind.NODE,
                                          maintenance=_maintenance(snap, [node]),
                                          **_gpu_counts([node]))
    return views


def site_view(snap: FactorySnapshot) -> SiteView:
    """The ``site`` CEL input: power against the site's own budget (a grid event's limit is in
    ``grid.event.targetKw``, not folded in here); thermal: the hottest rack."""
    budget = snap.site_budget_kw
    draw = snap.site_draw_kw().or_else(budget)  # stale: no headroom for new work
    known = [r for r in snap.racks if not r.inlet_c.missing]
    inlets = [_thermal(r)[0] for r in known]
    limit = (snap.site_limit_c or min((r.limit_c for r in known if r.limit_c), default=0.0)
             ) if known else 0.0
    lab = snap.labels
    return SiteView(power=SitePower(budget_kw=budget, draw_kw=draw),
                    thermal=SiteThermal(max_inlet_c=max(inlets, default=0.0), limit_c=limit),
                    labels=SiteLabels(clique=lab.clique, rack=lab.rack, block=lab.block,
                                      power_domain=lab.power_domain))


def grid_view(snap: FactorySnapshot) -> GridView:
    """The ``grid`` CEL input: the active event, else the next one (active=false)."""
    ev = snap.grid_event()
    if ev is None:
        return GridView()
    return GridView(event=GridEventView(
        active=ev.active(snap.now), id=ev.id, level=ev.level, target_kw=ev.target(),
        reduction_pct=ev.reduction_pct,
        starts_in_seconds=max(0, _seconds_up(snap.now, ev.start)),
        ends_in_seconds=max(0, _seconds_up(snap.now, ev.end)),
    ))
