"""A WorkloadState keeps its fields in slots, no instance dict (issue 14): the planner reads
100,000 of them in some fifteen passes a reconcile at 1,400 racks, paced by the memory each
read touches (docs/benchmarks.md, twenty-sixth and twenty-seventh sessions). Its ``key`` is
worked out once, kept right by every way of making a state, and never compared."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from m2g.k8s import build as kb
from m2g.model.cluster import WorkloadState
from m2g.testing.scale import LABELS, NOW, generate


def states() -> list[WorkloadState]:
    objs, readings = generate(4, 120)
    return list(kb.build_snapshot(objs, readings, NOW, labels=LABELS).workloads)


def slotted(w: WorkloadState) -> bool:
    """No instance dict: every field in a slot."""
    return not hasattr(w, "__dict__")


def test_converted_states_are_slotted_with_their_key() -> None:
    ws = states()
    assert ws and all(slotted(w) for w in ws)
    assert all(w.key == f"{w.namespace}/{w.name}" for w in ws)


def test_copies_are_slotted_and_keep_their_key_right() -> None:
    w = states()[0]
    viewed = w.with_view(w.view, power_cap=0.5)
    assert slotted(viewed) and viewed.key == w.key and viewed.power_cap == 0.5
    assert viewed.view is w.view and viewed.uid == w.uid and viewed != w
    assert w.with_view(w.view) == w
    moved = w.with_view(w.view, name="moved")
    assert moved.key == f"{w.namespace}/moved"
    renamed = dataclasses.replace(w, name="other")
    assert slotted(renamed) and renamed.key == f"{w.namespace}/other"
    made = WorkloadState(namespace="ns", name="n", phase=w.phase, view=w.view)
    assert slotted(made) and made.key == "ns/n"
    assert renamed != w and dataclasses.replace(renamed, name=w.name) == w
    with pytest.raises(AttributeError):
        w.with_view(w.view, no_such_field=1)


def test_a_state_pickles_with_its_key() -> None:
    """``m2g forecast --save`` pickles a snapshot."""
    w = states()[0]
    back = pickle.loads(pickle.dumps(w))
    assert back == w and back.key == w.key and slotted(back)
