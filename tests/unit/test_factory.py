"""The factory snapshot and its projection to CEL inputs: counts, fail-safe rules, events."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from m2g.model.factory import (
    MISSING,
    FactorySnapshot,
    GridEvent,
    MaintenanceWindow,
    Node,
    PowerDomain,
    Rack,
    Reading,
    domain_views,
    grid_view,
    site_view,
)
from m2g.model.inputs import DomainKind

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


COOL, DRAW = Reading(25.0, 5.0), Reading(100.0, 5.0)


def snap(inlet: Reading = COOL, power: Reading = DRAW, **kw: object) -> FactorySnapshot:
    nodes = (Node("n0", "r0", gpus_allocated=3), Node("n1", "r0", reasons=("NotReady",)),
             Node("n2", "r0", unhealthy_gpus=1))
    rack = Rack("r0", "b0", "pd0", "uuid.7", power_kw=power, cap_kw=132.0, inlet_c=inlet,
                limit_c=32.0)
    return FactorySnapshot(now=NOW, site="s", site_budget_kw=500.0,
                           power_domains=(PowerDomain("pd0", 400.0),), racks=(rack,),
                           nodes=nodes, **kw)  # type: ignore[arg-type]


def test_gpu_counts_per_domain() -> None:
    d = domain_views(snap())
    assert (d["r0"].total_gpus, d["r0"].healthy_gpus, d["r0"].free_gpus) == (12, 7, 4)
    assert d["uuid.7"].kind is DomainKind.CLIQUE and d["uuid.7"].parent == "r0"
    assert d["b0"].healthy_gpus == 7 and d["s"].kind is DomainKind.SITE
    assert d["pd0"].power.headroom_kw == 300.0  # 400 budget - the rack's 100 kW


def test_stale_power_means_no_headroom() -> None:
    stale = snap(power=Reading(100.0, 999.0))
    assert domain_views(stale)["r0"].power.headroom_kw == 0.0  # at its cap
    assert site_view(stale).power.headroom_kw == 0.0


def test_thermal_stale_counts_as_at_limit_but_missing_as_unknown() -> None:
    stale = domain_views(snap(inlet=Reading(25.0, 999.0)))["r0"].thermal
    assert (stale.inlet_c, stale.headroom_c) == (32.0, 0.0)
    missing = domain_views(snap(inlet=MISSING))["r0"].thermal
    assert (missing.inlet_c, missing.limit_c, missing.alarm) == (0.0, 0.0, False)
    hot = domain_views(snap(inlet=Reading(33.0, 5.0)))["r0"].thermal
    assert hot.alarm  # a fresh reading over the limit raises the alarm


def test_grid_event_from_a_reduction_and_a_baseline() -> None:
    ev = GridEvent("dr", NOW - timedelta(minutes=1), NOW + timedelta(minutes=30),
                   reduction_pct=30.0, baseline_kw=1000.0)
    s = snap(grid_events=(ev,))
    g = grid_view(s).event
    assert g.active and g.target_kw == 700.0 and g.ends_in_seconds == 1800
    assert s.effective_budget_kw() == 500.0  # the site budget is lower still
    later = snap(grid_events=(GridEvent("x", NOW + timedelta(hours=1),
                                        NOW + timedelta(hours=2), target_kw=50.0),))
    assert not grid_view(later).event.active and grid_view(later).event.starts_in_seconds == 3600
    assert later.effective_budget_kw() == 500.0


def test_maintenance_starts_in_and_active() -> None:
    soon = MaintenanceWindow("mw", NOW + timedelta(minutes=10), NOW + timedelta(hours=1),
                             nodes=("n0",))
    d = domain_views(snap(maintenance=(soon,)), with_nodes=True)
    assert d["n0"].maintenance.starts_in_seconds == 600 and not d["n1"].maintenance.starts_in_seconds
    # one node of the rack does not take the rack (or the site) into maintenance: m2g taints it
    assert not d["r0"].maintenance.starts_in_seconds
    assert not d[snap().site].maintenance.starts_in_seconds
    whole = replace(soon, nodes=(), racks=("r0",))
    assert domain_views(snap(maintenance=(whole,)))["r0"].maintenance.starts_in_seconds == 600
    now = MaintenanceWindow("mw", NOW - timedelta(minutes=1), NOW + timedelta(hours=1),
                            racks=("r0",))
    assert domain_views(snap(maintenance=(now,)))["r0"].maintenance.active
