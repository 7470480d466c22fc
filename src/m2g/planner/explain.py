"""Why a workload waits, and what would change that: counterfactual re-evaluation.

``explain`` evaluates the Admission stage for a workload now, then again under changes a user
or operator could make or wait for — fewer GPUs, a lower flex tier (more flexible) or a higher
one, another ClusterQueue, after the grid event ends, after a maintenance window — and reports
those that change the decision. Pure: it only re-runs the policies on edited snapshots.

Given the planner's settings, each Admit also goes through the site-headroom gate as the
controller's would (m2g.planner.headroom.alone): an Admit the gate would hold is a Defer with
the gate's reason (``site-headroom/shared-room``), so ``explain`` and ``submit --dry-run``
say what the controller will answer, not only what the policies say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.inputs import WorkloadView
from m2g.planner import headroom
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.policy import Decision, Evaluator
from m2g.policy.results import AdmissionResult, Reason


@dataclass(frozen=True)
class Counterfactual:
    """One change and the decision it would give."""

    change: str
    result: AdmissionResult


@dataclass(frozen=True)
class Explanation:
    """The decision now and the changes that would give another one."""

    workload: WorkloadState
    now: AdmissionResult
    alternatives: tuple[Counterfactual, ...]


def _view_variants(w: WorkloadView, queues: list[str]) -> list[tuple[str, WorkloadView]]:
    out: list[tuple[str, WorkloadView]] = []
    gpus = w.gpus
    while gpus > 1 and len(out) < 3:
        gpus //= 2
        scale = gpus / w.gpus if w.gpus else 0
        unit = "GPU" if gpus == 1 else "GPUs"
        out.append((f"request {gpus} {unit} instead of {w.gpus}", w.model_copy(update={
            "gpus": gpus, "pod_sets": (), "estimated_kw": w.estimated_kw * scale})))
    for tier in sorted({0, 3} - {w.flex_tier}):
        out.append((f"flex tier {tier} instead of {w.flex_tier}",
                    w.model_copy(update={"flex_tier": tier})))
    for q in queues:
        if q != w.cluster_queue:
            out.append((f"ClusterQueue {q} instead of {w.cluster_queue or '(none)'}",
                        w.model_copy(update={"cluster_queue": q})))
    return out


def _time_variants(snap: ClusterSnapshot) -> list[tuple[str, ClusterSnapshot]]:
    """Later moments worth trying, earliest first (only the earliest that helps is reported)."""
    moments: list[tuple[datetime, str]] = []
    event = snap.factory.grid_event()
    if event is not None and event.active(snap.now):
        moments.append((event.end, f"after grid event {event.id} ends at "
                                   f"{event.end:%Y-%m-%d %H:%M}Z"))
    for mw in snap.factory.maintenance:
        if mw.end > snap.now:
            moments.append((mw.end, f"after maintenance {mw.name} ends at "
                                    f"{mw.end:%Y-%m-%d %H:%M}Z"))
    return [(label, replace(snap, factory=replace(snap.factory,
                                                  now=when + timedelta(seconds=1))))
            for when, label in sorted(moments)]


def gated(result: AdmissionResult, snap: ClusterSnapshot, w: WorkloadState,
          config: PlannerConfig | None) -> AdmissionResult:
    """``result`` as the controller would answer it: an Admit the site-headroom gate holds
    becomes a Defer with the gate's reason and Retry time (no ``config``: the policies' word
    alone). A workload already admitted is not gated."""
    if config is None or result.decision is not Decision.ADMIT or w.phase is Phase.ADMITTED:
        return result
    hold = headroom.alone(snap, w, config)
    if hold is None:
        return result
    why = Reason(hold.policy, hold.rule, Decision.DEFER.value, hold.message)
    return replace(result, decision=Decision.DEFER,
                   requeue_after_seconds=hold.requeue_after_seconds,
                   reasons=(*result.reasons, why), pod_set_updates=())


def explain(snap: ClusterSnapshot, w: WorkloadState, evaluator: Evaluator,
            config: PlannerConfig | None = None) -> Explanation:
    """The Admission decision for ``w`` now, and each single change that alters it (each
    through the headroom gate when ``config`` is given)."""
    builder = InputBuilder(snap)
    seen = w.view_at(snap.now)  # (the later moments below ask of it as it is now)
    now = gated(evaluator.admission(builder.for_workload(w, seen)), snap, w, config)
    queues = sorted(q.name for q in snap.queues)
    variants = _view_variants(seen, queues)
    inputs = [builder.for_workload(w, view) for _, view in variants]
    results = evaluator.admission_many(inputs) if inputs else []
    results = [gated(res, snap, replace(w, view=view, waiting_since=None,
                                        checkpoint_since=None), config)
               for (_, view), res in zip(variants, results, strict=True)]
    alternatives = [Counterfactual(change, res) for (change, _), res
                    in zip(variants, results, strict=True) if res.decision != now.decision]
    for change, later in _time_variants(snap):
        res = gated(evaluator.admission(InputBuilder(later).for_workload(w, seen)), later, w,
                    config)
        if res.decision != now.decision:
            alternatives.append(Counterfactual(change, res))
            break
    return Explanation(w, now, tuple(alternatives))
