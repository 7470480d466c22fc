"""Graded curtailment: meet a shortfall with the cheapest kilowatts — GPU power caps first,
pauses last (docs/curtailment.md).

For each flexible job m2g may cap (admitted, flex tier ≥ 1, alone on its nodes, so a cap
never slows a neighbour), each step down its cap ladder (``cap_levels``: 0.875, 0.75, 0.625,
0.5 of the default limit) saves ``kW × (power(a) − power(b))`` and costs
``GPUs × (throughput(a) − throughput(b))`` (m2g.planner.curves: its template's curve, else its
kind's measured one). The steps are taken cheapest throughput-per-kW first across all jobs
(a heap: O(jobs · levels · log jobs) once per snapshot), within the ramp, until the shortfall
is covered — but never a step dearer than pausing that job outright (GPUs × its throughput +
the work since its last checkpoint spread over the horizon, per kW its pause saves), and never
deeper than:

* its **flex allowance as an average over its life** (Conductor's accounting): a job of tier
  f may lose ``allowance[f] × life`` throughput-seconds (life: its expected runtime, at least
  the time it has run plus the horizon). What its caps already cost (``flex_used_seconds`` +
  the current cap since it was set) is spent; the rest, spread over the horizon (the grid
  event's remaining time, else ``cap_horizon_seconds``), bounds the loss rate of a new cap;
* the Preemption stage's ``minCap`` (the most protective of the fired rules), when a policy
  gives one.

What the caps leave uncovered goes to pauses (m2g.planner.shedding). Restoring is the reverse:
paused work returns first; caps are lifted only once nothing m2g paused is still waiting, the
most recent cap first, as the room and the ramp allow.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import CapAction, NodeLimitUpdate
from m2g.model.powerlimit import LimitPhase
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.curves import CapCurve, curve_of, kind_curve
from m2g.planner.inputs import InputBuilder
from m2g.planner.memo import PlanMemo


def _full_kw(w: WorkloadState, config: PlannerConfig) -> float:
    return w.view.estimated_kw or w.view.gpus * config.default_kw_per_gpu


def cap_saving_kw(w: WorkloadState, config: PlannerConfig, frm: float, to: float) -> float:
    """kW saved by moving its cap from ``frm`` to ``to`` (negative: lifting adds)."""
    c = curve_of(w)
    return _full_kw(w, config) * (c.power(frm) - c.power(to))


def flex_used(w: WorkloadState, now: datetime) -> float:
    """Throughput-seconds its caps have cost so far (the current one included)."""
    used = w.flex_used_seconds
    if w.power_cap < 1.0 and w.power_cap_at is not None:
        loss = 1.0 - curve_of(w).throughput(w.power_cap)
        used += loss * max(0.0, (now - w.power_cap_at).total_seconds())
    return used


def running_seconds(w: WorkloadState, now: datetime) -> float:
    return max(0.0, (now - w.admitted_at).total_seconds()) if w.admitted_at else 0.0


def flex_budget(w: WorkloadState, now: datetime, horizon: float,
                config: PlannerConfig) -> float:
    """Throughput-seconds its tier allows over its life."""
    life = max(float(w.view.expected_runtime_seconds), running_seconds(w, now) + horizon)
    return config.flex_allowance[w.view.flex_tier] * life


def horizon_seconds(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """How long the caps decided now are planned to last: the active grid event's rest."""
    ev = snap.factory.grid_event()
    if ev is not None and ev.active(snap.now) and ev.end > snap.now:
        return max(60.0, (ev.end - snap.now).total_seconds())
    return config.cap_horizon_seconds


def exclusive_workloads(snap: ClusterSnapshot, memo: PlanMemo | None = None) -> frozenset[str]:
    """Admitted workloads whose nodes host no other admitted workload (one pass). ``memo``:
    the last plan's answer is reused while the admitted workloads' keys and the placements
    are equal to those it was worked out from (m2g.planner.memo)."""
    keys = [w.key for w in sparse.of(snap).admitted]
    placements = snap.placements
    if memo is not None:
        was = memo.exclusive
        if was is not None and was[1] == keys and was[0] == placements:
            memo.reused["exclusive"] += 1
            return was[2]
    admitted = set(keys)
    owner: dict[str, str] = {}  # node → the first admitted workload seen on it
    crowded: set[str] = set()  # nodes with two or more
    for key, nodes in placements.items():
        if key in admitted:
            for n in nodes:
                if owner.setdefault(n, key) != key:
                    crowded.add(n)
    got = frozenset(k for k in admitted if (on := placements.get(k))
                    and crowded.isdisjoint(on))
    if memo is not None:
        memo.exclusive = (dict(placements), keys, got)
    return got


