"""The snapshot memo's workload and rack entries, kept in place between snapshots (issue 14,
thirtieth session): after every step of a random sequence of changes — workloads changed,
gone, new, read without a resourceVersion, unreadable; a LocalQueue pointed elsewhere; the
m2g check renamed; a node relabelled into another power domain, block or clique, gone, or no
GPU node any more; a PowerDomain's rack list, rack cap or inlet limit edited; the topology
label mapping changed — the snapshot built through the memo
equals the one built without it (racks, workloads, rejections), and the memo holds exactly
the workloads read with a resourceVersion."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

import pytest

from m2g.k8s import build as kb
from m2g.testing.scale import CHECK, LABELS, NOW, POWER_DOMAIN_LABEL, generate


def _bump(o: dict[str, Any], step: int) -> dict[str, Any]:
    meta = {**o["metadata"], "resourceVersion": f"{o['metadata'].get('resourceVersion', '')}"
            f"-{step}"}
    return {**o, "metadata": meta}


def _changed(objs: kb.ClusterObjects, rng: random.Random, step: int) -> kb.ClusterObjects:
    workloads = dict(objs.workloads)
    nodes = dict(objs.nodes)
    domains = dict(objs.power_domains)
    lqs = dict(objs.local_queues)
    checks = dict(objs.admission_checks)
    for key in rng.sample(sorted(workloads), min(len(workloads), rng.randrange(0, 5))):
        pick = rng.randrange(6)
        old = workloads[key]
        if pick == 0:
            del workloads[key]
        elif pick == 1:  # a priority edit
            new = _bump(old, step)
            workloads[key] = {**new, "spec": {**new["spec"], "priority": rng.randrange(999)}}
        elif pick == 2:  # read without a resourceVersion
            meta = {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
            workloads[key] = {**old, "metadata": meta}
        elif pick == 3:  # unreadable
            workloads[key] = {**_bump(old, step), "spec": {"podSets": "not a list"}}
        elif pick == 4:  # a new tenant annotation m2g cannot honour, or back
            new = _bump(old, step)
            notes = dict(new["metadata"].get("annotations") or {})
            notes["m2g.io/min-parallelism"] = rng.choice(("zero", "1"))
            workloads[key] = {**new, "metadata": {**new["metadata"], "annotations": notes}}
        else:  # gone and back under a new version
            workloads[key] = _bump(old, step)
    if rng.random() < 0.3:  # a new workload, as a copy of one under another name
        src = workloads[rng.choice(sorted(workloads))]
        name = f"new-{step}"
        meta = {**src["metadata"], "name": name, "resourceVersion": f"n{step}"}
        workloads[f"{meta['namespace']}/{name}"] = {**src, "metadata": meta}
    if rng.random() < 0.15 and lqs:  # a LocalQueue pointed at another ClusterQueue
        key = rng.choice(sorted(lqs))
        other = rng.choice(sorted({str(o["spec"]["clusterQueue"]) for o in lqs.values()}))
        lqs[key] = {**_bump(lqs[key], step), "spec": {**lqs[key]["spec"], "clusterQueue": other}}
    if rng.random() < 0.1:  # the m2g check renamed, or back
        for key, o in list(checks.items()):
            name = CHECK if o["metadata"]["name"] != CHECK else f"{CHECK}-x"
            checks[key] = {**_bump(o, step), "metadata": {**o["metadata"], "name": name}}
    if rng.random() < 0.4:  # a node relabelled into another domain, block or clique
        key = rng.choice(sorted(nodes))
        new = _bump(nodes[key], step)
        labels = dict(new["metadata"]["labels"])
        label = rng.choice((POWER_DOMAIN_LABEL, "network.topology.nvidia.com/block",
                            "nvidia.com/gpu.clique"))
        labels[label] = f"moved-{step}"
        nodes[key] = {**new, "metadata": {**new["metadata"], "labels": labels}}
    if rng.random() < 0.1 and len(nodes) > 1:
        del nodes[rng.choice(sorted(nodes))]
    if rng.random() < 0.2:  # a node that is no GPU node any more (or one again)
        key = rng.choice(sorted(nodes))
        new = _bump(nodes[key], step)
        if "nvidia.com/gpu" in new["status"]["capacity"]:
            labels = {k: v for k, v in new["metadata"]["labels"].items()
                      if not k.startswith(("network.topology", "nvidia.com"))}
            status = {**new["status"], "capacity": {}, "allocatable": {}}
        else:
            labels = {**new["metadata"]["labels"], "nvidia.com/gpu.clique": f"back-{step}"}
            status = {**new["status"], "capacity": {"nvidia.com/gpu": "4"},
                      "allocatable": {"nvidia.com/gpu": "4"}}
        nodes[key] = {**new, "metadata": {**new["metadata"], "labels": labels},
                      "status": status}
    if rng.random() < 0.3 and domains:  # a PowerDomain edited
        key = rng.choice(sorted(domains))
        new = _bump(domains[key], step)
        spec = dict(new.get("spec") or {})
        pick = rng.randrange(3)
        if pick == 0:
            spec["rackCapKw"] = rng.choice((90, 120, 150))
        elif pick == 1:
            spec["inletLimitC"] = rng.choice((30, 32, 35))
        else:
            spec["racks"] = [f"rack-{rng.randrange(4):04d}"]
        domains[key] = {**new, "spec": spec}
    return dataclasses.replace(objs, workloads=workloads, nodes=nodes, power_domains=domains,
                               local_queues=lqs, admission_checks=checks)


#: Another topology label mapping: the nodes' power domains read from the block label.
OTHER = LABELS.model_copy(update={"power_domain": "network.topology.nvidia.com/block"})


@pytest.mark.parametrize("seed", range(6))
def test_snapshots_through_the_kept_memo_equal_the_plain_ones(seed: int) -> None:
    rng = random.Random(seed)
    objs, readings = generate(4, 60, seed=seed)
    memo = kb.SnapshotMemo()
    for step in range(14):
        if step:
            objs = _changed(objs, rng, step)
        now = NOW + timedelta(seconds=10 * step)
        labels = OTHER if step in (5, 6, 11) else LABELS  # the mapping changed, and back
        warm = kb.build_snapshot(objs, readings, now, memo=memo, labels=labels)
        plain = kb.build_snapshot(objs, readings, now, labels=labels)
        assert warm.factory.racks == plain.factory.racks
        assert warm.factory == plain.factory
        assert warm.workloads == plain.workloads
        assert [w.key for w in warm.workloads] == [w.key for w in plain.workloads]
        assert warm.rejected == plain.rejected
        versioned = {k for k, o in objs.workloads.items()
                     if o["metadata"].get("resourceVersion")
                     and any(w.key == f"{o['metadata']['namespace']}/{o['metadata']['name']}"
                             for w in plain.workloads)}
        assert set(memo.workloads) == versioned


def test_an_unchanged_rack_and_workload_are_the_kept_ones() -> None:
    """The memo's point: a snapshot a tick later, nothing changed, reuses each workload's
    state and each rack's make-up (the racks' readings read anew)."""
    objs, readings = generate(4, 60)
    memo = kb.SnapshotMemo()
    first = kb.build_snapshot(objs, readings, NOW, memo=memo, labels=LABELS)
    kept = dict(memo.workloads)
    racks = dict(memo.racks)
    later = kb.build_snapshot(objs, readings, NOW + timedelta(seconds=10), memo=memo,
                              labels=LABELS)
    assert all(a is b for a, b in zip(first.workloads, later.workloads, strict=True))
    assert all(memo.workloads[k] is v for k, v in kept.items())
    assert all(memo.racks[k] is v for k, v in racks.items())
