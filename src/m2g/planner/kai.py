"""KAI Scheduler: keep KAI's Topology in step with node labels and its Queues' GPU limits in
step with power budgets (pure; the adapter is m2g.k8s.kai).

**Topology.** One KAI ``Topology`` (``PlannerConfig.kai_topology_name``) whose levels are the
candidate labels (``kai_topology_levels``: block → rack → hostname, as kueue-config's Kueue
Topology) that some GPU node carries. KAI makes a Topology's nodeLabels immutable (a CEL rule),
so a changed level list replaces the object — but only one m2g created; a Topology someone else
made is never touched (a note says it differs).

**Queue GPU limits.** A KAI Queue opts in with the annotation ``m2g.io/power-domain: NAME``
naming a PowerDomain. The GPUs that domain's power affords are ``budget kW ÷ kW per GPU``; a
Site-level domain's budget is the one in force (lowered by an active GridEvent), and any other
domain's budget is scaled by the same fraction as the site's. The Queues of one domain share
those GPUs in proportion to their ``gpu.quota`` (equally when none has a positive quota), and
never get more than the platform team's limit (``-1`` = unlimited), which m2g records before it
first changes a limit. Hysteresis as for ClusterQueue quotas (capacity.py): changes under
``quota_hysteresis_gpus`` are skipped unless they return to the platform's value, lowering is
immediate, raising waits ``quota_raise_dwell_seconds`` after the last change. A Queue naming a
domain m2g does not know is left as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from m2g.model.cluster import ClusterSnapshot, KaiQueueState, KaiState
from m2g.model.factory import FactorySnapshot
from m2g.model.plan import KaiQueueUpdate, KaiTopologyUpdate
from m2g.planner.config import PlannerConfig

UNLIMITED = -1.0


def desired_levels(kai: KaiState, config: PlannerConfig) -> tuple[str, ...]:
    """The candidate levels some GPU node carries, coarse to fine."""
    return tuple(level for level in config.kai_topology_levels if level in kai.node_label_keys)


def topology_updates(kai: KaiState, config: PlannerConfig
                     ) -> tuple[list[KaiTopologyUpdate], list[str]]:
    """Create or replace m2g's KAI Topology when its levels differ from the node labels."""
    if not kai.topology_served:
        return [], []
    levels = desired_levels(kai, config)
    name = config.kai_topology_name
    if not levels:
        return [], [f"KAI Topology {name}: no GPU node carries a topology label"]
    current = next((t for t in kai.topologies if t.name == name), None)
    text = " > ".join(levels)
    if current is None:
        return [KaiTopologyUpdate(name, levels, False, f"levels {text} from node labels")], []
    if current.levels == levels:
        return [], []
    if not current.managed_by_m2g:
        return [], [f"KAI Topology {name} has levels {' > '.join(current.levels)}, node labels "
                    f"give {text}; not replaced: m2g did not create it"]
    return [KaiTopologyUpdate(name, levels, True, f"node labels changed: levels "
                              f"{' > '.join(current.levels)} -> {text}")], []


def site_fraction(factory: FactorySnapshot) -> float:
    """The fraction of its usual power the site may draw now (1 without a grid event)."""
    limit = factory.effective_budget_kw()
    if limit <= 0:
        return 1.0
    usual = factory.site_budget_kw or sum(d.budget_kw for d in factory.power_domains)
    return min(1.0, limit / usual) if usual > 0 else 1.0


def domain_kw(factory: FactorySnapshot, name: str) -> float | None:
    """kW available to ``name`` now; None when m2g knows no budget for it."""
    domain = next((d for d in factory.power_domains if d.name == name), None)
    if domain is not None:
        return domain.budget_kw * site_fraction(factory) if domain.budget_kw > 0 else None
    if name == factory.site:
        limit = factory.effective_budget_kw()
        return limit if limit > 0 else None
    return None


def _ceiling(value: float) -> float:
    return math.inf if value < 0 else value


def _fmt(value: float) -> str:
    return "unlimited" if value < 0 else f"{value:g}"


def _worth_it(q: KaiQueueState, target: float, snap: ClusterSnapshot,
              config: PlannerConfig) -> bool:
    now, new = _ceiling(q.limit), _ceiling(target)
    if now == new:
        return False
    small = abs(new - now) < config.quota_hysteresis_gpus  # inf - x is never small
    if small and target != q.base_limit and target != 0:
        return False
    if new < now:
        return True
    last = q.last_change
    return last is None or (snap.now - last).total_seconds() >= config.quota_raise_dwell_seconds


def _by_domain(queues: Iterable[KaiQueueState]) -> dict[str, list[KaiQueueState]]:
    out: dict[str, list[KaiQueueState]] = {}
    for q in queues:
        out.setdefault(q.power_domain, []).append(q)
    return out


def queue_updates(snap: ClusterSnapshot, kai: KaiState, config: PlannerConfig
                  ) -> tuple[list[KaiQueueUpdate], list[str]]:
    """GPU limit changes for the Queues that name a power domain."""
    kw_per_gpu = config.kai_kw_per_gpu or config.default_kw_per_gpu
    updates: list[KaiQueueUpdate] = []
    notes: list[str] = []
    known = {d.name for d in snap.factory.power_domains} | {snap.factory.site}
    for domain, members in sorted(_by_domain(kai.queues).items()):
        if domain not in known:
            notes.append(f"KAI Queues {', '.join(q.name for q in members)}: PowerDomain "
                         f"{domain} not found; limits left as they are")
            continue
        kw = domain_kw(snap.factory, domain)
        gpus = None if kw is None else math.floor(kw / kw_per_gpu + 1e-9)
        weights = [max(q.quota, 0.0) for q in members]
        total = sum(weights)
        if total <= 0:
            weights, total = [1.0] * len(members), float(len(members))
        for q, weight in zip(members, weights, strict=True):
            if gpus is None:
                target, why = q.base_limit, f"{domain}: no power budget limits it"
            else:
                share = float(math.floor(gpus * weight / total + 1e-9))
                target = share if q.base_limit < 0 else min(share, q.base_limit)
                why = (f"{domain}: {kw:.0f} kW / {kw_per_gpu:g} kW per GPU = {gpus} GPUs, "
                       f"{share:g} for this queue (quota {weight:g} of {total:g})")
            if _worth_it(q, target, snap, config):
                updates.append(KaiQueueUpdate(
                    q.name, target, q.base_limit,
                    f"gpu limit {_fmt(q.limit)} -> {_fmt(target)} (platform's "
                    f"{_fmt(q.base_limit)}); {why}"))
    return updates, notes


def kai_updates(snap: ClusterSnapshot, config: PlannerConfig
                ) -> tuple[list[KaiTopologyUpdate], list[KaiQueueUpdate], list[str]]:
    """Every KAI change for this snapshot (none when KAI's CRDs are not served)."""
    if snap.kai is None:
        return [], [], []
    topologies, notes = topology_updates(snap.kai, config)
    queues, more = queue_updates(snap, snap.kai, config)
    return topologies, queues, notes + more
