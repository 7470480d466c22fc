"""The few workloads the power bookkeeping reads, picked out of a snapshot once.

The settling, in-flight, ramp and cap-lift sums each read only workloads carrying one of a few
marks (m2g shed it, capped it, stamped it, or admitted it without a bound pod yet); at 1,400
racks those are a few hundred of 100,000, and every reconcile scanned all 100,000 for each
sum, five to seven times (docs/benchmarks.md, "Sixteenth session"). The firm gate's reach
reads the running flexible work m2g has not paused (~23,000 of 100,000 there; "Eighteenth
session"). ``of(snap)`` selects them in one pass, in the snapshot's order (so every sum adds
the same terms in the same order as the full scan: the same floats), and keeps the selection
on the snapshot it was computed from (a ``ClusterSnapshot`` is frozen: its workloads,
placements and pods never change under it; ``dataclasses.replace`` makes a new snapshot,
which selects again).

Every subset is a superset of what its reader selects: the readers keep their own predicates
(time-dependent ones included), the subset only spares them the workloads that cannot match.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState

_ATTR = "_m2g_sparse"
#: Work whose pods started running longer ago than this is in the site reading, whatever the
#: meter's lag (m2g.planner.shedding.not_drawing_yet reads no further back): the in-flight
#: selection need not look at it (at 1,400 racks nearly every admitted workload is bound).
STARTING_SECONDS = 300.0


@dataclass(frozen=True)
class Sparse:
    """The marked workloads of one snapshot, each tuple in the snapshot's order."""

    workloads: tuple[WorkloadState, ...]
    #: shed by m2g (``shed_by_m2g``): settling, restores, paused work waiting to come back
    shed: tuple[WorkloadState, ...]
    #: a power cap set (``power_cap`` < 1), any phase: cap lifts, settling caps
    capped: tuple[WorkloadState, ...]
    #: any of ``shed_at``, ``restored_at``, ``power_cap_at`` set: the ramp's last action
    stamped: tuple[WorkloadState, ...]
    #: admitted with an admission time and no bound pod, a bound pod not running yet or
    #: pods started within ``STARTING_SECONDS`` (``not_drawing_yet`` before its time tests),
    #: or restored by m2g, not shed again and not admitted again yet (``restoring`` before
    #: its time test): in flight
    in_flight: tuple[WorkloadState, ...]
    #: admitted, flex tier 1 and up and not shed by m2g: the running flexible work pausing
    #: could still free kW from (``reach_kw`` before its tier and ``drawing`` tests)
    flexible: tuple[WorkloadState, ...]
    #: admitted (``phase`` Admitted), shed or not: the Preemption stage's workloads, the cap
    #: ladders' and the node limits' — each read them in a pass of its own over all of them
    admitted: tuple[WorkloadState, ...]

    @cached_property
    def by_key(self) -> dict[str, WorkloadState]:
        """Every workload by key (the last of equal keys, as a dict comprehension keeps)."""
        return {w.key: w for w in self.workloads}


def of(snap: ClusterSnapshot) -> Sparse:
    """``snap``'s marked workloads, selected once per snapshot object."""
    got = vars(snap).get(_ATTR)
    if isinstance(got, Sparse) and got.workloads is snap.workloads:
        return got
    got = select(snap)
    vars(snap)[_ATTR] = got  # a memo beside the frozen fields: not a field, never compared
    return got


def select(snap: ClusterSnapshot) -> Sparse:
    """The selection itself, one pass over the workloads."""
    live, placements = snap.live_pods, snap.placements
    recent = snap.now - timedelta(seconds=STARTING_SECONDS)
    shed: list[WorkloadState] = []
    capped: list[WorkloadState] = []
    stamped: list[WorkloadState] = []
    flight: list[WorkloadState] = []
    flexible: list[WorkloadState] = []
    running: list[WorkloadState] = []
    admitted, back = Phase.ADMITTED, (Phase.PENDING, Phase.RESERVED)
    for w in snap.workloads:
        if w.phase is admitted:
            running.append(w)
        if w.shed_by_m2g:
            shed.append(w)
        elif w.phase is admitted and w.view.flex_tier >= 1:
            flexible.append(w)
        if w.power_cap < 1.0:
            capped.append(w)
        if w.shed_at is not None or w.restored_at is not None or w.power_cap_at is not None \
                or w.resized_at is not None:
            stamped.append(w)
        if w.restored_at is not None and not w.shed_by_m2g and w.phase in back:
            flight.append(w)  # restored, not admitted again (``restored_at`` outlives a shed)
        elif w.phase is admitted and w.admitted_at is not None:
            if live is None:
                if w.key not in placements:
                    flight.append(w)
            elif (pods := live.get(w.key)) is None or pods.waiting or (
                    pods.started_at is not None and pods.started_at > recent):
                flight.append(w)
    return Sparse(snap.workloads, tuple(shed), tuple(capped), tuple(stamped), tuple(flight),
                  tuple(flexible), tuple(running))

