"""Reservations: capacity held over time for a tenant or named workloads (m2g.model.schedule).

Computed once per snapshot (``ReservationBook``). For each Reservation, in order of start:

* **Invalid** — it cannot be honoured (more GPUs or cliques than the site or block has, a block
  that does not exist, or it overlaps earlier reservations beyond the healthy capacity): it is
  reported in its status and decides nothing; the others go on.
* **Pending** until ``leadSeconds`` (default ``reservation_lead_seconds``) before the start.
* **Holding** until the start: the reserved capacity is kept free. A workload that is not the
  reservation's is admitted only if it is expected to finish before the start (expected runtime:
  ``m2g.io/expected-runtime-seconds``, else ``default_runtime_seconds``) or fits in the capacity
  outside the held cliques / held GPUs; from ``drainLeadSeconds`` before the start, admitted work
  on the held cliques that would not finish in time is drained (as a maintenance drain:
  ``m2g.io/drained-for: reservation/<name>``), and for a GPU-count reservation enough such work
  to free the GPUs. Named workloads that come early keep their quota with m2g's check Pending
  until the start.
* **Active** from the start: the capacity is the reservation's workloads' (others are kept off
  it as before); **Released** at the end, or once every named workload has finished.

Held cliques stay those in ``status.heldCliques`` while they are usable (no churn between
reconciles); new ones are the least-allocated healthy cliques (in ``block`` when given).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import Node, Rack
from m2g.model.plan import ReservationStatusUpdate, ShedAction
from m2g.model.schedule import Reservation, ReservationPhase
from m2g.planner.config import PlannerConfig
from m2g.planner.shedding import workload_kw

P = ReservationPhase


@dataclass
class Held:
    """One reservation as this snapshot sees it."""

    r: Reservation
    phase: ReservationPhase
    message: str
    cliques: tuple[str, ...] = ()
    nodes: frozenset[str] = frozenset()
    gpus: int = 0  # the GPUs it reserves (cliques × their size, or spec.gpus)
    used: int = 0  # GPUs its own admitted workloads hold
    owned: list[str] = field(default_factory=list)

    @property
    def holding(self) -> bool:
        return self.phase in (P.HOLDING, P.ACTIVE)

    @property
    def free_need(self) -> int:
        """GPUs to keep free for it now (count-level; cliques are kept by node)."""
        return max(0, self.gpus - self.used) if self.holding and not self.r.cliques else 0


def owns(r: Reservation, w: WorkloadState) -> bool:
    """Is ``w`` one of the reservation's workloads (named, or the tenant's)?"""
    if r.workloads and not w.names().isdisjoint(r.workloads):
        return True
    return bool(r.namespace) and not r.workloads and w.namespace == r.namespace and (
        not r.local_queue or w.view.queue == r.local_queue)


def runtime_seconds(w: WorkloadState, config: PlannerConfig) -> float:
    """The expected runtime: the workload's own word, else the documented default."""
    return float(w.view.expected_runtime_seconds or config.default_runtime_seconds)


def ends_by(w: WorkloadState, config: PlannerConfig, now: datetime) -> datetime:
    """When ``w`` is expected to finish (running: from its admission; waiting: from now)."""
    began = w.admitted_at if w.phase is Phase.ADMITTED and w.admitted_at else now
    return max(now, began + timedelta(seconds=runtime_seconds(w, config)))


def _cliques(snap: ClusterSnapshot) -> dict[str, list[Node]]:
    """Clique (the rack's GFD clique, else the rack) → its nodes."""
    out: dict[str, list[Node]] = {}
    for rack in snap.factory.racks:
        out.setdefault(rack.clique or rack.name, []).extend(snap.factory.nodes_of(rack.name))
    return out


