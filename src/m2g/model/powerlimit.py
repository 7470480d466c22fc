"""The GPU power-limit lever: the ``GPUPowerLimit`` protocol between m2g and its node agent.

One cluster-scoped ``GPUPowerLimit`` (m2g.io/v1alpha1) per GPU node, named after the node.
The trust boundary is the object's two halves:

* ``spec`` — written only by m2g's controller (field manager ``m2g``; RBAC gives nobody else
  write access): ``fraction`` of each GPU's default power limit (or absolute ``watts``), the
  ``workloads`` it is for, a ``reason``, and ``expiresAt``, the controller's lease on it. The
  controller renews the lease while it still wants the cap and deletes the object to release it.
* ``status`` — written only by ``m2g node-agent`` (the ``/status`` subresource): the limit in
  force per GPU, the device's min/max/default, ``phase`` and when it was applied.

The agent's rules (``decide``, pure):

* a spec's target per GPU is ``watts`` or ``fraction`` × the GPU's default limit, clamped to the
  device's [min, max];
* **fail-safe**: no object (released), a spec that cannot be read, a lease more than an hour
  ahead, or a lease expired for more than ``grace_seconds`` (the agent's flag, default 60 s) →
  every GPU back to its default limit: a GPU is never left capped by a dead controller for
  longer than lease + grace;
* **rate limit**: a node's limits change at most once per ``min_interval_seconds``; a return
  to the default is never delayed (the safe direction).

Everything here is plain data and pure: the agent's loop (m2g_controllers.nodeagent) does the
I/O, the NVML backends (m2g.nodeagent) touch the devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

#: The lease the controller writes into ``spec.expiresAt`` (renewed at half of it).
DEFAULT_LEASE_SECONDS = 120.0
#: How long after ``expiresAt`` the agent still honours a cap (clock skew, a controller restart).
DEFAULT_GRACE_SECONDS = 60.0
#: The least time between two changes of a node's limits (restores are never delayed).
DEFAULT_MIN_INTERVAL_SECONDS = 5.0
#: A lease further ahead than this is refused (a typo, or a clock far off, would leave GPUs
#: capped for long after m2g is gone): the spec reads as unusable.
MAX_LEASE_SECONDS = 3600.0
#: The longest ``--interval``, ``--grace`` and ``--min-interval`` of the node agent: a cap
#: outlives its lease by at most an hour (an infinite grace kept a GPU capped for ever)
MAX_AGENT_SECONDS = 3600.0
#: The lowest fraction a spec may ask for (the CRD enforces it too); lower reads as this.
MIN_FRACTION = 0.1


class LimitPhase(StrEnum):
    """``status.phase`` of a GPUPowerLimit, as the agent reports it."""

    APPLIED = "Applied"  # the spec's limit is in force
    PENDING = "Pending"  # waiting for the rate limit
    EXPIRED = "Expired"  # the lease ran out: defaults restored
    INVALID = "Invalid"  # the spec cannot be read: defaults restored
    READ_ONLY = "ReadOnly"  # the agent only reads (``--read-only``): nothing changed
    FAILED = "Failed"  # NVML refused


@dataclass(frozen=True)
class LimitSpec:
    """What the controller asks of one node."""

    node: str
    fraction: float = 1.0
    watts: float | None = None
    expires_at: datetime | None = None
    workloads: tuple[str, ...] = ()
    reason: str = ""
    generation: int = 0


@dataclass(frozen=True)
class Device:
    """One GPU as NVML reports it, in watts."""

    index: int
    uuid: str
    limit_w: float
    default_w: float
    min_w: float
    max_w: float
    power_w: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What the agent does now: per GPU index, the limit to set (only those that change), the
    phase and message to report."""

    targets: Mapping[int, float]
    phase: LimitPhase
    message: str


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def parse_spec(obj: Mapping[str, Any]) -> LimitSpec | str:
    """A GPUPowerLimit object's spec, or one line saying why it cannot be used."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return "no spec"
    node = str(spec.get("nodeName") or (meta or {}).get("name") or "")
    fraction, watts = spec.get("fraction", 1.0), spec.get("watts")
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or \
            not 0 < fraction <= 1:
        return f"spec.fraction {fraction!r} is not in (0, 1]"
    if watts is not None and (not isinstance(watts, int | float) or isinstance(watts, bool)
                              or watts <= 0):
        return f"spec.watts {watts!r} is not a positive number"
    expires = _time(spec.get("expiresAt"))
    if expires is None:
        return f"spec.expiresAt {spec.get('expiresAt')!r} is not an RFC 3339 time"
    workloads = tuple(str(w) for w in spec.get("workloads") or () if isinstance(w, str))
    return LimitSpec(node, max(MIN_FRACTION, float(fraction)),
                     None if watts is None else float(watts), expires, workloads,
                     str(spec.get("reason") or "")[:1024],
                     int((meta or {}).get("generation") or 0))


def target_watts(spec: LimitSpec, d: Device) -> float:
    """The limit ``spec`` asks of device ``d``, clamped to its [min, max]."""
    want = spec.watts if spec.watts is not None else spec.fraction * d.default_w
    return round(min(d.max_w, max(d.min_w, want)))


def expired(spec: LimitSpec, now: datetime, grace_seconds: float) -> bool:
    return spec.expires_at is None or \
        now > spec.expires_at + timedelta(seconds=grace_seconds)


def _restore(devices: Sequence[Device]) -> dict[int, float]:
    return {d.index: d.default_w for d in devices if abs(d.limit_w - d.default_w) >= 1}


def decide(spec: LimitSpec | str | None, devices: Sequence[Device], now: datetime, *,
           last_change: datetime | None = None, grace_seconds: float = DEFAULT_GRACE_SECONDS,
           min_interval_seconds: float = DEFAULT_MIN_INTERVAL_SECONDS) -> Decision:
    """The agent's whole rule set for one node (see the module docstring). ``spec``: the parsed
    spec, a reason it is unusable (str), or None when there is no object."""
    if spec is None:
        return Decision(_restore(devices), LimitPhase.APPLIED, "released: default limits")
    if isinstance(spec, str):
        return Decision(_restore(devices), LimitPhase.INVALID,
                        f"spec unusable ({spec}): default limits restored")
    if spec.expires_at is not None and \
            (spec.expires_at - now).total_seconds() > MAX_LEASE_SECONDS:
        return Decision(_restore(devices), LimitPhase.INVALID,
                        f"lease until {spec.expires_at:%Y-%m-%dT%H:%M:%SZ} is more than "
                        f"{MAX_LEASE_SECONDS:g} s ahead: refused, default limits restored")
    if expired(spec, now, grace_seconds):
        return Decision(_restore(devices), LimitPhase.EXPIRED,
                        f"lease expired at {spec.expires_at:%Y-%m-%dT%H:%M:%SZ} (+{grace_seconds:g}"
                        " s grace): the controller is gone, default limits restored")
    want = {d.index: target_watts(spec, d) for d in devices}
    changes = {i: w for i, w in want.items()
               if abs(w - next(d.limit_w for d in devices if d.index == i)) >= 1}
    lowering = any(w < next(d.default_w for d in devices if d.index == i)
                   for i, w in changes.items())
    if changes and lowering and last_change is not None and \
            (now - last_change).total_seconds() < min_interval_seconds:
        return Decision({}, LimitPhase.PENDING,
                        f"rate limit: one change per {min_interval_seconds:g} s")
    shown = spec.watts if spec.watts is not None else spec.fraction
    what = f"{shown:g} W" if spec.watts is not None else f"{shown:g} of the default"
    return Decision(changes, LimitPhase.APPLIED, f"per-GPU limit {what}: {spec.reason}"[:1024])


def status_body(devices: Sequence[Device], decision: Decision, generation: int,
                applied_at: datetime | None) -> dict[str, Any]:
    """The ``status`` the agent writes (after applying ``decision``: ``devices`` as read back)."""
    out: dict[str, Any] = {
        "phase": str(decision.phase), "message": decision.message,
        "observedGeneration": generation,
        "gpus": [{"index": d.index, "uuid": d.uuid, "limitWatts": round(d.limit_w),
                  "defaultWatts": round(d.default_w), "minWatts": round(d.min_w),
                  "maxWatts": round(d.max_w)} for d in devices]}
    if applied_at is not None:
        out["appliedAt"] = applied_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


@dataclass(frozen=True)
class NodeLimitState:
    """A GPUPowerLimit as the controller's snapshot holds it: its spec and the status the agent
    reported (``applied_fraction``: the limit in force / default, mean over the node's GPUs;
    None before the agent reported)."""

    node: str
    spec: LimitSpec | None
    applied_fraction: float | None = None
    phase: str = ""
    applied_at: datetime | None = None


def node_limit_state(obj: Mapping[str, Any]) -> NodeLimitState | None:
    """The snapshot's view of one object; None when it names no node."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = str((meta or {}).get("name") or "")
    if not name:
        return None
    parsed = parse_spec(obj)
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    gpus = [g for g in (status or {}).get("gpus") or () if isinstance(g, Mapping)]
    fractions = [float(g["limitWatts"]) / float(g["defaultWatts"]) for g in gpus
                 if isinstance(g.get("limitWatts"), int | float)
                 and isinstance(g.get("defaultWatts"), int | float) and g["defaultWatts"] > 0]
    return NodeLimitState(
        name, parsed if isinstance(parsed, LimitSpec) else None,
        sum(fractions) / len(fractions) if fractions else None,
        str((status or {}).get("phase") or ""), _time((status or {}).get("appliedAt")))
