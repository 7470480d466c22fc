"""The per-snapshot clique facts (m2g.model.inputs.facts_of) against a plain scan of the cliques:
``cliquesFit`` counts usable (free healthy) GPUs, ``cliquesHealthyFit`` healthy GPUs free or busy
on cliques outside thermal alarm (health-admission's "could ever hold it")."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from m2g.model.inputs import (
    FACTS_MAX_GPUS,
    DomainKind,
    DomainThermal,
    DomainView,
    facts_of,
    topology_of,
    usable_gpus,
)


def _clique(name: str, total: int, healthy: int, free: int, alarm: bool = False) -> DomainView:
    return DomainView(name=name, kind=DomainKind.CLIQUE, total_gpus=total, healthy_gpus=healthy,
                      free_gpus=free, thermal=DomainThermal(alarm=alarm))


def test_a_busy_healthy_clique_could_hold_what_it_cannot_hold_now() -> None:
    facts = facts_of(topology_of({
        "a": _clique("a", 72, 72, 0),                # healthy, busy
        "b": _clique("b", 72, 68, 72),               # 4 unhealthy, idle: 68 usable
        "c": _clique("c", 72, 72, 72, alarm=True),   # healthy, idle, in thermal alarm
        "d": _clique("d", 0, 72, 72),                # size unknown: offers nothing
    }))
    assert facts.cliques_fit[72] == 1 and facts.cliques_fit[68] == 2  # c now, b too at 68
    assert facts.cliques_healthy_fit[72] == 1  # a: once its work ends; c is in alarm
    assert facts.cliques_healthy_fit[68] == 2  # a and b
    assert facts.cliques_healthy_fit[0] == 2 and facts.cliques_fit[0] == 3


@st.composite
def _cliques(draw: st.DrawFn) -> dict[str, DomainView]:
    out = {}
    for i in range(draw(st.integers(0, 6))):
        total = draw(st.sampled_from([0, 36, 72]))
        healthy = draw(st.integers(0, 72 if total == 0 else total))
        free = draw(st.integers(0, 72 if total == 0 else total))
        out[f"c{i}"] = _clique(f"c{i}", total, healthy, free, draw(st.booleans()))
    return out


@given(_cliques())
def test_the_facts_count_what_a_scan_counts(domains: dict[str, DomainView]) -> None:
    facts = facts_of(topology_of(domains))
    known = [c for c in domains.values() if c.total_gpus > 0]
    for n in range(FACTS_MAX_GPUS + 1):
        assert facts.cliques_fit[n] == sum(usable_gpus(c) >= n for c in known)
        assert facts.cliques_healthy_fit[n] == sum(
            c.healthy_gpus >= n and not c.thermal.alarm for c in known)
