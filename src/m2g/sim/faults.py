"""Conditions injected into the simulated factory (docs/signals.md, "Fault injection").

=====================  ==========================  ============================================
kind                   target                      effect
=====================  ==========================  ============================================
``cooling-degraded``   ``rack``                    coolant supply and inlet steady states
                                                   rise by ``deltaC`` (default 10 °C)
``tray-failed``        ``node``                    its GPUs draw idle power and report
                                                   ``DCGM_FI_DEV_XID_ERRORS`` = ``xid`` (79)
``power-cap``          ``node`` or ``rack``        GPUs capped at ``fraction`` × TDP
=====================  ==========================  ============================================

``parse_fault`` turns the JSON body of ``POST /faults`` into a ``Fault``; a bad spec raises
``FaultSpecError`` with one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel


class FaultKind(StrEnum):
    COOLING_DEGRADED = "cooling-degraded"
    TRAY_FAILED = "tray-failed"
    POWER_CAP = "power-cap"


class FaultSpecError(ValueError):
    """A fault spec that cannot be applied; ``str`` is one line."""


class Fault(BaseModel):
    """One injected condition."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel,
                              populate_by_name=True)

    kind: FaultKind
    rack: str = ""
    node: str = ""
    delta_c: float = Field(default=10.0, ge=-30, le=60)
    xid: int = Field(default=79, ge=1)
    fraction: float = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _target(self) -> Fault:
        if self.kind is FaultKind.COOLING_DEGRADED and (not self.rack or self.node):
            raise ValueError("cooling-degraded needs a rack (and no node)")
        if self.kind is FaultKind.TRAY_FAILED and (not self.node or self.rack):
            raise ValueError("tray-failed needs a node (and no rack)")
        if self.kind is FaultKind.POWER_CAP and bool(self.rack) == bool(self.node):
            raise ValueError("power-cap needs exactly one of rack or node")
        return self

    @property
    def target(self) -> str:
        return self.rack or self.node

    def wire(self) -> dict[str, Any]:
        """The JSON form, as accepted by ``parse_fault``."""
        return self.model_dump(by_alias=True, mode="json")


def parse_fault(data: Any) -> Fault:
    """Validate a fault spec (a JSON object); every problem becomes one line."""
    if not isinstance(data, Mapping):
        raise FaultSpecError("a fault is a JSON object, e.g. "
                             '{"kind": "cooling-degraded", "rack": "rack-000", "deltaC": 8}')
    try:
        return Fault.model_validate(dict(data))
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise FaultSpecError(f"bad fault spec: {problems}") from None


def cooling_delta(faults: Iterable[Fault], rack: str) -> float:
    return sum(f.delta_c for f in faults
               if f.kind is FaultKind.COOLING_DEGRADED and f.rack == rack)


def failed_xid(faults: Iterable[Fault], node: str) -> int:
    """The XID a failed tray reports, 0 when the tray is fine."""
    return next((f.xid for f in faults if f.kind is FaultKind.TRAY_FAILED and f.node == node), 0)


def cap_fraction(faults: Iterable[Fault], node: str, rack: str) -> float:
    """The tightest power cap on a node (1.0 = uncapped)."""
    return min((f.fraction for f in faults if f.kind is FaultKind.POWER_CAP
                and ((f.node and f.node == node) or (f.rack and f.rack == rack))),
               default=1.0)
