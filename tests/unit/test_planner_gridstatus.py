"""GridEvent status and percentage baselines (m2g.planner.gridstatus), without a cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from m2g.model.cluster import ClusterSnapshot, GridEventState, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.gridstatus import event_statuses, observe_baseline
from m2g.planner.plan import make_plan
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
START = NOW - timedelta(seconds=5)
CFG = PlannerConfig(check_name="m2g", ramp_kw_per_second=1000.0, max_step_kw=1000.0,
                    shed_saving_fraction=1.0)


def factory(draw: float | None, pct: float = 25.0, baseline: float = 0.0) -> FactorySnapshot:
    racks = (Rack("rack-0", "b", "pd", power_kw=Reading(draw, 1.0) if draw is not None
                  else Reading(None, 500.0), cap_kw=200.0),)
    events = (GridEvent("dr-7", START, START + timedelta(hours=1), reduction_pct=pct,
                        baseline_kw=baseline, source="ev"),)
    return FactorySnapshot(now=NOW, racks=racks, nodes=(Node("n0", "rack-0"),),
                           grid_events=events)


def state(status: dict[str, Any] | None = None, start: datetime = START) -> GridEventState:
    return GridEventState("ev", "dr-7", start, start + timedelta(hours=1), 25.0, status or {})


def history(*points: tuple[float, float]) -> tuple[tuple[datetime, float], ...]:
    """(seconds relative to START, kW)."""
    return tuple((START + timedelta(seconds=s), kw) for s, kw in points)


def snap(f: FactorySnapshot, ev: GridEventState, hist: tuple[tuple[datetime, float], ...],
         *workloads: WorkloadState) -> ClusterSnapshot:
    return ClusterSnapshot(f, workloads, grid_event_states=(ev,), draw_history=hist)


def test_the_baseline_is_the_mean_over_the_window_before_the_start() -> None:
    hist = history((-90, 900.0), (-50, 1000.0), (-10, 1200.0), (0, 1100.0), (3, 700.0))
    assert observe_baseline(hist, START, 60, 700.0)[:2] == (1100.0, "PreEventMean")
    # a gap over the window: the newest sample before it; none before at all: the draw now
    assert observe_baseline(history((-90, 900.0), (-75, 950.0)), START, 60, 700.0)[:2] == (
        950.0, "LastSampleBeforeStart")
    assert observe_baseline(history((3, 700.0)), START, 60, 700.0)[:2] == (
        700.0, "FirstSampleDuringEvent")
    assert observe_baseline((), START, 60, None) is None


def test_a_percentage_event_records_its_baseline_and_target_once() -> None:
    hist = history((-40, 1000.0), (-20, 1200.0))
    updates, baselines = event_statuses(snap(factory(1100.0), state(), hist), CFG,
                                        "2026-11-30T14:00:00Z")
    assert baselines == {"ev": 1100.0}
    st = updates[0].status
    assert (st["phase"], st["observedBaselineKw"], st["targetKw"]) == ("Active", 1100.0, 825.0)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Active"]["status"] == "True" and conds["Active"]["reason"] == "InProgress"
    assert conds["BaselineObserved"]["reason"] == "PreEventMean"
    assert "target 825 kW = 75 % of the 1100 kW baseline" in st["message"]
    # written: the next reconcile keeps it, even with other samples, and writes nothing
    again, new = event_statuses(snap(factory(600.0, baseline=1100.0), state(dict(st)),
                                     history((-30, 5000.0))), CFG, "2026-11-30T14:00:09Z")
    assert (again, new) == ([], {})


def test_phases_and_no_baseline_before_the_start_or_without_power() -> None:
    later = NOW + timedelta(minutes=10)
    updates, baselines = event_statuses(snap(factory(900.0), state(start=later), ()), CFG, "t")
    st = updates[0].status
    assert st["phase"] == "Pending" and "observedBaselineKw" not in st and baselines == {}
    assert {c["type"]: c["reason"] for c in st["conditions"]} == {
        "Active": "Pending", "BaselineObserved": "WaitingForStart"}
    stale, _ = event_statuses(snap(factory(None), state(), ()), CFG, "t")
    assert {c["type"]: c["reason"] for c in stale[0].status["conditions"]}[
        "BaselineObserved"] == "NoPowerReading"
    done = state(start=NOW - timedelta(hours=2))
    assert event_statuses(snap(factory(900.0), done, ()), CFG, "t")[0][0].status[
        "phase"] == "Completed"


def test_a_condition_keeps_its_transition_time_while_it_holds() -> None:
    first = event_statuses(snap(factory(900.0), state(), history((-5, 900.0))), CFG,
                           "2026-11-30T14:00:00Z")[0][0].status
    # a later reconcile of the same event (say its message was lost): same transition times
    kept = dict(first, message="")
    redo = event_statuses(snap(factory(900.0, baseline=900.0), state(kept), ()), CFG,
                          "2026-11-30T14:05:00Z")[0][0].status
    assert redo["conditions"] == first["conditions"]


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", {
        "shed.yaml": policy("shed", "Preemption", """
            - {name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}
        """)})


def running(name: str, kw: float, tier: int = 2) -> WorkloadState:
    view = WorkloadView(name=name, namespace="t", flex_tier=tier, gpus=8, estimated_kw=kw)
    return WorkloadState("t", name, view, Phase.ADMITTED, admitted_at=NOW - timedelta(hours=1))


def test_the_plan_that_measures_the_baseline_already_sheds_to_its_target(ev: Evaluator) -> None:
    # 1,000 kW before the start; 25 % off: target 750 kW; the draw is 1,000: shed 250 kW
    s = snap(factory(1000.0), state(), history((-30, 1000.0)),
             running("big", 300.0), running("small", 100.0), running("firm", 600.0, tier=0))
    plan = make_plan(s, ev, CFG)
    assert [e.status["targetKw"] for e in plan.event_statuses] == [750.0]
    assert [(a.name, a.active) for a in plan.sheds] == [("big", False)]
    # before: no baseline, no limit, nothing shed (the bug: a percentage event never shed)
    no_history = replace(s, draw_history=(), factory=factory(None))
    assert make_plan(no_history, ev, CFG).sheds == ()
    assert plan.wake_at == START + timedelta(hours=1)  # the loop wakes at the event's end
