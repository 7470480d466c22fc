"""Right-sizing under a shortfall: shrink an elastic batch/v1 Job by whole replicas, ranked
with the cap steps by throughput lost per kW saved (docs/curtailment.md).

A job m2g may shrink is admitted, flex tier ≥ 1, drawing, marked elastic by Kueue
(``kueue.x-k8s.io/elastic-job``) and declares ``m2g.io/min-parallelism``
(``WorkloadState.elastic_job``). Removing one replica saves its kW (the job's full kW over its
full parallelism, under its cap) and loses its share of the throughput, linearly: the cost per
kW is the same for every replica of a job, and never more than pausing it (no checkpoint is
lost: Kueue keeps a scale-down admitted). It goes no lower than its declared minimum nor than
its flex allowance allows (the same accounting as caps: the throughput its caps and its
current shrink already cost is spent). Growing back is the reverse: once nothing m2g paused
is waiting, before the caps are lifted, the most recent shrink first, to the full size in one
step (Kueue admits the larger size as a new Workload slice) — never while a grid event is
active (m2g.planner.shedding): the new slice goes through m2g's admission as new flexible
work, which the event defers, and a Retry of the slice stops the running job.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from datetime import datetime

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import CapAction, ResizeAction
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import (
    Ladders,
    cap_action,
    flex_budget,
    flex_used,
    pause_cost,
)
from m2g.planner.curves import curve_of
from m2g.planner.inputs import InputBuilder


def replica_kw(w: WorkloadState, config: PlannerConfig) -> float:
    """One replica's draw: its estimate's share at full size, else its GPUs × the default;
    under its power cap."""
    gpus = w.view.pod_sets[0].gpus_per_pod if w.view.pod_sets else 0
    full = (w.view.estimated_kw / w.full_parallelism if w.view.estimated_kw and
            w.full_parallelism else gpus * config.default_kw_per_gpu)
    return full * curve_of(w).power(w.power_cap)


def resize_used(w: WorkloadState, now: datetime) -> float:
    """Throughput-seconds its current shrink has cost so far."""
    if w.resized_at is None or w.full_parallelism <= 0:
        return 0.0
    lost = 1.0 - w.parallelism / w.full_parallelism
    return lost * max(0.0, (now - w.resized_at).total_seconds())


def floor_of(w: WorkloadState, now: datetime, horizon: float, config: PlannerConfig) -> int:
    """The fewest replicas its declared minimum and its flex allowance allow now."""
    rate = max(0.0, flex_budget(w, now, horizon, config) - flex_used(w, now)
               - resize_used(w, now)) / horizon
    thr = curve_of(w).throughput(w.power_cap)
    if thr <= 0:
        return w.parallelism
    by_flex = math.ceil(w.full_parallelism * (1.0 - rate) / thr - 1e-9)
    return max(w.min_parallelism, by_flex)


@dataclass(frozen=True)
class Shrinkable:
    """A job m2g may shrink: its state, fewest replicas, cost per kW, kW per replica and the
    cost per kW of pausing it instead."""

    w: WorkloadState
    floor: int
    cost: float
    kw: float
    pause: float


def shrinkable(builder: InputBuilder, config: PlannerConfig, horizon: float,
               exclude: frozenset[str] = frozenset()) -> list[Shrinkable]:
    """Every job m2g may shrink by one replica or more now, in the snapshot's order."""
    snap = builder.snap
    out: list[Shrinkable] = []
    for w in snap.workloads:
        if not w.elastic_job or w.phase is not Phase.ADMITTED or w.view.flex_tier <= 0 or \
                w.key in exclude or (snap.live_pods is not None and w.key not in snap.live_pods):
            continue
        floor = floor_of(w, snap.now, horizon, config)
        kw = replica_kw(w, config)
        if floor >= w.parallelism or kw <= 0:
            continue
        gpus = w.view.pod_sets[0].gpus_per_pod
        cost = gpus * curve_of(w).throughput(w.power_cap) / kw
        out.append(Shrinkable(w, floor, cost, kw, pause_cost(w, config, horizon, snap.now)))
    return out


def potential_kw(jobs: list[Shrinkable], exclude: frozenset[str] = frozenset()) -> float:
    """What shrinking every job to its floor would save (the jobs in ``exclude`` left out)."""
    return sum((j.w.parallelism - j.floor) * j.kw for j in jobs
               if j.w.key not in exclude and j.cost <= j.pause)


#: A step of either lever: (throughput lost per kW saved, lever (0 cap, 1 shrink), key,
#: to (cap fraction, or replicas), kW saved).
_Step = tuple[float, int, str, float, float]


