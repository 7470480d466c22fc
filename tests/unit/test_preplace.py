"""An elastic Job's workload that fits one NVLink domain is answered before Kueue reserves it,
Ready with the nodeSelector of a domain that has its pods free (m2g.planner.preplace)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import PodSetView, WorkloadView
from m2g.model.plan import CheckUpdate
from m2g.planner.config import PlannerConfig
from m2g.planner.headroom import share
from m2g.planner.plan import make_plan
from m2g.planner.preplace import MARK, REPLACEMENT_FOR, RULE, Room
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator
from tests.unit.test_planner import NOW, POLICIES

CFG = PlannerConfig(check_name="m2g", nvlink_preplace=True)  # (off by default)
CLIQUE = "nvidia.com/gpu.clique"


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def factory(used: dict[int, int], *, alarm: int = -1, broken: tuple[str, ...] = (),
            event: bool = False, racks: int = 3) -> FactorySnapshot:
    """``racks`` racks of 18 four-GPU nodes, rack r's first ``used[r]`` nodes full."""
    nodes = tuple(Node(f"r{r}-n{i:02d}", f"rack-{r}", clique=f"c{r}",
                       gpus_allocated=4 if i < used.get(r, 0) else 0,
                       reasons=("GpuXid",) if f"r{r}-n{i:02d}" in broken else ())
                  for r in range(racks) for i in range(18))
    rs = tuple(Rack(f"rack-{r}", "b0", "pd-0", clique=f"c{r}", thermal_alarm=r == alarm,
                    power_kw=Reading(20.0, 5.0), cap_kw=132.0) for r in range(racks))
    events = (GridEvent("dr-1", NOW - timedelta(minutes=5), NOW + timedelta(hours=1),
                        target_kw=100.0),) if event else ()
    return FactorySnapshot(now=NOW, site_budget_kw=3000.0, power_domains=(PowerDomain("pd-0"),),
                           racks=rs, nodes=nodes, grid_events=events)


