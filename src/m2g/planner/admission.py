"""AdmissionCheck decisions: Admission and Placement policies for every workload m2g must answer.

Kueue adds m2g's check as Pending once a workload has quota reserved; m2g answers Ready (with
podSetUpdates), Retry (Kueue releases the quota and requeues after ``requeueAfterSeconds``) or
Rejected (Kueue deactivates the workload). A Defer maps to Retry rather than to a Pending that
holds quota. Kueue v0.19 keeps the quota until ``requeueAfterSeconds`` has passed, so m2g caps
it (``max_retry_hold_seconds``) and states the policy's full wait in the message.

A workload m2g deferred is decided again while Kueue still holds it (Retry, quota reserved):
once the decision is Admit — the grid event ended, the headroom came back — m2g answers Ready
at once. Kueue v0.19.2 then admits it without the eviction and new quota reservation a Retry
leads to, at the ``requeueState.requeueAt`` the Retry set (its workload controller returns
early until then: pkg/controller/core/workload_controller.go, "Waiting for backoff to
finish"), that is at most ``max_retry_hold_seconds`` after the deferral. A decision that is
still Defer (or Reject) leaves the Retry alone: Kueue's requeue asks again.
"""

from __future__ import annotations

from m2g.model.cluster import CheckState, Phase, WorkloadState
from m2g.model.plan import CheckUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.policy import Decision, Evaluator
from m2g.policy.results import AdmissionResult, Reason

_STATE = {Decision.ADMIT: CheckState.READY, Decision.DEFER: CheckState.RETRY,
          Decision.REJECT: CheckState.REJECTED}
MAX_MESSAGE = 1024


def check_state(decision: Decision) -> CheckState:
    """The AdmissionCheck state m2g answers for an Admission decision."""
    return _STATE[decision]


def awaiting(w: WorkloadState, check: str) -> bool:
    """Does this workload wait for m2g's answer?"""
    return (w.phase is Phase.RESERVED and w.check == check
            and w.check_state in (CheckState.PENDING, None))


def deferred(w: WorkloadState, check: str) -> bool:
    """Did m2g defer this workload, and does Kueue still hold its quota for it?"""
    return w.phase is Phase.RESERVED and w.check == check and w.check_state is CheckState.RETRY


def deciding(result: AdmissionResult) -> list[Reason]:
    """The reasons that made the decision (all fired reasons when none match it)."""
    return [r for r in result.reasons if r.decision == result.decision.value] or list(
        result.reasons)


def message(result: AdmissionResult) -> str:
    """One line a user can act on: the deciding reasons first."""
    reasons = deciding(result)
    if not reasons:
        return "admitted: no policy objected"
    text = "; ".join(f"{r.policy}/{r.rule}: {r.message}" for r in reasons)
    if result.requeue_after_seconds:
        text += f" (retry in {result.requeue_after_seconds}s)"
    return text[:MAX_MESSAGE]


def check_updates(evaluator: Evaluator, builder: InputBuilder,
                  config: PlannerConfig) -> list[CheckUpdate]:
    """A CheckUpdate for every workload whose m2g check is Pending, and a Ready for every
    deferred one (``deferred``) whose decision is now Admit."""
    waiting = [w for w in builder.snap.workloads
               if awaiting(w, config.check_name) or deferred(w, config.check_name)]
    if not waiting:
        return []
    results = evaluator.admission_many([builder.for_workload(w) for w in waiting])
    out = []
    for w, res in zip(waiting, results, strict=True):
        if w.check_state is CheckState.RETRY and res.decision is not Decision.ADMIT:
            continue
        out.append(CheckUpdate(
            namespace=w.namespace, name=w.name, check=config.check_name,
            state=check_state(res.decision), message=message(res),
            requeue_after_seconds=None if res.requeue_after_seconds is None else min(
                res.requeue_after_seconds, config.max_retry_hold_seconds),
            pod_set_updates=tuple(u.to_json() for u in res.pod_set_updates),
            policy=next((r.policy for r in deciding(res)), ""),
            rule=next((r.rule for r in deciding(res)), ""),
        ))
    return out
