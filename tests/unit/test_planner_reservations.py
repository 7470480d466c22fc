"""Reservations and hourly capacity caps in the planner: held cliques, admission of short work
only, drains on time, the start, release, isolation of bad reservations, quotas per interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from m2g.k8s.convert_schedule import capacity_plan, reservation
from m2g.model.cluster import (
    CheckState,
    ClusterSnapshot,
    FlavorQuota,
    FlavorState,
    Phase,
    QueueState,
    WorkloadState,
)
from m2g.model.factory import FactorySnapshot, Node, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.model.schedule import CapacityPlan, CapUnit, Reservation
from m2g.planner.config import PlannerConfig
from m2g.planner.plan import make_plan
from m2g.planner.reservations import ReservationBook
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g", reservation_lead_seconds=3600,
                    maintenance_drain_lead_seconds=900)
POLICIES = {
    "admit.yaml": policy("admit", "Admission", """
        - {name: ok, when: "true", decision: Admit, message: "fine"}
    """),
    "cap.yaml": policy("cap", "Capacity", """
        - {name: healthy, when: "true", quota: "flavor.healthyGpus"}
    """),
}


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("r")), "cel-expr-python", POLICIES)


def factory(used: dict[str, int] | None = None, broken: str = "") -> FactorySnapshot:
    """Two NVL72 cliques (rack-0, rack-1: 18 nodes × 4 GPUs); ``used``: node → GPUs allocated."""
    nodes = tuple(Node(f"r{r}-n{i}", f"rack-{r}", clique=f"rack-{r}", block="b0",
                       gpus_allocated=(used or {}).get(f"r{r}-n{i}", 0),
                       reasons=("GpuXid",) if f"r{r}-n{i}" == broken else ())
                  for r in range(2) for i in range(18))
    racks = tuple(Rack(f"rack-{r}", "b0", "pd-0", clique=f"rack-{r}",
                       power_kw=Reading(50.0, 1.0), cap_kw=132.0) for r in range(2))
    return FactorySnapshot(now=NOW, site_budget_kw=400.0, racks=racks, nodes=nodes)


def wl(name: str, phase: Phase, gpus: int, runtime: int = 0, ns: str = "team",
       admitted_ago: float | None = None, check: CheckState | None = None) -> WorkloadState:
    view = WorkloadView(name=name, namespace=ns, gpus=gpus, cluster_queue="cq",
                        expected_runtime_seconds=runtime)
    return WorkloadState(ns, name, view, phase, cluster_queue="cq", check="m2g",
                         check_state=check,
                         admitted_at=None if admitted_ago is None else
                         NOW - timedelta(seconds=admitted_ago))


def rsv(starts_in: float = 1800, hours: float = 2, cliques: int = 1, gpus: int = 0,
        name: str = "big", workloads: tuple[str, ...] = ("ml/big-job",),
        status: dict[str, Any] | None = None, **kw: Any) -> Reservation:
    start = NOW + timedelta(seconds=starts_in)
    return Reservation(name, start, start + timedelta(hours=hours), gpus=gpus, cliques=cliques,
                       workloads=workloads, status=status or {}, **kw)


def snap(*ws: WorkloadState, reservations: tuple[Reservation, ...] = (),
         plans: tuple[CapacityPlan, ...] = (), f: FactorySnapshot | None = None,
         placements: dict[str, tuple[str, ...]] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(
        f or factory(), ws, (QueueState("cq", (FlavorQuota("gb300", "nvidia.com/gpu", 144,
                                                            144),)),),
        (FlavorState("gb300"),), placements=placements or {}, reservations=reservations,
        capacity_plans=plans)


def pending(name: str, gpus: int, runtime: int = 0, ns: str = "team") -> WorkloadState:
    return wl(name, Phase.RESERVED, gpus, runtime, ns=ns, check=CheckState.PENDING)


def answers(ev: Evaluator, s: ClusterSnapshot) -> dict[str, str]:
    return {f"{c.namespace}/{c.name}": c.state.value for c in make_plan(s, ev, CFG).checks}


def test_a_hold_keeps_one_clique_free_and_admits_short_work(ev: Evaluator) -> None:
    r = rsv()
    busy = {f"r0-n{i}": 4 for i in range(10)}  # rack-0 partly used: rack-1 is the free clique
    s = snap(pending("short", 8, runtime=600), pending("long", 32, runtime=7200),
             pending("long-2", 8, runtime=7200), reservations=(r,), f=factory(busy))
    book = ReservationBook(s, CFG)
    (h,) = book.held
    assert (h.phase.value, h.cliques, h.gpus) == ("Holding", ("rack-1",), 72)
    got = answers(ev, s)
    # short work ends before the start; of the long ones, only what fits in the 24 GPUs left
    # outside rack-1 (32 free, 8 given to the short one)
    assert got == {"team/short": "Ready", "team/long": "Retry", "team/long-2": "Ready"}
    # before the lead time nothing is held
    assert answers(ev, snap(pending("long", 64, runtime=7200),
                            reservations=(rsv(starts_in=7200),))) == {"team/long": "Ready"}


def test_a_workload_placed_on_the_held_clique_waits_unless_it_ends_in_time(ev: Evaluator
                                                                           ) -> None:
    on = {"team/long": ("r0-n0",), "team/short": ("r0-n1",)}  # rack-0 is held (ties: name)
    s = snap(pending("long", 4, runtime=7200), pending("short", 4, runtime=600),
             reservations=(rsv(),), placements=on)
    assert answers(ev, s) == {"team/long": "Retry", "team/short": "Ready"}
    plan = make_plan(s, ev, CFG)
    assert "held clique(s) rack-0" in next(c.message for c in plan.checks if c.name == "long")


def test_named_workloads_wait_for_the_start_and_get_it_then(ev: Evaluator) -> None:
    job = pending("big-job", 72, runtime=3600, ns="ml")
    # early: kept Pending with the reason (Kueue keeps its quota and placement)
    (early,) = make_plan(snap(job, reservations=(rsv(),)), ev, CFG).checks
    assert (early.state, early.requeue_after_seconds) == (CheckState.PENDING, None)
    assert early.message.startswith("reservation big: starts at")
    other = make_plan(snap(pending("long", 144, runtime=7200), reservations=(rsv(),)), ev, CFG)
    assert other.checks[0].requeue_after_seconds == CFG.reservation_retry_seconds
    started = rsv(starts_in=-1)
    # at the start: the job is admitted, others are still kept off the capacity
    got = answers(ev, snap(job, pending("other", 72, runtime=600),
                           reservations=(started,),
                           f=factory({f"r0-n{i}": 4 for i in range(18)})))
    assert got == {"ml/big-job": "Ready", "team/other": "Retry"}


def test_a_workload_is_named_by_its_own_name_or_its_jobs() -> None:
    from dataclasses import replace

    from m2g.planner.reservations import owns
    r = rsv(workloads=("ml/pretrain",))
    w = pending("job-pretrain-ab12c", 72, ns="ml")
    assert not owns(r, w) and owns(r, replace(w, owners=("pretrain",)))
    assert owns(rsv(workloads=("ml/job-pretrain-ab12c",)), w)
    assert not owns(r, replace(w, namespace="other", owners=("pretrain",)))


def test_drains_work_on_the_held_clique_from_the_drain_lead(ev: Evaluator) -> None:
    long = wl("long", Phase.ADMITTED, 8, runtime=7200, admitted_ago=60)
    short = wl("short", Phase.ADMITTED, 8, runtime=900, admitted_ago=600)
    on = {"team/long": ("r1-n0", "r1-n1"), "team/short": ("r1-n2", "r1-n3")}
    used = {n: 4 for n in ("r1-n0", "r1-n1", "r1-n2", "r1-n3")} | {
        f"r0-n{i}": 4 for i in range(17)}  # rack-0 busier: rack-1 is picked
    early = snap(long, short, reservations=(rsv(starts_in=1800),), placements=on,
                 f=factory(used))
    assert [a.name for a in make_plan(early, ev, CFG).sheds] == []  # 30 min: before the lead
    due = snap(long, short, reservations=(rsv(starts_in=600),), placements=on, f=factory(used))
    sheds = make_plan(due, ev, CFG).sheds
    assert [(a.name, a.active, a.drain) for a in sheds] == [("long", False, "reservation/big")]


def test_gpu_count_hold_drains_only_what_is_needed(ev: Evaluator) -> None:
    r = rsv(starts_in=600, cliques=0, gpus=64, workloads=(), namespace="ml")
    used = {f"r{r_}-n{i}": 4 for r_ in range(2) for i in range(18)}  # all 144 GPUs in use
    ws = [wl(f"w{i}", Phase.ADMITTED, 36, runtime=7200, admitted_ago=60) for i in range(4)]
    sheds = make_plan(snap(*ws, reservations=(r,), f=factory(used)), ev, CFG).sheds
    assert len(sheds) == 2 and all(a.drain == "reservation/big" for a in sheds)  # 72 >= 64


def test_release_at_end_or_when_named_workloads_finish() -> None:
    done = wl("big-job", Phase.FINISHED, 72, ns="ml")
    (h,) = ReservationBook(snap(done, reservations=(rsv(starts_in=-60),)), CFG).held
    assert h.phase.value == "Released" and h.nodes == frozenset()
    (h,) = ReservationBook(snap(reservations=(rsv(starts_in=-7300),)), CFG).held
    assert h.phase.value == "Released"
    (h,) = ReservationBook(snap(reservations=(rsv(starts_in=-60),)), CFG).held
    assert h.phase.value == "Active"  # the job has not come yet: kept until the end


def test_bad_reservations_are_isolated_and_reported(ev: Evaluator) -> None:
    rs = (rsv(name="a"), rsv(name="b", cliques=3), rsv(name="c", cliques=0, gpus=100),
          rsv(name="d", block="nowhere"), rsv(name="e", starts_in=5 * 3600))
    book = ReservationBook(snap(reservations=rs), CFG)
    got = {h.r.name: (h.phase.value, h.message) for h in book.held}
    assert got["a"][0] == "Holding"
    assert got["b"] == ("Invalid", "asks for 3 cliques; the site has 2")
    assert got["c"][0] == "Invalid" and "overlaps a: together 172 of 144" in got["c"][1]
    assert got["d"] == ("Invalid", "block nowhere has no GPU nodes")
    assert got["e"][0] == "Pending"
    statuses = {u.name: u.status for u in make_plan(snap(reservations=rs), ev, CFG)
                .reservation_statuses}
    assert statuses["a"]["heldCliques"] == ["rack-0"] and statuses["b"]["phase"] == "Invalid"
    # written once: a status already saying it is not written again
    again = snap(reservations=tuple(Reservation(**{**r.__dict__, "status": statuses[r.name]})
                                    for r in rs))
    assert make_plan(again, ev, CFG).reservation_statuses == ()


def test_held_cliques_stay_put_and_skip_unhealthy_ones() -> None:
    sticky = rsv(status={"heldCliques": ["rack-0"]})
    (h,) = ReservationBook(snap(reservations=(sticky,)), CFG).held
    assert h.cliques == ("rack-0",)
    (h,) = ReservationBook(snap(reservations=(sticky,), f=factory(broken="r0-n3")), CFG).held
    assert h.cliques == ("rack-1",)


def test_wakes_at_the_next_reservation_boundary(ev: Evaluator) -> None:
    plan = make_plan(snap(reservations=(rsv(starts_in=7200),)), ev, CFG)
    assert plan.wake_at == NOW + timedelta(seconds=3600)  # the hold begins


def hourly(values: tuple[float, ...], unit: CapUnit = CapUnit.GPUS) -> CapacityPlan:
    return CapacityPlan("dayahead", NOW - timedelta(hours=1), 3600, values, unit)


def quota(ev: Evaluator, s: ClusterSnapshot) -> int | None:
    got = [q.nominal for q in make_plan(s, ev, CFG).quotas]
    return got[0] if got else None


def test_an_hourly_cap_lowers_quota_in_its_hours_only(ev: Evaluator) -> None:
    p = hourly((144, 72, -1))  # the hour before, this hour, the next
    assert quota(ev, snap(plans=(p,))) == 72
    assert quota(ev, snap(plans=(hourly((72, 144, 72)),))) is None  # this hour: no cut
    assert quota(ev, snap(plans=(hourly((72, -1)),))) is None  # -1: no cap
    plan = make_plan(snap(plans=(p,)), ev, CFG)
    assert "capacity plan dayahead: 72 gpus" in plan.quotas[0].reason
    assert plan.wake_at == NOW + timedelta(hours=1)


def test_a_kw_cap_is_a_capacity_limit_and_a_quota(ev: Evaluator) -> None:
    s = snap(plans=(hourly((500, 67.0), CapUnit.KW),))
    assert quota(ev, s) == 50  # 67 kW / 1.34 kW per GPU
    from m2g.planner.caps import with_kw_caps
    events = with_kw_caps(s).factory.grid_events
    assert [(e.id, e.target_kw, e.start, e.end) for e in events] == [
        ("capacityplan/dayahead", 67.0, NOW, NOW + timedelta(hours=1))]


def test_conversion_refuses_what_cannot_be_honoured() -> None:
    base = {"metadata": {"name": "x"}, "spec": {"start": "2026-12-01T00:00:00Z",
                                                "end": "2026-12-01T01:00:00Z", "cliques": 1,
                                                "tenant": {"namespace": "ml"}}}
    assert reservation(base).cliques == 1
    for bad, needle in [({"end": "2026-11-30T00:00:00Z"}, "end must be after start"),
                        ({"cliques": 0}, "gpus or cliques"), ({"gpus": 10**9, "cliques": 0},
                                                              "plausible"),
                        ({"tenant": None}, "tenant namespace or workloads")]:
        with pytest.raises(ValueError, match=needle):
            reservation({**base, "spec": {**base["spec"], **bad}})
    named = reservation({**base, "spec": {**base["spec"], "tenant": None,
                                          "workloads": [{"namespace": "ml", "name": "j"}]}})
    assert named.workloads == ("ml/j",)
    p = capacity_plan({"metadata": {"name": "p"}, "spec": {"start": "2026-12-01T00:00:00Z",
                                                           "kw": [100, -1, 50]}})
    assert (p.unit, p.values, p.interval_seconds) == (CapUnit.KW, (100.0, -1.0, 50.0), 3600)
    for bad in ({"gpus": [1], "kw": [1]}, {"gpus": []}, {"gpus": ["x"]},
                {"gpus": [1], "intervalSeconds": 5}):
        with pytest.raises(ValueError):
            capacity_plan({"metadata": {"name": "p"},
                           "spec": {"start": "2026-12-01T00:00:00Z", **bad}})
