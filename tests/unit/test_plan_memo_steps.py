"""A plan made with the PlanMemo the plans before it kept (m2g.planner.memo, issue 14) equals
the plan made from scratch, after every step of a random sequence of changes to a small
factory of bench/scale.py's generator: workloads edited (priority, declared runtime, flex
tier, a checkpoint report), pods moved to another node (crowding a node, so a job is no longer
alone on its nodes), deleted, added, waiting, being deleted, or started later; the clock moved
by a few seconds or by many minutes; the config's ending lead, kW per GPU and saving
fraction changed and back. The snapshots come through the snapshot memo, as in the
controller (unchanged workloads keep their state objects, unchanged pods their placements).
The memo must be used (its reuse counts grow), and each memo key must name every input:
the last tests take one input out of a key each and expect a differing plan."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from m2g.k8s import build as kb
from m2g.k8s.parse import parse_time
from m2g.planner import curtail, shedding
from m2g.planner.config import PlannerConfig
from m2g.planner.memo import PlanMemo
from m2g.planner.plan import make_plan
from m2g.policy import Evaluator, load_dir
from m2g.testing.scale import LABELS, NOW, generate, plan_record, rfc3339

ROOT = Path(__file__).resolve().parents[2]
#: a long ending lead: many running workloads are near their expected end, and the clock's
#: steps move them in and out of the window
BASE = PlannerConfig(ending_lead_seconds=1800.0)


def _bump(o: dict[str, Any], step: int) -> dict[str, Any]:
    meta = {**o["metadata"], "resourceVersion": f"{o['metadata'].get('resourceVersion', '')}"
            f"-{step}"}
    return {**o, "metadata": meta}


def _changed(objs: kb.ClusterObjects, rng: random.Random, step: int, seconds: int
             ) -> kb.ClusterObjects:
    workloads, pods = dict(objs.workloads), dict(objs.pods)
    for key in rng.sample(sorted(workloads), rng.randrange(0, 4)):
        new = _bump(workloads[key], step)
        labels = dict(new["metadata"].get("labels") or {})
        notes = dict(new["metadata"].get("annotations") or {})
        spec = dict(new["spec"])
        status = new["status"]
        pick = rng.randrange(5)
        if pick == 0:
            spec["priority"] = rng.randrange(999)
        elif pick == 4:  # evicted (its pods stay, being deleted): no longer admitted
            status = _evicted(new, step)["status"]
        elif pick == 1:
            labels["m2g.io/expected-runtime-seconds"] = str(rng.choice((0, 600, 1800, 3600)))
        elif pick == 2:
            labels["m2g.io/flex-tier"] = str(rng.randrange(4))
        else:
            notes["m2g.io/last-checkpoint-time"] = rfc3339(NOW + timedelta(seconds=seconds))
        workloads[key] = {**new, "metadata": {**new["metadata"], "labels": labels,
                                              "annotations": notes}, "spec": spec,
                          "status": status}
    nodes = sorted(objs.nodes)
    for key in rng.sample(sorted(pods), min(len(pods), rng.randrange(0, 5))):
        new = _bump(pods[key], step)
        pick = rng.randrange(6)
        if pick == 0:  # onto another node: a node of another job's, often
            other = pods[rng.choice(sorted(pods))]["spec"]["nodeName"]
            host = other if rng.random() < 0.7 else rng.choice(nodes)
            pods[key] = {**new, "spec": {**new["spec"], "nodeName": host}}
        elif pick == 1:
            del pods[key]
        elif pick == 2:  # bound, not running yet
            pods[key] = {**new, "status": {**new["status"], "phase": "Pending"}}
        elif pick == 3:  # being deleted (Kueue evicted it)
            pods[key] = {**new, "metadata": {**new["metadata"],
                                             "deletionTimestamp": rfc3339(NOW)}}
        elif pick == 4:  # started later than its workload's admission
            start = NOW + timedelta(seconds=seconds - rng.randrange(0, 4000))
            pods[key] = {**new, "status": {**new["status"], "startTime": rfc3339(start)}}
        else:  # a second pod of its workload, on some node
            name = f"{new['metadata']['name']}-x{step}"
            pods[f"{new['metadata']['namespace']}/{name}"] = {
                **new, "metadata": {**new["metadata"], "name": name, "uid": f"u-{step}"},
                "spec": {**new["spec"], "nodeName": rng.choice(nodes)}}
    if rng.random() < 0.4:  # a running job's runtime re-declared: it ends within the lead
        key = rng.choice(sorted(workloads))
        o = workloads[key]
        at = next((c["lastTransitionTime"] for c in o["status"]["conditions"]
                   if c["type"] == "Admitted" and c["status"] == "True"), None)
        if at is not None:
            since = parse_time(at)
            assert since is not None
            ran = (NOW + timedelta(seconds=seconds) - since).total_seconds()
            new = _bump(o, step)
            labels = {**new["metadata"]["labels"],
                      "m2g.io/expected-runtime-seconds": str(int(ran) + rng.randrange(1, 900))}
            workloads[key] = {**new, "metadata": {**new["metadata"], "labels": labels}}
    if rng.random() < 0.4:  # a job sharing a node with another evicted: the other is alone
        _evict_a_neighbour(workloads, pods, rng, step)
    return dataclasses.replace(objs, workloads=workloads, pods=pods)


def _evicted(o: dict[str, Any], step: int) -> dict[str, Any]:
    new = _bump(o, step)
    status = new["status"]
    return {**new, "status": {**status, "conditions": [
        {**c, "status": "False"} if c["type"] == "Admitted" else c
        for c in status["conditions"]]}}


def _evict_a_neighbour(workloads: dict[str, Any], pods: dict[str, Any], rng: random.Random,
                       step: int) -> None:
    """Evict (in place) an admitted workload whose pods share a node with another's; its pods
    stay (being deleted), so the placements do not change, only the admitted workloads."""
    by_uid = {str(o["metadata"]["ownerReferences"][0]["uid"]): k for k, o in workloads.items()}
    on: dict[str, set[str]] = {}
    for p in pods.values():
        key = by_uid.get(str(p["metadata"]["ownerReferences"][0]["uid"]))
        if key is not None and p["spec"].get("nodeName"):
            on.setdefault(p["spec"]["nodeName"], set()).add(key)
    shared = sorted(k for keys in on.values() if len(keys) > 1 for k in keys
                    if any(c["type"] == "Admitted" and c["status"] == "True"
                           for c in workloads[k]["status"]["conditions"]))
    if shared:
        key = rng.choice(shared)
        workloads[key] = _evicted(workloads[key], step)


def _config(rng: random.Random) -> PlannerConfig:
    pick = rng.randrange(8)
    if pick == 0:
        return dataclasses.replace(BASE, ending_lead_seconds=rng.choice((0.0, 15.0, 600.0)))
    if pick == 1:
        return dataclasses.replace(BASE, default_kw_per_gpu=rng.choice((1.0, 2.0)))
    if pick == 2:
        return dataclasses.replace(BASE, shed_saving_fraction=rng.choice((0.5, 0.9)))
    return BASE


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(load_dir(ROOT / "deploy" / "policies", "cel-expr-python"))


def _run(evaluator: Evaluator, seed: int, steps: int = 16) -> tuple[int, PlanMemo]:
    """The steps of ``seed``: every memoised plan asserted equal to the plain one; returns how
    many plans differed (0) and the memo."""
    rng = random.Random(seed)
    objs, readings = generate(6, 120, seed=seed)
    smemo, memo = kb.SnapshotMemo(), PlanMemo()
    seconds = 0
    differed = 0
    for step in range(steps):
        if step:
            seconds += rng.choice((1, 10, 30, 300, 900))
            objs = _changed(objs, rng, step, seconds)
        cfg = _config(rng) if step else BASE
        snap = kb.build_snapshot(objs, readings, NOW + timedelta(seconds=seconds), memo=smemo,
                                 labels=LABELS)
        plain = plan_record(make_plan(snap, evaluator, cfg))
        kept = plan_record(make_plan(snap, evaluator, cfg, memo=memo))
        differed += plain != kept
    return differed, memo


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_memoised_plans_equal_the_plans_from_scratch(evaluator: Evaluator, seed: int) -> None:
    differed, memo = _run(evaluator, seed)
    assert differed == 0
    assert memo.reused["exclusive"] > 0 and memo.reused["ending"] > 0  # it was used


def test_the_memo_is_cleared(evaluator: Evaluator) -> None:
    _, memo = _run(evaluator, 1, steps=3)
    assert memo.exclusive is not None and memo.ending
    memo.clear()
    assert memo.exclusive is None and not memo.ending and memo.ending_config is None


def _without_placements(snap: Any, memo: PlanMemo | None = None) -> frozenset[str]:
    """exclusive_workloads whose memo key leaves the placements out (a mutant)."""
    keys = [w.key for w in curtail.sparse.of(snap).admitted]
    if memo is not None and memo.exclusive is not None and memo.exclusive[1] == keys:
        return memo.exclusive[2]
    got = ORIGINAL_EXCLUSIVE(snap)
    if memo is not None:
        memo.exclusive = (dict(snap.placements), keys, got)
    return got


def _without_keys(snap: Any, memo: PlanMemo | None = None) -> frozenset[str]:
    """exclusive_workloads whose memo key leaves the admitted workloads out (a mutant)."""
    if memo is not None and memo.exclusive is not None and \
            memo.exclusive[0] == snap.placements:
        return memo.exclusive[2]
    got = ORIGINAL_EXCLUSIVE(snap)
    if memo is not None:
        memo.exclusive = (dict(snap.placements), [], got)
    return got


ORIGINAL_EXCLUSIVE = curtail.exclusive_workloads


@pytest.mark.parametrize("mutant", ["placements", "admitted"])
def test_an_exclusive_key_without_an_input_is_caught(
        evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch, mutant: str) -> None:
    monkeypatch.setattr(curtail, "exclusive_workloads",
                        _without_placements if mutant == "placements" else _without_keys)
    assert sum(_run(evaluator, seed, steps=16)[0] for seed in (1, 2, 3, 4)) > 0


@pytest.mark.parametrize("mutant", ["state", "pods", "config"])
def test_an_ending_key_without_an_input_is_caught(
        evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch, mutant: str) -> None:
    """The ending memo's key loses the workload's state, its pods or the config: a stale
    entry is reused and some plan differs."""
    real_ending = shedding.ending

    def ending(by_key: Any, snap: Any, config: PlannerConfig, memo: PlanMemo | None = None
               ) -> dict[str, float]:
        if memo is not None:
            if mutant == "config":
                memo.ending_config = (config.ending_lead_seconds, config.default_kw_per_gpu,
                                      config.shed_saving_fraction)
            else:
                live = snap.live_pods
                for key, w in by_key.items():
                    was = memo.ending.get(key)
                    if was is not None:  # make the entry look current in the mutated part
                        pods = shedding.NOT_READ if live is None else live.get(key)
                        memo.ending[key] = (w, was[1], was[2]) if mutant == "state" else \
                            (was[0], pods, was[2])
        return real_ending(by_key, snap, config, memo)

    monkeypatch.setattr(shedding, "ending", ending)
    assert sum(_run(evaluator, seed, steps=16)[0] for seed in (1, 2, 3, 4)) > 0
