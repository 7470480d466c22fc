"""The snapshot reads pods through their facts (m2g.k8s.convert.PodFacts), memoised per
resourceVersion (SnapshotMemo.pods/links): the same allocated GPUs, placements, checkpoint
reports and rejections as the plain functions over the raw objects, on every step of a
sequence of changes, with the memo and without it."""

from __future__ import annotations

import copy
import random
from datetime import timedelta
from typing import Any

import pytest

from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.testing.scale import LABELS, NOW, generate

CKPT = "m2g.io/last-checkpoint-time"


def _objects() -> kb.ClusterObjects:
    objs, _ = generate(16, 240)
    return objs


def _plain(objs: kb.ClusterObjects) -> tuple[Any, ...]:
    pods, wls = list(objs.pods.values()), list(objs.workloads.values())
    hosts = kb.host_names(objs.nodes.values())
    return (cv.allocated_gpus(pods), cv.placements(pods, wls, hosts),
            cv.pod_checkpoints(pods, wls))


def _from_facts(objs: kb.ClusterObjects, memo: kb.SnapshotMemo | None) -> tuple[Any, ...]:
    got = kb._Pods(objs, memo)
    hosts = kb.host_names(objs.nodes.values())
    return got.allocated(kb.Isolator()), got.placements(hosts), got.checkpoints()


