"""During a grid event, Kueue does not preempt running work for new work m2g holds anyway.

Kueue preempts when it reserves quota, before it asks any AdmissionCheck (kueue#1178 asked
for preemption after the checks; closed unmerged): a new workload of higher priority that
does not fit its ClusterQueue evicts lower-priority running work of the same queue
(``withinClusterQueue: LowerPriority``; v0.19 ``pkg/scheduler/preemption``
``findCandidates``). During an active grid event the headroom gate holds every new workload
of the flexible tiers (m2g.planner.headroom.min_tier: flex ≥ 1 by default) until the room
under the limit holds it, and the room does not count what its victims free until the meter
shows it — so the preemptor is held (Retry, or Pending with its quota while its victims wait,
m2g.planner.preemptors) and the victims lose the work since their last checkpoint for
nothing. In a 16-rack twin event (docs/benchmarks.md, twenty-sixth session) 11 of the 23
jobs m2g had restored were preempted again this way (25 preemptions), e.g. one 7 times.

So while an event is active, a ClusterQueue all of whose work the gate holds (its
``m2g.io/min-flex-tier`` at or above the gate's tier) gets ``spec.preemption.
withinClusterQueue: Never``; the site's value is recorded in ``m2g.io/base-within-preemption``
and written back when no event is active (when the field still reads Never; a value someone
else wrote meanwhile is kept, and only the record goes). New work there then waits for free
quota instead of evicting running work; after the event Kueue preempts as the site
configured. Queues of firm work are left alone (m2g admits firm work during an event while it
can make room for it). ``hold_preemption_during_events: false`` turns it off (a hold m2g set
is still handed back). Kueue's cross-queue preemption (``reclaimWithinCohort``, fair sharing)
is not changed: a queue reclaims its own nominal quota as the site configured.
"""

from __future__ import annotations

from m2g.model.cluster import ClusterSnapshot
from m2g.model.plan import PreemptionUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.headroom import min_tier

NEVER = "Never"


def holding(snap: ClusterSnapshot, config: PlannerConfig) -> int | None:
    """The lowest ``m2g.io/min-flex-tier`` of the queues whose preemption is held now, None
    when none is (no active event, the gate off, or the hold off)."""
    if not (config.hold_preemption_during_events and config.share_headroom):
        return None
    event = snap.factory.grid_event()
    if event is None or not event.active(snap.now):
        return None
    return min_tier(snap, config)


def preemption_updates(snap: ClusterSnapshot, config: PlannerConfig) -> list[PreemptionUpdate]:
    """The ``withinClusterQueue`` writes this reconcile wants (ClusterQueue name order)."""
    tier = holding(snap, config)
    out: list[PreemptionUpdate] = []
    for q in sorted(snap.queues, key=lambda q: q.name):
        held = tier is not None and q.min_flex_tier >= tier
        if held and q.within_preemption not in ("", NEVER):
            out.append(PreemptionUpdate(
                q.name, NEVER, q.within_preemption_base or q.within_preemption,
                f"a grid event is active and m2g holds new work of flex tier >= {tier} "
                f"(all of this queue's, m2g.io/min-flex-tier {q.min_flex_tier}): Kueue "
                f"would preempt running work for work that then waits; "
                f"{q.within_preemption} again when no event is active"))
        elif not held and q.within_preemption_base:
            back = q.within_preemption_base if q.within_preemption == NEVER \
                else q.within_preemption
            out.append(PreemptionUpdate(
                q.name, back, "",
                "no grid event holds this queue's new work: the site's preemption "
                f"within the queue ({back}) is back"))
    return out
