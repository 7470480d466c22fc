"""A memoised workload a snapshot later (issue 14, the warm tick): ``_later`` moves a cached
workload's wait time and checkpoint age in one copy. It must give exactly what the two steps
it replaced gave — the wait time moved (``_waited``, kept here as it was), then
``with_pod_checkpoint`` — value, fields set and all, for every phase, report and clock; and
a memoised snapshot over several ticks must equal the one built without the memo."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.model.cluster import Phase, WorkloadState
from m2g.model.inputs import shallow_copy
from m2g.testing.scale import LABELS, NOW, generate, rfc3339


def waited(w: WorkloadState, created: datetime | None, now: datetime) -> WorkloadState:
    """The wait-time step as build._waited was before ``_later`` (the reference)."""
    if created is None:
        return w
    wait = max(0, int((now - created).total_seconds()))
    if wait == w.view.wait_seconds:
        return w
    return w.with_view(shallow_copy(w.view, wait_seconds=wait))


def same(got: WorkloadState, want: WorkloadState) -> None:
    assert got == want
    assert got.view == want.view
    assert got.view.model_fields_set == want.view.model_fields_set
    assert got.view.checkpoint == want.view.checkpoint
    assert got.view.checkpoint.model_fields_set == want.view.checkpoint.model_fields_set
    assert list(got.__dict__) == [k for k in want.__dict__ if k in got.__dict__]


def test_later_is_waited_then_checkpointed() -> None:
    objs, _ = generate(4, 120)
    memo = kb.SnapshotMemo()
    base = kb.build_snapshot(objs, None, NOW, memo=memo, labels=LABELS).workloads
    rng = random.Random(14)
    both = 0
    for _ in range(3_000):
        w = rng.choice(base)
        phase = rng.choice((w.phase, Phase.PENDING, Phase.RESERVED, Phase.ADMITTED))
        at = [None, *(NOW - timedelta(seconds=s) for s in (0, 30, 600, 7_200))]
        w = dataclasses.replace(w, phase=phase, admitted_at=rng.choice(at),
                                checkpoint_reported_at=rng.choice(at))
        # a state as a snapshot before left it (its age or wait set at some earlier time)
        w = cv.with_pod_checkpoint(w, rng.choice(at), NOW - timedelta(seconds=rng.choice(
            (0, 10, 20))))
        if rng.random() < 0.5:
            w = w.with_view(shallow_copy(w.view, wait_seconds=rng.randrange(0, 900)))
        created = rng.choice(at)
        report = rng.choice([*at, NOW + timedelta(seconds=5)])
        now = NOW + timedelta(seconds=rng.choice((0, 10, 20, 35)))
        want = cv.with_pod_checkpoint(waited(w, created, now), report, now)
        got = kb._later(w, created, report, now)
        same(got, want)
        if got is not w and want.view.wait_seconds != w.view.wait_seconds \
                and want.view.checkpoint != w.view.checkpoint:
            both += 1
        if want is w:  # nothing moved: the cached object itself, no copy
            assert got is w
    assert both > 50  # the fused copy (wait and checkpoint at once) was exercised


def _ticked(objs: kb.ClusterObjects, seconds: int, rng: random.Random) -> kb.ClusterObjects:
    """``objs`` with a few pods reporting a checkpoint at ``seconds`` (a new resourceVersion)
    and a few workloads' own reports moved."""
    pods = _reported(objs.pods, min(len(objs.pods), 12), seconds, seconds - 3, rng)
    workloads = _reported(objs.workloads, 8, seconds, seconds - 7, rng)
    return dataclasses.replace(objs, pods=pods, workloads=workloads)


def _reported(objs: Mapping[str, Any], count: int, seconds: int, at: int,
              rng: random.Random) -> dict[str, Any]:
    """``objs`` with ``count`` of them reporting a checkpoint at ``at`` seconds past NOW under
    a new resourceVersion."""
    out = dict(objs)
    for key in rng.sample(sorted(out), count):
        old = out[key]
        meta = {**old["metadata"], "resourceVersion": f"{old['metadata']['resourceVersion']}"
                f"-{seconds}", "annotations": {**old["metadata"].get("annotations", {}),
                                                "m2g.io/last-checkpoint-time": rfc3339(
                                                    NOW + timedelta(seconds=at))}}
        out[key] = {**old, "metadata": meta}
    return out


