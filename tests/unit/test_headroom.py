"""The site's headroom spent once across one reconcile's admissions (m2g.planner.headroom)
and caps that no longer count as settling once the agents report them in force
(m2g.planner.curtail.settling_cap_kw)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Reading
from m2g.model.plan import CheckUpdate
from m2g.model.powerlimit import LimitSpec, NodeLimitState
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import cap_saving_kw, settling_cap_kw
from m2g.planner.headroom import POLICY, Headroom, min_tier, share
from m2g.planner.shedding import saving_kw, workload_kw
from tests.unit.test_curtail import CFG, NOW, factory, job

LIMIT = 300.0


def pending(name: str, tier: int, gpus: int = 8, priority: int = 0,
            state: CheckState = CheckState.PENDING) -> WorkloadState:
    w = job(name, tier, gpus=gpus)
    return replace(w, phase=Phase.RESERVED, check="m2g", check_state=state, admitted_at=None,
                   view=w.view.model_copy(update={"priority": priority}))


def ready(w: WorkloadState) -> CheckUpdate:
    return CheckUpdate(w.namespace, w.name, "m2g", CheckState.READY, "admitted")


def room_for(n: int, w: WorkloadState) -> float:
    """A draw that leaves room for ``n`` workloads like ``w`` (and half of one more)."""
    return LIMIT * (1 - CFG.restore_margin) - (n + 0.5) * workload_kw(w, CFG)


def test_the_room_is_spent_once_in_priority_order() -> None:
    ws = [pending(f"p{i}", 2, priority=i % 3) for i in range(8)]
    s = ClusterSnapshot(factory(room_for(3, ws[0]), LIMIT), tuple(ws))
    out = share([ready(w) for w in ws], s, CFG)
    assert [u.name for u in out] == [w.name for w in ws]  # the order is kept
    admitted = [u.name for u in out if u.state is CheckState.READY]
    assert admitted == ["p1", "p2", "p5"]  # priority 2 (p2, p5), then the first of 1 (p1)
    held = [u for u in out if u.state is CheckState.RETRY]
    assert len(held) == 5 and all(u.policy == POLICY and u.requeue_after_seconds == 30
                                  for u in held)
    assert "3 workload(s) admitted before it" in held[0].message


def test_firm_tiers_are_never_held_but_spend_the_room_first() -> None:
    """As outside an event (or with the event gate off: headroom_event_min_tier 3, and firm
    work not held for room: hold_firm_beyond_reach off)."""
    cfg = replace(CFG, headroom_event_min_tier=3, hold_firm_beyond_reach=False)
    firm = [pending(f"f{i}", t) for i, t in enumerate((0, 1, 0))]
    flex = [pending("x", 2)]
    s = ClusterSnapshot(factory(room_for(2, flex[0]), LIMIT), tuple(firm + flex))
    out = share([ready(w) for w in firm + flex], s, cfg)
    assert [u.state for u in out] == [CheckState.READY] * 3 + [CheckState.RETRY]
    assert min_tier(s, cfg) == 2
    high = replace(s.factory, grid_events=tuple(replace(e, level=2)
                                                for e in s.factory.grid_events))
    assert min_tier(replace(s, factory=high), cfg) == 1


def test_during_an_event_new_flex1_work_starts_only_in_the_room() -> None:
    ws = [pending(f"f{i}", t, priority=3 - i) for i, t in enumerate((1, 1, 0, 1))]
    s = ClusterSnapshot(factory(room_for(1, ws[0]), LIMIT), tuple(ws))
    out = share([ready(w) for w in ws], s, CFG)
    # f2 (firm) is never held and spends first; f0 (flex-1, priority 3) takes what is left
    assert [u.state for u in out] == [CheckState.RETRY, CheckState.RETRY, CheckState.READY,
                                      CheckState.RETRY]
    assert min_tier(s, CFG) == 1
    over = replace(s.factory, grid_events=tuple(replace(e, end=NOW - timedelta(seconds=1))
                                                for e in s.factory.grid_events))
    assert min_tier(replace(s, factory=over), CFG) == 2  # no event: flex-1 is not held
    every = replace(CFG, headroom_event_min_tier=0)
    assert min_tier(s, every) == 0
    assert [u.state for u in share([ready(w) for w in ws], s, every)][:3] == [
        CheckState.READY, CheckState.RETRY, CheckState.RETRY]


def test_during_an_event_firm_work_waits_for_room_m2g_can_still_make() -> None:
    """Firm work is admitted into an event while the room plus what m2g can still free
    (running flexible work it has not paused, sheds not in the meter yet) covers it; once
    every flexible job is paused it waits (Retry), as the grid commitment asks."""
    firm = [pending(f"f{i}", 0, priority=2 - i) for i in range(2)]
    # room for one and a half under the limit itself: firm work may use restore_margin
    f = factory(LIMIT - 1.5 * workload_kw(firm[0], CFG), LIMIT)

    def states(*running: WorkloadState, cfg: PlannerConfig = CFG,
               fac: FactorySnapshot = f) -> list[CheckState]:
        s = ClusterSnapshot(fac, (*firm, *running),
                            placements={w.key: (f"n{i}",) for i, w in enumerate(running)})
        return [u.state for u in share([ready(w) for w in firm], s, cfg)]

    assert states() == [CheckState.READY, CheckState.RETRY]  # nothing left to pause
    assert share([ready(firm[0])], ClusterSnapshot(factory(room_for(0, firm[0]), LIMIT),
                                                   tuple(firm)), CFG)[0].state \
        is CheckState.READY  # within restore_margin of the limit: still under it
    flex = job("x", 2)  # running, drawing: pausing it frees saving_kw(x) >= a firm job's kW
    assert saving_kw(flex, CFG) >= workload_kw(firm[1], CFG)
    assert states(flex) == [CheckState.READY, CheckState.READY]
    assert states(job("y", 1)) == [CheckState.READY, CheckState.RETRY]  # flex-1: not paused
    shed = replace(flex, phase=Phase.INACTIVE, shed_by_m2g=True,
                   shed_at=NOW - timedelta(seconds=600))  # long paused: in the meter already
    # (paused work waiting to come back holds new firm work: restore_before_firm, below)
    unheld = replace(CFG, restore_before_firm=False)
    assert states(shed, cfg=unheld) == [CheckState.READY, CheckState.RETRY]
    settling = replace(shed, shed_at=NOW - timedelta(seconds=5), holds_quota=True)
    assert states(settling, cfg=unheld) == [CheckState.READY, CheckState.READY]  # not metered
    over = replace(f, grid_events=tuple(replace(e, end=NOW - timedelta(seconds=1))
                                        for e in f.grid_events))
    assert states(fac=over) == [CheckState.READY, CheckState.READY]  # no event: never held
    off = replace(CFG, hold_firm_beyond_reach=False)
    assert states(cfg=off) == [CheckState.READY, CheckState.READY]
    s = ClusterSnapshot(f, tuple(firm))
    held = share([ready(w) for w in firm], s, CFG)[1]
    assert "firm work waits for room m2g can make" in held.message
    assert "can free only 0 kW more" in held.message


def test_during_an_event_paused_work_comes_back_before_new_firm_work() -> None:
    """While work m2g paused waits to come back during an event, new firm work starts only
    in the room beyond the paused work's kW (restore_before_firm): the room that jobs
    finishing free goes to the paused work first (the 23rd session's twin: ~24 firm
    arrivals took it while the paused flex-2/3 work waited out the event). Before, firm
    work took the room (and the restore margin) first."""
    firm = [pending(f"f{i}", 0, priority=2 - i) for i in range(2)]
    paused = replace(job("p", 2, gpus=8), phase=Phase.INACTIVE, shed_by_m2g=True,
                     shed_at=NOW - timedelta(seconds=600))
    kw, back = workload_kw(firm[0], CFG), workload_kw(paused, CFG)

    def states(draw: float, *others: WorkloadState, cfg: PlannerConfig = CFG,
               limit: float = LIMIT) -> list[CheckState]:
        s = ClusterSnapshot(factory(draw, limit), (*firm, *others))
        return [u.state for u in share([ready(w) for w in firm], s, cfg)]

    # room under the limit itself for one firm job and a half (firm work may use the
    # restore margin), none beyond the paused kW
    draw = LIMIT - 1.5 * kw
    assert states(draw) == [CheckState.READY, CheckState.RETRY]  # nothing paused: as before
    assert states(draw, paused) == [CheckState.RETRY, CheckState.RETRY]
    assert states(draw, paused, cfg=replace(CFG, restore_before_firm=False)) == [
        CheckState.READY, CheckState.RETRY]
    # room under the restore margin for the paused work and one firm job and a half beyond
    # it: the first firm job starts
    assert states(room_for(1, firm[0]) - back, paused) == [CheckState.READY, CheckState.RETRY]
    # drained for maintenance, not paused for power: not waited for
    drained = replace(paused, drained_for="maintenance/w")
    assert states(draw, drained) == [CheckState.READY, CheckState.RETRY]
    # shed work returns only after the event (restore_during_events off): not waited for
    assert states(draw, paused, cfg=replace(CFG, restore_during_events=False)) == [
        CheckState.READY, CheckState.RETRY]
    # outside an event firm work is never held
    s = ClusterSnapshot(replace(factory(draw), grid_events=()), (*firm, paused))
    assert [u.state for u in share([ready(w) for w in firm], s, CFG)] == [CheckState.READY] * 2
    held = share([ready(w) for w in firm], ClusterSnapshot(factory(draw), (*firm, paused)),
                 CFG)[0]
    assert held.policy == POLICY and f"the work m2g paused ({back:.0f} kW) comes back first" \
        in held.message


def test_restored_work_is_admitted_though_firm_work_is_held_for_it() -> None:
    """A workload m2g restored during an event is admitted into the room kept for it even
    when new firm work is held in the same reconcile (for it: restore_before_firm, or for
    lack of reach); before, a held firm job kept all the room and the restored workload got
    Retry: back to Kueue's queue, the room unused (a 16-rack twin event restored 20 paused
    jobs and none ran again before the event's end)."""
    firm = pending("firm", 0)
    back = replace(pending("back", 2), restored_at=NOW - timedelta(seconds=2))
    other = replace(job("other", 2, gpus=8), phase=Phase.INACTIVE, shed_by_m2g=True,
                    shed_at=NOW - timedelta(seconds=600))  # still paused: firm work waits
    # room under the margin for the restored workload (counted in flight) and a little more
    draw = LIMIT * (1 - CFG.restore_margin) - workload_kw(back, CFG) - 5.0
    s = ClusterSnapshot(factory(draw, LIMIT), (firm, back, other))
    head = Headroom.of(s, CFG)
    assert head is not None and head.in_flight == workload_kw(back, CFG)
    out = {u.name: u.state for u in share([ready(firm), ready(back)], s, CFG)}
    assert out == {"firm": CheckState.RETRY, "back": CheckState.READY}


