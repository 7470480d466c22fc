"""Hourly capacity caps (CapacityPlan, m2g.model.schedule) → quota limits and a kW limit.

Computed once per snapshot. In each interval of a plan:

* a **GPU** cap limits the ClusterQueue GPU quotas of the flavors on its domain (the site: every
  flavor) to that many GPUs in total, shared in proportion to their base quotas (with the
  Capacity policies' limit: the lower wins);
* a **kW** cap does the same with cap ÷ ``default_kw_per_gpu`` GPUs, and for the site it is also
  a capacity limit like an OpenADR IMPORT_CAPACITY_LIMIT event (``capacityplan/<name>``), so
  admission headroom and the Preemption policies follow it: work is shed only when the measured
  draw exceeds the plan, never merely because the hour changed.

A daily-total-preserving plan (a CICM-style day-ahead plan) is simply a list of values.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from m2g.model.cluster import ClusterSnapshot
from m2g.model.factory import GridEvent, GridPayload
from m2g.model.schedule import CapacityPlan, CapUnit
from m2g.planner.config import PlannerConfig


def _site(plan: CapacityPlan, snap: ClusterSnapshot) -> bool:
    return plan.domain in ("", snap.factory.site)


def gpu_caps(snap: ClusterSnapshot, config: PlannerConfig) -> dict[str, tuple[float, str]]:
    """Domain ("" = site) → (GPU cap now, the plan's reason), the lowest of its plans."""
    out: dict[str, tuple[float, str]] = {}
    for p in snap.capacity_plans:
        value = p.at(snap.now)
        if value is None:
            continue
        gpus = value if p.unit is CapUnit.GPUS else value / config.default_kw_per_gpu
        key = "" if _site(p, snap) else p.domain
        why = f"capacity plan {p.name}: {value:g} {p.unit.value} this interval"
        if key not in out or gpus < out[key][0]:
            out[key] = (gpus, why)
    return out


def with_kw_caps(snap: ClusterSnapshot) -> ClusterSnapshot:
    """``snap`` with each site kW cap in force now as a capacity-limit grid interval."""
    extra = []
    for p in snap.capacity_plans:
        value = p.at(snap.now)
        if value is None or p.unit is not CapUnit.KW or not _site(p, snap):
            continue
        start = max((b for b in _bounds(p) if b <= snap.now), default=p.start)
        end = min((b for b in _bounds(p) if b > snap.now), default=p.end)
        extra.append(GridEvent(id=f"capacityplan/{p.name}", start=start, end=end,
                               program="CapacityPlan", payload=GridPayload.IMPORT_CAPACITY_LIMIT,
                               target_kw=max(value, 0.001)))
    if not extra:
        return snap
    events = tuple(sorted((*snap.factory.grid_events, *extra), key=lambda e: (e.start, e.id)))
    return replace(snap, factory=replace(snap.factory, grid_events=events))


def _bounds(p: CapacityPlan) -> list[datetime]:
    return [p.start + timedelta(seconds=p.interval_seconds * i) for i in range(len(p.values) + 1)]


def boundaries(snap: ClusterSnapshot) -> list[datetime]:
    return [t for p in snap.capacity_plans for t in p.boundaries_after(snap.now)]
