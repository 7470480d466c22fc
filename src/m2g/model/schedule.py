"""Capacity over time: Reservations (GPUs held for a tenant or named workloads from a start to an
end) and CapacityPlans (GPU or kW caps per interval, e.g. a day-ahead plan).

Adapters (m2g.k8s) convert the CRs into these; the planner (m2g.planner.reservations,
m2g.planner.caps) and the forecast (m2g.planner.forecast) read them. Plain data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

#: Expected runtime of a workload that states none (``m2g.io/expected-runtime-seconds``):
#: the templates' default (m2g.templates.params, ``expected_runtime``).
DEFAULT_RUNTIME_SECONDS = 3600


class ReservationPhase(StrEnum):
    """Where a Reservation is (``status.phase``)."""

    PENDING = "Pending"  # its hold has not begun
    HOLDING = "Holding"  # before the start: the capacity is kept free
    ACTIVE = "Active"  # between start and end: the capacity is the reservation's
    RELEASED = "Released"  # ended, or every named workload finished
    INVALID = "Invalid"  # cannot be honoured (reason in status.message); decides nothing


@dataclass(frozen=True)
class Reservation:
    """GPUs (``cliques`` whole NVLink cliques, optionally inside ``block``) for a tenant
    (``namespace``, optionally one LocalQueue) or for named ``workloads`` ("ns/name")."""

    name: str
    start: datetime
    end: datetime
    gpus: int = 0
    cliques: int = 0
    block: str = ""
    namespace: str = ""
    local_queue: str = ""
    workloads: tuple[str, ...] = ()
    lead_seconds: float | None = None  # None: the planner's default hold lead
    drain_lead_seconds: float | None = None
    status: Mapping[str, Any] = field(default_factory=dict)

    def hold_from(self, default_lead: float) -> datetime:
        lead = default_lead if self.lead_seconds is None else self.lead_seconds
        return self.start - timedelta(seconds=lead)

    @property
    def held_cliques(self) -> tuple[str, ...]:
        """The cliques the status says are held (kept while they stay usable: no churn)."""
        got = self.status.get("heldCliques")
        return tuple(str(x) for x in got) if isinstance(got, list) else ()


class CapUnit(StrEnum):
    GPUS = "gpus"
    KW = "kW"


@dataclass(frozen=True)
class CapacityPlan:
    """Caps per interval for a domain ("" = the site): ``values[i]`` holds from
    ``start + i*interval`` (GPUs or kW). A value < 0 means no cap in that interval."""

    name: str
    start: datetime
    interval_seconds: int
    values: tuple[float, ...]
    unit: CapUnit = CapUnit.GPUS
    domain: str = ""

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.interval_seconds * len(self.values))

    def at(self, t: datetime) -> float | None:
        """The cap in force at ``t`` (None: none)."""
        if t < self.start or t >= self.end:
            return None
        value = self.values[int((t - self.start).total_seconds() // self.interval_seconds)]
        return None if value < 0 else value

    def boundaries_after(self, t: datetime) -> list[datetime]:
        """The next interval boundary after ``t`` (the loop wakes then)."""
        if t >= self.end:
            return []
        if t < self.start:
            return [self.start]
        i = int((t - self.start).total_seconds() // self.interval_seconds) + 1
        return [self.start + timedelta(seconds=self.interval_seconds * i)]