def _mutate(objs: kb.ClusterObjects, rng: random.Random, step: int) -> kb.ClusterObjects:
    """A copy with some pods changed (bound elsewhere, finished, unbound, a checkpoint report,
    a new owner), some gone, some new, and a Workload with a TAS assignment; each changed
    object gets a new resourceVersion, as the API server gives it."""
    pods = copy.deepcopy(dict(objs.pods))
    wls = copy.deepcopy(dict(objs.workloads))
    nodes = sorted(objs.nodes)
    for key in rng.sample(sorted(pods), 12):
        pod = pods[key]
        change = rng.randrange(6)
        if change == 0:
            pod["spec"]["nodeName"] = rng.choice(nodes)
        elif change == 1:
            pod["status"]["phase"] = rng.choice(["Succeeded", "Failed", "Pending"])
        elif change == 2:
            pod["spec"].pop("nodeName", None)
        elif change == 3:
            at = NOW - timedelta(seconds=rng.randrange(1, 4000))
            pod["metadata"].setdefault("annotations", {})[CKPT] = at.strftime(
                "%Y-%m-%dT%H:%M:%SZ")
        elif change == 4:
            pod["metadata"]["ownerReferences"] = [{"uid": rng.choice(
                [str(r["uid"]) for w in wls.values()
                 for r in w["metadata"].get("ownerReferences") or []] or ["x"])}]
        else:
            del pods[key]
            continue
        pod["metadata"]["resourceVersion"] = f"{step}-{change}"
    pods[f"team-0/new-{step}"] = {
        "metadata": {"name": f"new-{step}", "namespace": "team-0", "uid": f"new-{step}",
                     "resourceVersion": "1", "annotations": {CKPT: "2026-01-01T00:00:00Z"},
                     "ownerReferences": [{"uid": "job-1"}]},
        "spec": {"nodeName": nodes[step % len(nodes)], "containers": [
            {"resources": {"requests": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Running"}}
    wkey = sorted(wls)[step % len(wls)]
    wls[wkey].setdefault("status", {}).setdefault("admission", {})["podSetAssignments"] = [
        {"topologyAssignment": {"levels": ["kubernetes.io/hostname"], "slices": [
            {"valuesPerLevel": [{"universal": nodes[(3 * step) % len(nodes)]}]}]}}]
    wls[wkey]["metadata"]["resourceVersion"] = f"w{step}"
    return kb.ClusterObjects(**{**objs.__dict__, "pods": pods, "workloads": wls})


def test_pod_facts_give_what_the_plain_functions_give_through_a_sequence_of_changes() -> None:
    rng = random.Random(14)
    objs = _objects()
    memo = kb.SnapshotMemo()
    for step in range(6):
        want = _plain(objs)
        assert _from_facts(objs, memo) == want, step
        assert _from_facts(objs, None) == want, step
        assert want[0] and want[1]  # the factory has bound pods and placements to compare
        if step:
            assert want[2]  # ... and, after the first change, pod checkpoint reports
        objs = _mutate(objs, rng, step + 1)


def test_the_memo_reuses_the_facts_of_unchanged_pods_only() -> None:
    objs = _objects()
    memo = kb.SnapshotMemo()
    kb._Pods(objs, memo)
    kept = dict(memo.pods)
    assert set(kept) == set(objs.pods)
    changed = _mutate(objs, random.Random(3), 1)
    kb._Pods(changed, memo)
    assert set(memo.pods) == {k for k, p in changed.pods.items()
                              if p["metadata"].get("resourceVersion")}
    for key, (rv, facts) in memo.pods.items():
        same = key in kept and kept[key][0] == rv
        assert (same and facts is kept[key][1]) == same, key
        assert facts == cv.pod_facts(changed.pods[key])


def test_snapshots_with_and_without_the_memo_are_equal_and_a_bad_pod_is_rejected_alike() -> None:
    objs = _objects()
    memo = kb.SnapshotMemo()
    rng = random.Random(5)
    for step in range(4):
        now = NOW + timedelta(seconds=5 * step)
        with_memo = kb.build_snapshot(objs, None, now, memo=memo, labels=LABELS)
        assert with_memo == kb.build_snapshot(objs, None, now, labels=LABELS), step
        objs = _mutate(objs, rng, step + 1)
    # a pod the facts cannot be read from: the plain functions decide, rejections included
    pods = dict(objs.pods)
    pods["team-0/bad"] = {"metadata": {"name": "bad", "namespace": "team-0",
                                       "resourceVersion": "1", "ownerReferences": "nope"},
                          "spec": {"nodeName": sorted(objs.nodes)[0], "containers": [
                              {"resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
                          "status": {"phase": "Running"}}
    bad = kb.ClusterObjects(**{**objs.__dict__, "pods": pods})
    assert kb._Pods(bad, None).pods is None
    got = kb.build_snapshot(bad, None, NOW, memo=memo, labels=LABELS)
    assert got == kb.build_snapshot(bad, None, NOW, labels=LABELS)


@pytest.mark.parametrize("phase", ["Running", "Succeeded", "Pending"])
def test_pod_facts_of_one_pod(phase: str) -> None:
    pod = {"metadata": {"uid": "p1", "ownerReferences": [{"uid": "job"}, {}],
                        "annotations": {CKPT: "2026-11-29T22:00:00Z"}},
           "spec": {"nodeName": "n1", "containers": [
               {"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
           "status": {"phase": phase}}
    facts = cv.pod_facts(pod)
    finished = phase == "Succeeded"
    assert facts.node == ("" if finished else "n1")
    assert facts.gpus == (0 if finished else 4)
    assert facts.uids == ("job", "", "p1")
    assert (facts.checkpoint is None) == finished


@pytest.mark.parametrize("statuses", [
    [{"state": "running"}, 5, {"state": {"running": "now"}}, {"state": {"running": {}}}],
    7, "Running", {"state": {"running": {"startedAt": "2026-11-29T22:00:00Z"}}}])
def test_a_running_pods_start_of_another_shape_is_passed_over(statuses: object) -> None:
    """Container statuses of a shape the API never gives (a proxy, a bad mutating webhook, a
    test double) leave the pod's facts readable: its start is the pod's ``startTime``, and it
    is still bound and drawing — not a reason to read every pod again without facts."""
    pod = {"metadata": {"uid": "p1", "ownerReferences": [{"uid": "job"}]},
           "spec": {"nodeName": "n1", "containers": [
               {"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
           "status": {"phase": "Running", "startTime": "2026-11-29T21:00:00Z",
                      "containerStatuses": statuses}}
    facts = cv.pod_facts(pod)
    assert (facts.node, facts.gpus, facts.waiting) == ("n1", 4, False)
    assert facts.started == cv.parse_time("2026-11-29T21:00:00Z")
    good = {"state": {"running": {"startedAt": "2026-11-29T22:00:00Z"}}}
    pod["status"]["containerStatuses"] = [statuses, good]  # type: ignore[index]
    assert cv.pod_facts(pod).started == cv.parse_time("2026-11-29T22:00:00Z")