#: One step down a job's cap ladder: (throughput lost per kW saved, key, to cap, kW saved).
#: A tuple, so the heap compares in C (cost, then key: one step per job is in the heap).
_Step = tuple[float, str, float, float]


def pause_cost(w: WorkloadState, config: PlannerConfig, horizon: float, now: datetime
               ) -> float:
    """Throughput per kW of pausing it instead at ``now``: all its throughput, plus the work
    since its last checkpoint spread over the horizon."""
    curve = curve_of(w)
    kw = _full_kw(w, config) * curve.power(w.power_cap) * config.shed_saving_fraction
    if kw <= 0:
        return float("inf")
    lost = 1.0 + w.checkpoint_at(now).last_age_seconds / horizon
    return w.view.gpus * curve.throughput(w.power_cap) * lost / kw


def _levels(w: WorkloadState, now: datetime, horizon: float, config: PlannerConfig,
            min_cap: float) -> list[float]:
    """The caps below its current one that its flex and the policies allow, mildest first."""
    curve = curve_of(w)
    rate = max(0.0, flex_budget(w, now, horizon, config) - flex_used(w, now)) / horizon
    return [c for c in config.cap_levels
            if c < w.power_cap and c >= min_cap and 1.0 - curve.throughput(c) <= rate + 1e-9]


#: (kind curve's id, full kW, GPUs, from, allowed caps) → (cost, to, kW) of the step down, or
#: None: most cappable jobs share a kind, a size and the allowed caps, and at 1,400 racks the
#: ladders take tens of thousands of steps per reconcile. Bounded (cleared when full).
_STEPS: dict[tuple[int, float, int, float, tuple[float, ...]],
             tuple[float, float, float] | None] = {}


def _next_step(w: WorkloadState, frm: float, levels: list[float],
               config: PlannerConfig) -> _Step | None:
    curve = curve_of(w)
    return _step_of(w.key, curve, _full_kw(w, config), w.view.gpus, frm, tuple(levels),
                    curve is kind_curve(w.view.kind))


def _step_of(key: str, curve: CapCurve, full: float, gpus: int, frm: float,
             levels: tuple[float, ...], memo: bool) -> _Step | None:
    """_next_step of a job whose curve, full kW, GPUs and allowed caps are known (``memo``:
    the curve is its kind's, shared: a job's own curve is a new object each time)."""
    mkey = (id(curve), full, gpus, frm, levels)
    got = _STEPS.get(mkey) if memo else None
    if got is None and not (memo and mkey in _STEPS):
        got = _step_down(curve, full, gpus, frm, levels)
        if memo:
            if len(_STEPS) >= 50_000:
                _STEPS.clear()
            _STEPS[mkey] = got
    return None if got is None else (got[0], key, got[1], got[2])


def _step_down(curve: CapCurve, full: float, gpus: int, frm: float, levels: Sequence[float]
               ) -> tuple[float, float, float] | None:
    """(throughput lost per kW saved, to cap, kW saved) of the step below ``frm``."""
    below = [c for c in levels if c < frm]
    if not below:
        return None
    to = below[0]
    kw = full * (curve.power(frm) - curve.power(to))
    if kw <= 0:
        return None
    lost = gpus * (curve.throughput(frm) - curve.throughput(to))
    return (lost / kw, to, kw)


@dataclass(frozen=True)
class _Job:
    """A job m2g may cap: its state, allowed caps, first step and the cost of pausing it."""

    w: WorkloadState
    levels: list[float]
    first: _Step
    pause: float
    #: (curve, full kW, GPUs, allowed caps, whether the curve is its kind's): its next steps
    ladder: tuple[CapCurve, float, int, tuple[float, ...], bool]


