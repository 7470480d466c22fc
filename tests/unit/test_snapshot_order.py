"""The Workloads in name order without sorting them all again each snapshot (2026-12-06):
``sorted_names`` keeps the last order while the names are the same and otherwise merges the
names kept with the new ones; the result is ``sorted`` of the names, every time, over random
sequences of updates, additions, removals and swaps (a name gone and another come: the same
count), in random arrival order; memoised snapshots whose workloads come and go list them
as the plain ones do."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

import pytest

from m2g.k8s import build as kb
from m2g.testing.scale import LABELS, NOW, generate


def _name(rng: random.Random) -> str:
    return f"ns-{rng.randrange(5)}/{rng.choice('abcxyz')}{rng.randrange(10**6):06d}"


@pytest.mark.parametrize("seed", range(30))
def test_sorted_names_is_sorted_over_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    objs: dict[str, Any] = {}
    for _ in range(rng.randrange(0, 300)):
        objs[_name(rng)] = {}
    kept: tuple[list[str], list[str]] = ([], [])
    for _ in range(25):
        change = rng.choice(("same", "update", "add", "remove", "swap", "reorder", "clear"))
        if change == "update" and objs:
            objs[rng.choice(list(objs))] = {"v": rng.random()}  # in place: order kept
        elif change == "add":
            for _ in range(rng.randrange(1, 20)):
                objs[_name(rng)] = {}
        elif change == "remove" and objs:
            for k in rng.sample(list(objs), min(len(objs), rng.randrange(1, 20))):
                del objs[k]
        elif change == "swap" and objs:  # the same count, another name
            del objs[rng.choice(list(objs))]
            objs[_name(rng)] = {}
        elif change == "reorder":
            items = list(objs.items())
            rng.shuffle(items)
            objs = dict(items)
        elif change == "clear" and rng.random() < 0.3:
            objs = {}
        order, kept = kb.sorted_names(objs, kept)
        assert order == sorted(objs)
        again, kept2 = kb.sorted_names(objs, kept)  # nothing changed: the kept order itself
        assert again is order and kept2 is kept


def test_a_swap_of_one_name_is_seen() -> None:
    objs = {"a": 1, "c": 2}
    order, kept = kb.sorted_names(objs, ([], []))
    objs2 = {"b": 1, "c": 2}
    order2, _ = kb.sorted_names(objs2, kept)
    assert order == ["a", "c"] and order2 == ["b", "c"]


def test_memoised_snapshots_list_workloads_that_come_and_go_as_plain_ones() -> None:
    objs, readings = generate(4, 120)
    rng = random.Random(5)
    memo = kb.SnapshotMemo()
    names = list(objs.workloads)
    rng.shuffle(names)  # arrival order, not name order
    objs = dataclasses.replace(objs, workloads={n: objs.workloads[n] for n in names})
    spare: dict[str, Any] = {}
    for seconds in range(0, 80, 10):
        workloads = dict(objs.workloads)
        for k in rng.sample(sorted(workloads), 5):  # some go...
            spare[k] = workloads.pop(k)
        for k in rng.sample(sorted(spare), min(3, len(spare))):  # ...and come back, at the end
            workloads[k] = spare.pop(k)
        objs = dataclasses.replace(objs, workloads=workloads)
        now = NOW + timedelta(seconds=seconds)
        warm = kb.build_snapshot(objs, readings, now, memo=memo, labels=LABELS)
        plain = kb.build_snapshot(objs, readings, now, labels=LABELS)
        assert [w.key for w in warm.workloads] == [w.key for w in plain.workloads]
        assert [w.key for w in warm.workloads] == sorted(w.key for w in warm.workloads)