def test_restored_work_is_admitted_into_the_band_its_restore_kept() -> None:
    """A restore of paused work keeps its own band under the limit (its kW, at least the
    meter's noise: m2g.planner.shedding.restore_band), less than ``restore_margin`` for a job
    smaller than it; the gate admits the restored workload while the room under the limit
    itself holds it. Before, restored work was admitted only within ``restore_margin`` of
    the limit: restored into the band, it would get Retry and its room stay unused."""
    back = replace(pending("back", 2), restored_at=NOW - timedelta(seconds=2))
    kw = workload_kw(back, CFG)
    assert kw < LIMIT * CFG.restore_margin < 2 * kw + 5.0  # a job smaller than the margin

    def state(draw: float) -> CheckState:
        return share([ready(back)], ClusterSnapshot(factory(draw, LIMIT), (back,)), CFG)[0].state

    assert state(LIMIT - kw - 5.0) is CheckState.READY  # 5 kW under the limit, in the margin
    assert state(LIMIT - kw + 5.0) is CheckState.RETRY  # over the limit itself
    new = pending("new", 2)  # new flexible work still keeps the margin
    s = ClusterSnapshot(factory(LIMIT - kw - 5.0, LIMIT), (new,))
    assert share([ready(new)], s, CFG)[0].state is CheckState.RETRY