class Ladders:
    """Every cappable job's ladder on one snapshot (for one config and ``min_caps``), worked
    out once: a reconcile plans caps several times (the potential in each pause round, then
    the caps), and only the jobs left out change between them."""

    def __init__(self, builder: InputBuilder, config: PlannerConfig,
                 min_caps: Mapping[str, float]) -> None:
        snap = builder.snap
        self.config = config
        self.now, self.horizon = snap.now, horizon_seconds(snap, config)
        # (admitted only: the admitted ones suffice)
        alone = exclusive_workloads(snap, builder.memo)
        self.jobs: list[_Job] = []  # in the snapshot's order (the heap's ties, as before)
        for w in sparse.of(snap).admitted:
            if w.view.flex_tier <= 0 or w.view.gpus <= 0 or w.key not in alone or (
                    snap.live_pods is not None and w.key not in snap.live_pods):
                continue  # not cappable, or no pod of it runs (a cap would save nothing)
            ok = _levels(w, self.now, self.horizon, config, min_caps.get(w.key, 0.0))
            if not ok:
                continue
            curve = curve_of(w)
            ladder = (curve, _full_kw(w, config), w.view.gpus, tuple(ok),
                      curve is kind_curve(w.view.kind))
            first = _step_of(w.key, ladder[0], ladder[1], ladder[2], w.power_cap, ladder[3],
                             ladder[4])
            if first is not None:
                self.jobs.append(_Job(w, ok, first, pause_cost(w, config, self.horizon, self.now),
                                      ladder))
        self.by_key = {j.w.key: j for j in self.jobs}
        self._alone_kw: list[tuple[str, float]] | None = None

    def next_step(self, job: _Job, frm: float) -> _Step | None:
        curve, full, gpus, levels, memo = job.ladder
        return _step_of(job.w.key, curve, full, gpus, frm, levels, memo)

    def potential_kw(self, exclude: frozenset[str] = frozenset()) -> float:
        """What caps without a shortfall or ramp limit would save, the jobs in ``exclude``
        left out: each job down its ladder while a step is cheaper than pausing it (with no
        limit, no job's steps depend on another's). Summed by key, as ``plan_caps``'s list."""
        if self._alone_kw is None:
            self._alone_kw = []
            for job in self.jobs:
                kw = 0.0
                s: _Step | None = job.first
                while s is not None and s[0] < job.pause:
                    kw = s[3] + kw
                    s = self.next_step(job, s[2])
                if s is not job.first:
                    self._alone_kw.append((job.w.key, kw))
            self._alone_kw.sort()
        return sum(kw for key, kw in self._alone_kw if key not in exclude)


def plan_caps(builder: InputBuilder, config: PlannerConfig, shortfall: float, step: float,
              min_caps: Mapping[str, float], exclude: frozenset[str] = frozenset(),
              ladders: Ladders | None = None) -> list[CapAction]:
    """The caps that cover as much of ``shortfall`` as is cheaper than pausing, within
    ``step`` kW (the ramp). ``min_caps``: key → the lowest cap the policies allow (absent: no
    policy limit); ``exclude``: workloads not to cap (paused in this plan); ``ladders``:
    ``Ladders(builder, config, min_caps)`` when the caller already has it."""
    lad = ladders if ladders is not None else Ladders(builder, config, min_caps)
    heap = [j.first for j in lad.jobs if j.w.key not in exclude]
    heapq.heapify(heap)
    chosen: dict[str, _Step] = {}
    covered = 0.0
    while heap and covered < shortfall:
        s = heapq.heappop(heap)
        job = lad.by_key[s[1]]
        if s[0] >= job.pause or covered + s[3] > step:
            continue  # pausing it is as cheap, or the ramp is used: this job stops here
        covered += s[3]
        prev = chosen.get(s[1])
        chosen[s[1]] = (s[0], s[1], s[2], s[3] + (prev[3] if prev else 0.0))
        nxt = lad.next_step(job, s[2])
        if nxt is not None:
            heapq.heappush(heap, nxt)
    return [cap_action(lad.by_key[k].w, s[2], s[3], lad.now, f"cap to {s[2]:g} of the default "
                 f"limit: {s[3]:.0f} kW at {s[0]:.2f} throughput/kW, for a {shortfall:.0f} kW "
                 "shortfall") for k, s in sorted(chosen.items())]


def cap_action(w: WorkloadState, to: float, kw: float, now: datetime, reason: str
               ) -> CapAction:
    return CapAction(w.namespace, w.name, to, kw, reason, round(flex_used(w, now), 1),
                     round(curve_of(w).throughput(to), 4))


