"""A gang that fits in one NVLink domain is not admitted split over several while it can wait.

Kueue TAS assigns a workload's nodes when it reserves quota, before m2g's check is asked. A
job that only *prefers* one rack (a hand-written Kueue job, a foreign job: m2g's templates
*require* one NVLink domain) is split over racks when no rack fits it in Kueue's view — and
then runs its collectives over the scale-out network instead of NVLink. m2g's check cannot
move an assignment (``podSetUpdates`` may only add a nodeSelector, which conflicts with it),
but a Retry hands the quota back, and the next reservation gets a fresh assignment
(docs/benchmarks.md, "Why ≤ 72-GPU jobs left their NVLink domain").

So a Ready answer for a workload that holds quota, whose TAS hosts span two or more cliques
though its GPUs fit in one of the site's cliques, becomes a Retry (rule ``nvlink-split``),
``split_retry_requeue_seconds`` later — while it has waited less than
``split_retry_seconds`` since it was created. After that it is admitted as assigned: a split
gang runs slower, a gang that never runs does not run at all. Level-triggered: the wait is
the Workload's own age, so nothing is counted between reconciles. Left alone: a preemptor
whose victims wait (a Retry would hand their quota back only for it to preempt them again:
m2g.planner.preemptors), a workload whose hosts are not all known nodes, and an elastic Job's
workload (``WorkloadState.elastic_job``): Kueue refuses a topology request on one and places
it unconstrained, so a split is its placement, not a miss — and a Retry of the new slice
that grows it back stops the running job (three grown flex-2 jobs in a 16-rack twin run,
2026-12-06, never ran again).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import CheckUpdate
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.preemptors import victims

POLICY, RULE = "nvlink-placement", "nvlink-split"


def split(updates: Sequence[CheckUpdate], snap: ClusterSnapshot,
          config: PlannerConfig) -> list[CheckUpdate]:
    """``updates`` with the Ready answers of split gangs that may still wait turned into
    Retry (dropped when m2g already answered Retry); the order is kept."""
    if config.split_retry_seconds <= 0 or not any(
            u.state is CheckState.READY for u in updates):
        return list(updates)
    by_key, ready = sparse.of(snap).by_key, CheckState.READY
    found = [(i, w) for i, u in enumerate(updates) if u.state is ready
             and (w := by_key.get(f"{u.namespace}/{u.name}")) is not None
             and _may_wait(w, snap, config)]  # (one key and one lookup per Ready answer)
    if not found:
        return list(updates)
    clique_of, largest = _cliques(snap)
    waiting = victims(snap)
    retry: dict[int, tuple[WorkloadState, tuple[str, ...]]] = {}
    for i, w in found:
        hosts = snap.placements.get(w.key, ())
        cliques = {clique_of.get(h) for h in hosts}
        if None in cliques or len(cliques) < 2 or w.view.gpus > largest \
                or waiting.get(w.uid):
            continue
        retry[i] = (w, tuple(sorted(str(c) for c in cliques)))
    out: list[CheckUpdate] = []
    for i, u in enumerate(updates):
        if i not in retry:
            out.append(u)
        elif retry[i][0].check_state is not CheckState.RETRY:
            out.append(_retry(u, *retry[i], config, snap.now))
    return out


def _may_wait(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig) -> bool:
    return (w.phase is Phase.RESERVED and w.view.topology_assigned and not w.elastic_job
            and w.wait_seconds(snap.now) < config.split_retry_seconds
            and len(snap.placements.get(w.key, ())) > 1)


def _cliques(snap: ClusterSnapshot) -> tuple[dict[str, str], int]:
    """Node → its NVLink clique (its rack without one), and the GPUs of the site's largest
    clique (healthy or not: the size a gang fits in); one pass over the nodes."""
    clique_of: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for n in snap.factory.nodes:
        key = clique_of[n.name] = n.clique or n.rack
        sizes[key] = sizes.get(key, 0) + n.gpus
    return clique_of, max(sizes.values(), default=0)


def _retry(u: CheckUpdate, w: WorkloadState, cliques: tuple[str, ...],
           config: PlannerConfig, now: datetime) -> CheckUpdate:
    wait = config.split_retry_requeue_seconds
    left = max(0, config.split_retry_seconds - w.wait_seconds(now))
    shown = ", ".join(cliques[:4]) + (", …" if len(cliques) > 4 else "")
    why = (f"Kueue assigned its {w.view.gpus} GPUs {len(cliques)} NVLink domains ({shown}) "
           f"though they fit in one; handing the quota back for a new assignment, asking "
           f"again in {wait} s (admitted as assigned once it has waited "
           f"{config.split_retry_seconds} s: {left} s from now)")
    return CheckUpdate(namespace=u.namespace, name=u.name, check=u.check,
                       state=CheckState.RETRY, message=why[:1024], requeue_after_seconds=wait,
                       policy=POLICY, rule=RULE)
