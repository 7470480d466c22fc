"""The one entry that applies a whole ``Plan``: every write of it, then the Events that explain
the admission answers.

``apply_plan`` runs, in order: the Kueue and Node writes (``Applier.apply_core``: quotas, stops,
taints, sheds, checks, weights), the power caps (``m2g.k8s.caps``: Workload records, node
GPUPowerLimits) and the resizes of elastic Jobs (``m2g.k8s.resize``) — these first when the
plan lowers a GPU's limit or shrinks a Job (``lowers_power``) —, the
KAI writes (``KaiApplier``: Topologies, Queue limits), and
one Event per AdmissionCheck answer written (in dry-run/shadow mode: per answer decided), on its
Workload. Errors of one write never stop the others: they are in ``ApplyResult.errors``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.caps import apply_caps
from m2g.k8s.client import WORKLOADS, KubeError, Obj
from m2g.k8s.kai import KaiApplier
from m2g.k8s.resize import apply_resizes
from m2g.model.cluster import CheckState
from m2g.model.plan import CheckUpdate, Plan

log = logging.getLogger(__name__)

#: Check state → (Event reason, Event type).
CHECK_EVENTS = {CheckState.READY: ("Admitted", "Normal"), CheckState.RETRY: ("Deferred", "Normal"),
                CheckState.REJECTED: ("Rejected", "Warning"),
                CheckState.PENDING: ("Pending", "Normal")}

Known = Callable[[str, str], Obj | None]

#: The ``withinClusterQueue`` value of a preemption hold (m2g.planner.eventhold.NEVER: the
#: adapters import no planner).
NEVER = "Never"


async def apply_plan(applier: Applier, plan: Plan, *, known: Known | None = None) -> ApplyResult:
    """Apply ``plan`` through ``applier`` (its dry-run flag, records, background Events).
    ``known(namespace, name)``: the Workload as the caller's watch cache has it (None: read).

    A preemption hold (``withinClusterQueue: Never`` at a grid event's start,
    m2g.planner.eventhold) is written before anything else: Kueue preempts for new work in
    every scheduling cycle, and written after the event's first caps and node limits (one
    write per node), the hold of a 16-rack twin event reached the API server 3.5 s after the
    event started, while Kueue preempted a running flex-2 job of that queue (2026-12-07,
    run F)."""
    holds = [p for p in plan.preemptions if p.within == NEVER]
    if holds:
        first = ApplyResult()
        for p in holds:
            try:
                await applier.apply_preemption(p, first)
            except KubeError as exc:
                first.errors.append((f"preemption {p.cluster_queue}", exc))
        rest = await apply_plan(applier, replace(plan, preemptions=tuple(
            p for p in plan.preemptions if p.within != NEVER)), known=known)
        rest.records[:0] = first.records
        rest.errors[:0] = first.errors
        return rest
    if lowers_power(plan):  # a shortfall: the grid commitment goes before the answers
        result = ApplyResult()
        await apply_caps(applier, plan, result, known)
        await apply_resizes(applier, plan, result)
        core = await applier.apply_core(plan, known=known)
        result.records += core.records
        result.errors += core.errors
    else:
        result = await applier.apply_core(plan, known=known)
        await apply_caps(applier, plan, result, known)
        await apply_resizes(applier, plan, result)
    await KaiApplier(applier).apply(plan, result)
    await check_events(applier, plan, result, known)
    return result


def lowers_power(plan: Plan) -> bool:
    """Does ``plan`` cap a GPU? Then its caps and node limits are written before the
    admission answers and sheds (a 16-rack twin event's reconcile wrote ~100 answers before its
    ~150 node limits, at ~4 writes a second on a loaded API server)."""
    return any(c.fraction < 1.0 for c in plan.caps) or any(
        r.parallelism < r.full for r in plan.resizes) or any(
        u.fraction is not None and u.fraction < 1.0 for u in plan.node_limits)


async def check_events(applier: Applier, plan: Plan, result: ApplyResult,
                       known: Known | None = None) -> None:
    """One Event per check written, up to ``applier.parallel`` at once, in the background when
    the applier writes Events so (an Event took as long as the check's own write, and the next
    reconcile need not wait for it: 2,000 admissions one after the other held it for minutes)."""
    shadow = applier.dry_run
    written = {r.target for r in result.records if r.action == "check" and (
        r.written or shadow)}

    async def one(c: CheckUpdate, wl: Obj | None) -> None:
        reason, kind = CHECK_EVENTS[c.state]
        prefix = "[shadow] " if shadow else ""
        try:
            if wl is None:
                wl = await applier.kube.get_or_none(WORKLOADS, c.name, c.namespace)
            if wl is not None:
                await applier.emit_event(wl, reason, prefix + c.message, kind,
                                         action="AdmissionCheck")
        except KubeError as exc:  # an Event is best effort
            log.info("event for %s/%s not written: %s", c.namespace, c.name, exc)

    for c in plan.checks:
        if f"{c.namespace}/{c.name}" not in written:
            continue
        wl = known(c.namespace, c.name) if known is not None else None
        if known is not None and wl is None:
            continue  # gone from the cache: nothing to hang the Event on
        if applier.background_events:
            applier.in_background(partial(one, c, wl))
        else:
            await one(c, wl)
