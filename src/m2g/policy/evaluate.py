"""Evaluate a PolicySet stage and combine the fired rules by the contract's rules.

Pure: no I/O, no clock. ``Evaluator.admission`` decides one workload; ``admission_many`` decides
many that share a snapshot, evaluating each policy once for all of them (m2g.policy.batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from m2g.model.inputs import PolicyInput, WorkloadItem
from m2g.policy.batch import FusedCache, Item, fired_many, snapshot_key
from m2g.policy.compiler import SITE_LABEL_KEYS, CompiledPolicy, PolicySet
from m2g.policy.fired import Err, Hit, RenderedUpdate
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
from m2g.policy.spec import Decision, Stage, StopPolicy

_STOP_ORDER = {StopPolicy.NONE: 0, StopPolicy.HOLD: 1, StopPolicy.HOLD_AND_DRAIN: 2}
Fired = list[Hit | Err]
R = TypeVar("R")


def label_keys(inp: PolicyInput) -> dict[str, str]:
    """Each ``SITE_LABEL_KEYS`` placeholder → the label it stands for in this input ("" = none)."""
    labels = inp.site.labels.model_dump(by_alias=True)
    return {key: str(labels[field]) for key, field in SITE_LABEL_KEYS.items()}


class _Updates:
    """Merges podSetUpdates; the first rule to set a key owns it, a different value conflicts.
    A ``SITE_LABEL_KEYS`` key is written as the site's label (``keys``); one the site lacks is
    dropped."""

    def __init__(self, pod_sets: list[str], keys: dict[str, str] | None = None) -> None:
        self.names = pod_sets
        self.keys = keys or {}
        self.maps: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self.tolerations: dict[str, list[dict[str, str]]] = {n: [] for n in pod_sets}
        self._result: tuple[PodSetUpdate, ...] | None = None

    def apply(self, upd: RenderedUpdate, ref: str) -> str | None:
        """Apply one update; return a conflict message, or None."""
        self._result = None
        targets = [n for n in self.names if not upd.pod_sets or n in upd.pod_sets]
        for fname, raw_key, value in upd.fields:
            key = self.keys.get(raw_key, raw_key) if raw_key.startswith("$") else raw_key
            if not key:
                continue
            for ps in targets:
                slot = self.maps.setdefault((ps, fname), {})
                owner = slot.get(key)
                if owner is not None and owner[0] != value:
                    return (f"podSetUpdates conflict on {ps} {fname}[{key}]: "
                            f"{owner[1]} sets {owner[0]!r}, {ref} sets {value!r}")
                slot.setdefault(key, (value, ref))
        for tol in upd.tolerations:
            for ps in targets:
                if tol not in self.tolerations[ps]:
                    self.tolerations[ps].append(tol)
        return None

    def result(self) -> tuple[PodSetUpdate, ...]:
        if self._result is None:
            self._result = self._build() if self.maps or any(self.tolerations.values()) else ()
        return self._result

    def _build(self) -> tuple[PodSetUpdate, ...]:
        out = []
        for ps in self.names:
            got = [{k: v for k, (v, _) in self.maps[(ps, f)].items()} if (ps, f) in self.maps
                   else {} for f in ("labels", "annotations", "nodeSelector")]
            tols = self.tolerations[ps]
            if got[0] or got[1] or got[2] or tols:
                out.append(PodSetUpdate(ps, got[0], got[1], got[2], tuple(tols)))
        return tuple(out)


def _pod_set_names(inp: Item) -> list[str]:
    sets = inp.field("pod_sets") if isinstance(inp, WorkloadItem) else inp.workload.pod_sets
    return [ps.name or "main" for ps in sets] or ["main"]


def _issue(err: Err) -> EvalIssue:
    return EvalIssue(err.policy.name, err.rule, err.message)


def _defer_for(err: Err) -> Reason:
    return Reason(err.policy.name, err.rule, Decision.DEFER.value,
                  f"evaluation error: {err.message}")


def combine_placement(fired: Fired, updates: _Updates) -> PlacementResult:
    """Placement: the first fired topologyLevel; podSetUpdates merged (first conflict kept)."""
    level: str | None = None
    reasons: list[Reason] = []
    errors: list[EvalIssue] = []
    conflict: Reason | None = None
    for item in fired:
        if isinstance(item, Err):
            errors.append(_issue(item))
            continue
        pay = item.payload
        if level is None and pay.level:
            level = pay.level
        for upd in pay.updates:
            clash = updates.apply(upd, item.ref)
            if clash is not None and conflict is None:
                conflict = Reason(item.policy.name, item.rule.name, "Defer", clash)
        reasons.append(Reason(item.policy.name, item.rule.name, "Place", pay.message))
    return PlacementResult(level, updates.result(), tuple(reasons), tuple(errors), conflict)


def combine_admission(fired: Fired, placed: Fired | None, pod_sets: list[str],
                      keys: dict[str, str] | None = None) -> AdmissionResult:
    """Reject > Defer (largest requeueAfter; 300 s default) > Admit; Placement merged in."""
    updates = _Updates(pod_sets, keys)
    reasons: list[Reason] = []
    errors: list[EvalIssue] = []
    requeues: list[int] = []
    for item in fired:
        if isinstance(item, Err):
            if item.fails:
                reasons.append(_defer_for(item))
                requeues.append(DEFAULT_REQUEUE_SECONDS)
            else:
                errors.append(_issue(item))
            continue
        decision = item.rule.decision or Decision.ADMIT
        reason = Reason(item.policy.name, item.rule.name, decision.value, item.payload.message)
        if decision is Decision.DEFER:
            req = item.payload.requeue
            requeues.append(DEFAULT_REQUEUE_SECONDS if req is None else max(0, req))
        elif decision is Decision.ADMIT:
            for upd in item.payload.updates:
                clash = updates.apply(upd, item.ref)
                if clash is not None:
                    reason = Reason(item.policy.name, item.rule.name, Decision.DEFER.value, clash)
                    requeues.append(DEFAULT_REQUEUE_SECONDS)
                    break
        reasons.append(reason)
    place = None
    if placed is not None:
        place = combine_placement([i for i in placed if isinstance(i, Hit) or not i.fails],
                                  updates)
        for err in (i for i in placed if isinstance(i, Err) and i.fails):
            reasons.append(_defer_for(err))
            requeues.append(DEFAULT_REQUEUE_SECONDS)
        if place.conflict is not None:
            reasons.append(place.conflict)
            requeues.append(DEFAULT_REQUEUE_SECONDS)
    decisions = {r.decision for r in reasons}
    if Decision.REJECT.value in decisions:
        return AdmissionResult(Decision.REJECT, None, tuple(reasons), (), tuple(errors), place)
    if Decision.DEFER.value in decisions:
        return AdmissionResult(Decision.DEFER, max(requeues), tuple(reasons), (), tuple(errors),
                               place)
    return AdmissionResult(Decision.ADMIT, None, tuple(reasons), updates.result(),
                           tuple(errors), place)


def combine_capacity(fired: Fired) -> CapacityResult:
    """Capacity: min quota over fired rules; strongest stopPolicy; Fail errors mark 'failed'."""
    quota: int | None = None
    stop = StopPolicy.NONE
    reasons: list[Reason] = []
    errors: list[EvalIssue] = []
    failed = False
    for item in fired:
        if isinstance(item, Err):
            failed = failed or item.fails
            errors.append(_issue(item))
            continue
        rule, pay = item.rule, item.payload
        if pay.quota is not None:
            quota = max(0, pay.quota) if quota is None else min(quota, max(0, pay.quota))
        if rule.stop_policy is not None and _STOP_ORDER[rule.stop_policy] > _STOP_ORDER[stop]:
            stop = rule.stop_policy
        label = rule.stop_policy.value if pay.quota is None and rule.stop_policy else "Quota"
        reasons.append(Reason(item.policy.name, rule.name, label, pay.message))
    return CapacityResult(quota, stop, tuple(reasons), tuple(errors), failed)


_Part = tuple[bool, float, float | None, Reason]


def _preemption_part(item: Hit) -> _Part:
    """What one fired rule adds to a Preemption result: (eligible, score, minCap, reason)."""
    pay = item.payload
    ok = True if pay.eligible is None else pay.eligible
    cap = None if pay.min_cap is None else min(1.0, max(0.0, pay.min_cap))
    return ok, pay.score or 0.0, cap, Reason(item.policy.name, item.rule.name,
                                             "Eligible" if ok else "Protected", pay.message)


def combine_preemption(fired: Fired, parts: dict[int, tuple[Hit, _Part]] | None = None
                       ) -> PreemptionResult:
    """Preemption: eligible if some fired rule says so and none vetoes; scores add up;
    ``minCap`` is the largest of the fired rules' (the most protective; None: none said).
    An error under failurePolicy Fail vetoes: m2g never sheds on an error — and never caps
    (minCap 1.0). ``parts`` memoises each Hit's share by its id (many workloads share Hits)."""
    yes = veto = False
    score = 0.0
    min_cap: float | None = None
    reasons: list[Reason] = []
    errors: list[EvalIssue] = []
    for item in fired:
        if isinstance(item, Err):
            veto = veto or item.fails
            errors.append(_issue(item))
            continue
        if parts is None:
            part = _preemption_part(item)
        else:
            got = parts.get(id(item))
            if got is None or got[0] is not item:
                got = parts[id(item)] = (item, _preemption_part(item))
            part = got[1]
        ok, add, cap, reason = part
        yes, veto = yes or ok, veto or not ok
        score += add
        if cap is not None:
            min_cap = cap if min_cap is None else max(min_cap, cap)
        reasons.append(reason)
    if errors and any(e.fails for e in fired if isinstance(e, Err)):
        min_cap = 1.0
    return PreemptionResult(yes and not veto, score, tuple(reasons), tuple(errors), min_cap)


