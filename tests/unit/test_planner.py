"""The pure planner: snapshot + policies → plan, without a cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from m2g.model.cluster import (
    CheckState,
    ClusterSnapshot,
    FlavorQuota,
    FlavorState,
    LivePods,
    Phase,
    QueueState,
    WorkloadState,
)
from m2g.model.factory import FactorySnapshot, GridEvent, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.plan import make_plan
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g")

POLICIES = {
    "dr.yaml": policy("dr", "Admission", """
        - name: defer
          when: "grid.event.active && workload.flexTier >= 2"
          decision: Defer
          requeueAfter: "grid.event.endsInSeconds"
          messageExpression: "'grid event ' + grid.event.id + ' is active'"
    """),
    "cap.yaml": policy("cap", "Capacity", """
        - {name: healthy, when: "true", quota: "flavor.healthyGpus"}
    """),
    "shed.yaml": policy("shed", "Preemption", """
        - {name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}
    """),
}


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def factory(draw_kw: float = 200.0, broken: int = 0, event: bool = False,
            stale: bool = False) -> FactorySnapshot:
    nodes = tuple(Node(f"r0-n{i}", "rack-0", reasons=("GpuXid",) if i < broken else ())
                  for i in range(18))
    racks = (Rack("rack-0", "block-0", "pd-0", power_kw=Reading(draw_kw, 200.0 if stale else 5.0),
                  cap_kw=132.0),)
    events = (GridEvent("dr-1", NOW - timedelta(minutes=5), NOW + timedelta(hours=1),
                        target_kw=100.0),) if event else ()
    return FactorySnapshot(now=NOW, site_budget_kw=300.0, power_domains=(PowerDomain("pd-0"),),
                           racks=racks, nodes=nodes, grid_events=events)


def wl(name: str, phase: Phase, tier: int = 0, gpus: int = 8, kw: float = 0.0,
       **kw_args: object) -> WorkloadState:
    view = WorkloadView(name=name, namespace="team", flex_tier=tier, gpus=gpus, estimated_kw=kw,
                        cluster_queue="cq-a")
    return WorkloadState("team", name, view, phase, cluster_queue="cq-a", check="m2g",
                         **kw_args)  # type: ignore[arg-type]


def queues(nominal_a: int = 48, nominal_b: int = 24, last: datetime | None = None
           ) -> tuple[QueueState, ...]:
    return (QueueState("cq-a", (FlavorQuota("gb300", "nvidia.com/gpu", nominal_a, 48),),
                       last_quota_change=last),
            QueueState("cq-b", (FlavorQuota("gb300", "nvidia.com/gpu", nominal_b, 24),),
                       last_quota_change=last))


def snap(f: FactorySnapshot, *workloads: WorkloadState, qs: tuple[QueueState, ...] | None = None
         ) -> ClusterSnapshot:
    return ClusterSnapshot(f, workloads, queues() if qs is None else qs,
                           (FlavorState("gb300", "rack-0"),))


def test_pending_checks_are_answered(ev: Evaluator) -> None:
    # under the event's 100 kW target: room for the firm job (over it, with nothing flexible
    # left to pause, firm work would wait: test_headroom, hold_firm_beyond_reach)
    s = snap(factory(draw_kw=80.0, event=True),
             wl("flex", Phase.RESERVED, tier=2, check_state=CheckState.PENDING),
             wl("firm", Phase.RESERVED, tier=0, check_state=CheckState.PENDING),
             wl("done", Phase.ADMITTED, tier=2, check_state=CheckState.READY))
    plan = make_plan(s, ev, CFG)
    by = {c.name: c for c in plan.checks}
    assert set(by) == {"flex", "firm"}
    # the policy asks for 3600 s; Kueue would hold the quota that long: m2g caps it at 60 s
    assert by["flex"].state is CheckState.RETRY and by["flex"].requeue_after_seconds == 60
    assert "grid event dr-1 is active" in by["flex"].message
    assert "(retry in 3600s)" in by["flex"].message
    assert by["firm"].state is CheckState.READY
    assert (by["flex"].policy, by["firm"].policy) == ("dr", "")  # metrics label by policy


def test_a_deferred_workload_is_answered_ready_once_its_decision_is_admit(ev: Evaluator) -> None:
    held = wl("flex", Phase.RESERVED, tier=2, check_state=CheckState.RETRY)
    evicted = wl("gone", Phase.PENDING, tier=2, check_state=CheckState.RETRY)
    # during the event the decision is still Defer: the Retry is left alone (no rewrite that
    # would move its lastTransitionTime and so Kueue's requeue)
    assert make_plan(snap(factory(event=True), held, evicted), ev, CFG).checks == ()
    # the event is over: Ready at once, while Kueue still holds the quota; a workload Kueue has
    # released is answered when it reserves again (its check is Pending then)
    checks = make_plan(snap(factory(event=False), held, evicted), ev, CFG).checks
    assert [(c.name, c.state) for c in checks] == [("flex", CheckState.READY)]


def test_an_event_ending_in_under_a_second_ends_in_one_second(ev: Evaluator) -> None:
    from m2g.model.factory import grid_view
    f = replace(factory(), grid_events=(GridEvent(
        "dr-2", NOW - timedelta(minutes=5), NOW + timedelta(milliseconds=400), target_kw=100.0),))
    assert grid_view(f).event.ends_in_seconds == 1
    upcoming = replace(f, grid_events=(GridEvent(
        "dr-3", NOW + timedelta(seconds=9.5), NOW + timedelta(minutes=5), target_kw=100.0),))
    assert grid_view(upcoming).event.starts_in_seconds == 10


def test_failed_nodes_derate_quota_in_proportion(ev: Evaluator) -> None:
    plan = make_plan(snap(factory(broken=6)), ev, CFG)  # 72 - 24 = 48 healthy of 72 base
    quotas = {q.cluster_queue: q.nominal for q in plan.quotas}
    assert quotas == {"cq-a": 32, "cq-b": 16}


def test_hysteresis_and_raise_dwell(ev: Evaluator) -> None:
    # one failed tray: 68/72 healthy -> targets 45 and 22, changes of 3 and 2: below hysteresis
    assert make_plan(snap(factory(broken=1)), ev, CFG).quotas == ()
    # two: 64/72 -> 42 (a change of 6) and 21 (3, still skipped)
    plan = make_plan(snap(factory(broken=2)), ev, CFG)
    assert {q.cluster_queue: q.nominal for q in plan.quotas} == {"cq-a": 42}
    # healthy again, quotas currently derated, changed 30 s ago: raising waits for the dwell
    recent = queues(32, 16, last=NOW - timedelta(seconds=30))
    assert make_plan(snap(factory(), qs=recent), ev, CFG).quotas == ()
    old = queues(32, 16, last=NOW - timedelta(seconds=600))
    assert {q.nominal for q in make_plan(snap(factory(), qs=old), ev, CFG).quotas} == {48, 24}


def test_sheds_highest_score_first_within_the_ramp(ev: Evaluator) -> None:
    s = snap(factory(draw_kw=260.0, event=True),  # limit 100 kW: 160 kW short
             wl("t1", Phase.ADMITTED, tier=1, kw=50.0), wl("t3", Phase.ADMITTED, tier=3, kw=60.0),
             wl("t2", Phase.ADMITTED, tier=2, kw=70.0), wl("t0", Phase.ADMITTED, tier=0, kw=90.0))
    first = make_plan(s, ev, CFG).sheds
    assert [a.name for a in first] == ["t3", "t2", "t1"] and not any(a.active for a in first)
    slow = replace(CFG, max_step_kw=100.0)  # saves 49.2 + 57.4 kW > 100 kW: one per step
    assert [a.name for a in make_plan(s, ev, slow).sheds] == ["t3"]


def test_equal_scores_shed_the_fewest_workloads(ev: Evaluator) -> None:
    """Same score: the largest first, then the smallest that covers the rest. Key order would
    take a, b, c and d: four writes for the same 123 kW."""
    s = snap(factory(draw_kw=200.0, event=True),  # limit 100 kW: 100 kW short
             wl("a", Phase.ADMITTED, tier=3, kw=12.5), wl("b", Phase.ADMITTED, tier=3, kw=12.5),
             wl("c", Phase.ADMITTED, tier=3, kw=75.0), wl("d", Phase.ADMITTED, tier=3, kw=50.0),
             wl("e", Phase.ADMITTED, tier=3, kw=100.0), wl("f", Phase.ADMITTED, tier=2, kw=200.0))
    # savings (82 %): a, b 10.25; c 61.5; d 41; e 82; f 164
    assert [a.name for a in make_plan(s, ev, CFG).sheds] == ["e", "d"]  # 82 + 41 (not + c)


def test_choose_victims_order_ramp_and_ties() -> None:
    from m2g.planner.shedding import Candidate, choose_victims

    cands = [Candidate(1.0, "x", 50.0), Candidate(2.0, "b", 10.0), Candidate(2.0, "a", 10.0),
             Candidate(2.0, "c", 30.0), Candidate(2.0, "d", 25.0)]

    def keys(shortfall: float, step: float = 1000.0) -> list[str]:
        return [c.key for c in choose_victims(cands, shortfall, step, CFG)]

    assert keys(8.0) == ["a"]  # smallest that covers, ties by key
    assert keys(26.0) == ["c"]
    assert keys(40.0) == ["c", "a"]  # 30, then 10 covers the remaining 10
    assert keys(75.0) == ["c", "d", "a", "b"]
    assert keys(100.0) == ["c", "d", "a", "b", "x"]  # the lower score only after the higher
    assert keys(100.0, step=60.0) == ["c", "d"]  # 55 kW: nothing of score 2 fits in 5 more
    assert keys(100.0, step=20.0) == ["a", "b"]  # c and d do not fit, 10 + 10 do; x waits
    assert keys(0.0) == []


def test_victims_from_groups_worked_out_once_as_from_the_candidates_left() -> None:
    """A pause round chooses from the score groups worked out once per reconcile, leaving out
    those paused before, what choose_victims chooses from the candidates left."""
    import random

    from m2g.planner.shedding import Candidate, _choose, by_score, choose_victims

    rng = random.Random(7)
    for _ in range(200):
        cands = [Candidate(float(rng.choice((1, 2, 3))), f"k{i}", float(rng.randrange(5, 60)))
                 for i in range(rng.randrange(0, 12))]
        out = frozenset(c.key for c in cands if rng.random() < 0.3)
        shortfall, step = float(rng.randrange(0, 150)), float(rng.choice((20, 60, 1000)))
        left = [c for c in cands if c.key not in out]
        assert _choose(by_score(cands), shortfall, step, CFG, out) == choose_victims(
            left, shortfall, step, CFG)


def test_victims_without_a_ramp_as_one_pass_per_pick() -> None:
    """Without a ramp (the pause rounds: step = inf) the victims are picked by index
    (_take_largest): the same as choosing as before, one pass over the pool per pick — the
    largest while none covers the rest, then the smallest that does (ties by key), and a
    lower score only after the higher."""
    import math
    import random

    from m2g.planner.shedding import Candidate, _choose, _fits, by_score

    def before(groups: list[tuple[float, list[Candidate]]], shortfall: float,
               exclude: frozenset[str]) -> list[Candidate]:
        out: list[Candidate] = []
        covered = 0.0
        for _, group in groups:
            pool = [c for c in group if c.key not in exclude]
            while pool and covered < shortfall:
                fitting = [c for c in pool if _fits(covered + c.kw, math.inf, bool(out), CFG)]
                rest = shortfall - covered
                covers = [c for c in fitting if c.kw >= rest]
                pick = min(covers, key=lambda c: (c.kw, c.key)) if covers else fitting[0]
                pool.remove(pick)
                out.append(pick)
                covered += pick.kw
            if covered >= shortfall:
                break
        return out

    rng = random.Random(11)
    picked = 0
    for _ in range(400):
        cands = [Candidate(float(rng.choice((1, 2))), f"k{i:02d}",
                           rng.choice((0.1, 0.2, 0.3)) * rng.randrange(1, 40))
                 for i in range(rng.randrange(0, 40))]
        out = frozenset(c.key for c in cands if rng.random() < 0.2)
        shortfall = rng.choice((0.0, 0.3, 1.0, 5.5, 20.0, 80.0, 300.0))
        got = _choose(by_score(cands), shortfall, math.inf, CFG, out)
        assert got == before(by_score(cands), shortfall, out)
        picked += len(got)
    assert picked > 1000


def test_settling_sheds_are_not_shed_twice(ev: Evaluator) -> None:
    just = NOW - timedelta(seconds=10)
    s = snap(factory(draw_kw=160.0, event=True),
             wl("gone", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True, shed_at=just),
             wl("t2", Phase.ADMITTED, tier=2, kw=70.0))
    # 160 - 80 x 0.82 settling = 94.4 <= 100: nothing more to shed (the ramp would allow it)
    assert make_plan(s, ev, CFG).sheds == ()


def test_sheds_still_stopping_keep_settling(ev: Evaluator) -> None:
    """Past settle_seconds, a shed workload whose quota Kueue still holds (its pods have not
    stopped) counts as shed, up to settle_max_seconds; once released it no longer does."""
    def with_gone(age_s: float, holds: bool) -> tuple[str, ...]:
        gone = wl("gone", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True,
                  shed_at=NOW - timedelta(seconds=age_s), holds_quota=holds)
        s = snap(factory(draw_kw=160.0, event=True), gone, wl("t2", Phase.ADMITTED, tier=2, kw=70.0))
        return tuple(a.name for a in make_plan(s, ev, CFG).sheds)

    assert with_gone(90.0, holds=True) == ()  # still stopping: 160 - 65.6 <= 100
    assert with_gone(90.0, holds=False) == ("t2",)  # stopped, yet the meter says 160 kW
    assert with_gone(400.0, holds=True) == ("t2",)  # never released: not hidden for good

    def placed(gone_pods_bound: bool) -> tuple[str, ...]:
        """Kueue still holds its quota, but the snapshot's placements (built) say whether its
        pods are still bound: once they are gone the meter has it, past settle_seconds."""
        gone = wl("gone", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True,
                  shed_at=NOW - timedelta(seconds=90.0), holds_quota=True)
        t2 = wl("t2", Phase.ADMITTED, tier=2, kw=70.0)
        where = {t2.key: ("n1",), **({gone.key: ("n0",)} if gone_pods_bound else {})}
        s = replace(snap(factory(draw_kw=160.0, event=True), gone, t2), placements=where)
        return tuple(a.name for a in make_plan(s, ev, CFG).sheds)

    assert placed(gone_pods_bound=True) == ()
    assert placed(gone_pods_bound=False) == ("t2",)


def test_a_shed_whose_pods_are_not_even_stopping_stops_settling(ev: Evaluator) -> None:
    """With the pods read (``live_pods``), a shed workload counts as saved past
    settle_seconds only while its pods are being deleted: pods still running and not
    stopping draw what the meter shows (Kueue slow to evict under load), so the rest of the
    shortfall is shed — and TAS-assigned hosts in ``placements`` no longer keep it settling."""
    def sheds(age_s: float, pods: LivePods | None) -> tuple[str, ...]:
        gone = wl("gone", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True,
                  shed_at=NOW - timedelta(seconds=age_s), holds_quota=True)
        t2 = wl("t2", Phase.ADMITTED, tier=2, kw=70.0)
        live = {t2.key: LivePods(2), **({gone.key: pods} if pods is not None else {})}
        s = replace(snap(factory(draw_kw=160.0, event=True), gone, t2),
                    placements={gone.key: ("n0",), t2.key: ("n1",)}, live_pods=live)
        return tuple(a.name for a in make_plan(s, ev, CFG).sheds)

    assert sheds(90.0, LivePods(2, stopping=2)) == ()  # terminating: still settling
    assert sheds(90.0, LivePods(2, stopping=0)) == ("t2",)  # Kueue has not evicted it yet
    assert sheds(90.0, None) == ("t2",)  # its pods are gone: the meter has it
    assert sheds(10.0, LivePods(2, stopping=0)) == ()  # within settle_seconds: settling


def test_a_shed_the_meter_already_shows_stops_settling_within_settle_seconds(
        ev: Evaluator) -> None:
    """Within settle_seconds a shed counts as saved — unless Kueue released its quota (its
    pods stopped) at least meter_lag_seconds before the site reading and its pods are gone:
    the reading has the saving, and counting it again held make demo's draw above the
    event's target until settle_seconds ran out (its second shed step 60 s after the first).
    The reading is 5 s old (``factory``), so it was taken at NOW - 5 s."""
    def sheds(released_s_ago: float | None, pods: LivePods | None = None,
              shed_s_ago: float = 20.0) -> tuple[str, ...]:
        released = None if released_s_ago is None else NOW - timedelta(seconds=released_s_ago)
        gone = wl("gone", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True,
                  shed_at=NOW - timedelta(seconds=shed_s_ago), holds_quota=released is None,
                  released_at=released)
        t2 = wl("t2", Phase.ADMITTED, tier=2, kw=70.0)
        live = {t2.key: LivePods(2), **({gone.key: pods} if pods is not None else {})}
        s = replace(snap(factory(draw_kw=160.0, event=True), gone, t2),
                    placements={t2.key: ("n1",)}, live_pods=live)
        return tuple(a.name for a in make_plan(s, ev, CFG).sheds)

    assert sheds(None) == ()  # Kueue still holds its quota: settling (160 - 65.6 <= 100)
    assert sheds(15.0) == ("t2",)  # released 15 s ago, the reading 5 s old: metered
    assert sheds(8.0) == ()  # released 3 s before the reading: within the meter's lag
    assert sheds(15.0, pods=LivePods(2, stopping=2)) == ()  # pods still stopping
    # a release from before this shed (an earlier eviction) says nothing about this one
    assert sheds(40.0, shed_s_ago=20.0) == ()
    # condition times are whole seconds: a release stamped up to 1 s before the shed counts
    assert sheds(20.5, shed_s_ago=20.0) == ("t2",)


def test_workloads_with_no_running_pod_are_not_shed_or_capped(ev: Evaluator) -> None:
    """A workload Kueue still counts as admitted whose pods have all finished (or not
    started) draws nothing: pausing it would save nothing but be counted as saved."""
    def plan(live: dict[str, LivePods] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        done = wl("done", Phase.ADMITTED, tier=3, kw=80.0)
        t2 = wl("t2", Phase.ADMITTED, tier=2, kw=70.0)
        s = replace(snap(factory(draw_kw=160.0, event=True), done, t2),
                    placements={done.key: ("n0",), t2.key: ("n1",)}, live_pods=live)
        p = make_plan(s, ev, CFG)
        return tuple(a.name for a in p.sheds), tuple(c.name for c in p.caps)

    unknown = plan(None)
    assert "done" in unknown[0] + unknown[1]  # pods not read: as before
    only_t2 = plan({"team/t2": LivePods(4)})
    assert "done" not in only_t2[0] + only_t2[1]
    assert "t2" in only_t2[0] + only_t2[1]


def test_curtailment_plans_for_a_limit_starting_within_the_lead(ev: Evaluator) -> None:
    """A grid event's interval that starts within ``shed_lead_seconds`` (a ramp's next step,
    a notified event) is planned for now: a pause shows in the meter only once Kueue has
    stopped its pods. Further ahead, or with a lead of 0, only the limit in force counts."""
    def plan(starts_in_s: float, lead: float = 30.0) -> tuple[tuple[str, ...], str]:
        soon = GridEvent("dr-2", NOW + timedelta(seconds=starts_in_s), NOW + timedelta(hours=1),
                         target_kw=100.0)
        f = replace(factory(draw_kw=160.0), grid_events=(soon,))
        s = snap(f, wl("t3", Phase.ADMITTED, tier=3, kw=80.0))
        p = make_plan(s, ev, replace(CFG, shed_lead_seconds=lead))
        return tuple(a.name for a in p.sheds) + tuple(c.name for c in p.caps), " ".join(p.notes)

    acted, why = plan(20.0)
    assert acted and "starting within 30 s" in why  # 160 kW against the 100 kW to come
    assert plan(60.0) == ((), plan(60.0)[1])  # beyond the lead: the 300 kW budget holds
    assert plan(20.0, lead=0.0)[0] == ()
    assert replace(factory(), grid_events=(GridEvent(
        "pct", NOW + timedelta(seconds=5), NOW + timedelta(hours=1),
        reduction_pct=20.0),)).limit_ahead_kw(30.0) == 300.0  # no baseline yet: no target


def test_a_ramp_is_curtailed_for_its_final_step_from_its_first_by_default(
        ev: Evaluator) -> None:
    """The shipped lead (15 s) plans a ramped event's final step from its first second: a cap
    shows in the meter 7–10 s after m2g sets it, so planning each step when it starts left a
    16-rack twin event's draw 7–10 s behind every step and 15.8 s above the final target
    after the ramp (2026-12-07, run F)."""
    assert PlannerConfig().shed_lead_seconds == 15.0
    in_force = GridEvent("ramp/0", NOW - timedelta(seconds=1), NOW + timedelta(seconds=11),
                         target_kw=150.0)
    final = GridEvent("ramp/1", NOW + timedelta(seconds=11), NOW + timedelta(hours=1),
                      target_kw=100.0)
    f = replace(factory(draw_kw=160.0), grid_events=(in_force, final))
    assert f.limit_ahead_kw(PlannerConfig().shed_lead_seconds) == 100.0
    s = snap(f, wl("t3", Phase.ADMITTED, tier=3, kw=80.0))
    p = make_plan(s, ev, CFG)
    freed = sum(a.kw for a in p.sheds) + sum(c.kw for c in p.caps)
    assert "100 kW limit (starting within 15 s)" in " ".join(p.notes)
    assert freed >= 50.0  # for the 100 kW to come, not the 10 kW over 150 now


def test_restore_waits_for_kueue_to_finish_evicting(ev: Evaluator) -> None:
    """Reactivating a workload Kueue is still evicting can leave its Job suspended for good:
    a shed workload whose quota is still held comes back only after settle_max_seconds."""
    def restored(age_s: float, holds: bool) -> bool:
        w = wl("a", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True,
               shed_at=NOW - timedelta(seconds=age_s), holds_quota=holds)
        return bool(make_plan(snap(factory(draw_kw=100.0), w), ev, CFG).sheds)

    assert restored(90.0, holds=False)
    assert not restored(90.0, holds=True)  # pods still stopping
    assert restored(400.0, holds=True)  # Kueue never released it: not held back for good
    assert not restored(30.0, holds=False)  # min_shed_seconds


def test_restores_are_paced_from_the_last_restore(ev: Evaluator) -> None:
    """A restore removes its workload's shed-at, so the ramp must count from the restore
    itself (``m2g.io/restored-at``): the next one waits, whoever makes it. Before, the ramp
    counted from the oldest shed still waiting and every reconcile restored a full step (the
    kill test saw two 20.8 kW restores in one second at a 2.1 kW/s ramp)."""
    slow = replace(CFG, ramp_kw_per_second=2.0, max_step_kw=25.0)
    long_ago = NOW - timedelta(minutes=30)

    def restores(restored_ago: float) -> list[str]:
        back = wl("a", Phase.ADMITTED, tier=3, kw=20.0,
                  restored_at=NOW - timedelta(seconds=restored_ago))
        waiting = wl("b", Phase.INACTIVE, tier=2, kw=20.0, shed_by_m2g=True, shed_at=long_ago)
        plan = make_plan(snap(factory(draw_kw=100.0), back, waiting), ev, slow)
        return [a.name for a in plan.sheds if a.active]

    assert restores(1.0) == []  # 2 kW of ramp: b waits
    assert restores(15.0) == ["b"]  # 25 kW: b comes back


def test_never_shed_on_stale_power(ev: Evaluator) -> None:
    s = snap(factory(draw_kw=500.0, event=True, stale=True), wl("t3", Phase.ADMITTED, tier=3))
    plan = make_plan(s, ev, CFG)
    assert plan.sheds == () and "stale" in plan.notes[0]


def test_restore_after_the_event_oldest_first(ev: Evaluator) -> None:
    long_ago = NOW - timedelta(minutes=30)
    s = snap(factory(draw_kw=150.0),  # budget 300, no event: 150 kW room, 15 kW margin
             wl("a", Phase.INACTIVE, tier=3, kw=80.0, shed_by_m2g=True, shed_at=long_ago),
             wl("b", Phase.INACTIVE, tier=2, kw=60.0, shed_by_m2g=True,
                shed_at=long_ago + timedelta(seconds=1)),
             wl("c", Phase.INACTIVE, tier=2, kw=10.0))  # not shed by m2g: left alone
    restored = make_plan(s, ev, CFG).sheds
    assert [(a.name, a.active) for a in restored] == [("a", True)]  # 80 + 60 > 150 - 15
    during = snap(factory(draw_kw=50.0, event=True), *s.workloads)
    assert make_plan(during, ev, CFG).sheds == ()
    fresh = snap(factory(draw_kw=150.0), wl("a", Phase.INACTIVE, tier=3, kw=80.0,
                                             shed_by_m2g=True, shed_at=NOW - timedelta(seconds=5)))
    assert make_plan(fresh, ev, CFG).sheds == ()  # Kueue may still be evicting it


def test_restore_first_fit_a_smaller_younger_one_takes_the_room(ev: Evaluator) -> None:
    """The oldest paused workload that does not fit leaves the room to a smaller one paused
    after it (first fit, oldest first); before, the restores stopped at it and the room
    stayed unused (a 16-rack twin event: 30-80 kW under the target for 150 s)."""
    long_ago = NOW - timedelta(minutes=30)
    s = snap(factory(draw_kw=150.0),  # budget 300, no event: 150 kW room, 15 kW margin
             wl("big", Phase.INACTIVE, tier=3, kw=140.0, shed_by_m2g=True, shed_at=long_ago),
             wl("mid", Phase.INACTIVE, tier=2, kw=100.0, shed_by_m2g=True,
                shed_at=long_ago + timedelta(seconds=1)),
             wl("small", Phase.INACTIVE, tier=2, kw=30.0, shed_by_m2g=True,
                shed_at=long_ago + timedelta(seconds=2)))
    restored = make_plan(s, ev, CFG).sheds
    assert [(a.name, a.active) for a in restored] == [("mid", True), ("small", True)]


def test_explain_names_the_changes_that_would_admit(ev: Evaluator) -> None:
    from m2g.planner.explain import explain

    w = wl("flex", Phase.RESERVED, tier=2, check_state=CheckState.PENDING)
    ex = explain(snap(factory(event=True), w), w, ev)
    assert ex.now.decision.value == "Defer"
    changes = {c.change: c.result.decision.value for c in ex.alternatives}
    assert changes["flex tier 0 instead of 2"] == "Admit"
    assert any(c.startswith("after grid event dr-1 ends at") for c in changes)
    assert not any(c.startswith("request") for c in changes)  # size is not why it waits


def test_explain_goes_through_the_headroom_gate_as_the_controller_would(ev: Evaluator) -> None:
    """Firm work during an event, over the target, with nothing flexible running to pause:
    the policies admit it, the controller's gate holds it (hold_firm_beyond_reach), and
    ``explain`` with the planner's settings says so; without them, the policies' word."""
    from m2g.planner.explain import explain

    w = wl("firm", Phase.RESERVED, tier=0, kw=40.0, check_state=CheckState.PENDING)
    over = snap(factory(draw_kw=200.0, event=True), w)
    assert explain(over, w, ev).now.decision.value == "Admit"
    held = explain(over, w, ev, CFG).now
    assert held.decision.value == "Defer" and held.requeue_after_seconds is not None
    assert held.reasons[-1].ref == "site-headroom/shared-room"
    assert "40 kW does not fit" in held.reasons[-1].message
    assert held.pod_set_updates == ()
    # after the event the gate lets it in: the time variant is gated too, and differs
    changes = {c.change: c.result.decision.value
               for c in explain(over, w, ev, CFG).alternatives}
    assert any(c.startswith("after grid event dr-1") and d == "Admit"
               for c, d in changes.items())
    # room under the target: admitted, as the controller would
    under = snap(factory(draw_kw=40.0, event=True), w)
    assert explain(under, w, ev, CFG).now.decision.value == "Admit"
    # an admitted workload is never gated; a Retry m2g already gave is set aside (asked anew)
    running = replace(w, phase=Phase.ADMITTED, check_state=CheckState.READY)
    assert explain(over, running, ev, CFG).now.decision.value == "Admit"
    retried = replace(w, check_state=CheckState.RETRY)
    assert explain(snap(over.factory, retried), retried, ev, CFG).now.decision.value == "Defer"


def test_headroom_alone_answers_a_workload_not_in_the_snapshot() -> None:
    """``m2g submit --dry-run``: the workload is not submitted yet."""
    from m2g.planner.headroom import alone

    w = wl("new", Phase.PENDING, tier=0, kw=40.0)
    empty_over = snap(factory(draw_kw=200.0, event=True))
    hold = alone(empty_over, w, CFG)
    assert hold is not None and hold.state is CheckState.RETRY and hold.name == "new"
    assert alone(snap(factory(draw_kw=40.0, event=True)), w, CFG) is None
    # stale power during an event: the gate assumes the racks at their caps (site power
    # unknown), as the controller does
    unknown = alone(snap(factory(draw_kw=40.0, event=True, stale=True)), w, CFG)
    assert unknown is not None and unknown.rule == "site-power-unknown"
    assert alone(empty_over, w, replace(CFG, share_headroom=False)) is None