def test_a_deferred_workload_keeps_its_retry_and_restores_spend_first() -> None:
    again = pending("again", 2, state=CheckState.RETRY)
    new = pending("new", 2)
    s = ClusterSnapshot(factory(room_for(1, new), LIMIT), (new, again))
    assert [u.name for u in share([ready(new), ready(again)], s, CFG)] == ["new"]
    spent = share([ready(new)], s, CFG, spent=workload_kw(new, CFG))
    assert spent[0].state is CheckState.RETRY


def test_work_admitted_and_not_bound_yet_counts_as_drawing() -> None:
    w = pending("w", 2)
    bound = replace(job("bound", 2), admitted_at=NOW - timedelta(seconds=10))
    unbound = replace(job("unbound", 2), admitted_at=NOW - timedelta(seconds=10))
    f = factory(room_for(1, w), LIMIT)
    placed = ClusterSnapshot(f, (w, bound), placements={bound.key: ("n0",)})
    assert share([ready(w)], placed, CFG)[0].state is CheckState.READY
    waiting = ClusterSnapshot(f, (w, unbound), placements={})
    head = Headroom.of(waiting, CFG)
    assert head is not None and head.in_flight == workload_kw(unbound, CFG)
    assert share([ready(w)], waiting, CFG)[0].state is CheckState.RETRY
    old = replace(unbound, admitted_at=NOW - timedelta(seconds=CFG.settle_seconds + 1))
    assert share([ready(w)], ClusterSnapshot(f, (w, old)), CFG)[0].state is CheckState.READY


