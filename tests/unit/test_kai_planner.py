"""The pure KAI planner: Topology levels from node labels, Queue GPU limits from power budgets."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from m2g.model import labels as L
from m2g.model.cluster import ClusterSnapshot, KaiQueueState, KaiState, KaiTopologyState
from m2g.model.factory import FactorySnapshot, GridEvent, PowerDomain
from m2g.planner.config import PlannerConfig
from m2g.planner.kai import kai_updates, queue_updates, site_fraction, topology_updates
from m2g.planner.plan import make_plan
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
CFG = PlannerConfig()
ALL = frozenset({L.BLOCK, L.RACK, L.HOSTNAME, L.GPU_CLIQUE, "kubernetes.io/os"})
FULL = (L.BLOCK, L.RACK, L.GPU_CLIQUE, L.HOSTNAME)  # the default mapping's levels


def factory(event_kw: float = 0.0, site_kw: float = 300.0,
            domains: tuple[PowerDomain, ...] = (PowerDomain("pd-a", 134.0),)) -> FactorySnapshot:
    events = (GridEvent("dr", NOW - timedelta(minutes=1), NOW + timedelta(hours=1),
                        target_kw=event_kw),) if event_kw else ()
    return FactorySnapshot(now=NOW, site="site", site_budget_kw=site_kw, power_domains=domains,
                           grid_events=events)


def q(name: str, quota: float, limit: float = -1, base: float | None = None,
      domain: str = "pd-a", last: datetime | None = None) -> KaiQueueState:
    return KaiQueueState(name, domain, quota, limit, limit if base is None else base, last)


def snap(f: FactorySnapshot, *queues: KaiQueueState,
         topologies: tuple[KaiTopologyState, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(factory=f, kai=KaiState(ALL, topologies, queues))


def limits(s: ClusterSnapshot, config: PlannerConfig = CFG) -> dict[str, float]:
    assert s.kai is not None
    return {u.queue: u.limit for u in queue_updates(s, s.kai, config)[0]}


# ---- Topology ------------------------------------------------------------------------------

def test_topology_levels_follow_the_labels_gpu_nodes_carry() -> None:
    ups, notes = topology_updates(KaiState(ALL), CFG)
    assert [(u.name, u.levels, u.replace) for u in ups] == [
        ("nvl72", FULL, False)]
    assert notes == []
    ups, _ = topology_updates(KaiState(frozenset({L.RACK, L.HOSTNAME})), CFG)
    assert ups[0].levels == (L.RACK, L.HOSTNAME)


def test_topology_in_step_is_left_alone_and_a_changed_one_is_replaced() -> None:
    mine = KaiTopologyState("nvl72", (L.RACK, L.HOSTNAME), managed_by_m2g=True)
    assert topology_updates(KaiState(frozenset({L.RACK, L.HOSTNAME}), (mine,)), CFG) == ([], [])
    ups, _ = topology_updates(KaiState(ALL, (mine,)), CFG)
    assert len(ups) == 1 and ups[0].replace and ups[0].levels == FULL


def test_a_topology_m2g_did_not_create_is_never_replaced() -> None:
    theirs = KaiTopologyState("nvl72", (L.GPU_CLIQUE, L.HOSTNAME), managed_by_m2g=False)
    ups, notes = topology_updates(KaiState(ALL, (theirs,)), CFG)
    assert ups == [] and "did not create it" in notes[0]


def test_no_topology_when_kai_serves_no_topology_crd() -> None:
    assert topology_updates(KaiState(ALL, topology_served=False), CFG) == ([], [])


def test_no_topology_without_labelled_gpu_nodes() -> None:
    ups, notes = topology_updates(KaiState(frozenset({"kubernetes.io/os"})), CFG)
    assert ups == [] and "no GPU node" in notes[0]


def test_nothing_for_kai_when_its_crds_are_absent() -> None:
    s = ClusterSnapshot(factory=factory(event_kw=50.0))
    assert kai_updates(s, CFG) == ([], [], [])


# ---- Queue GPU limits ----------------------------------------------------------------------

def test_budget_gpus_shared_in_proportion_to_quota() -> None:
    # pd-a: 134 kW / 1.34 kW per GPU = 100 GPUs; quotas 30:10 -> 75 and 25
    assert limits(snap(factory(), q("a", 30), q("b", 10))) == {"a": 75, "b": 25}


def test_never_above_the_platform_teams_limit() -> None:
    # shares 75 and 25: a keeps its 60, b goes down to 25
    assert limits(snap(factory(), q("a", 30, limit=60), q("b", 10, limit=40))) == {"b": 25}


def test_grid_event_scales_domain_budgets_with_the_site() -> None:
    f = factory(event_kw=150.0)  # the site may draw half its 300 kW budget
    assert site_fraction(f) == 0.5
    # pd-a: 67 kW -> 50 GPUs; 30:10 -> 37 and 12
    assert limits(snap(f, q("a", 30, limit=60), q("b", 10, limit=40))) == {"a": 37, "b": 12}


def test_grid_event_without_a_site_budget_scales_by_the_domains_total() -> None:
    f = factory(event_kw=100.0, site_kw=0.0, domains=(PowerDomain("pd-a", 134.0),
                                                      PowerDomain("pd-b", 66.0)))
    assert site_fraction(f) == 0.5
    assert limits(snap(f, q("a", 10))) == {"a": 50}


def test_a_queue_naming_the_site_gets_the_limit_in_force() -> None:
    f = factory(event_kw=67.0)
    assert limits(snap(f, q("a", 8, domain="site"))) == {"a": 50}


def test_restored_to_the_platforms_value_after_the_event() -> None:
    last = NOW - timedelta(seconds=CFG.quota_raise_dwell_seconds + 1)
    s = snap(factory(), q("a", 30, limit=37, base=60, last=last))
    ups, _ = queue_updates(s, s.kai, CFG)  # type: ignore[arg-type]
    assert [(u.queue, u.limit, u.base) for u in ups] == [("a", 60, 60)]


def test_raising_waits_for_the_dwell_lowering_does_not() -> None:
    recent = NOW - timedelta(seconds=10)
    assert limits(snap(factory(), q("a", 30, limit=37, base=60, last=recent))) == {}
    # a 60 kW grid limit is 1/5 of the site: pd-a gets 26.8 kW -> 20 GPUs, at once
    assert limits(snap(factory(event_kw=60.0), q("a", 30, limit=37, base=60, last=recent))) \
        == {"a": 20}


def test_small_changes_are_skipped_unless_back_to_base() -> None:
    # 134 kW -> 100 GPUs; a limit of 98 is within the 4-GPU hysteresis of 100
    assert limits(snap(factory(), q("a", 10, limit=98))) == {}
    last = NOW - timedelta(hours=1)
    assert limits(snap(factory(), q("a", 10, limit=98, base=100, last=last))) == {"a": 100}


def test_unlimited_back_from_a_budget_is_a_raise() -> None:
    f = factory(domains=(PowerDomain("pd-a", 0.0),))  # no budget: the platform's value
    recent = NOW - timedelta(seconds=5)
    assert limits(snap(f, q("a", 10, limit=50, base=-1, last=recent))) == {}
    assert limits(snap(f, q("a", 10, limit=50, base=-1))) == {"a": -1}


def test_equal_shares_when_no_queue_has_a_quota() -> None:
    assert limits(snap(factory(), q("a", -1), q("b", 0))) == {"a": 50, "b": 50}


def test_unknown_power_domain_leaves_the_limit() -> None:
    s = snap(factory(), q("a", 10, limit=8, domain="nope"))
    ups, notes = queue_updates(s, s.kai, CFG)  # type: ignore[arg-type]
    assert ups == [] and "PowerDomain nope not found" in notes[0]


def test_kw_per_gpu_is_configurable() -> None:
    cfg = replace(CFG, kai_kw_per_gpu=2.68)
    assert limits(snap(factory(), q("a", 10)), cfg) == {"a": 50}


def test_make_plan_carries_the_kai_changes(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {"cap.yaml": policy("cap", "Capacity", """
        - {name: healthy, when: "true", quota: "flavor.healthyGpus"}
    """)})
    plan = make_plan(snap(factory(), q("a", 10)), ev, CFG)
    assert [u.name for u in plan.kai_topologies] == ["nvl72"]
    assert [(u.queue, u.limit) for u in plan.kai_queues] == [("a", 100)]
    assert not plan.empty()
    applied = snap(factory(), q("a", 10, limit=100),
                   topologies=(KaiTopologyState("nvl72", FULL, True),))
    assert make_plan(applied, ev, CFG).empty()
