"""Isolation of bad objects: one malformed object is left out of the snapshot and reported,
and everything else keeps being decided (docs/reliability.md).

A CRD-valid object can still be impossible to use: a GridEvent starting in year 9999 (its end
overflows ``datetime``), a MaintenanceWindow starting in year 1 (its drain lead reaches before
year 1), a Node whose ``conditions`` are ``[1]`` or whose ``labels`` are a string. Before, one
of them raised out of the snapshot and every reconcile failed: no admission answers, no
derating, no shedding. ``Isolator.one`` runs one object's conversion; an exception, or a time
outside ``EARLIEST``..``LATEST``, leaves that object out and records a ``Rejected`` (kind, name,
one-line reason) that the controller reports (log, ``m2g_rejected_objects{kind}``) and
``m2g queues``/``status`` print.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from m2g.k8s.convert import (
    DomainSpec,
    Obj,
    grid_event_state,
    grid_events,
    maintenance_window,
    power_domain,
)
from m2g.model.cluster import GridEventState, Rejected
from m2g.model.factory import GridEvent, MaintenanceWindow

T = TypeVar("T")

#: Times m2g can reason about; outside them an object is rejected, not decided on.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
#: kW no site draws (10 GW; the site configuration's bound, m2g.config.site.MAX_SITE_KW): a
#: grid limit or a budget above it is not a limit m2g can hold a site to, and is rejected.
#: A GridEvent with a limit of 1e308 kW (CRD-valid: the schema has no maximum) was an active
#: grid event, and the shipped grid policy deferred every new flexible job for it.
MAX_KW = 10_000_000.0


def sane_time(value: datetime, what: str) -> datetime:
    """``value``, or ValueError when it lies outside EARLIEST..LATEST."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not EARLIEST <= value <= LATEST:
        raise ValueError(f"{what} {value.isoformat()} is outside {EARLIEST.year}-{LATEST.year}")
    return value


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns}/{name}" if ns else str(name)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Isolator:
    """Runs per-object conversions, collecting the objects that cannot be converted."""

    def __init__(self) -> None:
        self.rejected: list[Rejected] = []

    def one(self, kind: str, obj: Any, convert: Callable[..., T], *args: Any,
            **kwargs: Any) -> T | None:
        """``convert(obj, *args, **kwargs)``, or None (and a Rejected) if it raises."""
        try:
            return convert(obj, *args, **kwargs)
        except Exception as exc:  # any field of any type: the object is out, the rest goes on
            self.reject(kind, obj, one_line(exc))
            return None

    def reject(self, kind: str, obj: Any, reason: str) -> None:
        self.rejected.append(Rejected(kind, _name(obj), reason))

    def unique(self) -> tuple[Rejected, ...]:
        """The rejected objects, each once (an object converted twice is listed once)."""
        seen: dict[tuple[str, str], Rejected] = {}
        for r in self.rejected:
            seen.setdefault((r.kind, r.name), r)
        return tuple(sorted(seen.values(), key=lambda r: (r.kind, r.name)))


def checked_events(obj: Obj) -> tuple[GridEvent, ...]:
    """A GridEvent's intervals (m2g.k8s.convert.grid_events), every time within bounds; an
    interval that cannot be read at all rejects the object (ignoring it silently would drop a
    grid commitment without a word)."""
    events = grid_events(obj)
    intervals = (obj.get("spec") or {}).get("intervals")
    if not isinstance(intervals, list):
        raise ValueError("spec.intervals is not a list")
    if len(events) != len(intervals):
        raise ValueError(f"{len(intervals) - len(events)} of {len(intervals)} interval(s) "
                         "have no readable start or duration")
    for e in events:
        sane_time(e.start, "start")
        sane_time(e.end, "end")
        sane_kw(e.target_kw, "an interval's import capacity limit")
    return events


def sane_kw(value: float, what: str) -> float:
    """``value``, or ValueError when it is above MAX_KW (the conversion reads a value that
    is not a finite non-negative number as 0: no limit)."""
    if value > MAX_KW:
        raise ValueError(f"{what} of {value:g} kW is above {MAX_KW:g} kW: no site draws that")
    return value


def checked_domain(obj: Obj) -> DomainSpec:
    """A PowerDomain (m2g.k8s.convert.power_domain) whose budget and rack cap are kW a site
    can draw."""
    d = power_domain(obj)
    sane_kw(d.domain.budget_kw, "budgetKw")
    sane_kw(d.rack_cap_kw, "rackCapKw")
    return d


def checked_event_state(obj: Obj) -> GridEventState:
    checked_events(obj)
    return grid_event_state(obj)


def checked_window(obj: Obj) -> MaintenanceWindow | None:
    """A MaintenanceWindow (None when m2g.k8s.convert finds it unreadable: rejected too)."""
    w = maintenance_window(obj)
    if w is None:
        raise ValueError("start and end must be RFC 3339 times with end after start")
    sane_time(w.start, "start")
    sane_time(w.end, "end")
    return w
