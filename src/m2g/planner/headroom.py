"""The site's power headroom, spent once across the work one reconcile admits
(docs/curtailment.md, "Admission shares the headroom").

Admission policies decide each workload against the same snapshot: grid-demand-response
admits flexible work when ``site.power.drawKw`` plus its own kW stays under the event's
target. Each workload that fits alone is admitted, however many there are: in a 16-rack twin
event (2026-12-01, 23:06 UTC) one reconcile admitted 35 flex-2 jobs, ~600 kW, into 20 kW of
room, and the next reconciles capped them all. The gate spends the room once, after the
policies:

* room = the limit in force (an active grid event's target, else the site budget) less
  ``restore_margin`` of it (the margin restores keep), less the measured draw, less the kW
  the meter does not show yet (m2g.planner.shedding.in_flight_kw: work admitted within
  ``settle_seconds`` that is not in the reading yet — no pod bound, or not running yet, or
  started less than ``meter_lag_seconds`` before the reading — and work m2g restored that
  is not admitted again yet);
* the tiers that demand response holds back (the shipped grid-demand-response's: flex ≥ 2,
  or flex ≥ 1 from SIMPLE level 2 of an active event; ``headroom_min_tier``) are gated, and
  during an active event every tier from ``headroom_event_min_tier`` (1: new flex-1 work too,
  whatever the event's level — work admitted into an event's shortfall is paid for by pausing
  running flexible work: a 16-rack twin event admitted 58 flex-1 and 72 flex-0 workloads,
  250–490 kW, while its flex-2/3 work was paused 85–89 % of the event; 0 holds firm work
  too); the others (firm work) spend the room first and are held back only during an
  active event, when even pausing the running flexible work would not make room for them
  (``hold_firm_beyond_reach``, ``_firm_reach``) — and, while work m2g paused waits to come
  back, whenever the room beyond that paused work's kW does not hold them
  (``restore_before_firm``, ``paused_kw``: paused work first);
* then the gated workloads the policies admit: first those m2g restored (their room was kept
  for them: admitted while the room under the limit itself, theirs counted, is not
  negative — a restore keeps its own ``restore_band``, not ``restore_margin``), then the others,
  highest priority first, then the longest waiting (``wait_seconds``: a small job arriving
  each reconcile does not keep a larger one that waits out for ever), then the snapshot's
  order, while their kW fit in what is left;
  the rest get Retry — or, when m2g already deferred them, keep their Retry (Kueue's
  requeue asks again).

**Site power unknown** (a rack's reading stale, missing or invalid: Prometheus down, slow or
answering garbage) is not an open gate (docs/curtailment.md, "When the site's power is
unknown"). The draw is then bounded instead of measured: every rack with a fresh reading at
it, every other rack at its cap (``Rack.cap_kw``: the most it can draw; no cap: no bound, and
no gated work fits), and the room is the limit less that bound and less the kW admitted and
not drawing yet. So new work is admitted only where it is known to fit even if every rack
without a reading drew its cap; the rest gets Retry with rule ``site-power-unknown`` and a
message that starts "site power unknown". During an active grid event firm work gets the same
bound and nothing more (m2g never sheds on stale power, so there is no room it can make;
``hold_firm_beyond_reach: false`` admits firm work whatever the room, as with a fresh
reading); a percentage event whose baseline was never measured has no known limit: nothing is
known to fit. Outside an event the gated flexible tiers get the bound against the site budget
and firm work is not held, as with a fresh reading.

No limit known (no site budget, no event with a kW target or a reduction): no gate (the
policies' own fail-safes hold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot
from m2g.model.plan import CheckUpdate
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.shedding import in_flight_kw, reach_kw, restoring, workload_kw

POLICY, RULE = "site-headroom", "shared-room"
#: The rule of a Retry given because the site's power reading is stale, missing or invalid.
RULE_UNKNOWN = "site-power-unknown"


def min_tier(snap: ClusterSnapshot, config: PlannerConfig) -> int:
    """The lowest flex tier the gate holds back: ``headroom_min_tier``, one lower from SIMPLE
    level 2 of an active grid event (as grid-demand-response), and at most
    ``headroom_event_min_tier`` while an event is active: new work of those tiers then starts
    only in the room the running work leaves."""
    event = snap.factory.grid_event()
    if event is None or not event.active(snap.now):
        return config.headroom_min_tier
    tier = max(1, config.headroom_min_tier - 1) if event.level >= 2 else config.headroom_min_tier
    return min(tier, config.headroom_event_min_tier)


@dataclass(frozen=True)
class Headroom:
    """kW left for new work under ``limit`` (``room`` may be negative). ``unknown``: why the
    draw is a bound, not a reading ("" when measured): then ``draw`` is the bound."""

    limit: float
    draw: float
    in_flight: float
    room: float
    unknown: str = ""

    @classmethod
    def of(cls, snap: ClusterSnapshot, config: PlannerConfig) -> Headroom | None:
        draw = snap.factory.site_draw_kw()
        limit = snap.factory.limit_ahead_kw(config.shed_lead_seconds)  # as the shedding
        if not draw.stale and draw.value is not None:
            if limit <= 0:
                return None
            in_flight = in_flight_kw(snap, config)
            room = limit * (1.0 - config.restore_margin) - draw.value - in_flight
            return cls(limit, draw.value, in_flight, room)
        event = snap.factory.grid_event()
        active = event is not None and event.active(snap.now)
        if active and event is not None and event.reduction_pct > 0 and event.target() <= 0:
            return cls(limit, float("inf"), 0.0, float("-inf"), (
                f"the grid event's {event.reduction_pct:g} % reduction has no baseline (no "
                "fresh site draw since before it started), so its limit is not known"))
        if limit <= 0:
            return None
        bound, why = draw_bound_kw(snap.factory)
        in_flight = in_flight_kw(snap, config)
        room = limit * (1.0 - config.restore_margin) - bound - in_flight
        return cls(limit, bound, in_flight, room, why)


def draw_bound_kw(f: FactorySnapshot) -> tuple[float, str]:
    """The most the site can draw now when its reading is not fresh: each rack's fresh
    reading, every other rack at its cap (``inf`` when one of them has none), and why."""
    total, unknown, capless, oldest = 0.0, 0, 0, 0.0
    for r in f.racks:
        if not r.power_kw.stale and r.power_kw.value is not None:
            total += r.power_kw.value
            continue
        unknown += 1
        oldest = max(oldest, r.power_kw.age_seconds)
        if r.cap_kw > 0:
            total += r.cap_kw
        else:
            capless += 1
    age = "never read or invalid" if oldest == float("inf") else f"oldest {oldest:.0f} s"
    why = (f"{unknown} of {len(f.racks)} rack(s) without a fresh power reading ({age})"
           if f.racks else "no rack power reading")
    if capless or not f.racks:
        return float("inf"), why + (f", {capless} of them without a cap" if capless else "")
    return total, why


def share(updates: Sequence[CheckUpdate], snap: ClusterSnapshot, config: PlannerConfig,
          spent: float = 0.0) -> list[CheckUpdate]:
    """``updates`` with the Ready answers that do not fit in the headroom turned into Retry
    (or dropped, for a workload m2g already deferred); the order is kept. ``spent``: kW this
    plan already brings back (restores)."""
    return share_beyond(updates, snap, config, spent)[0]


def share_beyond(updates: Sequence[CheckUpdate], snap: ClusterSnapshot,
                 config: PlannerConfig, spent: float = 0.0
                 ) -> tuple[list[CheckUpdate], float]:
    """``share``, and the kW of the firm work it admits during an active grid event beyond
    the room under the limit (on what m2g can still free: ``_firm_reach``): the kW the
    running flexible work must free now (m2g.planner.plan curtails for it in the same plan),
    not once the meter shows the new work drawing over the limit — in a 16-rack twin event
    (2026-12-06, 24th session) ten firm jobs (~200 kW) admitted 28 kW into the room held
    the site over its target from 14 s later, when the meter showed them, for 10 s."""
    head = Headroom.of(snap, config) if config.share_headroom else None
    if head is None or not any(u.state is CheckState.READY for u in updates):
        return list(updates), 0.0
    marked = sparse.of(snap)
    by_key, tier = marked.by_key, min_tier(snap, config)
    back = {w.key for w in marked.in_flight  # restored, not admitted again: kW in in_flight
            if by_key.get(w.key) is w and restoring(w, snap, config)}
    # (gated, not reserved yet, not restored, -priority, -wait, index, workload, its kW):
    # firm work first, then the work Kueue reserved before the work m2g places ahead of its
    # reservation (m2g.planner.preplace), then the restored, the highest priority, the
    # longest waiting, the order of ``updates``; the kW read in the same pass (24,000 ready
    # at 1,400 racks: each read again is a cache miss)
    ready: list[tuple[bool, bool, bool, int, int, int, WorkloadState, float]] = []
    now, is_ready, pending = snap.now, CheckState.READY, Phase.PENDING
    for i, u in enumerate(updates):
        if u.state is is_ready:
            w = by_key.get(f"{u.namespace}/{u.name}")
            if w is not None:
                v = w.view
                ready.append((v.flex_tier >= tier, w.phase is pending, w.key not in back,
                              -v.priority, -w.wait_seconds(now), i, w,
                              workload_kw(w, config)))
    ready.sort()  # the index is unique: the workloads and kW themselves are never compared
    room, admitted = head.room - spent, 0
    start, firm_kw = room, 0.0
    held: list[tuple[int, WorkloadState, float, bool]] = []  # (index, workload, kW, firm)
    any_firm = not ready[0][0] if ready else False
    reach = _firm_reach(snap, config, any_firm, bool(head.unknown))
    paused = paused_kw(snap, config) if reach is not None else 0.0
    margin = head.limit * config.restore_margin  # firm work may use it: the limit is the limit
    firm_held = False  # a firm job held keeps the room: flexible work gets none before it
    for gated, _, fresh, _, _, i, w, full in ready:  # firm work first (the sort)
        kw = full if fresh else 0.0
        firm = not gated
        # restored work (not ``fresh``) is never held for a held firm job: its room was
        # kept for it when m2g restored it (held, it went back to Kueue's queue with a
        # Retry, and the room stayed unused: a 16-rack twin event, 2026-12-06) — room
        # under the limit itself: a restore keeps its ``restore_band``, less than
        # ``restore_margin`` for work smaller than it (m2g.planner.shedding.restore_band)
        if (firm and (reach is None or (kw <= room + margin + reach if paused <= 0 else
                                        kw <= room - paused and room >= 0))) or (
                not firm and (not firm_held or not fresh)
                and (kw <= room and room >= 0 if fresh else room + margin >= 0)):
            room -= kw
            admitted += 1
            firm_kw += kw if firm else 0.0
        else:
            firm_held = firm_held or firm
            held.append((i, w, full, firm))
    # firm work may use the margin: beyond the room under the limit itself, m2g frees it
    beyond = max(0.0, firm_kw - max(0.0, start + margin)) if reach is not None else 0.0
    if not held:
        return list(updates), beyond
    out: list[CheckUpdate | None] = list(updates)
    hold = _Holds(head, admitted, config, reach, paused)
    for i, w, kw, firm in held:  # already deferred by m2g: dropped (its Retry stands)
        out[i] = None if w.check_state is CheckState.RETRY else hold.of(updates[i], kw, firm)
    return [u for u in out if u is not None], beyond


def alone(snap: ClusterSnapshot, w: WorkloadState,
          config: PlannerConfig) -> CheckUpdate | None:
    """The gate's Retry for ``w`` if the policies admitted it now and nothing else were
    admitted in this reconcile (None: the gate lets it in, or is off) — what ``m2g explain``
    and ``m2g submit --dry-run`` show. ``w`` need not be in the snapshot (a workload not
    submitted yet); a Retry m2g already gave it is set aside, so the answer is the gate's
    word now, not the last one. An admitted workload is never gated."""
    if w.phase in (Phase.ADMITTED, Phase.FINISHED):
        return None
    probe = replace(w, check_state=None)
    others = tuple(x for x in snap.workloads if x.key != w.key)
    alone_snap = replace(snap, workloads=(*others, probe))
    ready = CheckUpdate(namespace=w.namespace, name=w.name, check=w.check or POLICY,
                        state=CheckState.READY, message="")
    out = share([ready], alone_snap, config)
    return out[0] if out and out[0].state is CheckState.RETRY else None


def paused_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """The kW of the work m2g paused for power that waits to come back (deactivated by m2g,
    not drained for maintenance), while an active grid event lets it come back
    (``restore_during_events``) and ``restore_before_firm`` holds new firm work for it; else 0.
    New firm work during the event then starts only in the room beyond it: the room jobs
    finishing free goes to the paused work first (m2g.planner.shedding restores it)."""
    event = snap.factory.grid_event()
    if not (config.restore_before_firm and config.restore_during_events
            and event is not None and event.active(snap.now)):
        return 0.0
    return sum(workload_kw(w, config) for w in sparse.of(snap).shed
               if w.shed_by_m2g and not w.drained_for and w.phase is Phase.INACTIVE)


def _firm_reach(snap: ClusterSnapshot, config: PlannerConfig, firm: bool,
                unknown: bool = False) -> float | None:
    """What m2g can still free for firm work (below the gate's tier) during an active grid
    event (m2g.planner.shedding.reach_kw, worked out once, and only when there is firm work
    to answer); None when firm work is not held (no active event, the gate off, no firm
    work). Firm work is admitted while the room under the limit itself (``restore_margin``
    is for restores and flexible work) plus this covers its kW — flexible running work makes
    room for it, but not room that is not there: a 16-rack twin event (2026-12-04) admitted
    ~30 firm jobs (~500 kW) after every flexible job was paused or capped, and the site drew
    up to 118 kW over the event's target for its last 90 s (``hold_firm_beyond_reach``).
    ``unknown`` (site power unknown): 0, not worked out — m2g never sheds on stale power."""
    event = snap.factory.grid_event()
    if not (firm and config.hold_firm_beyond_reach and event is not None
            and event.active(snap.now)):
        return None
    return 0.0 if unknown else reach_kw(snap, config)  # stale power: m2g never sheds


class _Holds:
    """The Retries of the workloads the room does not hold, for one ``share``: what is the
    same for all of them (the wait, the headroom's figures, the count admitted) worked out
    once; a message differs only by the workload's kW and whether it is firm work (then
    ``reach``, what m2g can still free for it during an event, is said; else not)."""

    def __init__(self, head: Headroom, admitted: int, config: PlannerConfig,
                 reach: float | None, paused: float = 0.0) -> None:
        self.head, self.admitted, self.reach, self.paused = head, admitted, reach, paused
        self.wait = min(config.headroom_retry_seconds, config.max_retry_hold_seconds)
        self.rule = RULE_UNKNOWN if head.unknown else RULE
        self._why: dict[tuple[str, bool], str] = {}  # by the kW as the message says it

    def of(self, u: CheckUpdate, kw: float, firm: bool) -> CheckUpdate:
        """The Retry for ``u``, its workload's kW ``kw`` (under its cap, restores' too)."""
        key = (f"{kw:.0f}", firm)
        why = self._why.get(key)
        if why is None:
            why = self._why[key] = self.why(kw, self.reach if firm else None)[:1024]
        return CheckUpdate(namespace=u.namespace, name=u.name, check=u.check,
                           state=CheckState.RETRY, message=why,
                           requeue_after_seconds=self.wait, policy=POLICY, rule=self.rule)

    def why(self, kw: float, reach: float | None) -> str:
        """The message of a Retry for ``kw`` (``reach``: None unless firm work during an
        event)."""
        head, wait = self.head, self.wait
        if head.unknown:
            return _unknown_why(kw, head, self.admitted, reach, wait)
        freeable = ""
        if reach is not None and self.paused > 0:
            freeable = (f"; during the grid event the work m2g paused ({self.paused:.0f} kW) "
                        "comes back first: new firm work starts only in the room beyond it")
        elif reach is not None:
            freeable = (f"; during the grid event firm work waits for room m2g can make, and "
                        f"the running flexible work can free only {reach:.0f} kW more")
        return (f"site headroom: {kw:.0f} kW does not fit in what is left of "
                f"{max(0.0, head.room):.0f} kW under the {head.limit:.0f} kW limit (draw "
                f"{head.draw:.0f} kW, {head.in_flight:.0f} kW admitted and not drawing yet, "
                f"{self.admitted} workload(s) admitted before it in this reconcile)"
                f"{freeable}; asking again in {wait} s")


def _unknown_why(kw: float, head: Headroom, admitted: int, reach: float | None,
                 wait: int) -> str:
    """The message of a Retry given because the site's power is not known (fail-safe)."""
    firm = ("; during the grid event firm work too is admitted only where it is known to "
            "fit (m2g never sheds on stale power)" if reach is not None else "")
    if head.room == float("-inf"):
        return (f"site power unknown: {head.unknown}; no new work is known to fit{firm}; "
                f"asking again in {wait} s")
    bound = ("no bound (a rack without a cap)" if head.draw == float("inf")
             else f"at most {head.draw:.0f} kW")
    return (f"site power unknown: {head.unknown}; {kw:.0f} kW is not known to fit under the "
            f"{head.limit:.0f} kW limit even with every such rack at its cap (draw {bound}, "
            f"{head.in_flight:.0f} kW admitted and not drawing yet, {admitted} workload(s) "
            f"admitted before it in this reconcile){firm}; new work waits for a fresh "
            f"reading; asking again in {wait} s")
