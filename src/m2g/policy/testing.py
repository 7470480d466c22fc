"""Run ``PolicyTest`` cases against a PolicySet and report expected vs got."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from m2g.model.inputs import PolicyInput
from m2g.policy.compiler import PolicySet
from m2g.policy.evaluate import Evaluator
from m2g.policy.jsonin import non_finite
from m2g.policy.results import StageResult
from m2g.policy.spec import PolicyTestDoc, Stage, TestCase, TestExpect
from m2g.policy.yamlsrc import SourceDoc


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case: ``failures`` is empty when it passed."""

    file: str
    line: int
    test: str
    case: str
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures

    def render(self) -> str:
        head = f"{self.file}:{self.line}: {self.test}/{self.case}"
        return "\n".join([f"FAIL {head}", *(f"    {f}" for f in self.failures)])


def input_error_text(exc: ValidationError) -> str:
    """A pydantic error as short ``field: message`` items on one line."""
    items = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "input"
        items.append(f"{where}: {err['msg']}")
    return "; ".join(items)


def evaluate_stage(evaluator: Evaluator, stage: Stage, inp: PolicyInput) -> StageResult:
    """Run one stage for one input."""
    if stage is Stage.ADMISSION:
        return evaluator.admission(inp)
    if stage is Stage.CAPACITY:
        return evaluator.capacity(inp)
    if stage is Stage.PREEMPTION:
        return evaluator.preemption(inp)
    if stage is Stage.FAIRNESS:
        return evaluator.fairness(inp)
    return evaluator.placement(inp)


def _fired(result: StageResult) -> list[str]:
    if hasattr(result, "fired"):
        return list(result.fired())
    return [r.ref for r in result.reasons]


def _compare(expect: TestExpect, result: StageResult) -> list[str]:
    got: dict[str, Any] = result.to_json()
    fired = _fired(result)
    failures = []
    simple = {"decision": "decision", "requeue_after_seconds": "requeueAfterSeconds",
              "quota": "quota", "stop_policy": "stopPolicy", "eligible": "eligible",
              "weight": "weight"}
    for attr, key in simple.items():
        want = getattr(expect, attr)
        if want is None:
            continue
        want = getattr(want, "value", want)
        if key not in got:
            failures.append(f"{key}: not produced by this stage")
        elif got[key] != want and not _close(got[key], want):
            failures.append(f"{key}: expected {want!r}, got {got[key]!r}")
    if expect.score is not None and not _close(got.get("score"), expect.score):
        failures.append(f"score: expected {expect.score!r}, got {got.get('score')!r}")
    if expect.min_cap is not None and not _close(got.get("minCap"), expect.min_cap):
        failures.append(f"minCap: expected {expect.min_cap!r}, got {got.get('minCap')!r}")
    if expect.topology_level is not None:
        level = got.get("topologyLevel", (got.get("placement") or {}).get("topologyLevel"))
        if level != expect.topology_level:
            failures.append(f"topologyLevel: expected {expect.topology_level!r}, got {level!r}")
    if expect.pod_set_updates is not None and got.get("podSetUpdates") != list(
            expect.pod_set_updates):
        failures.append(f"podSetUpdates: expected {list(expect.pod_set_updates)!r}, "
                        f"got {got.get('podSetUpdates')!r}")
    missing = [r for r in (expect.reasons or ()) if r not in fired]
    if missing:
        failures.append(f"reasons: expected {missing} to fire; fired: {fired or 'nothing'}")
    unwanted = [r for r in expect.not_reasons if r in fired]
    if unwanted:
        failures.append(f"notReasons: {unwanted} fired but must not")
    if expect.message_contains is not None and not any(
            expect.message_contains in str(r.get("message", "")) for r in got.get("reasons", [])):
        failures.append(f"messageContains: no fired rule's message contains "
                        f"{expect.message_contains!r}")
    if expect.errors is not None and len(got.get("errors", [])) != expect.errors:
        failures.append(f"errors: expected {expect.errors}, got {got.get('errors', [])}")
    if failures:
        msgs = [f"{r['policy']}/{r['rule']}: {r['message']}" for r in got.get("reasons", [])]
        failures.append("fired rules: " + ("; ".join(msgs) if msgs else "none"))
    return failures


def _close(a: Any, b: Any) -> bool:
    return (isinstance(a, int | float) and isinstance(b, int | float)
            and not isinstance(a, bool) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))


def run_case(pset: PolicySet, doc: SourceDoc, test: PolicyTestDoc, index: int,
             case: TestCase) -> CaseResult:
    """Run one case against the test's selection of the policy set."""
    line = doc.line_of(("cases", index))
    selected = pset.select(test.policies) if test.policies else pset
    missing = sorted(set(test.policies) - set(pset.names()))
    if missing:
        return CaseResult(doc.file, line, test.metadata.name, case.name,
                          (f"policies not found: {', '.join(missing)}",))
    try:
        inp = PolicyInput.model_validate(case.input)
    except ValidationError as exc:
        return CaseResult(doc.file, line, test.metadata.name, case.name,
                          (f"bad input: {input_error_text(exc)}",))
    bad = non_finite(inp)  # NaN, infinities and integers CEL cannot hold, as eval refuses them
    if bad:
        return CaseResult(doc.file, line, test.metadata.name, case.name, (f"bad input: {bad}",))
    result = evaluate_stage(Evaluator(selected), case.stage or test.stage, inp)
    return CaseResult(doc.file, line, test.metadata.name, case.name,
                      tuple(_compare(case.expect, result)))


def run_tests(pset: PolicySet, tests: list[tuple[SourceDoc, PolicyTestDoc]]) -> list[CaseResult]:
    """Run every case of every test document, in order."""
    return [run_case(pset, doc, test, i, case)
            for doc, test in tests for i, case in enumerate(test.cases)]