def test_memoised_snapshots_over_ticks_equal_the_plain_ones() -> None:
    objs, readings = generate(8, 160)
    memo = kb.SnapshotMemo()
    rng = random.Random(3)
    for seconds in (0, 10, 20, 35, 50, 61):
        objs = _ticked(objs, seconds, rng) if seconds else objs
        now = NOW + timedelta(seconds=seconds)
        warm = kb.build_snapshot(objs, readings, now, memo=memo, labels=LABELS)
        plain = kb.build_snapshot(objs, readings, now, labels=LABELS)
        assert len(warm.workloads) == len(plain.workloads) == len(objs.workloads)
        for got, want in zip(warm.workloads, plain.workloads, strict=True):
            same(got, want)
        assert warm.placements == plain.placements
        assert warm.live_pods == plain.live_pods


def _bumped(obj: Mapping[str, Any], seconds: int, **changes: object) -> dict[str, Any]:
    """``obj`` with a new resourceVersion and ``changes`` to its metadata / spec."""
    meta = {**obj["metadata"], "resourceVersion": f"{obj['metadata']['resourceVersion']}"
            f"-{seconds}"}
    spec = dict(obj.get("spec") or {})
    for k, v in changes.items():
        (meta if k in ("ownerReferences", "deletionTimestamp") else spec)[k] = v
    return {**obj, "metadata": meta, "spec": spec}


def test_pod_derived_maps_are_kept_only_while_nothing_they_read_changed() -> None:
    """placements and live pods are worked out anew when a pod or a workload's links changed,
    kept (the same object) when only the workloads' other fields did — and always equal to
    the snapshot built without the memo."""
    objs, readings = generate(8, 160)
    memo = kb.SnapshotMemo()
    rng = random.Random(5)
    nodes = sorted(objs.nodes)
    kept = changed = 0
    before = None
    for step, seconds in enumerate(range(0, 400, 10)):
        move = step % 4
        if move == 1:  # workloads edited, their links the same: the maps are kept
            workloads = dict(objs.workloads)
            for key in rng.sample(sorted(workloads), 5):
                workloads[key] = _bumped(workloads[key], seconds, priority=rng.randrange(99))
            objs = dataclasses.replace(objs, workloads=workloads)
        elif move == 2:  # a pod moved to another node, or is stopping
            pods = dict(objs.pods)
            key = rng.choice(sorted(k for k, p in pods.items() if p["spec"].get("nodeName")))
            pods[key] = (_bumped(pods[key], seconds, nodeName=rng.choice(nodes))
                         if rng.random() < 0.5 else
                         _bumped(pods[key], seconds, deletionTimestamp=rfc3339(NOW)))
            objs = dataclasses.replace(objs, pods=pods)
        elif move == 3:  # a workload claims another owner (its links change)
            workloads = dict(objs.workloads)
            a, b = rng.sample(sorted(workloads), 2)
            workloads[a] = _bumped(workloads[a], seconds,
                                   ownerReferences=workloads[b]["metadata"]["ownerReferences"])
            objs = dataclasses.replace(objs, workloads=workloads)
        now = NOW + timedelta(seconds=seconds)
        warm = kb.build_snapshot(objs, readings, now, memo=memo, labels=LABELS)
        plain = kb.build_snapshot(objs, readings, now, labels=LABELS)
        assert warm.placements and warm.live_pods
        assert warm.placements == plain.placements
        assert warm.live_pods == plain.live_pods
        assert [n.gpus_allocated for n in warm.factory.nodes] == [
            n.gpus_allocated for n in plain.factory.nodes]
        if before is not None:
            if move in (0, 1):
                assert warm.placements is before.placements
                assert warm.live_pods is before.live_pods
                kept += 1
            elif warm.placements != before.placements or warm.live_pods != before.live_pods:
                changed += 1
        before = warm
    assert kept >= 15 and changed >= 10
