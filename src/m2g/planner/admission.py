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

from collections.abc import Mapping
from typing import Any

from m2g.model.cluster import CheckState, Phase, WorkloadState
from m2g.model.plan import CheckUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.reservations import ReservationBook
from m2g.policy import Decision, Evaluator
from m2g.policy.results import AdmissionResult, Reason

_STATE = {Decision.ADMIT: CheckState.READY, Decision.DEFER: CheckState.RETRY,
          Decision.REJECT: CheckState.REJECTED}
MAX_MESSAGE = 1024


def check_state(decision: Decision) -> CheckState:
    """The AdmissionCheck state m2g answers for an Admission decision."""
    return _STATE[decision]


def awaiting(w: WorkloadState) -> bool:
    """Does this workload wait for m2g's answer (on any AdmissionCheck of m2g's)?"""
    return (w.phase is Phase.RESERVED and bool(w.check)
            and w.check_state in (CheckState.PENDING, None))


def deferred(w: WorkloadState) -> bool:
    """Did m2g defer this workload, and does Kueue still hold its quota for it?"""
    return w.phase is Phase.RESERVED and bool(w.check) and w.check_state is CheckState.RETRY


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


def check_updates(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
                  check_evaluators: Mapping[str, Evaluator | None] | None = None,
                  book: ReservationBook | None = None) -> list[CheckUpdate]:
    """A CheckUpdate for every workload whose m2g check is Pending, and a Ready for every
    deferred one (``deferred``) whose decision is now Admit. Every AdmissionCheck with
    controllerName m2g.io/policy is answered, by ``evaluator`` or by its own entry of
    ``check_evaluators`` (a policy selection, from the check's parameters); a check mapped to
    None (its parameters are broken: it is not Active) is not answered. ``book``: the
    reservations, which hold back (Retry) workloads their policies would admit."""
    own = check_evaluators or {}
    groups: dict[int, tuple[Evaluator, list[tuple[int, WorkloadState]]]] = {}
    for i, w in enumerate(builder.snap.workloads):
        ev = own.get(w.check, evaluator) if awaiting(w) or deferred(w) else None
        if ev is not None:
            groups.setdefault(id(ev), (ev, []))[1].append((i, w))
    out: list[tuple[int, CheckUpdate]] = []
    order = sorted((iw for _, ws in groups.values() for iw in ws), key=lambda iw: iw[0])
    gates = book.gates(w for _, w in order) if book is not None and order else {}
    for ev, waiting in groups.values():
        results = ev.admission_items(builder.base(), [builder.item(w) for _, w in waiting])
        answers: dict[int, dict[str, Any]] = {}  # workloads of one class share their result
        for (i, w), res in zip(waiting, results, strict=True):
            held = gates.get(w.key)
            if held and res.decision is Decision.ADMIT:
                if w.check_state is not CheckState.RETRY:
                    out.append((i, _held(w, *held, config)))
                continue
            if w.check_state is CheckState.RETRY and res.decision is not Decision.ADMIT:
                continue
            answer = answers.get(id(res))
            if answer is None:
                answer = answers[id(res)] = _answer(res, config)
            out.append((i, CheckUpdate(namespace=w.namespace, name=w.name, check=w.check,
                                       **answer)))
    return [u for _, u in sorted(out, key=lambda x: x[0])]  # in the snapshot's order


def _held(w: WorkloadState, why: str, pending: bool, config: PlannerConfig) -> CheckUpdate:
    """A reservation holds this workload back: Retry (it would take the reservation's
    capacity), or Pending (``pending``: the reservation's own, early: it keeps its quota)."""
    return CheckUpdate(namespace=w.namespace, name=w.name, check=w.check,
                       state=CheckState.PENDING if pending else CheckState.RETRY,
                       message=why[:MAX_MESSAGE],
                       requeue_after_seconds=None if pending else min(
                           config.reservation_retry_seconds, config.max_retry_hold_seconds),
                       policy="reservation", rule="hold")


def _answer(res: AdmissionResult, config: PlannerConfig) -> dict[str, Any]:
    """The fields of a CheckUpdate that come from the decision (the same for every workload
    that shares ``res``)."""
    reasons = deciding(res)
    return {
        "state": check_state(res.decision), "message": message(res),
        "requeue_after_seconds": None if res.requeue_after_seconds is None else min(
            res.requeue_after_seconds, config.max_retry_hold_seconds),
        "pod_set_updates": tuple(u.to_json() for u in res.pod_set_updates),
        "policy": reasons[0].policy if reasons else "",
        "rule": reasons[0].rule if reasons else "",
    }
