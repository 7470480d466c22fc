"""The planner's entry point: one ClusterSnapshot and a PolicySet in, one Plan out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from m2g.model.cluster import ClusterSnapshot
from m2g.model.collector import collector_paused
from m2g.model.plan import Plan, format_api_time
from m2g.planner import caps as hourly
from m2g.planner.admission import check_updates
from m2g.planner.capacity import capacity_updates
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import lapse_records, node_limit_updates, without_lapsed
from m2g.planner.eventhold import preemption_updates
from m2g.planner.fairness import weight_updates
from m2g.planner.gridstatus import event_statuses, next_boundary
from m2g.planner.headroom import share_beyond
from m2g.planner.inputs import InputBuilder
from m2g.planner.kai import kai_updates
from m2g.planner.memo import PlanMemo
from m2g.planner.nodes import drain_actions, taint_updates
from m2g.planner.preemptors import hold
from m2g.planner.preplace import preplace
from m2g.planner.reservations import ReservationBook
from m2g.planner.shedding import power_actions
from m2g.planner.split import split
from m2g.policy import Evaluator


def make_plan(snap: ClusterSnapshot, evaluator: Evaluator,
              config: PlannerConfig | None = None, *,
              check_evaluators: Mapping[str, Evaluator | None] | None = None,
              memo: PlanMemo | None = None) -> Plan:
    """Decide every change for this snapshot. Pure and deterministic: the same snapshot and
    policies give the same plan, and a plan already applied yields an empty one. Runs with the
    cyclic garbage collector paused (m2g.model.collector).
    ``check_evaluators``: AdmissionChecks answered with a policy selection of their own (None:
    not answered; see ``check_updates``). ``memo``: what the caller's last plan kept for
    this one (m2g.planner.memo; updated in place): the same plan, with less work."""
    with collector_paused():
        return _make_plan(snap, evaluator, config or PlannerConfig(), check_evaluators, memo)


def _make_plan(snap: ClusterSnapshot, evaluator: Evaluator, config: PlannerConfig,
               check_evaluators: Mapping[str, Evaluator | None] | None = None,
               memo: PlanMemo | None = None) -> Plan:
    statuses, baselines = event_statuses(snap, config, format_api_time(snap.now))
    snap = hourly.with_kw_caps(with_baselines(snap, baselines))
    snap, lapsed = without_lapsed(snap)  # caps whose lease ran out: not in force
    builder = InputBuilder(snap, config.default_kw_per_gpu, memo)
    book = ReservationBook(snap, config)
    quotas, stops = capacity_updates(evaluator, builder, config,
                                     hourly.gpu_caps(snap, config))
    sheds, caps, resizes, why, vetoed = power_actions(evaluator, builder, config)
    checks, beyond = share_beyond(split(check_updates(evaluator, builder, config,
                                                      check_evaluators, book), snap, config),
                                  snap, config, sum(a.kw for a in sheds if a.active))
    if beyond > 0:  # firm work admitted on what m2g can free: free it now, not once metered
        sheds, caps, resizes, why, vetoed = power_actions(evaluator, builder, config,
                                                          firm_kw=beyond)
    kai_topologies, kai_queues, kai_notes = kai_updates(snap, config)
    acted = frozenset(f"{a.namespace}/{a.name}" for a in sheds)
    drains = drain_actions(builder, config, acted)
    drains += book.drains(acted | {f"{a.namespace}/{a.name}" for a in drains})
    caps = lapse_records(caps, lapsed) if lapsed else caps
    wake = [t for t in (next_boundary(snap), *book.boundaries(), *hourly.boundaries(snap)) if t]
    return Plan(
        checks=tuple(preplace(hold(checks, snap, config), snap, config)),
        quotas=tuple(quotas),
        stops=tuple(stops),
        preemptions=tuple(preemption_updates(snap, config)),
        sheds=tuple(sheds) + tuple(drains),
        weights=tuple(weight_updates(evaluator, builder)),
        notes=(why, *kai_notes),
        kai_topologies=tuple(kai_topologies),
        kai_queues=tuple(kai_queues),
        taints=tuple(taint_updates(builder, config)),
        event_statuses=tuple(statuses),
        reservation_statuses=tuple(book.statuses()),
        wake_at=min(wake, default=None),
        caps=tuple(caps),
        node_limits=tuple(node_limit_updates(snap, config, caps)),
        resizes=tuple(resizes),
        preemption_failed=vetoed,
    )


def with_baselines(snap: ClusterSnapshot, baselines: dict[str, float]) -> ClusterSnapshot:
    """``snap`` with the baselines measured in this reconcile set on their events' intervals
    (the same plan then sheds to the new target)."""
    if not baselines:
        return snap
    events = tuple(replace(e, baseline_kw=baselines[e.source])
                   if e.source in baselines and not e.baseline_kw else e
                   for e in snap.factory.grid_events)
    return replace(snap, factory=replace(snap.factory, grid_events=events))
