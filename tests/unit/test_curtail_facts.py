"""The Preemption facts kept per reconcile (m2g.planner.shedding.facts, issue 14): a plan's
second ``power_actions`` (firm work admitted beyond the room) reads the first one's, and a
builder never hands back facts made with another evaluator or config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from m2g.model.cluster import Phase
from m2g.planner.inputs import InputBuilder
from m2g.planner.plan import make_plan
from m2g.planner.shedding import facts, power_actions, workload_kw
from m2g.policy import Evaluator
from tests.unit.policy_helpers import evaluator, policy
from tests.unit.test_curtail import CFG, POLICIES, factory, job, snap


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    return evaluator(Path(tmp_path_factory.mktemp("p")), "cel-expr-python", POLICIES)


def counting(ev: Evaluator, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many workloads each Preemption batch of ``ev`` held, one entry per batch."""
    calls: list[int] = []
    real = ev.preemption_items

    def spy(base: Any, items: Any) -> Any:
        calls.append(len(items))
        return real(base, items)

    monkeypatch.setattr(ev, "preemption_items", spy)
    return calls


def firm_case() -> tuple[Any, float]:
    """A running flexible job and firm work reserved 3 kW under an event's target, and the
    firm work's kW beyond the room."""
    flex, other = job("x", 2), job("y", 3, gpus=8)
    firm = replace(job("f", 0, gpus=8), phase=Phase.RESERVED, check="m2g",
                   check_state=None, admitted_at=None)
    return snap(factory(draw_kw=300.0 - 3.0), flex, other, firm), workload_kw(firm, CFG) - 3.0


def test_the_second_power_plan_of_a_reconcile_reuses_the_preemption_stage(
        ev: Evaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    s, beyond = firm_case()
    calls = counting(ev, monkeypatch)
    plan = make_plan(s, ev, CFG)
    assert f"new firm work admitted {beyond:.0f} kW beyond the room" in plan.notes[0]
    assert calls == [2]  # two running workloads, one batch for both plans
    # the second plan on a builder that planned once equals it on a builder of its own
    b = InputBuilder(s, CFG.default_kw_per_gpu)
    power_actions(ev, b, CFG)
    again = power_actions(ev, b, CFG, firm_kw=beyond)
    assert again == power_actions(ev, InputBuilder(s, CFG.default_kw_per_gpu), CFG,
                                  firm_kw=beyond)
    assert again[1] and calls == [2, 2, 2]


def test_facts_made_with_another_evaluator_or_config_are_not_reused(
        ev: Evaluator, tmp_path: Path) -> None:
    s, _ = firm_case()
    b = InputBuilder(s, CFG.default_kw_per_gpu)
    first = facts(ev, b, CFG)
    assert facts(ev, b, CFG) is first and first.ladders is not None
    assert sorted(k for _, g in first.groups for k in (c.key for c in g)) == ["t/x", "t/y"]
    # another evaluator: its own results (it protects tier 3), not the kept ones
    fussy = evaluator(tmp_path, "cel-expr-python", {"shed.yaml": policy("shed", "Preemption", """
        - {name: flexible, when: "workload.flexTier >= 1", score: "1.0"}
        - {name: keep, when: "workload.flexTier == 3", eligible: "false"}
    """)})
    other = facts(fussy, b, CFG)
    assert [c.key for _, g in other.groups for c in g] == ["t/x"]
    assert not other.results["t/y"].eligible and first.results["t/y"].eligible
    # another config, even an equal one: its own candidates' kW and levers
    pauses = replace(CFG, power_caps=False, shed_saving_fraction=0.5)
    mine = facts(fussy, b, pauses)
    assert mine.ladders is None and mine.elastic == []
    assert [c.kw for _, g in mine.groups for c in g] == [
        workload_kw(s.workloads[0], CFG) * 0.5]
    assert facts(fussy, b, replace(pauses)) is not mine
    # and back: new facts again, equal to the first
    assert facts(ev, b, CFG).results == first.results
