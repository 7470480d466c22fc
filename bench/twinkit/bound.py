"""The best weighted performance any controller could keep through an event, with m2g's
levers on the jobs running at its start (docs/twin-metrics.md, `performanceBound`).

The event asks for ``need`` kW: the pre-event draw less the target. The only kW the running
jobs can give are their GPUs' (trays and idle GPUs draw whatever happens), from the
simulator's own power model (m2g.sim.power: per-GPU watts by kind and cap, the measured
throughput at each cap): each flexible job (tier ≥ 1; tier 0 is never touched) may run at a
cap of the ladder or be paused (its GPUs idle, throughput 0). The loss of a choice is
gpus × (1 − throughput). Minimising the loss over the kW asked is a multiple-choice knapsack;
its LP relaxation (each job's lower convex hull of (kW saved, loss), the segments taken
cheapest per kW first, the last one in part) gives a loss no controller can beat, so
1 − loss / Σ gpus is an upper bound on ``weightedPerformance``. It ignores lost work since the
last checkpoint and jobs that finish inside the window (both would lower what a controller
keeps, or the kW it must find), and new work (deferring it is free here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from m2g.model.inputs import WorkloadKind
from m2g.planner.config import PlannerConfig
from m2g.sim.power import PowerModel

Point = tuple[float, float]  # (kW saved, GPU-throughput lost)


def options(kind: WorkloadKind, gpus: int, pm: PowerModel,
            levels: Sequence[float]) -> list[Point]:
    """The job's choices: uncapped, each cap, paused."""
    full = pm.gpu_watts(kind, 1.0)
    pts = [(gpus * (full - pm.gpu_watts(kind, c)) / 1000.0, gpus * (1.0 - pm.throughput(kind, c)))
           for c in (1.0, *levels)]
    pts.append((above_idle_kw(kind, gpus, pm), float(gpus)))
    return pts


def hull_segments(points: Sequence[Point]) -> list[Point]:
    """The lower convex hull of ``points`` from (0, 0), as (kW, loss) increments in order of
    rising loss per kW."""
    pts = sorted({p for p in points if p[0] >= 0.0})
    hull: list[Point] = [(0.0, 0.0)]
    for p in pts:
        if p[0] <= hull[-1][0]:
            if p[0] == hull[-1][0] and p[1] < hull[-1][1]:
                hull[-1] = p
            continue
        while len(hull) >= 2 and _slope(hull[-2], hull[-1]) >= _slope(hull[-1], p):
            hull.pop()
        hull.append(p)
    return [(b[0] - a[0], b[1] - a[1]) for a, b in pairwise(hull)]


def _slope(a: Point, b: Point) -> float:
    return (b[1] - a[1]) / (b[0] - a[0])


def performance_bound(jobs: Sequence[Mapping[str, Any]], need_kw: float | None,
                      event_s_trace: float | None, pm: PowerModel | None = None,
                      levels: Sequence[float] | None = None,
                      slices: int = 30, grace_s_trace: float = 0.0,
                      firm_new: Sequence[tuple[float, float, float]] = ()
                      ) -> dict[str, Any] | None:
    """``{"weightedPerformance", "needKw", "flexibleKw"}``, or None without an event.

    The window is cut in ``slices``; in each, the jobs still running at full speed give what
    the event still asks (``need_kw`` less what the jobs done by then drew above idle), at the
    least loss of *weighted performance* (a GPU-throughput loss on job j costs
    gpus_j / full_j per GPU-second: perf is each job's own ratio, weighted by its GPUs). The
    bound's performance is None when, in some slice, pausing every flexible job still gives
    less than asked (no controller could meet the target with the running work alone).
    ``grace_s_trace``: the first seconds of the window are free (the goal: at the target
    within 30 s of the event's start). ``firm_new``: (from, to, kW) in trace seconds after the
    event's start of firm work (tier 0) that started inside the window — what it drew above
    idle is asked of the running flexible jobs too (``firm_arrivals``)."""
    if need_kw is None or not event_s_trace:
        return None
    pm = pm or PowerModel()
    levels = tuple(levels if levels is not None else PlannerConfig().cap_levels)
    running = [j for j in jobs if j.get("running_at_event_start")
               and j.get("done_at_event_end") is not None and _full(j, event_s_trace) > 0]
    total = sum(int(j["gpus"]) for j in running)
    out: dict[str, Any] = {"needKw": round(max(0.0, need_kw), 1), "flexibleKw": None,
                           "weightedPerformance": None}
    if not total:
        return out
    step = event_s_trace / slices
    loss, first_flex = 0.0, None
    for k in range(slices):
        t = k * step
        if t + step <= grace_s_trace:
            continue
        live = [j for j in running if _ends(j) > t]
        freed = sum(_gpu_kw(j, pm) for j in running if _ends(j) <= t)
        ask = need_kw - freed + sum(kw for a, b, kw in firm_new if a <= t < b)
        segs = [(kw, lost * int(j["gpus"]) / _full(j, event_s_trace) * step)
                for j in live if int(j.get("tier", 0)) >= 1
                for kw, lost in hull_segments(options(_kind(j), int(j["gpus"]), pm, levels))]
        have = sum(kw for kw, _ in segs)
        first_flex = have if first_flex is None else first_flex
        if ask <= 0:
            continue
        if have < ask:
            out["flexibleKw"] = round(first_flex, 1)
            return out
        for kw, cost in sorted(segs, key=lambda sg: sg[1] / sg[0]):
            if ask <= 0:
                break
            take = min(1.0, ask / kw)
            loss += take * cost
            ask -= take * kw
    out["flexibleKw"] = round(first_flex or 0.0, 1)
    out["weightedPerformance"] = round(max(0.0, 1.0 - loss / total), 4)
    return out


def _full(job: Mapping[str, Any], event_s: float) -> float:
    return min(float(job["remaining_at_event_start"]), int(job["gpus"]) * event_s)


def _ends(job: Mapping[str, Any]) -> float:
    """Trace seconds after the event's start at which it finishes at full speed."""
    return float(job["remaining_at_event_start"]) / max(1, int(job["gpus"]))


def above_idle_kw(kind: WorkloadKind, gpus: int, pm: PowerModel) -> float:
    """What ``gpus`` GPUs of ``kind`` draw above idle at full speed (pausing saves it)."""
    return gpus * (pm.gpu_watts(kind, 1.0) - pm.idle_w) / 1000.0


def _gpu_kw(job: Mapping[str, Any], pm: PowerModel) -> float:
    """What its GPUs draw above idle at full speed."""
    return above_idle_kw(_kind(job), int(job["gpus"]), pm)


def _kind(job: Mapping[str, Any]) -> WorkloadKind:
    try:
        return WorkloadKind(str(job.get("kind") or ""))
    except ValueError:
        return WorkloadKind.TRAINING


def firm_arrivals(jobs: Sequence[Mapping[str, Any]], event_start: float, event_end: float,
                  scale: float, pm: PowerModel | None = None) -> list[tuple[float, float, float]]:
    """(from, to, kW above idle) in trace seconds after the event's start of each firm job
    (tier 0) whose pods were first seen on nodes inside the event (``bound``, wall seconds
    from the replay's start), until it finished or the event ended."""
    pm = pm or PowerModel()
    out = []
    for j in jobs:
        bound = j.get("bound")
        if int(j.get("tier", 0)) != 0 or bound is None or not event_start <= bound < event_end:
            continue
        end = min(event_end, float(j["finished"])) if j.get("finished") is not None \
            else event_end
        out.append(((bound - event_start) * scale, (end - event_start) * scale,
                    _gpu_kw(j, pm)))
    return out