def plan_levers(builder: InputBuilder, config: PlannerConfig, shortfall: float, step: float,
                ladders: Ladders, jobs: list[Shrinkable],
                exclude: frozenset[str] = frozenset()
                ) -> tuple[list[CapAction], list[ResizeAction]]:
    """The cap steps and replica removals that cover as much of ``shortfall`` as is cheaper
    than pausing, cheapest throughput per kW first, within ``step`` kW (the ramp)."""
    by_key = {j.w.key: j for j in jobs}
    heap: list[_Step] = [(j.first[0], 0, j.first[1], j.first[2], j.first[3])
                         for j in ladders.jobs if j.w.key not in exclude]
    heap += [(j.cost, 1, j.w.key, float(j.w.parallelism - 1), j.kw) for j in jobs
             if j.w.key not in exclude]
    heapq.heapify(heap)
    caps: dict[str, tuple[float, float, float]] = {}  # key → (cost, to, kW)
    shrinks: dict[str, tuple[float, int, float]] = {}  # key → (cost, to, kW)
    covered = 0.0
    while heap and covered < shortfall:
        cost, lever, key, to, alone = heapq.heappop(heap)
        kw = _combined(key, lever, alone, caps, shrinks, by_key)
        if covered + kw > step:
            continue
        if lever == 0:
            job = ladders.by_key[key]
            if cost >= job.pause:
                continue
            covered += kw
            prev = caps.get(key)
            caps[key] = (cost, to, kw + (prev[2] if prev else 0.0))
            nxt = ladders.next_step(job, to)
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], 0, nxt[1], nxt[2], nxt[3]))
        else:
            sj = by_key[key]
            if cost > sj.pause:  # at equal cost a shrink wins: nothing restarts
                continue
            # every replica of a job costs the same: take as many at once as are needed and
            # fit (one at a time, a Job of 10⁶ replicas of a few watts each took 2.4 s per
            # plan, and an int32 count never ended)
            n = _replicas(int(to) - sj.floor + 1, kw, shortfall - covered, step - covered)
            covered += n * kw
            prev_s = shrinks.get(key)
            shrinks[key] = (cost, int(to) - n + 1, n * kw + (prev_s[2] if prev_s else 0.0))
            if to - n >= sj.floor:
                # its kW alone: combined with a cap again when popped (pushing the combined
                # kW compounded the cap's factor at every replica: 8 replicas under a 0.64
                # cap were counted as saving a 0.64⁸ share of the last one's draw)
                heapq.heappush(heap, (cost, 1, key, to - n, alone))
    now = ladders.now
    cap_out = [cap_action(ladders.by_key[k].w, c[1], c[2], now, (
        f"cap to {c[1]:g} of the default limit: {c[2]:.0f} kW at {c[0]:.2f} throughput/kW, "
        f"for a {shortfall:.0f} kW shortfall")) for k, c in sorted(caps.items())]
    resize_out = [_resize(by_key[k].w, r[1], r[2], (
        f"shrink to {r[1]} of {by_key[k].w.full_parallelism} replicas: {r[2]:.0f} kW at "
        f"{r[0]:.2f} throughput/kW, for a {shortfall:.0f} kW shortfall"))
        for k, r in sorted(shrinks.items())]
    return cap_out, resize_out


def _replicas(available: int, kw: float, needed: float, room: float) -> int:
    """How many replicas of ``kw`` each to remove at once: enough to cover ``needed``, at
    most ``available`` and within ``room`` (at least one: the caller checked one fits)."""
    want = math.ceil(needed / kw - 1e-9) if math.isfinite(needed / kw) else available
    fit = math.floor(room / kw + 1e-9) if math.isfinite(room / kw) else available
    return max(1, min(available, want, fit))


def settling_shrink_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """kW of shrinks the meter may not show yet: the removed replicas' draw of elastic Jobs
    shrunk within ``settle_seconds``, and after that, within ``settle_max_seconds``, of the
    removed pods that still run (Kueue applied the shrink late: under load, the Workload's
    new size can come tens of seconds after m2g's record, and the pods stop after it)."""
    return sum(_settling_replicas(w, w.resized_at, snap, config) * replica_kw(w, config)
               for w in sparse.of(snap).stamped
               if w.resized_at is not None and w.elastic_job and w.phase is Phase.ADMITTED)


def _settling_replicas(w: WorkloadState, at: datetime, snap: ClusterSnapshot,
                       config: PlannerConfig) -> int:
    """How many of the replicas ``w``'s shrink (recorded ``at``) removed the meter may still
    not show."""
    age = (snap.now - at).total_seconds()
    if age < config.settle_seconds:
        return w.full_parallelism - w.parallelism
    if age >= config.settle_max_seconds or snap.live_pods is None:
        return 0
    pods = snap.live_pods.get(w.key)
    running = min(w.full_parallelism, pods.running if pods else 0)
    return max(0, running - w.parallelism)


def _combined(key: str, lever: int, kw: float, caps: dict[str, tuple[float, float, float]],
              shrinks: dict[str, tuple[float, int, float]], by_key: dict[str, Shrinkable]
              ) -> float:
    """A step's kW when the job also has a step of the other lever in this plan: a cap
    saves on the replicas left, a replica removed saves its draw under the new cap."""
    if lever == 0 and key in shrinks:
        w = by_key[key].w
        return kw * shrinks[key][1] / w.parallelism
    if lever == 1 and key in caps:
        c = curve_of(by_key[key].w)
        return kw * c.power(caps[key][1]) / c.power(by_key[key].w.power_cap)
    return kw


def _resize(w: WorkloadState, to: int, kw: float, reason: str) -> ResizeAction:
    return ResizeAction(w.namespace, w.name, w.elastic_job, to, w.full_parallelism, kw, reason)


def grow_back(builder: InputBuilder, config: PlannerConfig, room: float, limit: float,
              step: float) -> list[ResizeAction]:
    """Shrunk jobs grown back to their full size (most recent shrink first) while the site
    stays ``restore_margin`` under its limit with their kW added, within the ramp."""
    snap = builder.snap
    shrunk = sorted((w for w in snap.workloads if w.elastic_job and w.phase is Phase.ADMITTED
                     and w.parallelism < w.full_parallelism),
                    key=lambda w: (w.resized_at or snap.now, w.key), reverse=True)
    out: list[ResizeAction] = []
    used, margin = 0.0, limit * config.restore_margin
    for w in shrunk:
        add = (w.full_parallelism - w.parallelism) * replica_kw(w, config)
        if used + add > room - margin or used + add > step:
            break
        used += add
        out.append(_resize(w, w.full_parallelism, -add,
                           f"grow back to {w.full_parallelism} replicas: {add:.0f} kW back, "
                           f"{room - used:.0f} kW headroom remains"))
    return out