class ReservationBook:
    """Every reservation's phase, held capacity and effect, for one snapshot."""

    def __init__(self, snap: ClusterSnapshot, config: PlannerConfig) -> None:
        self.snap, self.config, self.now = snap, config, snap.now
        self.held: list[Held] = []
        if not snap.reservations:
            return
        cliques = _cliques(snap)
        racks = {r.clique or r.name: r for r in snap.factory.racks}
        healthy = {c: ns for c, ns in cliques.items() if ns and all(n.healthy for n in ns)}
        size = max((sum(n.gpus for n in ns) for ns in cliques.values()), default=0)
        total = sum(n.healthy_gpus for n in snap.factory.nodes)
        taken: set[str] = set()
        accepted: list[Held] = []
        for r in sorted(snap.reservations, key=lambda x: (x.start, x.name)):
            h = self._one(r, cliques, racks, healthy, size, total, accepted, taken)
            self.held.append(h)
            if h.phase is not P.INVALID:
                accepted.append(h)
        self.held_nodes = frozenset(n for h in self.held if h.holding for n in h.nodes)

    # ---- phases --------------------------------------------------------------------------

    def _one(self, r: Reservation, cliques: dict[str, list[Node]], racks: dict[str, Rack],
             healthy: dict[str, list[Node]], size: int, total: int, accepted: list[Held],
             taken: set[str]) -> Held:
        scope = [c for c in cliques if not r.block or racks[c].block == r.block]
        if r.block and not scope:
            return Held(r, P.INVALID, f"block {r.block} has no GPU nodes")
        gpus = r.cliques * size if r.cliques else r.gpus
        have = len(scope) if r.cliques else total
        if (r.cliques or gpus) > have:
            what = "cliques" if r.cliques else "healthy GPUs"
            return Held(r, P.INVALID, f"asks for {r.cliques or gpus} {what}; "
                        f"{'block ' + r.block if r.block else 'the site'} has {have}")
        overlap = [h for h in accepted if h.r.start < r.end and r.start < h.r.end
                   and h.phase is not P.RELEASED]
        if overlap and sum(h.gpus for h in overlap) + gpus > total:
            names = ", ".join(h.r.name for h in overlap)
            return Held(r, P.INVALID, f"overlaps {names}: together "
                        f"{sum(h.gpus for h in overlap) + gpus} of {total} healthy GPUs")
        h = Held(r, self._phase(r), "", gpus=gpus)
        mine = [w for w in self.snap.workloads if owns(r, w)]
        h.owned = sorted(w.key for w in mine if w.phase is Phase.ADMITTED)
        h.used = sum(w.view.gpus for w in mine if w.phase is Phase.ADMITTED)
        if h.holding and r.cliques:
            self._pick(h, [c for c in scope if c in healthy and c not in taken], cliques)
            taken.update(h.cliques)
        h.message = self._message(h)
        return h

    def _phase(self, r: Reservation) -> ReservationPhase:
        now = self.now
        if now >= r.end:
            return P.RELEASED
        if now >= r.start:
            finished = {n for w in self.snap.workloads if w.phase is Phase.FINISHED
                        for n in w.names()}
            done = bool(r.workloads) and set(r.workloads) <= finished
            if done or r.status.get("phase") == P.RELEASED.value:
                return P.RELEASED
            return P.ACTIVE
        return P.HOLDING if now >= r.hold_from(self.config.reservation_lead_seconds) \
            else P.PENDING

    def _pick(self, h: Held, usable: list[str], cliques: dict[str, list[Node]]) -> None:
        keep = [c for c in h.r.held_cliques if c in usable]
        rest = sorted((c for c in usable if c not in keep),
                      key=lambda c: (sum(n.gpus_allocated for n in cliques[c]), c))
        h.cliques = tuple((keep + rest)[:h.r.cliques])
        h.nodes = frozenset(n.name for c in h.cliques for n in cliques[c])

    def _message(self, h: Held) -> str:
        r = h.r
        what = f"{len(h.cliques)} clique(s) {', '.join(h.cliques)}" if r.cliques else \
            f"{h.gpus} GPUs"
        start, end = f"{r.start:%Y-%m-%d %H:%M:%S}Z", f"{r.end:%Y-%m-%d %H:%M:%S}Z"
        if h.phase is P.PENDING:
            return f"holds {h.gpus} GPUs from " \
                f"{r.hold_from(self.config.reservation_lead_seconds):%Y-%m-%d %H:%M:%S}Z"
        if h.phase is P.HOLDING:
            short = f" (of {r.cliques} asked: the others are unhealthy or held)" \
                if r.cliques and len(h.cliques) < r.cliques else ""
            return f"keeping {what} free for the start at {start}{short}: only work " \
                "expected to finish before it is admitted there"
        if h.phase is P.ACTIVE:
            return f"{what} given to its workloads until {end}; {h.used} GPUs in use"
        return "released: ended" if self.now >= r.end else \
            "released: its workloads finished"

    # ---- admission ---------------------------------------------------------------------

    def gates(self, waiting: Iterable[WorkloadState]) -> dict[str, tuple[str, bool]]:
        """Workload key → (why a reservation holds it back, whether to keep it Pending) for the
        workloads awaiting an answer, in order (capacity granted to one is gone for the next).
        Other work is answered Retry. A reservation's named workload that arrives before the
        start is left Pending (with the reason): Kueue keeps its quota and its placement, and
        m2g answers Ready at the start — a Retry would have Kueue evict and requeue it, and
        Kueue TAS took a minute and more to place it again (the e2e test saw it start late)."""
        active = [h for h in self.held if h.holding]
        if not active:
            return {}
        free = self._free_outside() - sum(h.free_need for h in active)
        out: dict[str, tuple[str, bool]] = {}
        for w in waiting:
            why = self._gate(w, active, free)
            if why:
                out[w.key] = (why, self._named_early(w, active))
            elif not any(owns(h.r, w) and h.phase is P.ACTIVE for h in active):
                free -= w.view.gpus
        return out

    @staticmethod
    def _named_early(w: WorkloadState, active: list[Held]) -> bool:
        return any(h.phase is P.HOLDING and h.r.workloads and owns(h.r, w) for h in active)

    def _free_outside(self) -> int:
        nodes = self.snap.factory.nodes
        unbound = sum(w.view.gpus for w in self.snap.workloads if w.phase is Phase.ADMITTED
                      and not self.snap.placements.get(w.key))
        return sum(n.free_gpus for n in nodes if n.name not in self.held_nodes) - unbound

    def _gate(self, w: WorkloadState, active: list[Held], free: int) -> str:
        for h in active:
            mine = owns(h.r, w)
            if mine and h.phase is P.ACTIVE:
                return ""
            if mine and h.phase is P.HOLDING and h.r.workloads:
                return f"reservation {h.r.name}: starts at {h.r.start:%Y-%m-%d %H:%M:%S}Z"
        soon = [h for h in active if h.phase is P.HOLDING]
        if soon and all(ends_by(w, self.config, self.now) <= h.r.start for h in soon) and all(
                h.phase is P.HOLDING for h in active):
            return ""  # short work: done before every hold it could be in the way of
        placed = set(self.snap.placements.get(w.key, ()))
        for h in active:
            if placed & h.nodes:
                return f"reservation {h.r.name}: placed on held clique(s) " \
                    f"{', '.join(h.cliques)}; {h.message}"
        if w.view.gpus > free:
            names = ", ".join(h.r.name for h in active)
            return f"reservation(s) {names}: {max(0, free)} GPUs free outside the held " \
                f"capacity, {w.view.gpus} asked"
        return ""

    # ---- drains and status --------------------------------------------------------------

    def drains(self, skip: frozenset[str]) -> list[ShedAction]:
        """Evict admitted work in a hold's way once its drain lead has begun."""
        out: list[ShedAction] = []
        seen = set(skip)
        for h in self.held:
            if not h.holding or self.now < self._drain_from(h.r):
                continue
            due = [w for w in self.snap.workloads if w.phase is Phase.ADMITTED
                   and w.key not in seen and not owns(h.r, w)
                   and (h.phase is P.ACTIVE or ends_by(w, self.config, self.now) > h.r.start)]
            if h.r.cliques:
                due = [w for w in due if set(self.snap.placements.get(w.key, ())) & h.nodes]
            else:
                due = self._enough(h, due)
            for w in due:
                seen.add(w.key)
                out.append(ShedAction(w.namespace, w.name, False, workload_kw(w, self.config),
                                      f"drain for reservation {h.r.name} (starts at "
                                      f"{h.r.start:%Y-%m-%d %H:%M:%S}Z): the workload would "
                                      "not finish before it", drain=f"reservation/{h.r.name}"))
        return out

    def _enough(self, h: Held, due: list[WorkloadState]) -> list[WorkloadState]:
        """For a GPU-count hold: the fewest of ``due`` (freshest checkpoint first) to free its
        GPUs, counting work that ends before the start as freed."""
        free = sum(n.free_gpus for n in self.snap.factory.nodes) + sum(
            w.view.gpus for w in self.snap.workloads if w.phase is Phase.ADMITTED
            and not owns(h.r, w) and ends_by(w, self.config, self.now) <= h.r.start)
        out: list[WorkloadState] = []
        for w in sorted(due, key=lambda x: (not x.checkpoint_at(self.now).reported, x.key)):
            if free >= h.free_need:
                break
            out.append(w)
            free += w.view.gpus
        return out

    def _drain_from(self, r: Reservation) -> datetime:
        lead = self.config.maintenance_drain_lead_seconds if r.drain_lead_seconds is None \
            else r.drain_lead_seconds
        return r.start - timedelta(seconds=lead)

    def statuses(self) -> list[ReservationStatusUpdate]:
        out: list[ReservationStatusUpdate] = []
        for h in self.held:
            want: dict[str, Any] = {"phase": h.phase.value, "message": h.message,
                                    "heldGpus": h.gpus if h.holding else 0,
                                    "heldCliques": list(h.cliques), "workloads": h.owned}
            if any(h.r.status.get(k) != v for k, v in want.items()):
                out.append(ReservationStatusUpdate(h.r.name, want))
        return out

    def boundaries(self) -> list[datetime]:
        """Times after now at which a reservation changes phase or starts draining."""
        lead = self.config.reservation_lead_seconds
        return [t for h in self.held if h.phase is not P.INVALID
                for t in (h.r.hold_from(lead), self._drain_from(h.r), h.r.start, h.r.end)
                if t > self.now]
