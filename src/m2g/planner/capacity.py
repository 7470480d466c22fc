"""Capacity: Capacity-stage policies per ResourceFlavor → ClusterQueue quotas and stopPolicy.

For each flavor, the Capacity stage gives the GPUs the factory can run on it now (healthy,
power- and thermal-derated; None = no limit from policy) and a stopPolicy. The ClusterQueues
sharing the flavor get that capacity in proportion to their base quotas (the platform team's
values, which m2g records before it first changes them) and never more than their base.

Hysteresis: changes under ``quota_hysteresis_gpus`` are skipped; raising waits
``quota_raise_dwell_seconds`` after the last change, lowering is immediate. Lowering a quota
never evicts in Kueue; draining is the stopPolicy's (HoldAndDrain) or the shedding planner's job.
"""

from __future__ import annotations

from collections.abc import Mapping

from m2g.model.cluster import QueueState
from m2g.model.labels import GPU_RESOURCE
from m2g.model.plan import QuotaUpdate, StopUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.policy import Evaluator
from m2g.policy.spec import StopPolicy

_STRENGTH = {StopPolicy.NONE.value: 0, StopPolicy.HOLD.value: 1,
             StopPolicy.HOLD_AND_DRAIN.value: 2}


def _gpu_quotas(queues: tuple[QueueState, ...], flavor: str) -> list[tuple[QueueState, int, int]]:
    """(queue, nominal, base) for every queue with a GPU quota on ``flavor``."""
    return [(q, x.nominal, x.base) for q in queues for x in q.quotas
            if x.flavor == flavor and x.resource == GPU_RESOURCE]


def _worth_it(q: QueueState, current: int, target: int, builder: InputBuilder,
              config: PlannerConfig) -> bool:
    if target == current or abs(target - current) < min(config.quota_hysteresis_gpus,
                                                        max(1, current)):
        return target == 0 and current != 0  # always close a queue completely
    if target < current:
        return True
    last = q.last_quota_change
    return last is None or (builder.snap.now - last).total_seconds() >= \
        config.quota_raise_dwell_seconds


def cap_shares(builder: InputBuilder, caps: Mapping[str, tuple[float, str]]
               ) -> dict[str, tuple[float, str]]:
    """Flavor → (the fraction of its base quotas a capacity plan allows now, why): a domain's
    GPU cap over the base quotas of every flavor on it ("" = the site: every flavor)."""
    if not caps:
        return {}
    site = builder.snap.factory.site
    base: dict[str, int] = {}
    for f in builder.snap.flavors:
        b = sum(x for _, _, x in _gpu_quotas(builder.snap.queues, f.name))
        for key in {"", "" if f.domain in ("", site) else f.domain}:
            base[key] = base.get(key, 0) + b
    out: dict[str, tuple[float, str]] = {}
    for f in builder.snap.flavors:
        for key in ("", "" if f.domain in ("", site) else f.domain):
            if key in caps and base.get(key):
                share = min(1.0, caps[key][0] / base[key])
                if f.name not in out or share < out[f.name][0]:
                    out[f.name] = (share, caps[key][1])
    return out


def capacity_updates(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
                     caps: Mapping[str, tuple[float, str]] | None = None
                     ) -> tuple[list[QuotaUpdate], list[StopUpdate]]:
    """Quota and stopPolicy changes for every ClusterQueue on a flavor m2g knows. ``caps``:
    GPU caps of the capacity plans in force (m2g.planner.caps.gpu_caps)."""
    quotas: list[QuotaUpdate] = []
    stops: dict[str, tuple[str, str]] = {}
    queues = builder.snap.queues
    planned = cap_shares(builder, caps or {})
    for flavor in builder.snap.flavors:
        members = _gpu_quotas(queues, flavor.name)
        if not members:
            continue
        total_base = sum(base for _, _, base in members)
        result = evaluator.capacity(builder.for_flavor(flavor, total_base))
        why = "; ".join(f"{r.policy}/{r.rule}: {r.message}" for r in result.reasons)
        if not result.failed:
            share = 1.0 if result.quota is None or total_base == 0 else min(
                1.0, result.quota / total_base)
            if flavor.name in planned and planned[flavor.name][0] < share:
                share, why = planned[flavor.name][0], planned[flavor.name][1]
            for q, nominal, base in members:
                target = int(base * share)
                if _worth_it(q, nominal, target, builder, config):
                    reason = why or "capacity restored: no Capacity policy limits the flavor"
                    quotas.append(QuotaUpdate(q.name, flavor.name, GPU_RESOURCE, target, base,
                                              f"{flavor.name}: {target}/{base} GPUs; {reason}"))
        for q, _, _ in members:
            want = result.stop_policy.value
            prev = stops.get(q.name, (StopPolicy.NONE.value, ""))
            if _STRENGTH[want] > _STRENGTH[prev[0]]:
                stops[q.name] = (want, why)
            stops.setdefault(q.name, prev)
    by_name = {q.name: q for q in queues}
    stop_updates = [StopUpdate(name, want, why or "no Capacity policy asks to stop")
                    for name, (want, why) in sorted(stops.items())
                    if by_name[name].stop_policy != want
                    and (want != StopPolicy.NONE.value or by_name[name].stop_set_by_m2g)]
    return quotas, stop_updates
