"""Decisions kept across reconciles (m2g.policy.batch.memo, 2026-12-04): an Evaluator that
evaluated earlier batches decides each new batch as a fresh Evaluator does — on random running
workloads whose checkpoint ages advance between batches, some of whose fields change, with a
grid event whose level changes the policy's hoisted variable (``severe``) on the way — and the
memo stays bounded to the last two batches."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from m2g.model.inputs import (
    Checkpoint,
    GridEventView,
    GridView,
    PolicyInput,
    QueueView,
    SitePower,
    SiteView,
    WorkloadItem,
    WorkloadView,
)
from m2g.policy import Evaluator, load_dir
from m2g.policy.batch.memo import PartMemos, Recent, frozen

POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "policies"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _base(step: int, level: int) -> PolicyInput:
    """A snapshot in a grid emergency (the Preemption stage fires) at ``step`` × 10 s."""
    return PolicyInput(
        site=SiteView(power=SitePower(budget_kw=1000.0, draw_kw=900.0)),
        grid=GridView(event=GridEventView(active=True, id="dr", level=level, target_kw=800.0)),
        now=NOW + timedelta(seconds=10 * step))


def _workloads(rng: random.Random, n: int) -> list[dict[str, int | bool]]:
    return [{"tier": rng.randrange(4), "priority": rng.randrange(-5, 50),
             "interval": rng.choice((0, 60, 120)), "age": rng.randrange(150),
             "reported": rng.random() < 0.5} for _ in range(n)]


def _advance(rng: random.Random, wls: list[dict[str, int | bool]]) -> None:
    """Ten seconds later: every age advances; a few workloads change or restart."""
    for w in wls:
        w["age"] = int(w["age"]) + 10
        if rng.random() < 0.05:
            w.update(_workloads(rng, 1)[0])


def _items(wls: list[dict[str, int | bool]]) -> list[WorkloadItem]:
    queue = QueueView(name="q")
    return [WorkloadItem(WorkloadView(
        name=f"w{i}", flex_tier=int(w["tier"]), priority=int(w["priority"]),
        checkpoint=Checkpoint(interval_seconds=int(w["interval"]),
                              last_age_seconds=int(w["age"]), reported=bool(w["reported"]))),
        queue) for i, w in enumerate(wls)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_preemption_with_memo_equals_a_fresh_evaluator(seed: int) -> None:
    rng = random.Random(seed)
    kept = Evaluator(load_dir(POLICIES, "cel-expr-python"))
    wls = _workloads(rng, 600)
    levels = [2, 2, 3, 3, 2, 2]
    for step, level in enumerate(levels):
        base, items = _base(step, level), _items(wls)
        fresh = Evaluator(load_dir(POLICIES, "cel-expr-python"))
        got = kept.preemption_items(base, items)
        assert got == fresh.preemption_items(base, items), f"step {step}"
        assert any(r.eligible for r in got) and len({r.score for r in got}) > 50
        if step in (1, 3, 5):  # the level did not change: the checkpoint classes were kept
            assert len(kept._fused.memos) > 0
        _advance(rng, wls)


def test_a_part_that_reads_the_snapshot_is_not_memoised() -> None:
    memos = PartMemos()
    ev = Evaluator(load_dir(POLICIES, "cel-expr-python"))
    policy = next(p for p in ev.policy_set.by_stage.values() for p in p
                  if p.name == "checkpoint-preemption")
    pure = memos.pure(policy, (policy.name, (3, 4), ("severe",)), frozenset({"site", "grid"}))
    # its tier rules test variables.severe: hoisted, it is a value of the key; not hoisted,
    # the rule reads the snapshot
    reads = memos.pure(policy, (policy.name, (0, 1, 2), ()), frozenset({"site", "grid"}))
    assert pure and not reads
    assert memos.memo(policy, (policy.name, (0, 1, 2), ()), [], {"site": 1, "grid": 2}) is None


def test_recent_keeps_two_generations() -> None:
    memo: Recent[int] = Recent()
    memo.turn()
    memo.put("a", 1)
    memo.turn()
    assert memo.get("a") == 1  # used in this generation: kept on
    memo.put("b", 2)
    memo.turn()
    memo.turn()
    assert memo.get("a") is None and memo.get("b") is None and len(memo) == 0


def test_hoisted_values_that_change_start_a_new_memo() -> None:
    memos = PartMemos()
    ev = Evaluator(load_dir(POLICIES, "cel-expr-python"))
    policy = next(p for p in ev.policy_set.by_stage.values() for p in p
                  if p.name == "checkpoint-preemption")
    part = (policy.name, (3, 4), ("severe",))
    one = memos.memo(policy, part, [False], {"site": 1})
    assert one is not None
    one.put("k", [])
    assert memos.memo(policy, part, [False], {"site": 1}) is one
    other = memos.memo(policy, part, [True], {"site": 1})
    assert other is not one and other is not None and other.get("k") is None
    assert frozen([1, 1.0, True]) != frozen([1, 1, 1])
