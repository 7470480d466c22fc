"""Work expected to end before a pause would show frees its kW without one
(m2g.planner.shedding.ending, ``ending_lead_seconds``; docs/curtailment.md)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import Checkpoint, WorkloadKind, WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import cap_saving_kw
from m2g.planner.curves import kind_curve
from m2g.planner.plan import make_plan
from m2g.planner.shedding import ending, saving_kw
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g", ramp_kw_per_second=100.0, max_step_kw=1000.0,
                    ending_lead_seconds=15.0)
OFF = replace(CFG, ending_lead_seconds=0.0)
POLICIES = {"shed.yaml": policy("shed", "Preemption", """
        - {name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}
    """)}
LIMIT = 300.0


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def factory(draw_kw: float) -> FactorySnapshot:
    nodes = tuple(Node(f"n{i}", "rack-0") for i in range(18))
    racks = (Rack("rack-0", "b0", "pd-0", power_kw=Reading(draw_kw, 1.0), cap_kw=1000.0),)
    events = (GridEvent("dr", NOW - timedelta(seconds=8), NOW + timedelta(minutes=3),
                        target_kw=LIMIT),)
    return FactorySnapshot(now=NOW, site_budget_kw=1000.0, power_domains=(PowerDomain("pd-0"),),
                           racks=racks, nodes=nodes, grid_events=events)


def job(name: str, tier: int, left_s: float = 4 * 3600.0, gpus: int = 16,
        **kw: object) -> WorkloadState:
    """Admitted an hour ago, its expected runtime ending ``left_s`` from now."""
    view = WorkloadView(name=name, namespace="t", flex_tier=tier, gpus=gpus,
                        kind=WorkloadKind.TRAINING, estimated_kw=gpus * 1.34,
                        expected_runtime_seconds=round(3600 + left_s),
                        checkpoint=Checkpoint(last_age_seconds=600))
    return WorkloadState("t", name, view, Phase.ADMITTED, admitted_at=NOW - timedelta(hours=1),
                         **kw)  # type: ignore[arg-type]


def snap(draw_kw: float, *ws: WorkloadState,
         pods: dict[str, LivePods] | None = None) -> ClusterSnapshot:
    placements = {w.key: tuple(f"n{i}" for i in range(j * 2, j * 2 + 2))
                  for j, w in enumerate(ws)}
    live = {w.key: LivePods(2, started_at=NOW - timedelta(hours=1)) for w in ws}
    live.update(pods or {})
    return ClusterSnapshot(factory(draw_kw), ws, placements=placements, live_pods=live)


def capped_just_now(name: str) -> WorkloadState:
    """A flex-2 job m2g capped to 0.625 three seconds ago (the meter does not show it yet:
    no node reports the limit in force) — as deep as flex 2 allows: no cap potential left."""
    return job(name, 2, power_cap=0.625, power_cap_at=NOW - timedelta(seconds=3))


def test_no_pause_for_the_kw_of_work_ending_before_a_pause_would_show(ev: Evaluator) -> None:
    """Run D's second wave in small: caps set seconds ago and not in the meter yet (counted
    as settling), no cap left to take, and the limit stepped down by less than a firm job
    that ends in 10 s draws: the pause rounds count that job's kW as freed and pause nothing;
    without the count (``ending_lead_seconds: 0``, the rule before) a capped job is paused."""
    capped = [capped_just_now(f"c{i}") for i in range(4)]
    firm = job("firm", 0, left_s=10.0)
    settling = sum(cap_saving_kw(w, CFG, 1.0, 0.625) for w in capped)
    short = 0.8 * saving_kw(firm, CFG)  # what the meter shows over the limit beyond settling
    s = snap(LIMIT + settling + short, *capped, firm)
    assert ending(dict.fromkeys([firm.key], firm) | {w.key: w for w in capped}, s, CFG) == {
        firm.key: pytest.approx(saving_kw(firm, CFG))}
    plan = make_plan(s, ev, CFG)
    assert plan.sheds == ()
    assert "1 workload(s) expected to end within 15 s free 18 kW (no pause for it)" \
        in plan.notes[0]
    before = make_plan(s, ev, OFF)
    assert [a.name for a in before.sheds if not a.active] and \
        all(a.name.startswith("c") for a in before.sheds)


def test_work_ending_soon_is_never_paused_and_the_pause_covers_only_the_rest(
        ev: Evaluator) -> None:
    """Pauses only (no caps): the flex-3 job scores first but ends in 5 s, so a pause of it
    would save nothing its end does not; the flex-2 job is paused for what is left."""
    soon, long = job("soon", 3, left_s=5.0), job("long", 2)
    s = snap(LIMIT + saving_kw(soon, CFG) + 5.0, soon, long)
    pause_only = replace(CFG, power_caps=False)
    assert [a.name for a in make_plan(s, ev, pause_only).sheds] == ["long"]
    assert [a.name for a in make_plan(s, ev, replace(pause_only, ending_lead_seconds=0.0)
                                      ).sheds] == ["soon", "long"]  # before: both
    # its end covers the whole shortfall: nothing paused
    s2 = snap(LIMIT + saving_kw(soon, CFG) - 1.0, soon, long)
    assert make_plan(s2, ev, pause_only).sheds == ()


def test_what_counts_as_ending() -> None:
    """Within the lead at the throughput of its cap and its replicas left, from its last
    pod's start; not once past its expected end, not with pods waiting or being deleted,
    not without a declared runtime, not when shed."""
    def ends(w: WorkloadState, pods: LivePods | None = None,
             config: PlannerConfig = CFG) -> bool:
        s = snap(400.0, w, pods={w.key: pods} if pods else None)
        return w.key in ending({w.key: w}, s, config)

    assert ends(job("a", 2, left_s=14.0))
    assert not ends(job("a", 2, left_s=16.0))
    assert not ends(job("a", 2, left_s=14.0), config=replace(CFG, ending_lead_seconds=10.0))
    assert not ends(job("a", 2, left_s=14.0), config=OFF)
    assert not ends(job("a", 2, left_s=-5.0))  # ran past its expected end: not known
    # capped to 0.5 (pre-training throughput ~0.63): 8 s of work take ~12.7 s, 12 s ~19 s
    assert kind_curve(WorkloadKind.TRAINING).throughput(0.5) == pytest.approx(0.63, abs=0.01)
    assert ends(job("a", 2, left_s=8.0, power_cap=0.5, power_cap_at=NOW))
    assert not ends(job("a", 2, left_s=12.0, power_cap=0.5, power_cap_at=NOW))
    # shrunk to half its replicas: 8 s of work at full size take 16 s
    assert not ends(job("a", 2, left_s=8.0, parallelism=2, full_parallelism=4))
    assert ends(job("a", 2, left_s=6.0, parallelism=2, full_parallelism=4))
    # its pods restarted half an hour ago: half an hour of work left
    assert not ends(job("a", 2, left_s=10.0),
                    LivePods(2, started_at=NOW - timedelta(minutes=30)))
    assert not ends(job("a", 2, left_s=10.0), LivePods(2, started_at=NOW - timedelta(hours=1),
                                                        waiting=1))
    assert not ends(job("a", 2, left_s=10.0), LivePods(2, stopping=2,
                                                        started_at=NOW - timedelta(hours=1)))
    undeclared = job("a", 2)
    undeclared = undeclared.with_view(undeclared.view.model_copy(
        update={"expected_runtime_seconds": 0}))
    assert not ends(undeclared)
    assert not ends(job("a", 2, left_s=10.0, shed_by_m2g=True, shed_at=NOW))


def test_with_caps_the_ending_job_is_not_paused_and_its_caps_do_not_count_twice(
        ev: Evaluator) -> None:
    """Caps on: the flex-3 job ending in 5 s scores first but is not paused (its end frees
    what a pause would); and its end counts its whole draw, so the cap steps left on it are
    not counted on top: for 3 kW more than its end frees, the other job is paused."""
    soon = job("soon", 3, left_s=5.0, power_cap=0.5, power_cap_at=NOW - timedelta(seconds=3))
    long = capped_just_now("long")
    settling = sum(cap_saving_kw(w, CFG, 1.0, w.power_cap) for w in (soon, long))
    s = snap(LIMIT + settling + saving_kw(soon, CFG) + 3.0, soon, long)
    assert [a.name for a in make_plan(s, ev, CFG).sheds] == ["long"]
    assert [a.name for a in make_plan(s, ev, OFF).sheds] == ["soon", "long"]  # before
    fresh = job("soon", 3, left_s=5.0)  # uncapped: ~10 kW of cap steps left
    settling = cap_saving_kw(long, CFG, 1.0, long.power_cap)
    s = snap(LIMIT + settling + saving_kw(fresh, CFG) + 3.0, fresh, long)
    assert [a.name for a in make_plan(s, ev, CFG).sheds] == ["long"]
