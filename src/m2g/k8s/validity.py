"""The ``Accepted`` status condition on m2g's own objects that the snapshot leaves out.

An object m2g cannot use (m2g.k8s.isolate) is left out of the snapshot and reported: a Warning
Event ``LeftOut``, a log line, ``m2g_rejected_objects{kind}``, the CLI's warning — and, on
m2g's own kinds with a status subresource (``CONDITIONED``), this condition on the object:

* left out: ``Accepted=False``, reason ``LeftOut``, the one-line reason in the message,
  ``observedGeneration`` the generation it was judged at;
* fixed (no longer left out, and its condition said False): ``Accepted=True``, reason
  ``Accepted``. An object that was never left out gets no condition (no write per object).

``condition_updates`` returns only the conditions that differ from what the object already
says (status, reason, message, observedGeneration), so an object that stays broken is not
written again every reconcile. Nodes and Workloads are not m2g's: Event only.

The writes are server-side applies of ``status.conditions`` (a list keyed by ``type``) with
their own field manager, ``FIELD_MANAGER``: an apply replaces everything its manager applied
before, so the planner's GridEvent and Reservation status (manager ``m2g``) and this condition
must be two managers, or each write would remove the other's fields.

Pure: no I/O, no clock (``now_text`` is passed in).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from m2g.k8s import client as k
from m2g.model.cluster import Rejected
from m2g.model.status import conditions_by_type

ACCEPTED = "Accepted"
LEFT_OUT = "LeftOut"
#: The field manager of this condition (the planner's status fields are ``m2g``'s).
FIELD_MANAGER = "m2g-snapshot"
MAX_MESSAGE = 1024

#: Rejected.kind → (ClusterObjects field, resource): m2g's kinds with a status subresource.
CONDITIONED: dict[str, tuple[str, k.Resource]] = {
    "PowerDomain": ("power_domains", k.POWER_DOMAINS),
    "GridEvent": ("grid_events", k.GRID_EVENTS),
    "MaintenanceWindow": ("maintenance_windows", k.MAINTENANCE_WINDOWS),
    "GPUPowerLimit": ("gpu_power_limits", k.GPU_POWER_LIMITS),
    "Reservation": ("reservations", k.RESERVATIONS),
    "CapacityPlan": ("capacity_plans", k.CAPACITY_PLANS),
}


@dataclass(frozen=True)
class ConditionUpdate:
    """Set ``condition`` on one object's status (``key``: its cache key, the name)."""

    kind: str
    key: str
    resource: k.Resource
    condition: dict[str, Any]

    @property
    def accepted(self) -> bool:
        return bool(self.condition["status"] == "True")

    def body(self) -> dict[str, Any]:
        """The server-side apply body (status subresource)."""
        return {"apiVersion": self.resource.api_version, "kind": self.resource.kind,
                "metadata": {"name": self.key}, "status": {"conditions": [self.condition]}}


def _generation(obj: Mapping[str, Any]) -> int | None:
    gen = (obj.get("metadata") or {}).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) and gen >= 0 else None


def _current(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return conditions_by_type(status.get("conditions") if isinstance(status, dict) else None
                              ).get(ACCEPTED) or {}


def condition(obj: Mapping[str, Any], kind: str, reason: str | None,
              now_text: str) -> dict[str, Any]:
    """The ``Accepted`` condition ``obj`` should bear: False with ``reason`` when it is left
    out, True when ``reason`` is None; the transition time kept while the status holds."""
    ok = reason is None
    status = "True" if ok else "False"
    text = (f"m2g decides with this {kind}" if ok else
            f"m2g cannot use this {kind} and decides without it: {reason}")
    prev = _current(obj)
    cond: dict[str, Any] = {
        "type": ACCEPTED, "status": status, "reason": ACCEPTED if ok else LEFT_OUT,
        "message": text[:MAX_MESSAGE],
        "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status
        and isinstance(prev.get("lastTransitionTime"), str) else now_text}
    gen = _generation(obj)
    if gen is not None:
        cond["observedGeneration"] = gen
    return cond


def _differs(obj: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    have = _current(obj)
    return any(have.get(f) != want.get(f)
               for f in ("status", "reason", "message", "observedGeneration"))


def condition_updates(objects: Mapping[str, Mapping[str, Mapping[str, Any]]],
                      rejected: Iterable[Rejected], now_text: str) -> list[ConditionUpdate]:
    """The condition writes this snapshot needs. ``objects``: ClusterObjects field → the
    cache's key → object; ``rejected``: the snapshot's left-out objects (all of them). One
    with a ``part`` is not left out (the object is used, only that part is ignored): it gets
    no ``Accepted=False``."""
    out: list[ConditionUpdate] = []
    left_out = {(r.kind, r.name): r.reason for r in rejected if not r.part}
    for kind, (field_name, res) in CONDITIONED.items():
        for key, obj in sorted((objects.get(field_name) or {}).items()):
            if not isinstance(obj, dict):
                continue
            reason = left_out.get((kind, key))
            if reason is None and _current(obj).get("status") != "False":
                continue  # never left out, or already cleared: nothing to say
            want = condition(obj, kind, reason, now_text)
            if _differs(obj, want):
                out.append(ConditionUpdate(kind, key, res, want))
    return out
