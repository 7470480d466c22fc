"""Apply the power-cap part of a ``Plan``: m2g's cap record on each Workload, then each node's
GPUPowerLimit (docs/curtailment.md, docs/node-agent.md).

* ``CapAction`` → a merge patch of the Workload's own annotations ``m2g.io/power-cap``,
  ``m2g.io/power-cap-at`` (the last change: set, renewed or lifted) and
  ``m2g.io/flex-used-seconds``; written only when the cap differs from the record; one Event
  (``PowerCapped``/``PowerCapLifted``).
* ``NodeLimitUpdate`` → server-side apply of the GPUPowerLimit's ``spec`` (field manager
  ``m2g``; the agent owns ``status``), or its deletion on release.
In dry-run (shadow) mode only the records say what would have been written.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from m2g.k8s.annotations import FLEX_USED, POWER_CAP, POWER_CAP_AT
from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.client import GPU_POWER_LIMITS, WORKLOADS, KubeError, NotFound, Obj
from m2g.k8s.parse import format_time
from m2g.model.plan import CapAction, NodeLimitUpdate, Plan

log = logging.getLogger(__name__)


def cap_annotations(a: CapAction, annotations: dict[str, Any], now: str) -> dict[str, Any]:
    """The annotation changes for ``a`` on a Workload with ``annotations`` ({} : none). A lift
    removes the cap and stamps ``m2g.io/power-cap-at`` with the lift's time: the ramp counts from
    it, so the next lift is paced (whoever makes it). Until 2026-12-07 a lift stamped
    ``m2g.io/restored-at``, the pause-restore stamp: a job paused soon after its cap was lifted
    then read as one that flapped, and one Kueue preempted soon after as restored work in
    flight."""
    used = f"{a.flex_used_seconds:g}"
    if a.fraction >= 1.0:
        want: dict[str, Any] = {POWER_CAP: None, POWER_CAP_AT: now, FLEX_USED: used}
    else:
        want = {POWER_CAP: f"{a.fraction:g}", POWER_CAP_AT: now, FLEX_USED: used}
        if annotations.get(POWER_CAP) == want[POWER_CAP] and not a.renew:
            return {}
    if a.fraction >= 1.0 and POWER_CAP not in annotations:
        return {}
    return want


async def apply_cap(applier: Applier, a: CapAction, result: ApplyResult,
                    current: Obj | None = None) -> bool:
    """Write ``a``'s record on its Workload; False when there is nothing to write, or the
    Workload is gone (it finished: no cap to record — not a failed reconcile, which a 16-rack
    twin event hit whenever a capped job finished)."""
    try:
        return await _apply_cap(applier, a, result, current)
    except NotFound:
        return False


async def _apply_cap(applier: Applier, a: CapAction, result: ApplyResult,
                     current: Obj | None) -> bool:
    wl = current if current is not None else await applier.kube.get(WORKLOADS, a.name,
                                                                     a.namespace)
    annotations = dict((wl.get("metadata") or {}).get("annotations") or {})
    changes = cap_annotations(a, annotations, format_time(applier.clock()))
    verb = "lift-cap" if a.fraction >= 1.0 else "cap"
    if not applier._record(result, verb, f"{a.namespace}/{a.name}",
                           f"{a.kw:.1f} kW: {a.reason}", bool(changes)):
        return False
    await applier.kube.patch(WORKLOADS, a.name, {"metadata": {"annotations": changes}},
                             namespace=a.namespace, field_manager=applier.field_manager)

    async def event() -> None:
        try:
            await applier.emit_event(wl, "PowerCapLifted" if a.fraction >= 1.0
                                     else "PowerCapped", a.reason, "Normal")
        except KubeError as exc:  # best effort
            log.info("event for cap %s/%s: %s", a.namespace, a.name, exc)

    if applier.background_events:  # the controller: an Event never holds up a reconcile
        applier.in_background(event)
    else:
        await event()
    return True


async def apply_node_limit(applier: Applier, u: NodeLimitUpdate, result: ApplyResult) -> bool:
    if u.fraction is None:
        if not applier._record(result, "release-gpu-limit", u.node, u.reason, True):
            return False
        await applier.kube.delete(GPU_POWER_LIMITS, u.node)
        return True
    spec: dict[str, Any] = {"nodeName": u.node, "fraction": round(u.fraction, 4),
                            "expiresAt": format_time(u.expires_at) if u.expires_at else None,
                            "workloads": list(u.workloads), "reason": u.reason[:1024]}
    if not applier._record(result, "gpu-limit", u.node,
                           f"{u.fraction:g} until {spec['expiresAt']}", True):
        return False
    await applier.kube.apply(GPU_POWER_LIMITS, u.node, {
        "apiVersion": GPU_POWER_LIMITS.api_version, "kind": GPU_POWER_LIMITS.kind,
        "metadata": {"name": u.node}, "spec": spec}, field_manager=applier.field_manager)
    return True


async def apply_caps(applier: Applier, plan: Plan, result: ApplyResult,
                     known: Any = None) -> None:
    """Every cap record, then every node limit, each up to ``applier.parallel`` at once (a
    16-rack twin event capped 74 workloads on ~200 nodes: one write after the other held the
    reconcile — and every other answer — for tens of seconds); one failure never stops the
    others."""
    await applier.bounded_recorded(result, [(f"cap {a.namespace}/{a.name}", partial(
        apply_cap, applier, a, result,
        known(a.namespace, a.name) if known is not None else None)) for a in plan.caps])
    await applier.bounded_recorded(result, [(f"gpu-limit {u.node}", partial(
        apply_node_limit, applier, u, result)) for u in plan.node_limits])
