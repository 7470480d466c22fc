"""InputBuilder.covered (a flavor's part of the factory, its Capacity input's ``domains``) reads
a per-snapshot index of each domain's cliques and position instead of two passes over every
domain per flavor (2026-12-06: ~90 flavors × ~3,100 domains at 1,400 racks): the result is
the straightforward filter's, keys and order, on random factories and on random domain trees
whose cliques hang under racks, blocks, power domains or nothing, and whose names differ from
their keys."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from m2g.model.cluster import ClusterSnapshot
from m2g.model.inputs import DomainKind, DomainView
from m2g.planner.inputs import InputBuilder, Views
from tests.unit.test_domain_views_index import _factory


def _reference(b: InputBuilder, name: str) -> dict[str, DomainView]:
    """``covered`` as computed before the index (2026-12-05)."""
    doms = b.v.domains
    if name == b.snap.factory.site or name not in doms:
        return doms
    under: dict[str, list[str]] = {}
    for r in b.snap.factory.racks:
        for key in {r.power_domain, r.block, r.name} - {""}:
            under.setdefault(key, []).append(r.name)
    keep: set[str] = set()
    for start in (name, *under.get(name, ())):
        n = start
        while n in doms and n not in keep:
            keep.add(n)
            n = doms[n].parent
    keep |= {d.name for d in doms.values() if d.parent in keep and d.kind is DomainKind.CLIQUE}
    return {k: v for k, v in doms.items() if k in keep}


def _check(b: InputBuilder, names: list[str]) -> None:
    for name in names:
        got, want = b.covered(name), _reference(b, name)
        assert list(got) == list(want), name
        assert all(got[k] is want[k] for k in want)


@pytest.mark.parametrize("seed", range(40))
def test_covered_is_the_filter_on_random_factories(seed: int) -> None:
    rng = random.Random(seed)
    b = InputBuilder(ClusterSnapshot(factory=_factory(rng)))
    names = [*b.v.domains, "nowhere", b.snap.factory.site]
    rng.shuffle(names)
    _check(b, names + names)  # the second time from the memo


@pytest.mark.parametrize("seed", range(40))
def test_covered_is_the_filter_on_random_domain_trees(seed: int) -> None:
    rng = random.Random(1000 + seed)
    snap = ClusterSnapshot(factory=_factory(rng))
    b = InputBuilder(snap)
    doms = dict(b.v.domains)
    kinds = list(DomainKind)
    keys = list(doms)
    for i in range(rng.randrange(1, 30)):  # cliques and others under anything, or nothing
        key = f"x{i}"
        parent = rng.choice([*keys, "", "missing"])
        doms[key] = DomainView(name=rng.choice((key, key, f"other{i}", rng.choice(keys))),
                               parent=parent, kind=rng.choice(
                                   (DomainKind.CLIQUE, DomainKind.CLIQUE, rng.choice(kinds))))
        keys.append(key)
    items = list(doms.items())
    rng.shuffle(items)  # the order of ``domains`` is the order kept
    b.v = replace(b.v, domains=dict(items))
    assert isinstance(b.v, Views)
    names = list(b.v.domains)
    rng.shuffle(names)
    _check(b, names)
