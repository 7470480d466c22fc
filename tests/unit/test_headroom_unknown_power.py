"""The headroom gate when the site's power is unknown (m2g.planner.headroom; docs/curtailment.md,
"When the site's power is unknown"): a stale, missing or invalid rack reading — Prometheus
down, hanging or answering garbage — never opens the gate. New work is admitted only where it
is known to fit with every rack without a fresh reading at its cap; during a grid event firm
work too (m2g never sheds on stale power); the Retry says "site power unknown"."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from m2g.model.cluster import CheckState, ClusterSnapshot, WorkloadState
from m2g.model.factory import (
    MISSING,
    FactorySnapshot,
    GridEvent,
    Node,
    PowerDomain,
    Rack,
    Reading,
)
from m2g.model.plan import CheckUpdate
from m2g.planner.headroom import POLICY, RULE_UNKNOWN, Headroom, draw_bound_kw, share
from m2g.planner.plan import make_plan
from m2g.planner.shedding import workload_kw
from m2g.policy import Evaluator, load_dir
from tests.unit.test_curtail import CFG, NOW, job
from tests.unit.test_headroom import pending, ready

ROOT = Path(__file__).resolve().parents[2]
LIMIT, CAP = 300.0, 100.0
#: Prometheus down (the query failed: no series), a reading gone stale (scraped 500 s ago),
#: a reading refused as impossible (m2g.signals.sanity: no value, age inf, as missing).
UNKNOWN = {"missing": MISSING, "stale": Reading(80.0, 500.0), "invalid": Reading(None, 1e308)}


def site(readings: tuple[Reading, ...], cap: float = CAP, event: bool = True,
         limit: float = LIMIT, budget: float = 1000.0, **ev: float) -> FactorySnapshot:
    racks = tuple(Rack(f"rack-{i}", "b0", "pd-0", power_kw=r, cap_kw=cap)
                  for i, r in enumerate(readings))
    nodes = tuple(Node(f"n{i}", "rack-0") for i in range(18))
    events = (GridEvent("dr", NOW - timedelta(minutes=1), NOW + timedelta(hours=1),
                        target_kw=limit, **ev),) if event else ()  # type: ignore[arg-type]
    return FactorySnapshot(now=NOW, site_budget_kw=budget, power_domains=(PowerDomain("pd-0"),),
                           racks=racks, nodes=nodes, grid_events=events)


def states(f: FactorySnapshot, *ws: WorkloadState, running: tuple[WorkloadState, ...] = (),
           cfg: object = CFG) -> list[CheckState]:
    s = ClusterSnapshot(f, (*ws, *running),
                        placements={w.key: (f"n{i}",) for i, w in enumerate(running)})
    return [u.state for u in share([ready(w) for w in ws], s, cfg)]  # type: ignore[arg-type]


def held(f: FactorySnapshot, *ws: WorkloadState) -> list[CheckUpdate]:
    out = share([ready(w) for w in ws], ClusterSnapshot(f, tuple(ws)), CFG)
    return [u for u in out if u.state is CheckState.RETRY]


def test_during_an_event_unknown_power_holds_new_work_it_admits_on_a_fresh_reading() -> None:
    """Before: a stale or missing reading turned the gate off, so during an event a firm job
    and every flexible job the policies admitted were admitted whatever the draw."""
    ws = (pending("firm", 0), pending("flex1", 1), pending("flex2", 2))
    fresh = site((Reading(100.0, 5.0), Reading(100.0, 5.0)))  # 85 kW of room: all fit
    assert states(fresh, *ws) == [CheckState.READY] * 3
    for name, r in UNKNOWN.items():
        f = site((r, Reading(100.0, 5.0)), cap=250.0)  # at its cap: 350 kW, over the limit
        out = held(f, *ws)
        assert [u.name for u in out] == ["firm", "flex1", "flex2"], name
        assert all(u.policy == POLICY and u.rule == RULE_UNKNOWN
                   and u.requeue_after_seconds == 30
                   and u.message.startswith("site power unknown: 1 of 2 rack(s) without a "
                                            "fresh power reading") for u in out), name
        assert "firm work too is admitted only where it is known to fit" in out[0].message
        assert "firm work too" not in out[2].message


def test_unknown_power_admits_what_fits_with_every_unread_rack_at_its_cap() -> None:
    w = pending("w0", 2)
    kw = workload_kw(w, CFG)
    ws = tuple(pending(f"w{i}", 2, priority=-i) for i in range(20))
    room = LIMIT * (1 - CFG.restore_margin)

    def admitted(*readings: Reading) -> int:
        return states(site(readings), *ws).count(CheckState.READY)

    both = room - 2 * CAP  # 85 kW: both racks at their 100 kW cap
    assert admitted(MISSING, MISSING) == int(both // kw) > 0
    one = room - CAP - 40.0  # one rack read fresh at 40 kW
    assert admitted(Reading(40.0, 5.0), MISSING) == int(one // kw) > int(both // kw)
    assert draw_bound_kw(site((Reading(40.0, 5.0), MISSING))) == (
        140.0, "1 of 2 rack(s) without a fresh power reading (never read or invalid)")
    head = Headroom.of(ClusterSnapshot(site((MISSING, MISSING)), ws), CFG)
    assert head is not None and head.unknown and head.draw == 2 * CAP


def test_during_an_event_firm_work_gets_no_room_m2g_could_make_on_unknown_power() -> None:
    """With a fresh reading firm work may count on pausing running flexible work; on stale
    power m2g never sheds, so firm work is admitted only under the limit itself."""
    firm = pending("firm", 0)
    kw = workload_kw(firm, CFG)
    flex = job("x", 2)  # running flexible work m2g could pause
    assert states(site((Reading(CAP, 5.0),) * 2, limit=2 * CAP + kw / 2), firm,
                  running=(flex,)) == [CheckState.READY]  # fresh: pausing x makes room
    f = site((MISSING, MISSING), limit=2 * CAP + kw / 2)  # the caps leave half its kW
    assert states(f, firm, running=(flex,)) == [CheckState.RETRY]
    roomy = site((MISSING, MISSING), limit=2 * CAP + kw + 0.5)  # fits under the limit itself
    assert states(roomy, firm, running=(flex,)) == [CheckState.READY]
    off = replace(CFG, hold_firm_beyond_reach=False)  # documented: firm work never held
    assert states(f, firm, running=(flex,), cfg=off) == [CheckState.READY]


def test_outside_an_event_unknown_power_holds_flexible_work_beyond_the_budget_only() -> None:
    ws = (pending("firm", 0), pending("flex1", 1), pending("flex2", 2))
    over = site((MISSING, MISSING), cap=600.0, event=False, budget=1000.0)  # 1200 kW at caps
    assert states(over, *ws) == [CheckState.READY, CheckState.READY, CheckState.RETRY]
    (u,) = held(over, *ws)
    assert u.rule == RULE_UNKNOWN and "firm work too" not in u.message
    fits = site((MISSING, MISSING), cap=300.0, event=False, budget=1000.0)
    assert states(fits, *ws) == [CheckState.READY] * 3
    none = site((MISSING, MISSING), cap=600.0, event=False, budget=0.0)  # no limit at all
    assert states(none, *ws) == [CheckState.READY] * 3


def test_a_percentage_event_without_a_baseline_holds_all_new_work() -> None:
    """Its limit is the baseline less the reduction; never measured (no fresh draw since
    before the start), nothing is known to fit — the site budget is no stand-in for it."""
    ws = (pending("firm", 0), pending("flex2", 2))
    f = site((MISSING, MISSING), limit=0.0, reduction_pct=30.0)
    out = held(f, *ws)
    assert [u.name for u in out] == ["firm", "flex2"]
    assert all("has no baseline" in u.message and u.rule == RULE_UNKNOWN for u in out)
    measured = site((MISSING, MISSING), cap=50.0, limit=0.0, reduction_pct=30.0,
                    baseline_kw=400.0)  # 280 kW limit, 100 kW at the caps
    assert states(measured, *ws) == [CheckState.READY, CheckState.READY]


def test_a_rack_without_a_cap_and_without_a_reading_bounds_nothing() -> None:
    f = site((Reading(50.0, 5.0), MISSING), cap=0.0)
    assert draw_bound_kw(f)[0] == float("inf")
    out = held(f, pending("firm", 0), pending("flex2", 2))
    assert len(out) == 2 and "without a cap" in out[1].message


def test_without_the_power_budget_policy_unknown_power_during_an_event_admits_nothing_new(
        tmp_path: Path) -> None:
    """The whole plan with the shipped policies (deploy/policies) but power-budget, whose
    "defer-site-headroom" was the only thing that held new work on stale power: Prometheus
    down during a grid event. Before, both jobs were admitted (the gate was off on stale
    power); now the gate holds them itself, whichever policies are installed."""
    for p in (ROOT / "deploy" / "policies").glob("*.yaml"):
        if p.name != "power-budget.policy.yaml" and p.name != "kustomization.yaml":
            (tmp_path / p.name).write_text(p.read_text())
    ev = Evaluator(load_dir(tmp_path, "cel-expr-python"))
    firm, flex = pending("firm", 0, gpus=8), pending("flex", 2, gpus=8)
    f = site((MISSING, MISSING), cap=132.0, limit=200.0)
    plan = make_plan(ClusterSnapshot(f, (firm, flex)), ev, CFG)
    answers = {c.name: c for c in plan.checks}
    assert answers["firm"].state is CheckState.RETRY
    assert answers["firm"].rule == RULE_UNKNOWN
    assert "site power unknown" in answers["firm"].message
    assert answers["flex"].state is not CheckState.READY
    fresh = site((Reading(60.0, 5.0),) * 2, cap=132.0, limit=200.0)
    plan = make_plan(ClusterSnapshot(fresh, (firm, flex)), ev, CFG)
    assert {c.name: c.state for c in plan.checks}["firm"] is CheckState.READY
