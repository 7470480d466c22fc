"""Snapshot conversions share what is alike between workloads (issue 14, memory): the pydantic
fields-set of their views, one PodSetView tuple per pod-set shape, one Checkpoint per value,
one empty TAS host set. Sharing must not change any value: the views equal those built the
plain way, field by field and in what they report as set."""

from __future__ import annotations

from datetime import timedelta

from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.model.inputs import Checkpoint, PodSetView, WorkloadView, shallow_copy, shared_fields
from m2g.testing.scale import LABELS, NOW, generate


def test_shared_fields_keeps_values_and_shares_the_set() -> None:
    a = shared_fields(PodSetView(name="main", count=2, gpus_per_pod=4))
    b = shared_fields(PodSetView(name="other", count=1, gpus_per_pod=1))
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert a.model_fields_set == {"name", "count", "gpus_per_pod"}
    assert a == PodSetView(name="main", count=2, gpus_per_pod=4)
    # model_copy copies the set before adding to it: the shared one is left alone
    c = a.model_copy(update={"count": 3})
    assert c.count == 3 and a.count == 2
    assert b.model_fields_set == {"name", "count", "gpus_per_pod"}


def test_shallow_copy_with_new_fields_shares_the_union() -> None:
    v = WorkloadView(name="w")
    one, two = shallow_copy(v, wait_seconds=3), shallow_copy(v, wait_seconds=4)
    assert one.__pydantic_fields_set__ is two.__pydantic_fields_set__
    assert one.model_fields_set == {"name", "wait_seconds"} == two.model_fields_set
    assert v.model_fields_set == {"name"}


def test_pod_sets_and_checkpoints_are_one_object_per_value() -> None:
    assert cv.pod_set_views((("main", 2, 4),)) is cv.pod_set_views((("main", 2, 4),))
    ck = cv.checkpoint(1800, NOW - timedelta(seconds=90), NOW - timedelta(seconds=600), NOW)
    assert ck is cv.checkpoint(1800, NOW - timedelta(seconds=90),
                               NOW - timedelta(seconds=700), NOW)
    assert ck == Checkpoint(interval_seconds=1800, reported=True, last_age_seconds=90)
    assert ck.model_fields_set == Checkpoint(interval_seconds=1800, reported=True,
                                             last_age_seconds=90).model_fields_set
    idle = cv.checkpoint(0, None, None, NOW)
    assert idle == Checkpoint(interval_seconds=0, reported=False)
    assert idle.model_fields_set == {"interval_seconds", "reported"}


def test_shared_snapshot_equals_the_plain_conversion() -> None:
    """Every workload of a memoised, warm snapshot equals its conversion with no sharing
    (pydantic's own constructors), fields-set included; links with no TAS hosts share one."""
    objs, readings = generate(16, 240)
    memo = kb.SnapshotMemo()
    kb.build_snapshot(objs, readings, NOW, memo=memo, labels=LABELS)
    later = NOW + timedelta(seconds=7)
    snap = kb.build_snapshot(objs, readings, later, memo=memo, labels=LABELS)
    reports = kb._Pods(objs, None).checkpoints()
    lqs = {k: str(o["spec"]["clusterQueue"]) for k, o in objs.local_queues.items()}
    checks = cv.check_names(objs.admission_checks.values())
    floors = cv.min_flex_tiers(objs.cluster_queues.values())
    assert len(snap.workloads) == len(objs.workloads)
    for w in snap.workloads:
        plain = cv.with_pod_report(
            cv.workload(objs.workloads[w.key], later, local_queues=lqs, checks=checks,
                        tier_floors=floors), reports.get(w.key))
        assert w == plain
        assert w.view == plain.view
        assert w.view_at(later) == plain.view_at(later)
        for got, want in ((w.view, plain.view), (w.view.checkpoint, plain.view.checkpoint),
                          *zip(w.view.pod_sets, plain.view.pod_sets, strict=True)):
            assert got.model_fields_set == want.model_fields_set
    links = [cv.workload_links(o) for o in objs.workloads.values()]
    assert all(x.tas is cv.NO_HOSTS for x in links)
