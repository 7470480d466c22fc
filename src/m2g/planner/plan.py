"""The planner's entry point: one ClusterSnapshot and a PolicySet in, one Plan out."""

from __future__ import annotations

from m2g.planner.admission import check_updates
from m2g.planner.capacity import capacity_updates
from m2g.planner.config import PlannerConfig
from m2g.planner.fairness import weight_updates
from m2g.planner.inputs import InputBuilder
from m2g.planner.kai import kai_updates
from m2g.planner.nodes import drain_actions, taint_updates
from m2g.planner.shedding import shed_actions
from m2g.planner.types import ClusterSnapshot, Plan
from m2g.policy import Evaluator


def make_plan(snap: ClusterSnapshot, evaluator: Evaluator,
              config: PlannerConfig | None = None) -> Plan:
    """Decide every change for this snapshot. Pure and deterministic: the same snapshot and
    policies give the same plan, and a plan already applied yields an empty one."""
    config = config or PlannerConfig()
    builder = InputBuilder(snap)
    quotas, stops = capacity_updates(evaluator, builder, config)
    sheds, why = shed_actions(evaluator, builder, config)
    kai_topologies, kai_queues, kai_notes = kai_updates(snap, config)
    drains = drain_actions(builder, config, frozenset(f"{a.namespace}/{a.name}" for a in sheds))
    return Plan(
        checks=tuple(check_updates(evaluator, builder, config)),
        quotas=tuple(quotas),
        stops=tuple(stops),
        sheds=tuple(sheds) + tuple(drains),
        weights=tuple(weight_updates(evaluator, builder)),
        notes=(why, *kai_notes),
        kai_topologies=tuple(kai_topologies),
        kai_queues=tuple(kai_queues),
        taints=tuple(taint_updates(builder, config)),
    )
