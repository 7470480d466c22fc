"""GridEvent status: the phase, and the baseline a percentage event is measured against.

* **Phase**: ``Pending`` before the first interval starts, ``Active`` from then until the last
  interval ends, ``Completed`` after. Condition ``Active`` (True while Active; reasons
  ``Pending``, ``InProgress``, ``Completed``).
* **Baseline** (events with ``targetReductionPercent``): the mean site draw over the
  ``baseline_window_seconds`` (60 s) before the event's start — the same site draw shedding
  compares with the limit, sampled at every reconcile (``ClusterSnapshot.draw_history``, fresh
  readings only). Recorded once, at the first reconcile at or after the start, in
  ``status.observedBaselineKw``, with ``status.targetKw`` = baseline × (1 − reduction) and
  condition ``BaselineObserved`` saying how it was measured:

  * ``PreEventMean``: the mean of the samples in [start − window, start];
  * ``LastSampleBeforeStart``: no sample in the window (m2g had a gap): the newest before it;
  * ``FirstSampleDuringEvent``: no sample before the start (m2g started during the event):
    the draw now, which may already be lower.

  Without a fresh draw at all it is not recorded yet (``BaselineObserved=False``,
  ``NoPowerReading``); the event then has no kW limit, so nothing is shed for it, while the
  admission policies treat an unknown target as "over target".
  A recorded baseline is never measured again (level-triggered: the status is the record).

The baselines found in this reconcile are also returned, so the same plan already sheds to the
new target (the status write reaches the watch cache a moment later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from m2g.model.cluster import ClusterSnapshot, GridEventState
from m2g.model.plan import GridEventStatusUpdate
from m2g.model.status import same_status
from m2g.planner.config import PlannerConfig

PENDING, ACTIVE, COMPLETED = "Pending", "Active", "Completed"
_ACTIVE_REASON = {PENDING: "Pending", ACTIVE: "InProgress", COMPLETED: "Completed"}


def phase(ev: GridEventState, now: datetime) -> str:
    if ev.start is None or now < ev.start:
        return PENDING
    if ev.end is not None and now >= ev.end:
        return COMPLETED
    return ACTIVE


def observe_baseline(history: Sequence[tuple[datetime, float]], start: datetime,
                     window_seconds: float, now_kw: float | None
                     ) -> tuple[float, str, str] | None:
    """(kW, reason, how) for an event starting at ``start``; None without any reading."""
    lo = start - timedelta(seconds=window_seconds)
    inside = [kw for t, kw in history if lo <= t <= start]
    if inside:
        return (sum(inside) / len(inside), "PreEventMean",
                f"mean site draw of {len(inside)} samples over the {window_seconds:g} s "
                "before the start")
    before = [(t, kw) for t, kw in history if t < lo]
    if before:
        t, kw = max(before)
        return (kw, "LastSampleBeforeStart",
                f"no sample in the {window_seconds:g} s before the start: the last one, "
                f"{(start - t).total_seconds():.0f} s before it")
    if now_kw is not None:
        return (now_kw, "FirstSampleDuringEvent",
                "no sample before the start (m2g was not running): the draw when first seen")
    return None


def _condition(old: Mapping[str, Mapping[str, Any]], kind: str, ok: bool, reason: str,
               message: str, now: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    prev = old.get(kind) or {}
    since = prev.get("lastTransitionTime") if prev.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or now}


def _status(ev: GridEventState, snap: ClusterSnapshot, config: PlannerConfig,
            now_kw: float | None, now_text: str) -> tuple[dict[str, Any], float | None]:
    now = snap.now
    ph = phase(ev, now)
    conds = [_condition(ev.conditions, "Active", ph == ACTIVE, _ACTIVE_REASON[ph],
                        f"event {ev.event_id} is {ph.lower()}", now_text)]
    status: dict[str, Any] = {"phase": ph}
    new_baseline: float | None = None
    message = f"event {ev.event_id}: {ph}"
    if ev.reduction_pct > 0:
        baseline, reason, how = ev.baseline_kw, ev.baseline_reason, ev.baseline_how
        if baseline is None and ph != PENDING and ev.start is not None:
            found = observe_baseline(snap.draw_history, ev.start,
                                     config.baseline_window_seconds, now_kw)
            if found is not None:
                baseline, reason, how = found
                new_baseline = baseline
        if baseline is None:
            why = "WaitingForStart" if ph == PENDING else "NoPowerReading"
            text = ("measured at the start" if ph == PENDING
                    else "no fresh site draw yet: no kW limit (nothing is shed for it)")
            conds.append(_condition(ev.conditions, "BaselineObserved", False, why, text,
                                    now_text))
        else:
            target = baseline * (1 - ev.reduction_pct / 100)
            status |= {"observedBaselineKw": round(baseline, 3), "targetKw": round(target, 3)}
            conds.append(_condition(ev.conditions, "BaselineObserved", True, reason or "", how,
                                    now_text))
            message += (f": target {target:.0f} kW = {100 - ev.reduction_pct:g} % of the "
                        f"{baseline:.0f} kW baseline")
    status["conditions"] = conds
    status["message"] = message
    return status, new_baseline


def event_statuses(snap: ClusterSnapshot, config: PlannerConfig, now_text: str
                   ) -> tuple[list[GridEventStatusUpdate], dict[str, float]]:
    """Status updates for the GridEvents whose status differs from what it should say, and
    the baselines measured now (CR name → kW). ``now_text``: ``now`` as the API writes it."""
    draw = snap.factory.site_draw_kw()
    now_kw = None if draw.stale else draw.value
    out: list[GridEventStatusUpdate] = []
    baselines: dict[str, float] = {}
    for ev in snap.grid_event_states:
        status, new = _status(ev, snap, config, now_kw, now_text)
        if new is not None:
            baselines[ev.name] = new
        if not same_status(ev.status, status):
            out.append(GridEventStatusUpdate(ev.name, status))
    return out, baselines


def next_boundary(snap: ClusterSnapshot) -> datetime | None:
    """The soonest grid event start or end after ``now``: the loop wakes then, so an event's
    start (its baseline, its shedding) is not left to the next periodic resync."""
    times = [t for e in snap.factory.grid_events for t in (e.start, e.end) if t > snap.now]
    return min(times, default=None)