def test_no_gate_without_a_limit_or_when_off() -> None:
    """(Stale or missing power is no open gate: tests/unit/test_headroom_unknown_power.py.)"""
    ws = [pending(f"p{i}", 3) for i in range(4)]
    f = factory(LIMIT, LIMIT)  # no room at all
    updates = [ready(w) for w in ws]
    assert all(u.state is CheckState.RETRY for u in share(updates, ClusterSnapshot(f, tuple(ws)),
                                                          CFG))
    off = replace(CFG, share_headroom=False)
    assert share(updates, ClusterSnapshot(f, tuple(ws)), off) == updates
    no_limit = replace(f, site_budget_kw=0.0, grid_events=(GridEvent(
        "dr", NOW - timedelta(minutes=1), NOW + timedelta(hours=1)),))
    assert share(updates, ClusterSnapshot(no_limit, tuple(ws)), CFG) == updates
    stale = replace(no_limit, racks=(replace(f.racks[0], power_kw=Reading(LIMIT, 500.0)),))
    assert share(updates, ClusterSnapshot(stale, tuple(ws)), CFG) == updates  # no kW limit


def capped_snapshot(applied: float | None, applied_ago: float) -> ClusterSnapshot:
    w = replace(job("c", 2), power_cap=0.75, power_cap_at=NOW - timedelta(seconds=20))
    nodes = tuple(f"n{i}" for i in range(4))
    spec = LimitSpec("n0", 0.75, None, NOW + timedelta(seconds=100), (w.key,))
    limits = {n: NodeLimitState(n, replace(spec, node=n), applied, "Applied",
                                NOW - timedelta(seconds=applied_ago)) for n in nodes}
    f = factory(280.0, LIMIT)  # the reading is 5 s old (factory's racks)
    return ClusterSnapshot(f, (w,), placements={w.key: nodes}, node_limits=limits)


def test_a_cap_in_force_in_the_meter_no_longer_settles() -> None:
    s = capped_snapshot(0.75, applied_ago=15)
    assert settling_cap_kw(s, CFG) == 0.0  # applied 15 s ago, read 5 s ago, lag 5 s
    w = s.workloads[0]
    full = cap_saving_kw(w, CFG, 1.0, 0.75)
    assert settling_cap_kw(capped_snapshot(0.75, applied_ago=8), CFG) == full  # too recent
    assert settling_cap_kw(capped_snapshot(1.0, applied_ago=15), CFG) == full  # not in force
    assert settling_cap_kw(capped_snapshot(None, applied_ago=15), CFG) == full  # no report
    late = replace(s, node_limits={**s.node_limits, "n3": replace(
        s.node_limits["n3"], applied_fraction=None)})
    assert settling_cap_kw(late, CFG) == full  # one node has not reported


def test_restored_work_is_admitted_before_new_work_into_the_room_kept_for_it() -> None:
    """A workload m2g restored (not admitted again yet) has its kW counted as in flight: it
    is admitted ahead of new flexible work of a higher priority, which gets what is left."""
    back = replace(pending("back", 2, priority=0), restored_at=NOW - timedelta(seconds=30))
    new = pending("new", 2, priority=5)
    s = ClusterSnapshot(factory(room_for(1, new), LIMIT), (new, back))
    head = Headroom.of(s, CFG)
    assert head is not None and head.in_flight == workload_kw(back, CFG)
    out = {u.name: u.state for u in share([ready(new), ready(back)], s, CFG)}
    assert out == {"new": CheckState.RETRY, "back": CheckState.READY}
    # the same workload not restored by m2g: the higher priority goes first
    plain = replace(back, restored_at=None)
    s2 = ClusterSnapshot(factory(room_for(1, new), LIMIT), (new, plain))
    out = {u.name: u.state for u in share([ready(new), ready(plain)], s2, CFG)}
    assert out == {"new": CheckState.READY, "back": CheckState.RETRY}


def test_among_equal_priorities_the_longest_waiting_goes_first() -> None:
    young, old = pending("young", 2), pending("old", 2)
    old = replace(old, view=old.view.model_copy(update={"wait_seconds": 900}))
    young = replace(young, view=young.view.model_copy(update={"wait_seconds": 30}))
    s = ClusterSnapshot(factory(room_for(1, young), LIMIT), (young, old))
    out = share([ready(young), ready(old)], s, CFG)
    assert [(u.name, u.state) for u in out] == [("young", CheckState.RETRY),
                                                ("old", CheckState.READY)]
    # priority still comes first
    vip = replace(young, view=young.view.model_copy(update={"priority": 5}))
    out = share([ready(vip), ready(old)], replace(s, workloads=(vip, old)), CFG)
    assert [u.state for u in out] == [CheckState.READY, CheckState.RETRY]
