"""Graded curtailment (m2g.planner.curtail): caps before pauses, ranked by throughput lost per
kW saved, within each job's flex allowance over its life, the ramp, and the policies; restore
in the reverse order; the nodes' GPUPowerLimits with their lease."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import Checkpoint, WorkloadKind, WorkloadView
from m2g.model.powerlimit import LimitSpec, NodeLimitState
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import (
    cap_saving_kw,
    flex_used,
    node_limit_updates,
    plan_caps,
    without_lapsed,
)
from m2g.planner.curves import curve_of, kind_curve
from m2g.planner.headroom import share_beyond
from m2g.planner.inputs import InputBuilder
from m2g.planner.plan import make_plan
from m2g.planner.shedding import workload_kw
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g", ramp_kw_per_second=100.0, max_step_kw=1000.0)
POLICIES = {"shed.yaml": policy("shed", "Preemption", """
        - {name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}
    """)}


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def factory(draw_kw: float, limit_kw: float = 300.0, event_minutes: int = 60) -> FactorySnapshot:
    nodes = tuple(Node(f"n{i}", "rack-0") for i in range(18))
    racks = (Rack("rack-0", "b0", "pd-0", power_kw=Reading(draw_kw, 5.0), cap_kw=1000.0),)
    events = (GridEvent("dr", NOW - timedelta(minutes=1),
                        NOW + timedelta(minutes=event_minutes), target_kw=limit_kw),)
    return FactorySnapshot(now=NOW, site_budget_kw=1000.0, power_domains=(PowerDomain("pd-0"),),
                           racks=racks, nodes=nodes, grid_events=events)


def job(name: str, tier: int, gpus: int = 16, kind: WorkloadKind = WorkloadKind.TRAINING,
        runtime: int = 4 * 3600, **kw: object) -> WorkloadState:
    view = WorkloadView(name=name, namespace="t", flex_tier=tier, gpus=gpus, kind=kind,
                        estimated_kw=gpus * 1.34, expected_runtime_seconds=runtime,
                        checkpoint=Checkpoint(last_age_seconds=600))
    return WorkloadState("t", name, view, Phase.ADMITTED, admitted_at=NOW - timedelta(hours=1),
                         **kw)  # type: ignore[arg-type]


def snap(f: FactorySnapshot, *ws: WorkloadState, shared: bool = False,
         limits: dict[str, NodeLimitState] | None = None) -> ClusterSnapshot:
    placements = {w.key: tuple(f"n{i}" for i in range(j * 4, j * 4 + 4))
                  for j, w in enumerate(ws)}
    if shared and len(ws) > 1:
        placements[ws[1].key] = placements[ws[0].key]
    return ClusterSnapshot(f, ws, placements=placements, node_limits=limits or {})


def test_curves_are_the_measured_ones_and_saving_follows_power() -> None:
    c = kind_curve(WorkloadKind.TRAINING)
    assert c.throughput(0.75) == pytest.approx(0.867, abs=1e-3)  # pt_* rows of dvfs_sweep.csv
    assert c.power(0.75) == pytest.approx(0.728 / 0.955, abs=2e-3)
    w = job("a", 2)
    assert cap_saving_kw(w, CFG, 1.0, 0.75) == pytest.approx(16 * 1.34 * (1 - c.power(0.75)))
    own = replace(w, cap_curve=((0.5, 0.9), (1.0, 1.0)))
    assert curve_of(own).throughput(0.75) == pytest.approx(0.95)  # the template's own curve


def test_a_small_shortfall_is_met_by_caps_without_pausing(ev: Evaluator) -> None:
    s = snap(factory(draw_kw=310.0), job("a", 2), job("b", 2, kind=WorkloadKind.INFERENCE))
    plan = make_plan(s, ev, CFG)
    assert plan.sheds == ()
    assert sum(c.kw for c in plan.caps) >= 10.0
    assert all(c.fraction < 1.0 for c in plan.caps)
    # the nodes of each capped job get a limit, with the lease
    limited = {u.node: u for u in plan.node_limits}
    for c in plan.caps:
        for n in s.placements[f"t/{c.name}"]:
            assert limited[n].fraction == c.fraction
            assert limited[n].expires_at == NOW + timedelta(seconds=CFG.cap_lease_seconds)


def test_the_cheapest_kilowatts_go_first() -> None:
    """Per kW, inference loses less throughput than pre-training at the first steps: with a
    shortfall one step covers, inference is capped and training is not."""
    train, infer = job("train", 2), job("infer", 2, kind=WorkloadKind.INFERENCE)
    caps = plan_caps(InputBuilder(snap(factory(305.0), train, infer)), CFG, 2.0, 1000.0, {})
    assert [c.name for c in caps] == ["infer"]
    t, i = kind_curve(WorkloadKind.TRAINING), kind_curve(WorkloadKind.INFERENCE)
    cost = [(1 - c.throughput(0.875)) / (1 - c.power(0.875)) for c in (t, i)]
    assert cost[1] < cost[0]


def test_flex_zero_and_shared_nodes_are_never_capped(ev: Evaluator) -> None:
    firm = job("firm", 0)
    assert plan_caps(InputBuilder(snap(factory(320.0), firm)), CFG, 20.0, 1000.0, {}) == []
    a, b = job("a", 2), job("b", 2)
    assert plan_caps(InputBuilder(snap(factory(320.0), a, b, shared=True)), CFG, 20.0, 1000.0,
                     {}) == []


def test_the_flex_allowance_is_an_average_over_the_life() -> None:
    """Flex 1 (10 %) on a 4 h job: 1,440 s of throughput to lose. Fresh, over a 60 min event
    it may lose 0.4 of its rate: deep caps allowed. Having spent 1,400 s, only a cap whose
    loss fits 40 s over the hour (rate 0.011): none on the ladder."""
    fresh = job("a", 1)
    deep = plan_caps(InputBuilder(snap(factory(400.0), fresh)), CFG, 100.0, 1000.0, {})
    assert deep and deep[0].fraction == 0.5
    spent = replace(fresh, flex_used_seconds=1400.0)
    assert plan_caps(InputBuilder(snap(factory(400.0), spent)), CFG, 100.0, 1000.0, {}) == []
    # the current cap is counted as it runs: 0.75 (loss 0.133) for 10 min = 80 s
    capped = replace(fresh, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=10))
    assert flex_used(capped, NOW) == pytest.approx(0.133 * 600, rel=0.01)


def test_caps_first_then_pauses_for_the_rest(ev: Evaluator) -> None:
    """A shortfall larger than every allowed cap can cover: the caps and the pauses for the
    remainder in the same plan; the paused job is not also capped."""
    s = snap(factory(draw_kw=400.0), *(job(f"j{i}", 2) for i in range(8)))
    plan = make_plan(s, ev, CFG)
    capped = {c.name for c in plan.caps}
    paused = {a.name for a in plan.sheds}
    assert capped and paused and not capped & paused
    assert sum(c.kw for c in plan.caps) + sum(a.kw for a in plan.sheds) >= 100.0


def test_pause_only_levers(ev: Evaluator) -> None:
    s = snap(factory(draw_kw=310.0), job("a", 2))
    plan = make_plan(s, ev, replace(CFG, power_caps=False))
    assert plan.caps == () and [a.name for a in plan.sheds] == ["a"]


def test_the_ramp_bounds_caps_too() -> None:
    caps = plan_caps(InputBuilder(snap(factory(400.0), job("a", 2), job("b", 2))), CFG,
                     100.0, 3.0, {})
    assert sum(c.kw for c in caps) <= 3.0


def test_policy_min_cap_is_respected() -> None:
    a = job("a", 3)
    caps = plan_caps(InputBuilder(snap(factory(400.0), a)), CFG, 100.0, 1000.0, {a.key: 0.75})
    assert caps and min(c.fraction for c in caps) >= 0.75


def test_restore_in_reverse_order_paused_work_first(ev: Evaluator) -> None:
    old = job("old", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=30))
    new = job("new", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=20))
    paused = replace(job("p", 2), phase=Phase.INACTIVE, shed_by_m2g=True,
                     shed_at=NOW - timedelta(minutes=25))
    over = replace(factory(200.0, event_minutes=-1), grid_events=())
    # room for the paused job only: it comes back, the caps stay
    p_kw = workload_kw(paused, CFG)
    just = replace(over, racks=(replace(over.racks[0], power_kw=Reading(
        1000.0 - CFG.restore_margin * 1000.0 - p_kw - 0.5, 5.0)),))
    plan = make_plan(snap(just, old, new, paused), ev, CFG)
    assert [a.name for a in plan.sheds] == ["p"] and plan.caps == ()
    # room for all: the paused job and the caps come back in the same reconcile
    plan = make_plan(snap(over, old, new, paused), ev, CFG)
    assert [a.name for a in plan.sheds] == ["p"]
    assert sorted(c.name for c in plan.caps) == ["new", "old"]
    # a paused job Kueue is still evicting cannot come back yet: its kW stay reserved
    evicting = replace(paused, shed_at=NOW - timedelta(seconds=CFG.min_shed_seconds / 2))
    plan = make_plan(snap(just, old, new, evicting), ev, CFG)
    assert plan.sheds == () and plan.caps == ()
    plan = make_plan(snap(over, old, new, evicting), ev, CFG)
    assert plan.sheds == () and sorted(c.name for c in plan.caps) == ["new", "old"]
    # nothing paused any more: caps lifted, the most recent first, as room allows
    room = CFG.restore_margin * 1000.0 + cap_saving_kw(new, CFG, 1.0, 0.75) + 0.5
    tight = replace(over, racks=(replace(over.racks[0], power_kw=Reading(
        1000.0 - room, 5.0)),))
    plan = make_plan(snap(tight, old, new), ev, CFG)
    assert [(c.name, c.fraction) for c in plan.caps] == [("new", 1.0)]
    assert plan.caps[0].flex_used_seconds == pytest.approx(flex_used(new, NOW), abs=0.1)


def test_node_limits_are_renewed_at_half_lease_and_released() -> None:
    a = job("a", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=5))
    f = factory(250.0)
    fresh = LimitSpec("n0", 0.75, None, NOW + timedelta(seconds=100), ("t/a",))
    stale = replace(fresh, expires_at=NOW + timedelta(seconds=50))
    limits = {f"n{i}": NodeLimitState(f"n{i}", fresh) for i in range(4)}
    assert node_limit_updates(snap(f, a, limits=limits), CFG, []) == []  # in force
    limits["n2"] = NodeLimitState("n2", stale)
    [renew] = node_limit_updates(snap(f, a, limits=limits), CFG, [])
    assert renew.node == "n2" and renew.expires_at == NOW + timedelta(seconds=120)
    lifted = replace(a, power_cap=1.0, power_cap_at=None)
    released = node_limit_updates(snap(f, lifted, limits=limits), CFG, [])
    assert sorted(u.node for u in released) == ["n0", "n1", "n2", "n3"]
    assert all(u.fraction is None for u in released)


def test_a_preemption_policy_bounds_caps_with_min_cap(tmp_path: Path) -> None:
    """``minCap`` (an extension of the Preemption stage): the most protective fired rule
    wins; the planner never caps below it."""
    files = {"shed.yaml": policy("shed", "Preemption", """
        - {name: flexible, when: "workload.flexTier >= 1", score: "1.0"}
        - {name: training-gently, when: "workload.kind == 'training'", minCap: "0.75"}
        - {name: tier3-deep, when: "workload.flexTier == 3", minCap: 0.5}
    """)}
    ev = evaluator(tmp_path, "cel-expr-python", files)
    s = snap(factory(draw_kw=314.0), job("a", 3), job("b", 3, kind=WorkloadKind.INFERENCE))
    results = ev.preemption_many([InputBuilder(s).for_workload(w) for w in s.workloads])
    assert [r.min_cap for r in results] == [0.75, 0.5]
    assert results[0].to_json()["minCap"] == 0.75
    plan = make_plan(s, ev, CFG)
    by = {c.name: c.fraction for c in plan.caps}
    assert by["a"] >= 0.75 and by["b"] >= 0.5 and by["b"] < 0.75


def test_paused_work_comes_back_during_an_event_when_there_is_room(ev: Evaluator) -> None:
    """Jobs that finish during an event free kW; they go back to the paused work (in shed
    order), counting what restores not admitted again yet will draw."""
    paused = replace(job("p", 2), phase=Phase.INACTIVE, shed_by_m2g=True,
                     shed_at=NOW - timedelta(minutes=25))
    p_kw = workload_kw(paused, CFG)
    room_for_one = factory(300.0 * (1 - CFG.restore_margin) - p_kw - 0.5)  # event active
    plan = make_plan(snap(room_for_one, paused), ev, CFG)
    assert [(a.name, a.active) for a in plan.sheds] == [("p", True)]
    assert any("during grid event dr" in n for n in plan.notes), plan.notes
    off = replace(CFG, restore_during_events=False)
    assert make_plan(snap(room_for_one, paused), ev, off).sheds == ()
    # one restored a minute ago and not admitted again yet takes that room
    back = replace(job("r", 2), phase=Phase.RESERVED, admitted_at=None,
                   restored_at=NOW - timedelta(minutes=1))
    assert make_plan(snap(room_for_one, paused, back), ev, CFG).sheds == ()
    # ... until Kueue admits it and its pods are bound (then the meter shows it)
    admitted = replace(back, phase=Phase.ADMITTED, admitted_at=NOW - timedelta(seconds=5))
    plan = make_plan(snap(room_for_one, paused, admitted), ev, CFG)
    assert [a.name for a in plan.sheds] == ["p"]


def _gather_every_node(placements: dict[str, tuple[str, ...]], fraction: dict[str, float]
                       ) -> dict[str, list[str]]:
    """node_limit_updates' gathering before _capped_nodes (2026-12-04): every node's
    workloads."""
    on_node: dict[str, list[str]] = {}
    for key, nodes in placements.items():
        if key in fraction:
            for n in nodes:
                on_node.setdefault(n, []).append(key)
    return on_node


def _wanted(on_node: dict[str, list[str]], fraction: dict[str, float]
            ) -> dict[str, tuple[float, tuple[str, ...]]]:
    """The limits node_limit_updates wants from a gathering: the mildest cap on a node, none
    if one of its workloads is uncapped."""
    want = {}
    for node, on in on_node.items():
        f = max(fraction[k] for k in on)
        if f < 1.0:
            want[node] = (f, tuple(sorted(on)))
    return want


def test_capped_nodes_give_the_limits_of_gathering_every_node() -> None:
    """Only the nodes of capped workloads are gathered: the limits are those of gathering
    all — a node shared by a capped and an uncapped workload gets none, one shared by two
    capped ones the milder cap, a workload outside ``fraction`` (not admitted) is ignored."""
    import random

    from m2g.planner.curtail import _capped_nodes

    rng = random.Random(14)
    for _ in range(200):
        nodes = [f"n{i}" for i in range(rng.randint(1, 12))]
        placements = {f"t/w{j}": tuple(rng.sample(nodes, rng.randint(0, min(3, len(nodes)))))
                      for j in range(rng.randint(0, 10))}
        fraction = {k: rng.choice((1.0, 1.0, 0.875, 0.75, 0.5)) for k in placements
                    if rng.random() < 0.9}
        assert _wanted(_capped_nodes(placements, fraction), fraction) == _wanted(
            _gather_every_node(placements, fraction), fraction), (placements, fraction)
    shared = {"t/a": ("n0", "n1"), "t/b": ("n1",), "t/c": ("n2",), "t/d": ("n2",)}
    got = _capped_nodes(shared, {"t/a": 0.75, "t/b": 1.0, "t/c": 0.5, "t/d": 0.875})
    assert got == {"n0": ["t/a"], "n1": ["t/a", "t/b"], "n2": ["t/c", "t/d"]}
    assert _capped_nodes(shared, {"t/a": 1.0, "t/b": 1.0}) == {}


def test_firm_work_admitted_beyond_the_room_is_curtailed_for_in_the_same_plan(
        ev: Evaluator) -> None:
    """During an event, firm work is admitted on what m2g can still free (the firm gate's
    reach): the running flexible work is curtailed for it in the same plan, not once the
    meter shows the new work drawing over the limit (a 16-rack twin event, 2026-12-06: ten
    firm jobs admitted ~170 kW beyond the room, capped only 14 s later when the meter showed
    the site over its target, which it then stayed for 10 s). Before, the plan admitted it
    and curtailed nothing: the meter still showed room."""
    flex = job("x", 2)  # running, alone on its nodes: cappable, and pausing it frees kW
    firm = replace(job("f", 0, gpus=8), phase=Phase.RESERVED, check="m2g",
                   check_state=None, admitted_at=None)
    kw = workload_kw(firm, CFG)
    s = snap(factory(draw_kw=300.0 - 3.0), flex, firm)  # 3 kW under the 300 kW target
    plan = make_plan(s, ev, CFG)
    assert [(u.name, u.state.value) for u in plan.checks] == [("f", "Ready")]
    beyond = kw - 3.0
    freed = sum(c.kw for c in plan.caps) + sum(a.kw for a in plan.sheds if not a.active)
    assert freed >= beyond - 1e-6 and plan.caps
    assert f"new firm work admitted {beyond:.0f} kW beyond the room" in plan.notes[0]
    # the room under the limit holds it: nothing to free
    roomy = snap(factory(draw_kw=300.0 - kw - 1.0), flex, firm)
    assert share_beyond([], roomy, CFG) == ([], 0.0)
    calm = make_plan(roomy, ev, CFG)
    assert [u.state.value for u in calm.checks] == ["Ready"] and not calm.caps
    # no event: firm work is never held, nor curtailed for
    quiet = snap(replace(factory(draw_kw=297.0), grid_events=()), flex, firm)
    assert make_plan(quiet, ev, CFG).caps == ()


def test_caps_are_not_lifted_into_room_that_bound_work_not_yet_metered_takes(
        ev: Evaluator) -> None:
    """Work whose pods run but are not in the site reading yet (started less than
    ``meter_lag_seconds`` before it, or bound and not running yet) still counts as in flight:
    the room the cap lifts read is not theirs. In a 16-rack twin event (2026-12-06, 24th
    session) m2g capped 12 jobs for ~180 kW of firm and restored work and lifted 11 of those
    caps 0.7–3.6 s later, as soon as the pods were bound ("82 kW headroom remains"): the
    meter showed them 5–10 s after that. Before, bound pods counted as drawing at once, and
    the cap below was lifted in every case."""
    flex = replace(job("x", 2), power_cap=0.5, power_cap_at=NOW - timedelta(seconds=1))
    firm = replace(job("f", 0, gpus=8), admitted_at=NOW - timedelta(seconds=2))
    lift = -cap_saving_kw(flex, CFG, 0.5, 1.0)
    assert workload_kw(firm, CFG) > 2.0
    # the reading (5 s old) shows room for the lift and 2 kW more beyond the restore margin
    draw = 300.0 * (1 - CFG.restore_margin) - lift - 2.0

    def lifted(firm_pods: LivePods) -> bool:
        live = {flex.key: LivePods(4, started_at=NOW - timedelta(hours=1)),
                firm.key: firm_pods}
        plan = make_plan(replace(snap(factory(draw), flex, firm), live_pods=live), ev, CFG)
        return any(c.name == "x" and c.fraction == 1.0 for c in plan.caps)

    assert not lifted(LivePods(2, started_at=NOW - timedelta(seconds=1)))  # not metered yet
    assert not lifted(LivePods(2, waiting=2))  # bound, not running yet
    assert not lifted(LivePods(2, waiting=1, started_at=NOW - timedelta(seconds=30)))
    # one of 18 bound pods not running yet: 1/18 of its kW is not in the reading, not all
    assert lifted(LivePods(18, waiting=1, started_at=NOW - timedelta(seconds=30)))
    # started 20 s ago: in the reading taken 5 s ago (meter lag 5 s) — the room is real
    assert lifted(LivePods(2, started_at=NOW - timedelta(seconds=20)))
    assert lifted(LivePods(2))  # start not known: drawing once bound, as before


def lapsed(node: str, key: str, fraction: float = 0.75,
           lease_end: datetime = NOW - timedelta(seconds=90)) -> NodeLimitState:
    """A GPUPowerLimit whose lease ran out with nobody renewing it: the agent restored full
    power after its grace (60 s) and says so (phase Expired, every GPU at its default)."""
    return NodeLimitState(node, LimitSpec(node, fraction, None, lease_end, (key,)), 1.0,
                          "Expired", lease_end + timedelta(seconds=60))


def test_a_cap_whose_lease_lapsed_is_recorded_lifted_not_put_back(ev: Evaluator) -> None:
    """A successor that comes after the caps' lease ran out (m2g away for longer than the
    lease and the agent's grace): the agents have restored full power and the meter shows it.
    Before, it renewed the lease of every cap still recorded — the agents capped the nodes
    again though the event was over — and lifted them one ramp step at a time (here none:
    the room under the margin is 1 kW). Now each lapsed cap's record is lifted at once with
    0 kW (the meter has its power already), its flex counted up to the lapse, and every
    GPUPowerLimit released; nothing is capped again."""
    a = job("a", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=10))
    b = job("b", 3, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=9))
    over = replace(factory(0.0), grid_events=())  # the event is over
    tight = replace(over, racks=(replace(over.racks[0], power_kw=Reading(
        1000.0 * (1 - CFG.restore_margin) - 1.0, 5.0)),))
    limits = {f"n{i}": lapsed(f"n{i}", "t/a" if i < 4 else "t/b") for i in range(8)}
    plan = make_plan(snap(tight, a, b, limits=limits), ev, CFG)
    assert [(u.node, u.fraction) for u in plan.node_limits] == [
        (f"n{i}", None) for i in range(8)], "a lapsed cap put back"
    assert [(c.name, c.fraction, c.kw, c.renew) for c in plan.caps] == [
        ("a", 1.0, 0.0, False), ("b", 1.0, 0.0, False)]
    assert all("cap lapsed" in c.reason for c in plan.caps)
    lapse = NOW - timedelta(seconds=30)
    assert plan.caps[0].flex_used_seconds == pytest.approx(flex_used(a, lapse), abs=0.1)
    assert plan.sheds == ()
    # read as lifted at the lapse, the cap's own stamp (the ramp counts from it), not as a
    # pause's restore (``restored_at``: a pause soon after would count as a flap)
    read, _ = without_lapsed(snap(tight, a, b, limits=limits))
    assert [(w.power_cap, w.power_cap_at, w.restored_at) for w in read.workloads] == [
        (1.0, lapse, None), (1.0, lapse, None)]
    # applied (records lifted, objects deleted): nothing more to do
    done = [replace(w, power_cap=1.0, power_cap_at=NOW) for w in (a, b)]
    plan = make_plan(snap(tight, *done), ev, CFG)
    assert plan.caps == () and plan.node_limits == ()


def test_a_cap_is_not_lapsed_while_in_force_or_once_renewed(ev: Evaluator) -> None:
    """Within the agent's grace the cap is still in force (phase Applied): renewed, as
    before. Once renewed, the agent's status may still say Expired for a moment: the spec's
    lease is in the future, so it is not lapsed (no lift, no second write)."""
    a = job("a", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=10))
    f = replace(factory(250.0), grid_events=())
    f = replace(f, racks=(replace(f.racks[0], power_kw=Reading(
        1000.0 * (1 - CFG.restore_margin) - 1.0, 5.0)),))
    grace = {f"n{i}": replace(lapsed(f"n{i}", "t/a"), phase="Applied", applied_fraction=0.75)
             for i in range(4)}
    plan = make_plan(snap(f, a, limits=grace), ev, CFG)
    assert plan.caps == ()
    assert [(u.node, u.fraction) for u in plan.node_limits] == [
        (f"n{i}", 0.75) for i in range(4)]
    renewed = {n: replace(s, spec=replace(s.spec, expires_at=NOW + timedelta(seconds=100)),
                          phase="Expired", applied_fraction=1.0) for n, s in grace.items()
               if s.spec is not None}
    plan = make_plan(snap(f, a, limits=renewed), ev, CFG)
    assert plan.caps == () and plan.node_limits == ()
    # the record set anew after the lapse, the object read before its renewal (the caches
    # are not read at one instant): not lapsed either — no lift of the new cap
    anew = replace(a, power_cap_at=NOW - timedelta(seconds=2))
    stale = {f"n{i}": lapsed(f"n{i}", "t/a") for i in range(4)}
    plan = make_plan(snap(f, anew, limits=stale), ev, CFG)
    assert plan.caps == ()
    assert [(u.node, u.fraction) for u in plan.node_limits] == [
        (f"n{i}", 0.75) for i in range(4)]


def test_during_an_event_a_lapsed_cap_is_set_anew_from_full_power(ev: Evaluator) -> None:
    """The event still on when the successor comes: the meter shows the lapsed job at full
    power. Its caps are planned from full power (the mildest step that covers the shortfall,
    the record rewritten from now: ``renew``), the lease set anew. Before, the planner read
    the 0.75 cap as in force and stepped the job down from it (to 0.625) while renewing 0.75
    on the nodes: deeper than the shortfall needed."""
    a = job("a", 2, power_cap=0.75, power_cap_at=NOW - timedelta(minutes=10))
    full = replace(a, power_cap=1.0, power_cap_at=None)
    need = cap_saving_kw(full, CFG, 1.0, 0.875) - 0.5
    limits = {f"n{i}": lapsed(f"n{i}", "t/a") for i in range(4)}
    plan = make_plan(snap(factory(300.0 + need), a, limits=limits), ev, CFG)
    assert [(c.name, c.fraction, c.renew) for c in plan.caps] == [("a", 0.875, True)]
    assert plan.caps[0].kw == pytest.approx(cap_saving_kw(full, CFG, 1.0, 0.875))
    # what the lapsed cap cost until the lapse is carried into the new record, not after it
    lapse = NOW - timedelta(seconds=30)
    assert plan.caps[0].flex_used_seconds == pytest.approx(flex_used(a, lapse), abs=0.1)
    assert flex_used(a, lapse) < flex_used(a, NOW)
    assert [(u.node, u.fraction, u.expires_at) for u in plan.node_limits] == [
        (f"n{i}", 0.875, NOW + timedelta(seconds=CFG.cap_lease_seconds)) for i in range(4)]
    assert plan.sheds == ()
    # applied, the agents not there yet (status still Expired, the lease renewed): the new
    # cap settles; nothing more
    capped = replace(a, power_cap=0.875, power_cap_at=NOW)
    renewed = {n: replace(s, spec=replace(s.spec, fraction=0.875,
                                          expires_at=NOW + timedelta(seconds=120)))
               for n, s in limits.items() if s.spec is not None}
    plan = make_plan(snap(factory(300.0 + need), capped, limits=renewed), ev, CFG)
    assert plan.caps == () and plan.node_limits == () and plan.sheds == ()
