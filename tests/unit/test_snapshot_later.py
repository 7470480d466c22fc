"""Memoised workloads a snapshot later (issue 14, the warm tick): a snapshot reuses an
unchanged workload's state as it is and derives its time fields — wait time, checkpoint age —
at use (``WorkloadState.view_at``, ``wait_seconds``, ``checkpoint_at``). What they derive
must be what the conversion at that moment gave (``eager``: the formulas as the converter
applied them before, 2026-12-06) for every phase, report and clock, through the memo too;
a memoised snapshot over several ticks must equal the one built without the memo."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.k8s.parse import parse_time
from m2g.model.cluster import Phase, WorkloadState
from m2g.model.inputs import Checkpoint
from m2g.planner.inputs import policy_view, trusted_view
from m2g.testing.scale import LABELS, NOW, generate, rfc3339

CKPT = "m2g.io/last-checkpoint-time"


def eager(wl: Mapping[str, Any], pod_report: datetime | None, now: datetime
          ) -> tuple[int, Checkpoint]:
    """The reference: a Workload's wait and checkpoint at ``now`` from its raw object, as the
    conversion worked them out at ``now`` (the newer of its own and its pods' reports)."""
    meta = wl["metadata"]
    phase = cv.workload_phase(wl)
    created = parse_time(meta.get("creationTimestamp"))
    wait = (max(0, int((now - created).total_seconds()))
            if phase in (Phase.PENDING, Phase.RESERVED) and created is not None else 0)
    reported = parse_time((meta.get("annotations") or {}).get(CKPT)
                          or (meta.get("labels") or {}).get(CKPT))
    if pod_report is not None and (reported is None or pod_report > reported):
        reported = pod_report
    interval = int((meta.get("annotations") or {}).get("m2g.io/checkpoint-interval-seconds")
                   or (meta.get("labels") or {}).get("m2g.io/checkpoint-interval-seconds")
                   or 0)
    started = cv.true_since(wl, "Admitted") if phase is Phase.ADMITTED else None
    if started is None:
        return wait, Checkpoint(interval_seconds=interval, reported=reported is not None)
    fresh = reported is not None and reported >= started
    age = max(0, int((now - (reported if fresh and reported else started)).total_seconds()))
    return wait, Checkpoint(interval_seconds=interval, reported=fresh, last_age_seconds=age)


def _shuffled(objs: kb.ClusterObjects, rng: random.Random) -> dict[str, Any]:
    """The generated workloads with their own checkpoint reports and creation times moved at
    random (before or after their start, unreadable, gone)."""
    out: dict[str, Any] = {}
    for key, wl in objs.workloads.items():
        notes = dict(wl["metadata"].get("annotations") or {})
        pick = rng.randrange(5)
        if pick == 0:
            notes.pop(CKPT, None)
        elif pick == 1:
            notes[CKPT] = "not a time"
        elif pick < 4:
            notes[CKPT] = rfc3339(NOW - timedelta(seconds=rng.randrange(-60, 20_000)))
        meta = {**wl["metadata"], "annotations": notes, "creationTimestamp": rfc3339(
            NOW - timedelta(seconds=rng.randrange(0, 9_000)))}
        out[key] = {**wl, "metadata": meta}
    return out


def test_time_fields_derived_at_use_are_those_of_a_conversion_then() -> None:
    objs, _ = generate(4, 120)
    rng = random.Random(14)
    workloads = _shuffled(objs, rng)
    at = [None, *(NOW - timedelta(seconds=s) for s in (-30, 0, 30, 600, 7_200, 30_000))]
    moved = {"wait": 0, "age": 0}
    for _ in range(4):
        for key, wl in workloads.items():
            report = rng.choice(at)
            w = cv.with_pod_report(cv.workload(wl, NOW), report)
            for later in (0, 1, 10, 599, 3_601):
                now = NOW + timedelta(seconds=later)
                wait, ckpt = eager(wl, report, now)
                view = w.view_at(now)
                assert (view.wait_seconds, view.checkpoint) == (wait, ckpt), key
                assert (w.wait_seconds(now), w.checkpoint_at(now)) == (wait, ckpt), key
                assert view.model_dump() == w.view.model_dump() | {
                    "wait_seconds": wait, "checkpoint": ckpt.model_dump()}
                moved["wait"] += wait != eager(wl, report, NOW)[0]
                moved["age"] += ckpt != eager(wl, report, NOW)[1]
    assert moved["wait"] > 100 and moved["age"] > 100  # both moved after NOW, many times


def test_a_state_made_by_hand_keeps_its_view_values() -> None:
    """Without anchors (states a test or the simulator makes) the view's values are the
    values, at any moment."""
    objs, _ = generate(1, 4)
    converted = cv.workload(objs.workloads[sorted(objs.workloads)[0]], NOW)
    w = WorkloadState("a", "w", converted.view_at(NOW), Phase.ADMITTED,
                      admitted_at=NOW - timedelta(seconds=600))
    for later in (0, 60):
        now = NOW + timedelta(seconds=later)
        assert w.view_at(now) is w.view
        assert w.wait_seconds(now) == w.view.wait_seconds
        assert w.checkpoint_at(now) is w.view.checkpoint


def same(got: WorkloadState, want: WorkloadState, now: datetime) -> None:
    assert got == want
    assert got.view == want.view
    assert got.view.model_fields_set == want.view.model_fields_set
    assert got.view.checkpoint == want.view.checkpoint
    assert got.view.checkpoint.model_fields_set == want.view.checkpoint.model_fields_set
    assert got.view_at(now) == want.view_at(now)
    assert [getattr(got, k) for k in got.__slots__] == [
        getattr(want, k) for k in want.__slots__]  # ``key`` too (not compared by ==)


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
        reports = kb._Pods(objs, None).checkpoints()
        for got, want in zip(warm.workloads, plain.workloads, strict=True):
            same(got, want, now)
            wait, ckpt = eager(objs.workloads[got.key], reports.get(got.key), now)
            assert (got.wait_seconds(now), got.checkpoint_at(now)) == (wait, ckpt)
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


def test_policy_view_is_the_trusted_view_then_in_one_copy_at_most() -> None:
    """What the CEL items read (``policy_view``): the view at that moment with its declared
    kW raised to the floor — what ``trusted_view`` of ``view_at`` gives —, the stored view
    itself when neither moves."""
    objs, _ = generate(4, 120)
    rng = random.Random(7)
    workloads = _shuffled(objs, rng)
    kept = 0
    for key, wl in workloads.items():
        w = cv.workload(wl, NOW)
        anchor = w.checkpoint_since or w.waiting_since or NOW  # (at it: nothing moved)
        for now, floor in ((NOW, 0.0), (NOW, 1.34), (NOW + timedelta(seconds=30), 50.0),
                           (anchor, 0.0), (anchor, 1.34)):
            got = policy_view(w, now, floor)
            assert got == trusted_view(w.view_at(now), floor), key
            if got is w.view:
                kept += 1
                assert w.view.estimated_kw >= w.view.gpus * floor
                assert w.view_at(now) is w.view
    assert kept > 50
