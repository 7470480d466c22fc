"""A WorkloadState keeps its fields in a compact dict (issue 14): built field by field by the
dataclass ``__init__`` its dict is a 64-slot table of ~1.5 KB; the planner reads 100,000 of
them several times a reconcile at 1,400 racks (docs/benchmarks.md, twenty-sixth session)."""

from __future__ import annotations

import dataclasses
import sys

from m2g.k8s import build as kb
from m2g.model.cluster import WorkloadState
from m2g.testing.scale import LABELS, NOW, generate


def states() -> list[WorkloadState]:
    objs, readings = generate(4, 120)
    return list(kb.build_snapshot(objs, readings, NOW, labels=LABELS).workloads)


def compact(w: WorkloadState) -> bool:
    """Is ``w``'s dict no larger than the same entries built in one go?"""
    return sys.getsizeof(w.__dict__) <= sys.getsizeof(dict(w.__dict__))


def test_converted_states_have_compact_dicts_with_their_key() -> None:
    ws = states()
    assert ws and all(compact(w) for w in ws)
    assert all(w.__dict__["key"] == f"{w.namespace}/{w.name}" == w.key for w in ws)


def test_copies_are_compact_and_keep_their_key_right() -> None:
    w = states()[0]
    viewed = w.with_view(w.view, power_cap=0.5)
    assert compact(viewed) and viewed.key == w.key and viewed.power_cap == 0.5
    renamed = dataclasses.replace(w, name="other")
    assert compact(renamed) and renamed.key == f"{w.namespace}/other"
    made = WorkloadState(namespace="ns", name="n", phase=w.phase, view=w.view)
    assert compact(made) and made.key == "ns/n"
    assert renamed != w and dataclasses.replace(renamed, name=w.name) == w
