"""Node levers: m2g's maintenance and thermal taints, and draining a window's nodes on time."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from m2g.k8s import convert as cv
from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import MISSING, FactorySnapshot, MaintenanceWindow, Node, Rack, Reading
from m2g.model.inputs import Checkpoint, WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.nodes import drain_actions, taint_updates, taint_value
from m2g.planner.shedding import shed_actions
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g", maintenance_taint_lead_seconds=600,
                    maintenance_drain_lead_seconds=300, drain_deadline_seconds=60,
                    ramp_kw_per_second=1.0, max_step_kw=20.0, min_shed_seconds=60)
MAINT, THERMAL = "m2g.io/maintenance", "m2g.io/thermal"


def nodes(taints: dict[str, tuple[tuple[str, str], ...]] | None = None) -> tuple[Node, ...]:
    return tuple(Node(f"r{r}-n{i}", f"rack-{r}", m2g_taints=(taints or {}).get(f"r{r}-n{i}", ()))
                 for r in range(2) for i in range(2))


def factory(*windows: MaintenanceWindow, inlet: Reading = MISSING, alarm: bool = False,
            taints: dict[str, tuple[tuple[str, str], ...]] | None = None) -> FactorySnapshot:
    racks = (Rack("rack-0", "b0", "pd0", inlet_c=inlet, limit_c=32.0, thermal_alarm=alarm,
                  power_kw=Reading(100.0, 1.0), cap_kw=132.0),
             Rack("rack-1", "b0", "pd0", limit_c=32.0, power_kw=Reading(100.0, 1.0)))
    return FactorySnapshot(now=NOW, racks=racks, nodes=nodes(taints), maintenance=windows)


def window(starts_in: float, minutes: int = 60, name: str = "mw-1",
           lead: float | None = None) -> MaintenanceWindow:
    start = NOW + timedelta(seconds=starts_in)
    return MaintenanceWindow(name, start, start + timedelta(minutes=minutes), racks=("rack-1",),
                             drain_lead_seconds=lead)


def taints_of(f: FactorySnapshot, *ws: WorkloadState,
              placements: dict[str, tuple[str, ...]] | None = None) -> list[tuple[Any, ...]]:
    b = InputBuilder(ClusterSnapshot(f, ws, placements=placements or {}))
    return [(t.node, t.key, t.value, t.add) for t in taint_updates(b, CFG)]


def test_maintenance_taints_start_at_the_lead_time_and_end_with_the_window() -> None:
    assert taints_of(factory(window(900))) == []  # 15 min ahead: lead is 10 min
    assert taints_of(factory(window(500))) == [("r1-n0", MAINT, "mw-1", True),
                                               ("r1-n1", MAINT, "mw-1", True)]
    on = {f"r1-n{i}": ((MAINT, "mw-1"),) for i in range(2)}
    assert taints_of(factory(window(500), taints=on)) == []  # in place: nothing to do
    assert taints_of(factory(window(-60), taints=on)) == []  # under way: stays
    over = window(-7200)  # ended an hour ago
    assert taints_of(factory(over, taints=on)) == [("r1-n0", MAINT, "mw-1", False),
                                                   ("r1-n1", MAINT, "mw-1", False)]
    assert taints_of(factory(taints=on)) == [("r1-n0", MAINT, "mw-1", False),
                                             ("r1-n1", MAINT, "mw-1", False)]  # deleted


def test_thermal_taint_has_hysteresis_and_keeps_on_stale_data() -> None:
    hot = factory(inlet=Reading(33.0, 1.0))
    assert taints_of(hot) == [("r0-n0", THERMAL, "rack-0", True),
                              ("r0-n1", THERMAL, "rack-0", True)]
    assert [t[0] for t in taints_of(factory(alarm=True))] == ["r0-n0", "r0-n1"]  # facility bit
    on = {f"r0-n{i}": ((THERMAL, "rack-0"),) for i in range(2)}
    assert taints_of(factory(inlet=Reading(31.5, 1.0), taints=on)) == []  # under, in the margin
    assert taints_of(factory(inlet=Reading(31.5, 900.0), taints=on)) == []  # stale: keep
    cool = taints_of(factory(inlet=Reading(30.5, 1.0), taints=on))
    assert cool == [("r0-n0", THERMAL, "rack-0", False), ("r0-n1", THERMAL, "rack-0", False)]
    assert len(taints_of(factory(taints=on))) == 2  # no telemetry at all: clear
    assert taints_of(factory(inlet=Reading(31.5, 1.0))) == []  # not added under the limit


def test_taint_values_are_label_values() -> None:
    assert taint_value("mw.2026/11 rack 7") == "mw.2026-11-rack-7"
    assert len(taint_value("x" * 100)) == 63


def running(name: str, kw: float = 10.0, runtime: int = 0, ckpt_age: int | None = None,
            admitted: timedelta = timedelta(minutes=10), **kw_args: Any) -> WorkloadState:
    age = ckpt_age if ckpt_age is not None else int(admitted.total_seconds())
    view = WorkloadView(name=name, namespace="t", gpus=8, estimated_kw=kw,
                        expected_runtime_seconds=runtime,
                        checkpoint=Checkpoint(interval_seconds=600, last_age_seconds=age,
                                              reported=ckpt_age is not None))
    fields: dict[str, Any] = {"admitted_at": NOW - admitted, **kw_args}
    phase = fields.pop("phase", Phase.ADMITTED)
    return WorkloadState("t", name, view, phase, **fields)


def drains(f: FactorySnapshot, *ws: WorkloadState, on: dict[str, tuple[str, ...]] | None = None,
           cfg: PlannerConfig = CFG) -> list[tuple[str, bool, str]]:
    place = on if on is not None else {w.key: ("r1-n0",) for w in ws}
    b = InputBuilder(ClusterSnapshot(f, ws, placements=place))
    return [(a.name, a.active, a.drain) for a in drain_actions(b, cfg)]


def test_drain_starts_at_the_drain_lead_and_skips_work_that_finishes_in_time() -> None:
    w = running("a")
    assert drains(factory(window(400)), w) == []  # taint lead, not yet the drain lead
    assert drains(factory(window(250)), w) == [("a", False, "maintenance/mw-1")]
    assert drains(factory(window(250, lead=100)), w) == []  # the window's own lead
    assert drains(factory(window(250)), w, on={"t/a": ("r0-n0",)}) == []  # not on its racks
    # admitted 10 min ago, 12 min runtime: done 2 min from now, before the window (4 min)
    assert drains(factory(window(250)), running("short", runtime=720)) == []
    assert drains(factory(window(250)), running("long", runtime=900)) == [
        ("long", False, "maintenance/mw-1")]


def test_drain_is_paced_freshest_checkpoint_first_and_all_at_the_deadline() -> None:
    ws = [running("old", ckpt_age=500, kw=15.0), running("fresh", ckpt_age=30, kw=15.0),
          running("none", kw=15.0)]
    # no action yet: a full step (20 kW) — one 15 kW workload, the freshest checkpoint
    assert drains(factory(window(250)), *ws) == [("fresh", False, "maintenance/mw-1")]
    # 50 s before the window (deadline 60 s): everything at once
    assert [d[0] for d in drains(factory(window(50)), *ws)] == ["fresh", "old", "none"]
    # a shed 5 s ago leaves a 5 kW step: nothing fits, nothing goes
    recent = running("x", phase=Phase.INACTIVE, shed_by_m2g=True,
                     shed_at=NOW - timedelta(seconds=5))
    assert drains(factory(window(250)), *ws, recent, on={w.key: ("r1-n0",) for w in ws}) == []


def test_drained_work_comes_back_when_its_pods_are_gone() -> None:
    gone = running("d", phase=Phase.INACTIVE, shed_by_m2g=True, drained_for="maintenance/mw-1",
                   shed_at=NOW - timedelta(seconds=90))
    assert drains(factory(window(-10)), gone, on={}) == [("d", True, "maintenance/mw-1")]
    assert drains(factory(window(-10)), gone) == []  # a pod still on the node
    young = replace(gone, shed_at=NOW - timedelta(seconds=30))
    assert drains(factory(window(-10)), young, on={}) == []  # min_shed_seconds


def test_power_restore_leaves_drained_work_to_the_drain_planner(tmp_path: Any) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {"s.yaml": policy("s", "Preemption", """
        - {name: any, when: "true", score: "1.0"}
    """)})
    drained = running("d", phase=Phase.INACTIVE, shed_by_m2g=True,
                      drained_for="maintenance/mw-1", shed_at=NOW - timedelta(hours=1))
    shed = replace(drained, name="s", drained_for="")
    f = replace(factory(), site_budget_kw=1000.0)
    actions, _ = shed_actions(ev, InputBuilder(ClusterSnapshot(f, (drained, shed))), CFG)
    assert [(a.name, a.active) for a in actions] == [("s", True)]


def test_m2g_taints_are_not_health_reasons_and_placements_follow_owners() -> None:
    obj = {"metadata": {"name": "n", "labels": {"network.topology.nvidia.com/accelerator": "r"}},
           "spec": {"taints": [{"key": MAINT, "value": "mw", "effect": "NoSchedule"},
                               {"key": "other.io/x", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    n = cv.node(obj)
    assert n.reasons == ("Tainted",)  # the other taint only
    assert n.m2g_taints == ((MAINT, "mw"),)
    only_m2g = {**obj, "spec": {"taints": obj["spec"]["taints"][:1]}}
    assert cv.node(only_m2g).healthy
    wls = [{"metadata": {"name": "w", "namespace": "t",
                         "ownerReferences": [{"uid": "job-1", "name": "j"}]}}]
    pods = [{"metadata": {"ownerReferences": [{"uid": "job-1"}]}, "spec": {"nodeName": "n2"}},
            {"metadata": {"ownerReferences": [{"uid": "job-1"}]}, "spec": {"nodeName": "n1"}},
            {"metadata": {"ownerReferences": [{"uid": "job-1"}]}, "spec": {"nodeName": "n3"},
             "status": {"phase": "Succeeded"}},
            {"metadata": {"ownerReferences": [{"uid": "job-2"}]}, "spec": {"nodeName": "n4"}},
            {"metadata": {"ownerReferences": [{"uid": "job-1"}]}, "spec": {}}]
    assert cv.placements(pods, wls) == {"t/w": ("n1", "n2")}
    mw = cv.maintenance_window({"metadata": {"name": "m"}, "spec": {
        "start": "2026-11-29T16:00:00Z", "end": "2026-11-29T17:00:00Z",
        "scope": {"racks": ["r"]}, "drainLeadSeconds": 120}})
    assert mw is not None and mw.drain_lead_seconds == 120


def test_placements_include_the_nodes_kueue_tas_assigned() -> None:
    # the shape Kueue v0.19.2 writes (seen in the e2e control plane)
    ta = {"levels": ["kubernetes.io/hostname"], "slices": [
        {"domainCount": 2, "podCounts": {"universal": 1},
         "valuesPerLevel": [{"individual": {"prefix": "small-r000-n0", "roots": ["0", "1"]}}]},
        {"domainCount": 1, "podCounts": {"universal": 2},
         "valuesPerLevel": [{"universal": "host-9"}]}]}
    wl = {"metadata": {"name": "w", "namespace": "t"},
          "status": {"admission": {"podSetAssignments": [{"name": "main",
                                                          "topologyAssignment": ta}]}}}
    assert cv.tas_hosts(wl) == {"small-r000-n00", "small-r000-n01", "host-9"}
    assert cv.placements([], [wl], {"host-9": "node-9"}) == {
        "t/w": ("node-9", "small-r000-n00", "small-r000-n01")}
    by_rack = {"levels": ["network.topology.nvidia.com/accelerator"], "slices": [
        {"domainCount": 1, "podCounts": {"universal": 1},
         "valuesPerLevel": [{"universal": "rack-0"}]}]}
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = by_rack
    assert cv.tas_hosts(wl) == set()  # not down to hosts: pods tell


def test_a_tas_placed_workload_says_so() -> None:
    wl: dict[str, Any] = {"metadata": {"name": "w", "namespace": "t"}, "spec": {},
                          "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                              {"name": "main", "topologyAssignment": {"levels": ["h"]}}]}}}
    assert cv.workload(wl, NOW).view.topology_assigned
    wl["status"]["admission"]["podSetAssignments"][0].pop("topologyAssignment")
    assert not cv.workload(wl, NOW).view.topology_assigned


def test_live_pods_count_bound_unfinished_pods_and_those_stopping() -> None:
    """``live_pods``: what runs (and is being deleted) per workload, by owner UID; a finished
    or unbound pod and a TAS assignment count for nothing (unlike ``placements``)."""
    ta = {"levels": ["kubernetes.io/hostname"], "slices": [
        {"domainCount": 1, "podCounts": {"universal": 1},
         "valuesPerLevel": [{"universal": "host-9"}]}]}
    wls = [{"metadata": {"name": "w", "namespace": "t", "ownerReferences": [{"uid": "job-1"}]}},
           {"metadata": {"name": "done", "namespace": "t", "ownerReferences": [{"uid": "job-3"}]},
            "status": {"admission": {"podSetAssignments": [{"topologyAssignment": ta}]}}}]
    own = {"ownerReferences": [{"uid": "job-1"}]}
    pods = [{"metadata": own, "spec": {"nodeName": "n1"}},
            {"metadata": {**own, "deletionTimestamp": "2026-11-29T16:00:00Z"},
             "spec": {"nodeName": "n2"}},
            {"metadata": own, "spec": {"nodeName": "n3"}, "status": {"phase": "Succeeded"}},
            {"metadata": own, "spec": {}},
            {"metadata": {"ownerReferences": [{"uid": "job-3"}]}, "spec": {"nodeName": "n4"},
             "status": {"phase": "Failed"}},
            {"metadata": {"ownerReferences": [{"uid": "job-2"}]}, "spec": {"nodeName": "n5"}}]
    want = {"t/w": LivePods(2, stopping=1)}
    assert cv.live_pods(pods, wls) == want
    links = [cv.workload_links(w) for w in wls]
    assert cv.live_pods_of([cv.pod_facts(p) for p in pods], links) == want
    # when they started running (the latest container start, else startTime), and how many
    # are bound but not running yet: new work shows in the meter only after it starts
    pods[0]["status"] = {"phase": "Running", "startTime": "2026-11-29T15:59:00Z",
                         "containerStatuses": [
                             {"state": {"running": {"startedAt": "2026-11-29T15:59:02Z"}}},
                             {"state": {"running": {"startedAt": "2026-11-29T15:59:04Z"}}}]}
    pods[1]["status"] = {"phase": "Pending"}
    started = datetime(2026, 11, 29, 15, 59, 4, tzinfo=UTC)
    want = {"t/w": LivePods(2, stopping=1, started_at=started, waiting=1)}
    assert cv.live_pods(pods, wls) == want
    assert cv.live_pods_of([cv.pod_facts(p) for p in pods], links) == want
    pods[0]["status"].pop("containerStatuses")
    assert cv.live_pods(pods, wls)["t/w"].started_at == started - timedelta(seconds=4)
    assert "t/done" in cv.placements(pods, wls)  # its TAS hosts: placed, yet nothing runs