def lift_caps(builder: InputBuilder, config: PlannerConfig, room: float, limit: float,
              step: float) -> list[CapAction]:
    """Caps lifted (most recent first) while the site stays ``restore_margin`` under its
    limit with their kW added, within the ramp."""
    snap = builder.snap
    capped = sorted((w for w in sparse.of(snap).capped if w.power_cap < 1.0),
                    key=lambda w: (w.power_cap_at or snap.now, w.key), reverse=True)
    out: list[CapAction] = []
    used, margin = 0.0, limit * config.restore_margin
    for w in capped:
        running = w.phase is Phase.ADMITTED
        kw = cap_saving_kw(w, config, w.power_cap, 1.0) if running else 0.0  # < 0: adds
        add = -kw
        if running and (used + add > room - margin or used + add > step):
            break
        used += add
        out.append(cap_action(w, 1.0, kw, snap.now,
                        f"lift the {w.power_cap:g} cap: {add:.0f} kW back, "
                        f"{room - used:.0f} kW headroom remains"))
    return out


def settling_cap_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """kW of caps the meter may not show yet: set within ``settle_seconds`` and not reported
    in force by the agents of all its nodes ``meter_lag_seconds`` before the reading."""
    draw = snap.factory.site_draw_kw()
    read_at = snap.now - timedelta(seconds=min(draw.age_seconds, config.settle_seconds))
    return sum(cap_saving_kw(w, config, 1.0, w.power_cap) for w in sparse.of(snap).capped
               if w.phase is Phase.ADMITTED and w.power_cap < 1.0 and w.power_cap_at
               and (snap.now - w.power_cap_at).total_seconds() < config.settle_seconds
               and not metered(w, snap, read_at, config))


def metered(w: WorkloadState, snap: ClusterSnapshot, read_at: datetime,
            config: PlannerConfig) -> bool:
    """Does the reading taken at ``read_at`` show ``w``'s cap: every node of it reports a
    limit at or under the cap, applied ``meter_lag_seconds`` before the reading and not
    before the cap was set?"""
    nodes = snap.placements.get(w.key, ())
    if not nodes or w.power_cap_at is None:
        return False
    lag = timedelta(seconds=config.meter_lag_seconds)
    for n in nodes:
        s = snap.node_limits.get(n)
        if s is None or s.applied_fraction is None or s.applied_at is None or \
                s.applied_fraction > w.power_cap + 0.01 or \
                s.applied_at + lag > read_at or s.applied_at < w.power_cap_at - lag:
            return False
    return True


def _capped_nodes(placements: Mapping[str, tuple[str, ...]], fraction: Mapping[str, float]
                  ) -> dict[str, list[str]]:
    """Node → the workloads in ``fraction`` on it, for the nodes of a capped one (fraction
    under 1) only: a node whose workloads are not all capped gets no limit, so the others
    are not gathered (a loop over every placement cost 0.1 s at 1,400 racks, 2026-12-04)."""
    capped = {n for k, f in fraction.items() if f < 1.0 for n in placements.get(k, ())}
    on_node: dict[str, list[str]] = {}
    if not capped:
        return on_node
    for key, nodes in placements.items():
        if key in fraction and not capped.isdisjoint(nodes):
            for n in nodes:
                if n in capped:
                    on_node.setdefault(n, []).append(key)
    return on_node