def elastic(name: str, pods: int = 4, per_pod: int = 4, tier: int = 2,
            phase: Phase = Phase.PENDING, **kw: object) -> WorkloadState:
    annotations = kw.pop("annotations", {})
    view = WorkloadView(name=name, namespace="team", flex_tier=tier, gpus=pods * per_pod,
                        cluster_queue="cq-a", annotations=annotations,  # type: ignore[arg-type]
                        pod_sets=(PodSetView(name="main", count=pods, gpus_per_pod=per_pod),))
    fields: dict[str, object] = {"check": "m2g", "check_state": CheckState.PENDING,
                                 "elastic_job": name, "parallelism": pods,
                                 "min_parallelism": max(1, pods // 2),
                                 "full_parallelism": pods, **kw}
    return WorkloadState("team", name, view, phase, cluster_queue="cq-a",
                         **fields)  # type: ignore[arg-type]


def snap(f: FactorySnapshot, *ws: WorkloadState) -> ClusterSnapshot:
    return ClusterSnapshot(f, ws)


def checks(s: ClusterSnapshot, ev: Evaluator, cfg: PlannerConfig = CFG) -> dict[str, CheckUpdate]:
    return {c.name: c for c in make_plan(s, ev, cfg).checks}


def selector(u: CheckUpdate) -> dict[str, str]:
    (ps,) = u.pod_set_updates
    assert ps["name"] == "main"
    return dict(ps.get("nodeSelector") or {})


def test_a_waiting_elastic_job_is_answered_ready_in_a_domain_with_room(ev: Evaluator) -> None:
    """Before, m2g answered only what Kueue had reserved: no answer here, and Kueue placed
    the job unconstrained (over racks)."""
    s = snap(factory({0: 16, 1: 8, 2: 18}), elastic("e"))
    by = checks(s, ev)
    assert set(by) == {"e"}
    u = by["e"]
    assert u.state is CheckState.READY and (u.policy, u.rule) == ("nvlink-placement", RULE)
    assert selector(u) == {CLIQUE: "c1"}  # c0 has 2 nodes free, c2 none
    assert u.message.startswith(f"{MARK}c1:")


def test_the_fullest_domain_that_fits_and_the_gpus_taken_are_counted(ev: Evaluator) -> None:
    # free nodes: c0 5, c1 8, c2 4 (4-GPU pods): best fit first, what is taken is gone
    s = snap(factory({0: 13, 1: 10, 2: 14}), elastic("a"), elastic("b"), elastic("c"),
             elastic("d", pods=5), elastic("e", pods=2))
    by = checks(s, ev)
    got = {n: selector(u)[CLIQUE] for n, u in by.items()}
    # a: c2 (4 fit exactly), b: c0 (5), c: c1 (8 -> 4 left), d: 5 pods: nowhere (c0 1 left,
    # c1 4 left) -> no answer, e: 2 pods: c0 has 1, c1 has 4 -> c1
    assert got == {"a": "c2", "b": "c0", "c": "c1", "e": "c1"}


def test_alarmed_racks_unhealthy_and_tainted_nodes_are_never_chosen(ev: Evaluator) -> None:
    f = factory({0: 0, 1: 0, 2: 18}, alarm=0, broken=tuple(f"r1-n{i:02d}" for i in range(15)))
    by = checks(snap(f, elastic("e")), ev)
    assert by == {}  # c0 alarmed, c1 has 3 healthy nodes, c2 full
    tainted = replace(f, nodes=tuple(replace(n, m2g_taints=(("m2g.io/drain", "x"),))
                                     if n.rack == "rack-1" else n for n in f.nodes))
    assert checks(snap(tainted, elastic("e", pods=3)), ev) == {}
    assert selector(checks(snap(f, elastic("e", pods=3)), ev)["e"]) == {CLIQUE: "c1"}


def test_an_answer_keeps_its_domain_while_it_has_room_else_is_withdrawn(ev: Evaluator) -> None:
    f = factory({0: 14, 1: 0, 2: 18})  # c0 fits best now; c1 had been chosen before
    before = elastic("e", check_state=CheckState.READY, check_message=f"{MARK}c1: earlier")
    u = checks(snap(f, before), ev)["e"]
    assert u.state is CheckState.READY and selector(u) == {CLIQUE: "c1"}
    full = factory({0: 14, 1: 16, 2: 18})  # c1 filled: podSetUpdates of a Ready answer may
    u = checks(snap(full, before), ev)["e"]  # not change, so back to Pending first
    assert u.state is CheckState.PENDING and u.pod_set_updates == ()
    assert "no longer fit in c1" in u.message


def test_a_decision_that_is_not_admit_leaves_it_or_withdraws_it(ev: Evaluator) -> None:
    f = factory({}, event=True)  # the dr policy defers flex >= 2 during the event
    assert checks(snap(f, elastic("fresh")), ev) == {}
    before = elastic("e", check_state=CheckState.READY, check_message=f"{MARK}c1: earlier")
    u = checks(snap(f, before), ev)["e"]
    assert u.state is CheckState.PENDING and "grid event dr-1 is active" in u.message


def test_what_is_not_placed_ahead(ev: Evaluator) -> None:
    f = factory({})
    grown = elastic("grown", annotations={REPLACEMENT_FOR: "team/old"})
    fixed = replace(elastic("fixed"), elastic_job="")
    big = elastic("big", pods=19)  # 76 GPUs: more than a domain
    foreign = elastic("foreign", check_state=CheckState.READY, check_message="admitted")
    assert checks(snap(f, grown, fixed, big, foreign), ev) == {}
    assert checks(snap(f, elastic("e")), ev, replace(CFG, nvlink_preplace=False)) == {}
    assert checks(snap(f, elastic("e")), ev, PlannerConfig(check_name="m2g")) == {}  # default
    # reserved: answered as before (no nodeSelector: Kueue has placed it already)
    u = checks(snap(f, elastic("r", phase=Phase.RESERVED)), ev)["r"]
    assert u.state is CheckState.READY and u.rule != RULE and not any(
        "nodeSelector" in p for p in u.pod_set_updates)


def test_the_gate_admits_reserved_work_before_work_placed_ahead() -> None:
    """Room for one: the reserved workload gets it though the waiting one ranks higher."""
    from tests.unit.test_headroom import LIMIT, room_for
    from tests.unit.test_headroom import factory as hfactory
    waiting = replace(elastic("waiting"), view=elastic("waiting").view.model_copy(
        update={"priority": 10}))
    reserved = elastic("reserved", phase=Phase.RESERVED)
    s = ClusterSnapshot(hfactory(room_for(1, reserved), LIMIT), (waiting, reserved))
    out = share([CheckUpdate("team", n, "m2g", CheckState.READY, "ok")
                 for n in ("waiting", "reserved")], s, replace(CFG, check_name="m2g"))
    assert {u.name: u.state for u in out} == {"waiting": CheckState.RETRY,
                                               "reserved": CheckState.READY}


def _brute(free: dict[str, list[int]], g: int, pods: int) -> str:
    fits = [(sum(f // g for f in fr), name) for name, fr in free.items()
            if sum(f // g for f in fr) >= pods]
    return min(fits)[1] if fits else ""


def test_the_room_index_chooses_as_a_scan_of_every_domain() -> None:
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 12)
        used = {r: rng.randint(0, 18) for r in range(n)}
        f = factory(used, racks=n)
        f = replace(f, nodes=tuple(replace(x, gpus_allocated=rng.choice((0, 1, 2, 3, 4)))
                                   if rng.random() < 0.3 else x for x in f.nodes))
        room = Room(ClusterSnapshot(f, ()))
        free = {d.name: list(d.free) for d in room.domains.values()}
        for _ in range(25):
            g, pods = rng.choice((1, 2, 4)), rng.randint(1, 12)
            want = _brute(free, g, pods)
            assert room.place(g, pods) == want
            if want:
                before = sum(free[want])
                free[want] = list(room.domains[want].free)
                assert before - sum(free[want]) == g * pods  # exactly its pods taken
        for g, index in room._index.items():  # the index is the domains' slots, in order
            assert index == sorted((d.slots(g), -d.headroom, d.name)
                                   for d in room.domains.values() if d.slots(g) > 0)


def test_small_pods_fill_the_fullest_nodes_first() -> None:
    """As Kueue packs a domain: a 1-GPU pod goes to a node with 1 GPU free, so the node with
    4 free still takes a 4-GPU pod."""
    f = factory({0: 16}, racks=1)
    f = replace(f, nodes=tuple(replace(n, gpus_allocated=3) if n.name == "r0-n00" else n
                               for n in f.nodes))  # c0: free 1, 4, 4 (and 15 full nodes)
    room = Room(ClusterSnapshot(f, ()))
    assert room.place(1, 1) == "c0"
    assert room.place(4, 2) == "c0"


def test_a_domain_kueue_sees_full_is_not_chosen(ev: Evaluator) -> None:
    """c1 is the best fit in the pods' view, but a workload holding quota there has pods not
    bound yet (Kueue's TAS counts its hosts): c2 is chosen. Before, c1 — and the workload
    waited for a domain Kueue saw full."""
    f = factory({0: 18, 1: 12, 2: 10})  # pods' view: c1 6 nodes free, c2 8
    holder = replace(elastic("holder", pods=16, tier=0, phase=Phase.RESERVED),
                     check_state=CheckState.READY)
    hosts = tuple(f"r1-n{i:02d}" for i in range(4))  # 64 GPUs on 4 of c1's hosts: 8 left
    s = ClusterSnapshot(f, (holder, elastic("e")), placements={holder.key: hosts})
    assert selector(checks(s, ev)["e"]) == {CLIQUE: "c2"}
    alone = ClusterSnapshot(f, (holder, elastic("e")))  # no placements read: the pods' view
    assert selector(checks(alone, ev)["e"]) == {CLIQUE: "c1"}


def test_what_one_reconcile_places_is_taken_from_kueues_view_too(ev: Evaluator) -> None:
    """c1 has 8 nodes free in the pods' view but 16 GPUs (4 pods) in Kueue's: the first
    4-pod job goes there, the second to c2."""
    f = factory({0: 18, 1: 10, 2: 6})  # pods' view: c1 8 nodes free, c2 12
    holder = replace(elastic("holder", pods=14, tier=0, phase=Phase.RESERVED),
                     check_state=CheckState.READY)
    hosts = tuple(f"r1-n{i:02d}" for i in range(14))  # 56 GPUs: Kueue sees 16 free in c1
    s = ClusterSnapshot(f, (holder, elastic("a"), elastic("b")),
                        placements={holder.key: hosts})
    by = checks(s, ev)
    assert (selector(by["a"]), selector(by["b"])) == ({CLIQUE: "c1"}, {CLIQUE: "c2"})
