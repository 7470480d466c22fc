"""A workload that preempted others keeps its quota while m2g holds it back.

Kueue preempts when it reserves quota, before any AdmissionCheck is asked (kueue#1178 asked
for preemption after the checks; closed unmerged). When m2g then holds the preemptor back —
a policy's Defer, the site headroom (m2g.planner.headroom) — a Retry hands its quota back:
Kueue evicts it at ``requeueAt``, its victims (lower priority, often work m2g never holds
back) are admitted again and draw what the preemptor would have drawn, and at its next
attempt the preemptor preempts them again. Every round costs the victims the work since their
last checkpoint and saves no power. In the 16-rack twin (docs/benchmarks.md, sixth session)
foreign priority-0 jobs were preempted 3–8 times each this way, most of the flex-0 work lost.

So a Retry for a workload whose victims still wait — a Workload whose Preempted condition
names its UID and that holds no quota — becomes a Pending that keeps the quota, for up to
``preemptor_hold_seconds`` after the quota was reserved; after that, the Retry as before
(a hold never lasts for good). The message does not change from one reconcile to the next,
so the applier writes it once. A reservation's Retry (it frees capacity for the reservation)
is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import CheckUpdate, format_api_time
from m2g.planner.config import PlannerConfig

RULE = "preemptor-hold"


def victims(snap: ClusterSnapshot) -> dict[str, int]:
    """Preemptor UID → how many of the workloads Kueue preempted for it still wait (hold no
    quota and are active)."""
    out: dict[str, int] = {}
    for w in snap.workloads:
        if w.preempted_by and w.phase is Phase.PENDING:
            out[w.preempted_by] = out.get(w.preempted_by, 0) + 1
    return out


def hold(updates: Sequence[CheckUpdate], snap: ClusterSnapshot,
         config: PlannerConfig) -> list[CheckUpdate]:
    """``updates`` with the Retry answers of preemptors whose victims wait turned into a
    Pending hold (dropped when the check already says it); the order is kept."""
    if config.preemptor_hold_seconds <= 0 or not any(
            u.state is CheckState.RETRY for u in updates):
        return list(updates)
    waiting = victims(snap)
    if not waiting:
        return list(updates)
    by_key = {w.key: w for w in snap.workloads if w.uid in waiting}
    out: list[CheckUpdate] = []
    for u in updates:
        w = by_key.get(f"{u.namespace}/{u.name}")
        until = _until(w, snap, config) if w is not None and u.state is CheckState.RETRY \
            and u.policy != "reservation" else None
        if w is None or until is None:
            out.append(u)
            continue
        held = _pending(w, u, waiting[w.uid], until)
        if (w.check_state, w.check_message) != (CheckState.PENDING, held.message):
            out.append(held)
    return out


def _until(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig) -> str | None:
    """The end of ``w``'s hold (API time), None when it is not held (no quota reserved, no
    reservation time, or the hold has run out)."""
    if w.phase is not Phase.RESERVED or w.reserved_at is None:
        return None
    end = w.reserved_at + timedelta(seconds=config.preemptor_hold_seconds)
    return format_api_time(end) if snap.now < end else None


def _pending(w: WorkloadState, u: CheckUpdate, n: int, until: str) -> CheckUpdate:
    why = (f"held back ({u.policy or 'policy'}/{u.rule or 'defer'}) and keeping its quota: "
           f"Kueue preempted {n} workload(s) for it, and a Retry would give the quota back to "
           f"them only for it to preempt them again; m2g asks again each reconcile, until "
           f"{until} at the latest")
    return CheckUpdate(namespace=u.namespace, name=u.name, check=u.check,
                       state=CheckState.PENDING, message=why[:1024], policy=u.policy or RULE,
                       rule=RULE)
