"""domain_views counts each rack's GPUs once and groups the racks by power domain and block in
one pass (2026-12-04): the views are those of the straightforward computation (every domain
summing its own nodes, every rack scanned per domain) on random factories, with racks left
out of every power domain or block, empty racks, unhealthy and allocated GPUs, stale readings
and maintenance windows."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from m2g.model import factory as F
from m2g.model.factory import (
    DomainKind,
    FactorySnapshot,
    MaintenanceWindow,
    Node,
    PowerDomain,
    Rack,
    Reading,
    domain_views,
)
from m2g.model.inputs import DomainPower, DomainView

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _reference(snap: FactorySnapshot) -> dict[str, DomainView]:
    """The power domains' and blocks' views as computed before the index."""
    views: dict[str, DomainView] = {}
    for pd in snap.power_domains:
        racks = [r for r in snap.racks if r.power_domain == pd.name]
        nodes = [n for r in racks for n in snap.nodes_of(r.name)]
        rack_sum = Reading(sum(r.power_kw.value or 0.0 for r in racks),
                           max((r.power_kw.age_seconds for r in racks), default=0.0)) \
            if racks and not any(r.power_kw.stale for r in racks) else F.MISSING
        draw = pd.draw_kw if not pd.draw_kw.stale else rack_sum
        views[pd.name] = DomainView(
            name=pd.name, parent=snap.site, kind=DomainKind.POWER_DOMAIN,
            **F._gpu_counts(nodes),
            power=DomainPower(draw_kw=draw.or_else(pd.budget_kw), cap_kw=pd.budget_kw),
            maintenance=F._maintenance(snap, nodes))
    for block in sorted({r.block for r in snap.racks if r.block}):
        nodes = [n for r in snap.racks if r.block == block for n in snap.nodes_of(r.name)]
        views[block] = DomainView(name=block, parent=snap.site, kind=DomainKind.BLOCK,
                                  maintenance=F._maintenance(snap, nodes),
                                  **F._gpu_counts(nodes))
    for rack in snap.racks:
        views[rack.name] = F._rack_view(snap, rack, DomainKind.RACK, rack.name)
    return views


def _factory(rng: random.Random) -> FactorySnapshot:
    n_racks = rng.randrange(1, 40)
    racks = tuple(Rack(
        name=f"r{i}", block=rng.choice(("", "b0", "b1", "b2")),
        power_domain=rng.choice(("", "pd0", "pd1", "pd2", "pd3")), clique=f"c{i}",
        power_kw=Reading(rng.uniform(50, 120), rng.choice((1.0, 500.0))),
        cap_kw=130.0) for i in range(n_racks))
    nodes = tuple(Node(
        name=f"r{r}-n{j}", rack=f"r{r}", gpus=4, gpus_allocated=rng.randrange(5),
        unhealthy_gpus=rng.randrange(2), reasons=("xid",) if rng.random() < 0.1 else (),
        block=racks[r].block, power_domain=racks[r].power_domain)
        for r in range(n_racks) for j in range(rng.randrange(0, 5)))
    windows = tuple(MaintenanceWindow(
        name=f"m{k}", start=NOW + timedelta(minutes=rng.randrange(-30, 30)),
        end=NOW + timedelta(hours=1), racks=tuple(rng.sample([r.name for r in racks],
                                                             k=min(3, n_racks))),
        blocks=(rng.choice(("b0", "b1")),)) for k in range(rng.randrange(3)))
    domains = tuple(PowerDomain(name=f"pd{k}", budget_kw=500.0) for k in range(5))
    return FactorySnapshot(now=NOW, site_budget_kw=5000.0, power_domains=domains,
                           racks=racks, nodes=nodes, maintenance=windows)


@pytest.mark.parametrize("seed", range(40))
def test_domain_views_equal_the_straightforward_computation(seed: int) -> None:
    snap = _factory(random.Random(seed))
    got = domain_views(snap)
    for name, view in _reference(snap).items():
        assert got[name] == view, name
