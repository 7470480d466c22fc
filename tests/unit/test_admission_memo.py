"""The admission answers decided once per class (m2g.planner.admission.Answers, issue 14) are
those of deciding every workload on its own: the loop of check_updates before the memo is kept
here as the reference, run over a snapshot whose waiting workloads vary in everything the
decision reads (check state, pod set names, reservation gates, a second AdmissionCheck with
its own policies, a check with broken parameters)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

import pytest

from m2g.k8s.build import build_snapshot
from m2g.model.cluster import CheckState, ClusterSnapshot, WorkloadState
from m2g.model.inputs import PodSetView
from m2g.model.plan import CheckUpdate
from m2g.planner.admission import (
    Answers,
    _answer,
    _held,
    awaiting,
    check_updates,
    decide,
    deferred,
    retry_hold,
)
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.reservations import ReservationBook
from m2g.policy import Decision, Evaluator, load_dir
from m2g.policy.results import AdmissionResult, Reason
from m2g.testing.scale import LABELS, NOW, generate

ROOT = Path(__file__).resolve().parents[2]


def _reference(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
               own: Mapping[str, Evaluator | None], gates: dict[str, tuple[str, bool]]
               ) -> list[CheckUpdate]:
    """check_updates as it was before the class memo: every workload decided on its own."""
    out: list[tuple[int, CheckUpdate]] = []
    for i, w in enumerate(builder.snap.workloads):
        ev = own.get(w.check, evaluator) if awaiting(w) or deferred(w) else None
        if ev is None:
            continue
        res = ev.admission_items(builder.base(), [builder.item(w)])[0]
        held = gates.get(w.key)
        if held and res.decision is Decision.ADMIT:
            if w.check_state is not CheckState.RETRY:
                out.append((i, CheckUpdate(w.namespace, w.name, w.check,
                                           *_held(*held, config))))
            continue
        if w.check_state is CheckState.RETRY and res.decision is not Decision.ADMIT:
            continue
        out.append((i, CheckUpdate(w.namespace, w.name, w.check, *_answer(res, config))))
    return [u for _, u in sorted(out, key=lambda x: x[0])]


class _Book:
    """A ReservationBook stand-in whose gates are fixed."""

    def __init__(self, gates: dict[str, tuple[str, bool]]) -> None:
        self._gates = gates

    def gates(self, waiting: Iterable[WorkloadState]) -> dict[str, tuple[str, bool]]:
        keys = {w.key for w in waiting}
        return {k: v for k, v in self._gates.items() if k in keys}


def _varied(snap: ClusterSnapshot) -> ClusterSnapshot:
    """The waiting workloads of ``snap`` in every combination the answer depends on."""
    out = []
    for n, w in enumerate(snap.workloads):
        if not awaiting(w):
            out.append(w)
            continue
        if n % 3 == 1:
            w = dataclasses.replace(w, check_state=CheckState.RETRY)
        elif n % 7 == 2:
            w = dataclasses.replace(w, check_state=None)
        if n % 4 == 3:
            w = dataclasses.replace(w, check="other-check")
        elif n % 11 == 5:
            w = dataclasses.replace(w, check="broken-check")
        if n % 5 == 4 and w.view.pod_sets:
            ps = tuple(PodSetView(name=f"ps{k}", count=p.count, gpus_per_pod=p.gpus_per_pod)
                       for k, p in enumerate(w.view.pod_sets))
            w = w.with_view(w.view.model_copy(update={"pod_sets": ps}))
        out.append(w)
    return dataclasses.replace(snap, workloads=tuple(out))


@pytest.fixture(scope="module")
def setup() -> tuple[InputBuilder, Evaluator, Evaluator]:
    objs, readings = generate(6, 240)
    snap = _varied(build_snapshot(objs, readings, NOW, labels=LABELS))
    ev = Evaluator(load_dir(ROOT / "deploy" / "policies", "cel-expr-python"))
    other = Evaluator(load_dir(ROOT / "deploy" / "policies", "cel-expr-python"))
    return InputBuilder(snap), ev, other


@pytest.mark.parametrize("gated", [0, 2, 3])
def test_the_memo_answers_as_deciding_each_workload_alone(
        setup: tuple[InputBuilder, Evaluator, Evaluator], gated: int) -> None:
    builder, ev, other = setup
    config = PlannerConfig()
    own: dict[str, Evaluator | None] = {"other-check": other, "broken-check": None}
    waiting = [w for w in builder.snap.workloads if awaiting(w) or deferred(w)]
    gates = {} if not gated else {w.key: (f"reservation r{k % 2} holds its GPUs", k % 3 == 0)
                                  for k, w in enumerate(waiting) if k % gated == 0}
    book = cast(ReservationBook, _Book(gates)) if gates else None
    got = check_updates(ev, builder, config, own, book)
    want = _reference(ev, builder, config, own, gates)
    assert got == want
    states = {u.state for u in got}
    assert CheckState.READY in states and len(got) > 50  # the varied inputs are answered
    if gated:
        assert any(u.policy == "reservation" for u in got)
    assert not any(u.check == "broken-check" for u in got)


def _result(decision: Decision, requeue: int | None = None) -> AdmissionResult:
    reason = Reason("p", "r", decision.value, f"because {decision.value}")
    return AdmissionResult(decision=decision, reasons=(reason,),
                           requeue_after_seconds=requeue)


def test_answers_are_decided_once_per_result_gate_and_retry() -> None:
    config = PlannerConfig()
    answers = Answers(config)
    results = [_result(Decision.ADMIT), _result(Decision.DEFER, 10_000),
               _result(Decision.REJECT), _result(Decision.ADMIT)]
    gates: list[tuple[str, bool] | None] = [None, ("held", True), ("held", False), ("x", False)]
    for res in results:
        for held in gates:
            for retry in (False, True):
                want = decide(res, held, retry, config)
                first = answers(res, held, retry)
                assert first == want
                assert answers(res, held, retry) is first  # memoised: the same object
    # equal results that are distinct objects are decided apart, with equal answers
    assert answers(results[0], None, False) == answers(results[3], None, False)


def test_decide_keeps_the_rules_of_a_deferred_and_a_held_workload() -> None:
    config = PlannerConfig()
    admit, defer = _result(Decision.ADMIT), _result(Decision.DEFER, 10_000)
    assert decide(admit, ("held", False), True, config) is None  # keeps its Retry
    assert decide(defer, None, True, config) is None  # left to Kueue's requeue
    held = decide(admit, ("held", True), False, config)
    assert held is not None and held[0] is CheckState.PENDING and held[4] == "reservation"
    retry = decide(defer, None, False, config)
    assert retry is not None and retry[0] is CheckState.RETRY
    assert retry[2] == config.max_retry_hold_seconds  # capped
    soon = decide(_result(Decision.DEFER, 58), None, False, config)
    assert soon is not None and soon[2] == 58 + config.retry_grace_seconds  # ends in the cap
    ready = decide(admit, None, True, config)
    assert ready is not None and ready[0] is CheckState.READY


def test_a_wait_that_ends_within_the_cap_is_asked_a_grace_longer() -> None:
    """Kueue evicts a Retry's workload at its requeueAt: a wait ending within the cap (an event
    ending in 58 s) is asked retry_grace_seconds longer, so m2g's Ready when the event ends
    reaches Kueue first (the demo of 2026-12-07: both in the same second, the job requeued)."""
    config = PlannerConfig(max_retry_hold_seconds=60, retry_grace_seconds=5)
    assert retry_hold(None, config) is None
    assert retry_hold(58, config) == 63
    assert retry_hold(60, config) == 65
    assert retry_hold(61, config) == 60  # the decision is still Defer at the cap: no race
    assert retry_hold(3600, config) == 60
    assert retry_hold(58, dataclasses.replace(config, retry_grace_seconds=0)) == 58
