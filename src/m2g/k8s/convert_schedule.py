"""Reservation and CapacityPlan CRs → m2g.model.schedule; one that cannot be honoured as
written raises ValueError with one line (m2g.k8s.isolate leaves it out and reports it).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from m2g.k8s.isolate import sane_time
from m2g.k8s.parse import nonneg_float, nonneg_int, parse_time
from m2g.model.schedule import CapacityPlan, CapUnit, Reservation

Obj = Mapping[str, Any]
MAX_GPUS = 1_000_000
MAX_INTERVALS = 24 * 14  # two weeks of hours


def _part(obj: Obj, key: str) -> Mapping[str, Any]:
    got = obj.get(key) or {}
    if not isinstance(got, Mapping):
        raise ValueError(f"{key} is not an object")
    return got


def _times(spec: Mapping[str, Any]) -> tuple[Any, Any]:
    start, end = parse_time(spec.get("start")), parse_time(spec.get("end"))
    if start is None or end is None:
        raise ValueError("start and end must be RFC 3339 times")
    if end <= start:
        raise ValueError("end must be after start")
    return sane_time(start, "start"), sane_time(end, "end")


def _opt_seconds(value: Any) -> float | None:
    return None if value is None else min(nonneg_float(value), 7 * 86400.0)


def reservation(obj: Obj) -> Reservation:
    """A Reservation CR → model (ValueError: unusable as written)."""
    spec, meta = _part(obj, "spec"), _part(obj, "metadata")
    start, end = _times(spec)
    gpus, cliques = nonneg_int(spec.get("gpus")), nonneg_int(spec.get("cliques"))
    if gpus == 0 and cliques == 0:
        raise ValueError("a reservation asks for gpus or cliques")
    if gpus > MAX_GPUS or cliques > MAX_GPUS // 4:
        raise ValueError(f"{gpus or cliques} is not a plausible size")
    tenant = _part(spec, "tenant")
    names = spec.get("workloads") or []
    if not isinstance(names, list):
        raise ValueError("workloads is not a list")
    workloads = tuple(sorted(f"{w.get('namespace') or tenant.get('namespace') or ''}/"
                             f"{w.get('name', '')}" for w in names if isinstance(w, Mapping)))
    if not tenant.get("namespace") and not workloads:
        raise ValueError("a reservation names a tenant namespace or workloads")
    status = obj.get("status") or {}
    return Reservation(
        name=str(meta.get("name", "")), start=start, end=end, gpus=gpus, cliques=cliques,
        block=str(spec.get("block") or ""), namespace=str(tenant.get("namespace") or ""),
        local_queue=str(tenant.get("localQueue") or ""), workloads=workloads,
        lead_seconds=_opt_seconds(spec.get("leadSeconds")),
        drain_lead_seconds=_opt_seconds(spec.get("drainLeadSeconds")),
        status=status if isinstance(status, Mapping) else {})


def capacity_plan(obj: Obj) -> CapacityPlan:
    """A CapacityPlan CR → model (ValueError: unusable as written)."""
    spec, meta = _part(obj, "spec"), _part(obj, "metadata")
    start = parse_time(spec.get("start"))
    if start is None:
        raise ValueError("start must be an RFC 3339 time")
    sane_time(start, "start")
    interval = nonneg_int(spec.get("intervalSeconds") or 3600)
    if not 60 <= interval <= 86400:
        raise ValueError(f"intervalSeconds {interval} is outside 60-86400")
    gpus, kw = spec.get("gpus"), spec.get("kw")
    if (gpus is None) == (kw is None):
        raise ValueError("a capacity plan gives exactly one of gpus or kw per interval")
    raw = gpus if gpus is not None else kw
    if not isinstance(raw, list) or not raw or len(raw) > MAX_INTERVALS:
        raise ValueError(f"the caps are a list of 1-{MAX_INTERVALS} numbers")
    values = tuple(-1.0 if v is None else _cap(v) for v in raw)
    plan = CapacityPlan(name=str(meta.get("name", "")), start=start, interval_seconds=interval,
                        values=values, unit=CapUnit.GPUS if gpus is not None else CapUnit.KW,
                        domain=str(spec.get("domain") or ""))
    sane_time(plan.end, "end")
    return plan


def _cap(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"cap {value!r} is not a number")
    if value != value or value > 1e9:
        raise ValueError(f"cap {value!r} is not plausible")
    return float(value) if value >= 0 else -1.0
