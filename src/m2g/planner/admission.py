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
still Defer (or Reject) leaves the Retry alone: Kueue's requeue asks again. A wait that ends
within the cap (an event ending in 58 s) is asked ``retry_grace_seconds`` longer
(``retry_hold``): at ``requeueAt`` Kueue evicts the workload, so the Ready m2g answers when the
wait ends must come first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from m2g.model.cluster import CheckState, Phase, WorkloadState
from m2g.model.plan import CheckUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.preplace import candidate
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
    groups = _groups(builder.snap.workloads, evaluator, check_evaluators or {},
                     config.nvlink_preplace)
    out: list[tuple[int, CheckUpdate]] = []
    order = sorted((iw for _, ws in groups.values() for iw in ws), key=lambda iw: iw[0])
    gates = book.gates(w for _, w in order) if book is not None and order else {}
    retry = CheckState.RETRY
    for ev, waiting in groups.values():
        results = ev.admission_items(builder.base(), builder.items(w for _, w in waiting))
        decide = Answers(config)  # workloads of one class share their result: decided once
        for (i, w), res in zip(waiting, results, strict=True):
            fields = decide(res, gates.get(w.key) if gates else None, w.check_state is retry)
            if fields is not None:
                out.append((i, CheckUpdate(w.namespace, w.name, w.check, *fields)))
    if len(groups) > 1:
        out.sort(key=lambda x: x[0])  # in the snapshot's order (one group: already)
    return [u for _, u in out]


def _groups(workloads: Iterable[WorkloadState], evaluator: Evaluator,
            own: Mapping[str, Evaluator | None], ahead: bool = False
            ) -> dict[int, tuple[Evaluator, list[tuple[int, WorkloadState]]]]:
    """The workloads m2g answers (``awaiting`` or ``deferred``, and the waiting elastic
    workloads it places before Kueue reserves them: m2g.planner.preplace), with their
    positions in the snapshot, by the Evaluator that answers them (in first-seen order)."""
    groups: dict[int, tuple[Evaluator, list[tuple[int, WorkloadState]]]] = {}
    reserved = Phase.RESERVED
    pending = Phase.PENDING if ahead else None
    for i, w in enumerate(workloads):
        if (w.phase is reserved and w.check and w.check_state in _ASKED) or (
                w.phase is pending and candidate(w)):
            ev = own.get(w.check, evaluator)
            if ev is not None:
                groups.setdefault(id(ev), (ev, []))[1].append((i, w))
    return groups


#: The check states m2g answers: Pending (or none yet; ``awaiting``), Retry (``deferred``).
_ASKED = frozenset({CheckState.PENDING, None, CheckState.RETRY})

#: A CheckUpdate's fields after (namespace, name, check), in order: (state, message,
#: requeue_after_seconds, pod_set_updates, policy, rule).
Fields = tuple[CheckState, str, int | None, tuple[dict[str, Any], ...], str, str]


class Answers:
    """The answer of each class of waiting workloads, decided once: a workload's CheckUpdate
    (but for its namespace, name and check) depends only on its AdmissionResult (shared by
    the workloads of one class: Evaluator.admission_items), the reservation gate holding it
    (``gates``), and whether m2g deferred it already; ``decide`` is that decision, this its
    memo by exactly those (the results stay alive meanwhile: their ids hold). At 400 racks
    8,000 waiting workloads had 21 distinct results."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._memo: dict[tuple[int, tuple[str, bool] | None, bool], Fields | None] = {}
        self._keep: list[AdmissionResult] = []  # the results keyed by id: kept alive

    def __call__(self, res: AdmissionResult, held: tuple[str, bool] | None,
                 retry: bool) -> Fields | None:
        key = (id(res), held, retry)
        if key in self._memo:
            return self._memo[key]
        self._keep.append(res)
        got = self._memo[key] = decide(res, held, retry, self.config)
        return got


def decide(res: AdmissionResult, held: tuple[str, bool] | None, retry: bool,
           config: PlannerConfig) -> Fields | None:
    """The CheckUpdate fields for a workload whose decision is ``res``, held back by a
    reservation (``held``: why, whether to keep it Pending) or not, deferred by m2g already
    (``retry``: Kueue holds it with a Retry) or not; None: no update (a held workload keeps
    its Retry; a deferred one whose decision is not Admit is left to Kueue's requeue)."""
    if held and res.decision is Decision.ADMIT:
        return None if retry else _held(*held, config)
    if retry and res.decision is not Decision.ADMIT:
        return None
    return _answer(res, config)


def _held(why: str, pending: bool, config: PlannerConfig) -> Fields:
    """A reservation holds this workload back: Retry (it would take the reservation's
    capacity), or Pending (``pending``: the reservation's own, early: it keeps its quota)."""
    return (CheckState.PENDING if pending else CheckState.RETRY, why[:MAX_MESSAGE],
            None if pending else min(config.reservation_retry_seconds,
                                     config.max_retry_hold_seconds),
            (), "reservation", "hold")


def retry_hold(wait: int | None, config: PlannerConfig) -> int | None:
    """The ``requeueAfterSeconds`` of a Retry for a policy's ``wait``: capped at
    ``max_retry_hold_seconds`` (Kueue holds the quota that long), and a wait that ends within
    the cap asked ``retry_grace_seconds`` longer, so that m2g's Ready when the wait ends (the
    event is over: the decision flips to Admit) reaches Kueue before its requeue evicts the
    workload at ``requeueAt``."""
    if wait is None:
        return None
    cap = config.max_retry_hold_seconds
    return wait + config.retry_grace_seconds if wait <= cap else cap


def _answer(res: AdmissionResult, config: PlannerConfig) -> Fields:
    """The fields of a CheckUpdate that come from the decision (the same for every workload
    that shares ``res``)."""
    reasons = deciding(res)
    return (check_state(res.decision), message(res),
            retry_hold(res.requeue_after_seconds, config),
            tuple(u.to_json() for u in res.pod_set_updates),
            reasons[0].policy if reasons else "", reasons[0].rule if reasons else "")