def node_limit_updates(snap: ClusterSnapshot, config: PlannerConfig,
                       caps: tuple[CapAction, ...] | list[CapAction]) -> list[NodeLimitUpdate]:
    """Each node's GPUPowerLimit as the caps (after ``caps``) want it: a node whose admitted
    workloads are all capped gets the mildest of their caps, with a lease; any other node has
    none (deleted). Leases are renewed at half their length."""
    fraction = {w.key: w.power_cap for w in sparse.of(snap).admitted}
    fraction.update({f"{c.namespace}/{c.name}": c.fraction for c in caps
                     if f"{c.namespace}/{c.name}" in fraction})
    on_node = _capped_nodes(snap.placements, fraction)
    want: dict[str, tuple[float, tuple[str, ...]]] = {}
    for node, on in on_node.items():
        f = max(fraction[k] for k in on)
        if f < 1.0:
            want[node] = (f, tuple(sorted(on)))
    now = snap.now
    expires = now + timedelta(seconds=config.cap_lease_seconds)
    renew_by = now + timedelta(seconds=config.cap_lease_seconds / 2)
    out: list[NodeLimitUpdate] = []
    for node, (f, keys) in sorted(want.items()):
        have = snap.node_limits.get(node)
        spec = have.spec if have is not None else None
        if spec is None or abs(spec.fraction - f) > 1e-6 or spec.workloads != keys or \
                spec.expires_at is None or spec.expires_at <= renew_by:
            out.append(NodeLimitUpdate(node, f, expires, keys,
                                       f"cap {', '.join(keys)} to {f:g} of the default limit"))
    for node in sorted(set(snap.node_limits) - set(want)):
        out.append(NodeLimitUpdate(node, None, None, (), "released: no capped workload here"))
    return out


def lapsed_caps(snap: ClusterSnapshot) -> dict[str, datetime]:
    """Workload key → when its cap lapsed: m2g's record says capped, but the node agent of a
    node of it reports the lease run out and full power restored (phase ``Expired``, the
    spec's lease in the past: not one m2g has renewed since) — m2g was gone for longer than
    the lease and the agent's grace — and the record is older than that restore (a record
    set anew after it, beside an object read before its renewal, is not lapsed). The time
    is the latest of those restores."""
    out: dict[str, datetime] = {}
    limits = snap.node_limits
    if not limits:
        return out
    now = snap.now
    for w in sparse.of(snap).capped:
        for n in snap.placements.get(w.key, ()):
            s = limits.get(n)
            if s is None or s.phase != LimitPhase.EXPIRED or s.spec is None or \
                    s.spec.expires_at is None or s.spec.expires_at > now:
                continue
            at = min(now, s.applied_at or s.spec.expires_at)
            if w.power_cap_at is not None and w.power_cap_at > at:
                continue  # set anew after the lapse: the object read is older than the record
            out[w.key] = max(out.get(w.key, at), at)
    return out


def without_lapsed(snap: ClusterSnapshot
                   ) -> tuple[ClusterSnapshot, dict[str, tuple[WorkloadState, datetime]]]:
    """``snap`` with every lapsed cap (``lapsed_caps``) read as what is in force — none: full
    power since the lapse, its cost until then in ``flex_used_seconds``, the lapse as the
    last power change the ramp counts from — and the lapsed workloads as they were, with the
    time. A successor that came after the lease ran out otherwise renewed the lease of every
    cap still recorded, so the agents put back caps the grid no longer needed (and lowered
    the power of nodes that were at full power a moment before) only for m2g to lift them one
    ramp step at a time; and during an event it capped deeper from caps not in force."""
    lapsed = lapsed_caps(snap)
    if not lapsed:
        return snap, {}
    was: dict[str, tuple[WorkloadState, datetime]] = {}
    workloads = []
    for w in snap.workloads:
        at = lapsed.get(w.key)
        if at is not None:
            was[w.key] = (w, at)
            w = replace(w, power_cap=1.0, power_cap_at=at, flex_used_seconds=flex_used(w, at))
        workloads.append(w)
    return replace(snap, workloads=tuple(workloads)), was


def lapse_records(caps: Sequence[CapAction], lapsed: Mapping[str, tuple[WorkloadState, datetime]]
                  ) -> list[CapAction]:
    """``caps`` with each lapsed cap's record settled: set anew (``renew``: the record is
    rewritten from now even at the same fraction) when this plan caps the workload again,
    else lifted — kW 0: the meter already has its full power."""
    out = [replace(c, renew=True) if f"{c.namespace}/{c.name}" in lapsed and c.fraction < 1.0
           else c for c in caps]
    acted = {f"{c.namespace}/{c.name}" for c in caps}
    for key, (w, at) in sorted(lapsed.items()):
        if key not in acted:
            out.append(CapAction(
                w.namespace, w.name, 1.0, 0.0,
                f"the {w.power_cap:g} cap lapsed: the node agent restored full power at "
                f"{at:%Y-%m-%dT%H:%M:%SZ} when its lease ran out (m2g was away); recorded as "
                "lifted", round(flex_used(w, at), 1), 1.0))
    return out
