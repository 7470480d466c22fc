"""Evaluate a PolicySet stage against one input and combine the fired rules (the contract's rules).

Pure: no I/O, no clock. One activation is built per input and reused for every expression.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from m2g.model.inputs import PolicyInput
from m2g.policy.compiler import CompiledPolicy, CompiledRule, CompiledUpdate, PolicySet
from m2g.policy.results import (
    DEFAULT_REQUEUE_SECONDS,
    AdmissionResult,
    CapacityResult,
    EvalIssue,
    FairnessResult,
    PlacementResult,
    PodSetUpdate,
    PreemptionResult,
    Reason,
)
from m2g.policy.runtime import CelEvalError, Program
from m2g.policy.spec import Decision, FailurePolicy, Stage, StopPolicy

_STOP_ORDER = {StopPolicy.NONE: 0, StopPolicy.HOLD: 1, StopPolicy.HOLD_AND_DRAIN: 2}


@dataclass(frozen=True, slots=True)
class _Hit:
    policy: CompiledPolicy
    rule: CompiledRule


@dataclass(frozen=True, slots=True)
class _Err:
    policy: CompiledPolicy
    rule: str
    message: str

    @property
    def fails(self) -> bool:
        return self.policy.failure_policy is FailurePolicy.FAIL

    def issue(self) -> EvalIssue:
        return EvalIssue(self.policy.name, self.rule, self.message)


def _walk(policies: tuple[CompiledPolicy, ...], act: Any) -> Iterator[_Hit | _Err]:
    """Every fired rule, in order; evaluation errors come out as _Err."""
    for policy in policies:
        applies = True
        for name, prog in policy.match:
            try:
                if not prog.run(act):
                    applies = False
                    break
            except CelEvalError as exc:
                yield _Err(policy, "", f"matchConditions.{name}: {exc}")
                applies = False
                break
        if not applies:
            continue
        for rule in policy.rules:
            try:
                fired = rule.when.run(act)
            except CelEvalError as exc:
                yield _Err(policy, rule.name, f"when: {exc}")
                continue
            if fired is True:
                yield _Hit(policy, rule)


def _message(hit: _Hit, act: Any) -> str:
    rule = hit.rule
    default = rule.message or f"{hit.policy.name}/{rule.name} fired"
    if rule.message_expr is None:
        return default
    try:
        return str(rule.message_expr.run(act))
    except CelEvalError as exc:
        return f"{default} (messageExpression failed: {exc})"


def _run(prog: Program, act: Any, kind: type, what: str) -> Any:
    value = prog.run(act)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CelEvalError(f"{what} returned {type(value).__name__}, want {kind.__name__}")
    return value


class _Updates:
    """Merges podSetUpdates; the first rule to set a key owns it, a different value conflicts."""

    def __init__(self, pod_sets: list[str]) -> None:
        self.names = pod_sets
        self.maps: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self.tolerations: dict[str, list[dict[str, str]]] = {n: [] for n in pod_sets}

    def apply(self, upd: CompiledUpdate, act: Any, ref: str) -> str | None:
        """Apply one update; return a conflict message, or None."""
        targets = [n for n in self.names if not upd.pod_sets or n in upd.pod_sets]
        fields = (("labels", upd.labels), ("annotations", upd.annotations),
                  ("nodeSelector", upd.node_selector))
        for fname, pairs in fields:
            for key, prog in pairs:
                value = _run(prog, act, str, f"{fname}[{key}]")
                for ps in targets:
                    slot = self.maps.setdefault((ps, fname), {})
                    owner = slot.get(key)
                    if owner is not None and owner[0] != value:
                        return (f"podSetUpdates conflict on {ps} {fname}[{key}]: "
                                f"{owner[1]} sets {owner[0]!r}, {ref} sets {value!r}")
                    slot.setdefault(key, (value, ref))
        for tol in upd.tolerations:
            rendered = {k: _run(p, act, str, f"tolerations.{k}") for k, p in tol}
            for ps in targets:
                if rendered not in self.tolerations[ps]:
                    self.tolerations[ps].append(rendered)
        return None

    def result(self) -> tuple[PodSetUpdate, ...]:
        out = []
        for ps in self.names:
            def get(fname: str, ps: str = ps) -> dict[str, str]:
                return {k: v for k, (v, _) in self.maps.get((ps, fname), {}).items()}
            upd = PodSetUpdate(ps, get("labels"), get("annotations"), get("nodeSelector"),
                               tuple(self.tolerations[ps]))
            if upd.labels or upd.annotations or upd.node_selector or upd.tolerations:
                out.append(upd)
        return tuple(out)


def _pod_set_names(inp: PolicyInput) -> list[str]:
    return [ps.name or "main" for ps in inp.workload.pod_sets] or ["main"]


def _fail_reason(err: _Err) -> Reason:
    return Reason(err.policy.name, err.rule, Decision.DEFER.value,
                  f"evaluation error: {err.message}")


class Evaluator:
    """Evaluates the stages of one PolicySet. Stateless; safe to share."""

    def __init__(self, policy_set: PolicySet) -> None:
        self.policy_set = policy_set
        self._runtime = policy_set.runtime

    def activation(self, inp: PolicyInput) -> Any:
        return self._runtime.activation(inp.cel_data())

    def admission(self, inp: PolicyInput, *, placement: bool = True,
                  act: Any = None) -> AdmissionResult:
        """Admission (and, if any Placement policies exist, Placement) for one workload."""
        act = self.activation(inp) if act is None else act
        updates = _Updates(_pod_set_names(inp))
        reasons: list[Reason] = []
        errors: list[EvalIssue] = []
        requeues: list[int] = []
        for item in _walk(self.policy_set.by_stage[Stage.ADMISSION], act):
            if isinstance(item, _Err):
                self._on_error(item, reasons, errors, requeues)
                continue
            try:
                reasons.append(self._admission_hit(item, act, updates, requeues))
            except CelEvalError as exc:
                self._on_error(_Err(item.policy, item.rule.name, str(exc)), reasons, errors,
                               requeues)
        place = None
        if placement and self.policy_set.by_stage[Stage.PLACEMENT]:
            place = self._placement(act, updates)
            for err in place.errors:
                if self._policy(err.policy).failure_policy is FailurePolicy.FAIL:
                    reasons.append(Reason(err.policy, err.rule, "Defer",
                                          f"evaluation error: {err.message}"))
                    requeues.append(DEFAULT_REQUEUE_SECONDS)
            if place.conflict is not None:
                reasons.append(place.conflict)
                requeues.append(DEFAULT_REQUEUE_SECONDS)
            place = PlacementResult(place.topology_level, place.pod_set_updates, place.reasons,
                                    tuple(e for e in place.errors
                                          if self._policy(e.policy).failure_policy
                                          is FailurePolicy.IGNORE), place.conflict)
        return _combine_admission(reasons, requeues, updates, errors, place)

    def _policy(self, name: str) -> CompiledPolicy:
        return next(p for p in self.policy_set.policies if p.name == name)

    @staticmethod
    def _on_error(err: _Err, reasons: list[Reason], errors: list[EvalIssue],
                  requeues: list[int]) -> None:
        if err.fails:
            reasons.append(_fail_reason(err))
            requeues.append(DEFAULT_REQUEUE_SECONDS)
        else:
            errors.append(err.issue())

    @staticmethod
    def _admission_hit(hit: _Hit, act: Any, updates: _Updates, requeues: list[int]) -> Reason:
        rule = hit.rule
        decision = rule.decision or Decision.ADMIT
        message = _message(hit, act)
        if decision is Decision.DEFER:
            requeue = DEFAULT_REQUEUE_SECONDS
            if rule.requeue_after is not None:
                requeue = max(0, _run(rule.requeue_after, act, int, "requeueAfter"))
            requeues.append(requeue)
        elif decision is Decision.ADMIT:
            ref = f"{hit.policy.name}/{rule.name}"
            for upd in rule.updates:
                conflict = updates.apply(upd, act, ref)
                if conflict is not None:
                    requeues.append(DEFAULT_REQUEUE_SECONDS)
                    return Reason(hit.policy.name, rule.name, Decision.DEFER.value, conflict)
        return Reason(hit.policy.name, rule.name, decision.value, message)

    def placement(self, inp: PolicyInput) -> PlacementResult:
        """The Placement stage alone."""
        return self._placement(self.activation(inp), _Updates(_pod_set_names(inp)))

    def _placement(self, act: Any, updates: _Updates) -> PlacementResult:
        level: str | None = None
        reasons: list[Reason] = []
        errors: list[EvalIssue] = []
        conflict: Reason | None = None
        for item in _walk(self.policy_set.by_stage[Stage.PLACEMENT], act):
            if isinstance(item, _Err):
                errors.append(item.issue())
                continue
            rule = item.rule
            try:
                if rule.topology_level is not None and level is None:
                    level = _run(rule.topology_level, act, str, "topologyLevel")
                ref = f"{item.policy.name}/{rule.name}"
                for upd in rule.updates:
                    clash = updates.apply(upd, act, ref)
                    if clash is not None and conflict is None:
                        conflict = Reason(item.policy.name, rule.name, "Defer", clash)
            except CelEvalError as exc:
                errors.append(EvalIssue(item.policy.name, rule.name, str(exc)))
                continue
            reasons.append(Reason(item.policy.name, rule.name, "Place", _message(item, act)))
        return PlacementResult(level or None, updates.result(), tuple(reasons), tuple(errors),
                               conflict)

    def capacity(self, inp: PolicyInput) -> CapacityResult:
        """Capacity for one flavor/domain: min quota over fired rules, strongest stopPolicy."""
        act = self.activation(inp)
        quota: int | None = None
        stop = StopPolicy.NONE
        reasons: list[Reason] = []
        errors: list[EvalIssue] = []
        failed = False
        for item in _walk(self.policy_set.by_stage[Stage.CAPACITY], act):
            if isinstance(item, _Err):
                failed = failed or item.fails
                errors.append(item.issue())
                continue
            rule = item.rule
            try:
                if rule.quota is not None:
                    q = max(0, _run(rule.quota, act, int, "quota"))
                    quota = q if quota is None else min(quota, q)
            except CelEvalError as exc:
                failed = failed or item.policy.failure_policy is FailurePolicy.FAIL
                errors.append(EvalIssue(item.policy.name, rule.name, str(exc)))
                continue
            if rule.stop_policy is not None and _STOP_ORDER[rule.stop_policy] > _STOP_ORDER[stop]:
                stop = rule.stop_policy
            label = rule.stop_policy.value if rule.quota is None and rule.stop_policy else "Quota"
            reasons.append(Reason(item.policy.name, rule.name, label, _message(item, act)))
        return CapacityResult(quota, stop, tuple(reasons), tuple(errors), failed)

    def preemption(self, inp: PolicyInput) -> PreemptionResult:
        """May this admitted workload be shed? Any fired 'eligible' and no veto; scores add."""
        act = self.activation(inp)
        yes = veto = False
        score = 0.0
        reasons: list[Reason] = []
        errors: list[EvalIssue] = []
        for item in _walk(self.policy_set.by_stage[Stage.PREEMPTION], act):
            if isinstance(item, _Err):
                veto = veto or item.fails  # never shed on an error
                errors.append(item.issue())
                continue
            rule = item.rule
            try:
                ok = True if rule.eligible is None else _run(rule.eligible, act, bool, "eligible")
                s = 0.0 if rule.score is None else _run(rule.score, act, float, "score")
            except CelEvalError as exc:
                veto = veto or item.policy.failure_policy is FailurePolicy.FAIL
                errors.append(EvalIssue(item.policy.name, rule.name, str(exc)))
                continue
            yes, veto, score = yes or ok, veto or not ok, score + s
            label = "Eligible" if ok else "Protected"
            reasons.append(Reason(item.policy.name, rule.name, label, _message(item, act)))
        return PreemptionResult(yes and not veto, score, tuple(reasons), tuple(errors))

    def fairness(self, inp: PolicyInput) -> FairnessResult:
        """The fair-sharing weight of ``inp.queue``: the first fired rule's weight."""
        act = self.activation(inp)
        weight: float | None = None
        reasons: list[Reason] = []
        errors: list[EvalIssue] = []
        for item in _walk(self.policy_set.by_stage[Stage.FAIRNESS], act):
            if isinstance(item, _Err):
                errors.append(item.issue())
                continue
            rule = item.rule
            try:
                if weight is None and rule.weight is not None:
                    weight = max(0.0, _run(rule.weight, act, float, "weight"))
            except CelEvalError as exc:
                errors.append(EvalIssue(item.policy.name, rule.name, str(exc)))
                continue
            reasons.append(Reason(item.policy.name, rule.name, "Weight", _message(item, act)))
        return FairnessResult(weight, tuple(reasons), tuple(errors))


def _combine_admission(reasons: list[Reason], requeues: list[int], updates: _Updates,
                       errors: list[EvalIssue],
                       place: PlacementResult | None) -> AdmissionResult:
    decisions = {r.decision for r in reasons}
    if Decision.REJECT.value in decisions:
        return AdmissionResult(Decision.REJECT, None, tuple(reasons), (), tuple(errors), place)
    if Decision.DEFER.value in decisions:
        return AdmissionResult(Decision.DEFER, max(requeues), tuple(reasons), (), tuple(errors),
                               place)
    return AdmissionResult(Decision.ADMIT, None, tuple(reasons), updates.result(), tuple(errors),
                           place)