def combine_fairness(fired: Fired) -> FairnessResult:
    """Fairness: the first fired rule's weight (None: leave the queue's weight as it is)."""
    weight: float | None = None
    reasons: list[Reason] = []
    errors: list[EvalIssue] = []
    for item in fired:
        if isinstance(item, Err):
            errors.append(_issue(item))
            continue
        if weight is None and item.payload.weight is not None:
            weight = max(0.0, item.payload.weight)
        reasons.append(Reason(item.policy.name, item.rule.name, "Weight", item.payload.message))
    return FairnessResult(weight, tuple(reasons), tuple(errors))


def _shared(combine: Callable[[Fired], R], fired: list[Fired]) -> list[R]:
    """``combine`` of each fired list, once per distinct list of Hit/Err objects (the fired
    lists are alive meanwhile, so their ids identify them; a list shared by many workloads,
    as the batch's class paths give them, is looked up by its own id first)."""
    memo: dict[tuple[int, ...], R] = {}
    by_list: dict[int, R] = {}
    out = []
    for items in fired:
        got = by_list.get(id(items))
        if got is None:
            key = tuple(map(id, items))
            got = memo.get(key)
            if got is None:
                got = memo[key] = combine(items)
            by_list[id(items)] = got
        out.append(got)
    return out


class Evaluator:
    """Evaluates the stages of one PolicySet. Holds only compiled caches; safe to share.

    Every method goes through ``_fired``: inputs that share a snapshot are evaluated as one batch
    (one fused CEL evaluation per policy) when the runtime supports it, else one by one.
    """

    def __init__(self, policy_set: PolicySet) -> None:
        self.policy_set = policy_set
        self._runtime = policy_set.runtime
        self._fused = FusedCache(policy_set.runtime)
        self._policies: dict[tuple[Stage, ...], tuple[CompiledPolicy, ...]] = {}

    def forget(self) -> None:
        """Drop the decisions kept from earlier batches (m2g.policy.batch.memo: what pure
        policy parts fired per class); the compiled programs stay. The next batch is decided
        as by a new Evaluator."""
        self._fused.memos.clear()

    def _stage(self, stage: Stage) -> tuple[CompiledPolicy, ...]:
        return self.policy_set.by_stage[stage]

    def _policies_of(self, stages: tuple[Stage, ...]) -> tuple[CompiledPolicy, ...]:
        policies = self._policies.get(stages)
        if policies is None:  # one tuple per stage list: the batch path caches plans by it
            policies = self._policies[stages] = tuple(p for s in stages for p in self._stage(s))
        return policies

    def _fired_items(self, stages: tuple[Stage, ...], base: PolicyInput,
                     items: Sequence[WorkloadItem]) -> list[Fired]:
        """``_fired`` of ``items`` over ``base``: one batch, no input per workload."""
        if not items:
            return []
        return fired_many(self._policies_of(stages), self._runtime, self._fused, items,
                          snapshot_key(base), base)

    def _fired(self, stages: tuple[Stage, ...], inputs: Sequence[PolicyInput]) -> list[Fired]:
        policies = self._policies_of(stages)
        groups: dict[tuple[Any, ...], list[int]] = {}
        domain_ids: dict[int, tuple[int, ...]] = {}
        if inputs:  # inputs copied from one base share its parts: no key for each
            first = inputs[0]
            site, grid, flavor, domain, domains, now = (
                first.site, first.grid, first.flavor, first.domain, first.domains, first.now)
            same: list[int] = []
            groups[snapshot_key(first, domain_ids)] = same
            apart = False
            for i, inp in enumerate(inputs):
                if inp.domains is domains and inp.site is site and inp.grid is grid and \
                        inp.flavor is flavor and inp.domain is domain and inp.now is now:
                    same.append(i)
                else:
                    apart = True
                    groups.setdefault(snapshot_key(inp, domain_ids), []).append(i)
            if apart:  # some of the first's key may have been appended out of order
                same.sort()
        out: list[Fired] = [[] for _ in inputs]
        for key, idx in groups.items():
            batch = [inputs[i] for i in idx]
            fired = fired_many(policies, self._runtime, self._fused, batch, key)
            for i, items in zip(idx, fired, strict=True):
                out[i] = items
        return out

    def admission_many(self, inputs: Sequence[PolicyInput]) -> list[AdmissionResult]:
        """Admission (with Placement merged in when Placement policies exist) per workload.
        Workloads whose policies fired the same Hits (shared objects: m2g.policy.batch) on the
        same pod sets share one result, combined once."""
        fired = self._fired((Stage.ADMISSION, Stage.PLACEMENT), inputs)
        return self._admission(fired, inputs, list(inputs))

    def admission_items(self, base: PolicyInput, items: Sequence[WorkloadItem]
                        ) -> list[AdmissionResult]:
        """``admission_many`` of ``base`` with each item's workload and queue."""
        fired = self._fired_items((Stage.ADMISSION, Stage.PLACEMENT), base, items)
        return self._admission(fired, items, [base] * len(items))

    def _admission(self, fired: list[Fired], inputs: Sequence[Item],
                   bases: Sequence[PolicyInput]) -> list[AdmissionResult]:
        """Each input's result, combined once per distinct (fired Hits, site labels, pod set
        names); a fired list shared by many inputs (a class's: m2g.policy.batch) is looked up
        by its own id first, not by the ids of its Hits."""
        placing = bool(self._stage(Stage.PLACEMENT))
        results = []
        memo: dict[tuple[Any, ...], AdmissionResult] = {}
        by_list: dict[tuple[Any, ...], AdmissionResult] = {}
        for inp, base, items in zip(inputs, bases, fired, strict=True):
            names = _pod_set_names(inp)
            short = (id(items), id(base.site.labels), *names)  # inputs alive: ids hold
            hit = by_list.get(short)
            if hit is None:
                key = (*map(id, items), id(base.site.labels), *names)
                hit = memo.get(key)
                if hit is None:
                    adm = [x for x in items if x.policy.stage is Stage.ADMISSION]
                    placed = [x for x in items if x.policy.stage is Stage.PLACEMENT] \
                        if placing else None
                    hit = memo[key] = combine_admission(adm, placed, names, label_keys(base))
                by_list[short] = hit
            results.append(hit)
        return results

    def admission(self, inp: PolicyInput) -> AdmissionResult:
        """Admission for one workload."""
        return self.admission_many([inp])[0]

    def placement(self, inp: PolicyInput) -> PlacementResult:
        """The Placement stage alone."""
        fired = self._fired((Stage.PLACEMENT,), [inp])[0]
        return combine_placement(fired, _Updates(_pod_set_names(inp), label_keys(inp)))

    def capacity_many(self, inputs: Sequence[PolicyInput]) -> list[CapacityResult]:
        """Capacity per flavor / domain (``flavor``, ``domain`` of each input)."""
        return [combine_capacity(f) for f in self._fired((Stage.CAPACITY,), inputs)]

    def capacity(self, inp: PolicyInput) -> CapacityResult:
        return self.capacity_many([inp])[0]

    def preemption_many(self, inputs: Sequence[PolicyInput]) -> list[PreemptionResult]:
        """May each admitted workload be shed, and how early (higher score first)."""
        parts: dict[int, tuple[Hit, Any]] = {}
        return _shared(lambda f: combine_preemption(f, parts),
                       self._fired((Stage.PREEMPTION,), inputs))

    def preemption_items(self, base: PolicyInput, items: Sequence[WorkloadItem]
                         ) -> list[PreemptionResult]:
        """``preemption_many`` of ``base`` with each item's workload and queue."""
        parts: dict[int, tuple[Hit, Any]] = {}
        return _shared(lambda f: combine_preemption(f, parts),
                       self._fired_items((Stage.PREEMPTION,), base, items))

    def preemption(self, inp: PolicyInput) -> PreemptionResult:
        return self.preemption_many([inp])[0]

    def fairness_many(self, inputs: Sequence[PolicyInput]) -> list[FairnessResult]:
        """The fair-sharing weight of each input's ``queue``."""
        return [combine_fairness(f) for f in self._fired((Stage.FAIRNESS,), inputs)]

    def fairness(self, inp: PolicyInput) -> FairnessResult:
        return self.fairness_many([inp])[0]
