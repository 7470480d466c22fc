"""m2g.planner.sparse: the sums over the marked workloads equal the full scans they replace
(the same terms in the same order), on random snapshots with every mark and phase."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import cap_saving_kw, exclusive_workloads, metered, settling_cap_kw
from m2g.planner.inputs import InputBuilder
from m2g.planner.shedding import (
    _read_at,
    _settles,
    drawing,
    in_flight_kw,
    last_action,
    not_drawing_share,
    not_drawing_yet,
    reach_kw,
    restoring,
    saving_kw,
    settling_kw,
    workload_kw,
)

NOW = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
CFG = PlannerConfig()


def _when(rng: random.Random) -> datetime | None:
    return None if rng.random() < 0.5 else NOW - timedelta(seconds=rng.choice((1, 20, 100, 900)))


def _started(rng: random.Random) -> datetime | None:
    """A pod's start: not known, within the meter's lag, in the reading, or long ago."""
    return None if rng.random() < 0.3 else NOW - timedelta(
        seconds=rng.choice((1, 8, 60, sparse.STARTING_SECONDS, 900)))


def _snapshot(seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    f = FactorySnapshot(now=NOW, site_budget_kw=5000.0, power_domains=(PowerDomain("pd-0"),),
                        racks=(Rack("r0", "b0", "pd-0", power_kw=Reading(900.0, 5.0)),),
                        nodes=tuple(Node(f"n{i}", "r0") for i in range(8)))
    ws = []
    for i in range(rng.randint(0, 60)):
        gpus = rng.choice((1, 4, 8))
        view = WorkloadView(name=f"w{i}", namespace="t", gpus=gpus, flex_tier=rng.randint(0, 3),
                            estimated_kw=rng.choice((0.0, gpus * 1.1)))
        ws.append(WorkloadState(
            "t", f"w{i}", view, rng.choice(list(Phase)), shed_by_m2g=rng.random() < 0.3,
            shed_at=_when(rng), restored_at=_when(rng), admitted_at=_when(rng),
            holds_quota=rng.random() < 0.5, released_at=_when(rng),
            power_cap=rng.choice((1.0, 1.0, 0.75, 0.5)), power_cap_at=_when(rng)))
    placed = [w for w in ws if rng.random() < 0.6]
    placements = {w.key: (f"n{rng.randrange(8)}",) for w in placed}
    live = None if rng.random() < 0.4 else {
        w.key: LivePods(2, rng.randint(0, 1), _started(rng), rng.choice((0, 0, 0, 1, 2)))
        for w in placed if rng.random() < 0.8}
    return ClusterSnapshot(f, tuple(ws), placements=placements, live_pods=live)


def _full_scans(snap: ClusterSnapshot) -> tuple[float, float, float, datetime | None]:
    """The scans over every workload, as they were before m2g.planner.sparse."""
    read_at = _read_at(snap)
    cap_read = snap.now - timedelta(seconds=min(snap.factory.site_draw_kw().age_seconds,
                                                CFG.settle_seconds))
    caps = sum(cap_saving_kw(w, CFG, 1.0, w.power_cap) for w in snap.workloads
               if w.phase is Phase.ADMITTED and w.power_cap < 1.0 and w.power_cap_at
               and (snap.now - w.power_cap_at).total_seconds() < CFG.settle_seconds
               and not metered(w, snap, cap_read, CFG))
    settle = sum(saving_kw(w, CFG) for w in snap.workloads
                 if w.shed_by_m2g and w.shed_at is not None
                 and _settles(w, snap, CFG, read_at)) + caps
    flight = 0.0
    for w in snap.workloads:
        share = not_drawing_share(w, snap, CFG)
        if share > 0.0:
            flight += workload_kw(w, CFG) * share
        elif restoring(w, snap, CFG):
            flight += workload_kw(w, CFG)
    times = [t for w in snap.workloads for t in (w.shed_at, w.restored_at, w.power_cap_at)
             if t is not None]
    return settle, caps, flight, max(times) if times else None


@pytest.mark.parametrize("seed", range(60))
def test_the_sums_over_the_marked_workloads_are_the_full_scans(seed: int) -> None:
    snap = _snapshot(seed)
    settle, caps, flight, last = _full_scans(snap)
    assert settling_kw(snap, CFG) == settle  # exactly: the same terms in the same order
    assert settling_cap_kw(snap, CFG) == caps
    assert in_flight_kw(snap, CFG) == flight
    assert last_action(InputBuilder(snap)) == last
    assert sparse.of(snap).by_key == {w.key: w for w in snap.workloads}


def test_the_random_snapshots_reach_every_subset() -> None:
    """The differential above means something: its snapshots put workloads in every subset,
    and some of each subset in the sums."""
    snaps = [_snapshot(s) for s in range(60)]
    for name in ("shed", "capped", "stamped", "in_flight"):
        assert sum(len(getattr(sparse.of(s), name)) for s in snaps) > 20, name
    assert sum(1 for s in snaps if in_flight_kw(s, CFG) > 0) > 5
    # bound work in flight too: its pods not running yet, or not in the reading yet
    assert sum(1 for s in snaps if s.live_pods for w in sparse.of(s).in_flight
               if w.key in s.live_pods and not_drawing_yet(w, s, CFG)) > 5
    assert sum(1 for s in snaps if settling_kw(s, CFG) > settling_cap_kw(s, CFG)) > 5


def test_the_selection_is_kept_per_snapshot_object() -> None:
    snap = _snapshot(3)
    first = sparse.of(snap)
    assert sparse.of(snap) is first
    other = replace(snap, workloads=snap.workloads[:1])  # a new snapshot selects again
    assert sparse.of(other) is not first
    assert sparse.of(other).workloads == snap.workloads[:1]
    assert snap == replace(snap)  # the memo is no field: equality is unchanged


@pytest.mark.parametrize("seed", range(60))
def test_the_firm_gates_reach_over_the_flexible_work_is_the_full_scan(seed: int) -> None:
    """reach_kw reads ``flexible`` (admitted, flex >= 1, not shed): the same sum as over every
    workload, exactly, at both tiers it starts from (SIMPLE level 3 of an event: flex 1)."""
    snap = _snapshot(seed)
    for lowest in (1, 2):
        s = snap if lowest == 2 else replace(snap, factory=replace(
            snap.factory, grid_events=(GridEvent("e", NOW - timedelta(minutes=1),
                                                 NOW + timedelta(hours=1), level=3),)))
        full = settling_kw(s, CFG) + sum(
            saving_kw(w, CFG) for w in s.workloads
            if w.phase is Phase.ADMITTED and w.view.flex_tier >= lowest and not w.shed_by_m2g
            and drawing(w, s))
        assert reach_kw(s, CFG) == full


def test_the_random_snapshots_reach_the_flexible_subset() -> None:
    snaps = [_snapshot(s) for s in range(60)]
    assert sum(1 for s in snaps if reach_kw(s, CFG) > settling_kw(s, CFG)) > 10


def test_restored_work_shed_again_or_admitted_and_drawing_leaves_the_in_flight_subset() -> None:
    """``restored_at`` outlives a shed (early restore's flap rule), so "ever restored" would
    grow the subset with every pause and restore of an event; only restored work not shed
    again and not admitted again yet is in flight by its restore (``restoring``)."""
    f = FactorySnapshot(now=NOW, site_budget_kw=5000.0, power_domains=(PowerDomain("pd-0"),),
                        racks=(Rack("r0", "b0", "pd-0", power_kw=Reading(900.0, 5.0)),),
                        nodes=(Node("n0", "r0"),))
    back = NOW - timedelta(seconds=20)
    long_ago = NOW - timedelta(seconds=900)

    def restored(name: str, phase: Phase, **kw: object) -> WorkloadState:
        view = WorkloadView(name=name, namespace="t", gpus=4, flex_tier=2, estimated_kw=4.4)
        return WorkloadState("t", name, view, phase, restored_at=back, **kw)  # type: ignore[arg-type]

    waiting = restored("waiting", Phase.PENDING)
    shed_again = restored("shed-again", Phase.INACTIVE, shed_by_m2g=True, shed_at=NOW)
    running = restored("running", Phase.ADMITTED, admitted_at=long_ago)
    starting = restored("starting", Phase.ADMITTED, admitted_at=NOW - timedelta(seconds=5))
    live = {running.key: LivePods(2, 0, long_ago, 0), starting.key: LivePods(1, 0, None, 1)}
    snap = ClusterSnapshot(f, (waiting, shed_again, running, starting),
                           placements={w.key: ("n0",) for w in (running, starting)},
                           live_pods=live)
    assert [w.name for w in sparse.of(snap).in_flight] == ["waiting", "starting"]
    assert in_flight_kw(snap, CFG) == _full_scans(snap)[2] > 0


@pytest.mark.parametrize("seed", range(40))
def test_the_admitted_subset_and_the_exclusive_workloads_are_the_full_scans(seed: int) -> None:
    """The Preemption stage, the cap ladders and the node limits read ``admitted`` (issue 14:
    one pass, not one each): every Admitted workload in the snapshot's order; the workloads
    alone on their nodes, worked out from it, are those of a scan over every workload."""
    snap = _snapshot(seed)
    admitted = [w for w in snap.workloads if w.phase is Phase.ADMITTED]
    assert list(sparse.of(snap).admitted) == admitted
    assert all(a is b for a, b in zip(sparse.of(snap).admitted, admitted, strict=True))
    keys = {w.key for w in admitted}
    nodes_of = {k: set(n) for k, n in snap.placements.items() if k in keys}
    alone = {k for k, on in nodes_of.items() if on and not any(
        on & other for o, other in nodes_of.items() if o != k)}
    assert exclusive_workloads(snap) == alone


def test_the_random_snapshots_reach_the_admitted_subset() -> None:
    snaps = [_snapshot(s) for s in range(40)]
    assert sum(len(sparse.of(s).admitted) for s in snaps) > 100
    assert sum(len(exclusive_workloads(s)) for s in snaps) > 20
    assert sum(len(sparse.of(s).admitted) - len(exclusive_workloads(s)) for s in snaps) > 20
