"""Fairness: Fairness-stage policies per ClusterQueue → fairSharing.weight."""

from __future__ import annotations

import math

from m2g.model.plan import WeightUpdate
from m2g.planner.inputs import InputBuilder
from m2g.policy import Evaluator


def weight_updates(evaluator: Evaluator, builder: InputBuilder) -> list[WeightUpdate]:
    """A WeightUpdate for every ClusterQueue whose policy weight differs from its own."""
    queues = list(builder.snap.queues)
    if not queues:
        return []
    results = evaluator.fairness_many([builder.for_queue(q) for q in queues])
    out = []
    for q, res in zip(queues, results, strict=True):
        if res.weight is None:
            continue
        if q.weight is not None and math.isclose(q.weight, res.weight, rel_tol=1e-6):
            continue
        why = "; ".join(f"{r.policy}/{r.rule}: {r.message}" for r in res.reasons)
        out.append(WeightUpdate(q.name, res.weight, why))
    return out
