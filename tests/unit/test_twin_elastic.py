"""Elastic jobs in the twin (docs/twin.md "Elastic jobs"): which trace jobs the mapping makes
elastic and with what minimum, the Job they become (what Kueue v0.19 and m2g's right-sizing
need), and the progress of a job m2g shrank — on the replicas it has, nothing lost."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from twinkit import trace as T
from twinkit.driver import Driver
from twinkit.jobs import PREFERRED, REQUIRED, manifest
from twinkit.metrics import elastic_figures, loss_class
from twinkit.progress import Progress, advance, evict

from m2g.k8s import convert
from m2g.model import labels as L
from m2g.sim.power import PowerModel

HEADER = "name,num_gpu,gpu_milli,qos,creation_time,deletion_time,scheduled_time\n"
T0 = 1_000_000.0
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def trace(n: int = 400) -> T.ReadResult:
    """``n`` pods cycling through sizes (¼ to 8 GPUs) and QoS classes."""
    sizes = [(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]
    qos = ["BE", "LS", "Burstable", "BE", "BE"]
    rows = [f"p{i},{sizes[i % 6][0]},{sizes[i % 6][1]},{qos[i % 5]},{10 * i},{10 * i + 900},"
            f"{10 * i + 5}" for i in range(n)]
    return T.read_trace(HEADER + "\n".join(rows) + "\n")


def mapped(**kw: Any) -> list[T.TraceJob]:
    return T.map_pods(trace().pods, T.Mapping(**kw))


# ---- the mapping -----------------------------------------------------------------------------

def test_only_multi_pod_fine_tuning_and_batch_jobs_within_a_rack_are_elastic() -> None:
    jobs = mapped()
    elastic = [j for j in jobs if j.elastic]
    assert elastic
    for j in elastic:
        assert j.kind in ("fine-tuning", "batch") and j.tier >= 2 and not j.foreign
        assert j.pods > 1 and j.gpus <= T.RACK_GPUS
        assert j.min_pods == -(-j.pods // 2)  # half its pods, rounded up
        assert 1 <= j.min_pods < j.pods
        assert j.topology == ""  # Kueue v0.19 refuses a topology request on an elastic Job
    for j in jobs:
        if j.kind in ("training", "inference", "") or j.foreign or j.pods == 1 \
                or j.gpus > T.RACK_GPUS:
            assert not j.elastic, j


def test_about_the_share_asked_for_of_the_candidates() -> None:
    jobs = mapped(elastic_probability=0.5)
    candidates = [j for j in jobs if T.elastic_candidate(j.kind, j.gpus, j.foreign)]
    share = sum(j.elastic for j in candidates) / len(candidates)
    assert len(candidates) > 80 and 0.35 < share < 0.65
    assert all(j.elastic for j in mapped(elastic_probability=1.0)
               if T.elastic_candidate(j.kind, j.gpus, j.foreign))


def test_elastic_off_is_the_mapping_before_and_on_changes_nothing_else() -> None:
    off, on = mapped(elastic_probability=0.0), mapped(elastic_probability=0.5)
    assert not any(j.elastic for j in off)
    assert len(off) == len(on)
    for a, b in zip(off, on, strict=True):  # the other draws are the same jobs
        assert replace(b, min_pods=0, topology=a.topology) == a
        assert b.topology == ("" if b.elastic else a.topology)
    assert mapped(seed=15) == on and mapped(seed=16) != on  # seeded


def test_the_minimum_follows_the_fraction() -> None:
    for j in mapped(elastic_probability=1.0, elastic_min_fraction=0.25):
        if j.elastic:
            assert j.min_pods == max(1, -(-j.pods // 4))


# ---- the Job it becomes ----------------------------------------------------------------------

def elastic_job(pods: int = 4, low: int = 2) -> T.TraceJob:
    return T.TraceJob("twin-00001", "p", 0.0, 600.0, pods * 4, "fine-tuning", 2, "research",
                      "m2g-fine-tuning", 1800, False, "", False, min_pods=low)


def test_an_elastic_job_is_what_kueue_and_m2g_right_sizing_need() -> None:
    body = manifest(elastic_job(), 60.0, PowerModel())
    assert body["metadata"]["annotations"] == {L.ELASTIC_JOB: "true"}
    spec = body["spec"]
    assert spec["parallelism"] == 4 and "completions" not in spec  # a work-queue Job
    notes = spec["template"]["metadata"]["annotations"]
    assert notes[L.MIN_PARALLELISM] == "2"
    assert REQUIRED not in notes and PREFERRED not in notes
    # Kueue copies its elastic annotation and the pod template onto the Workload: m2g's
    # snapshot then reads the range
    wl = {"metadata": {"name": "job-twin-00001", "namespace": "research",
                       "annotations": {L.ELASTIC_JOB: "true"},
                       "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                            "name": "twin-00001"}]},
          "spec": {"podSets": [{"name": "main", "count": 4, "template": spec["template"]}]}}
    got = convert.elastic_range(wl, convert.own_annotations(wl), notes[L.MIN_PARALLELISM], NOW)
    assert got["elastic_job"] == "twin-00001" and got["min_parallelism"] == 2
    assert got["full_parallelism"] == 4


def test_a_fixed_job_is_unchanged() -> None:
    job = replace(elastic_job(), min_pods=0, topology="required-clique")
    body = manifest(job, 60.0, PowerModel())
    assert "annotations" not in body["metadata"]
    assert body["spec"]["completions"] == body["spec"]["parallelism"] == 4
    notes = body["spec"]["template"]["metadata"]["annotations"]
    assert L.MIN_PARALLELISM not in notes and notes[REQUIRED] == L.GPU_CLIQUE


def test_a_foreign_job_is_never_elastic_even_if_asked() -> None:
    job = replace(elastic_job(), kind="", foreign=True)
    assert not T.elastic_candidate(job.kind, job.gpus, job.foreign)
    body = manifest(job, 60.0, PowerModel())
    assert "annotations" not in body["metadata"] and "completions" in body["spec"]


# ---- progress --------------------------------------------------------------------------------

def test_a_shrunk_job_progresses_on_the_gpus_it_has() -> None:
    p = Progress(work=16 * 100, gpus=16, checkpoint_s=0)
    half, _ = advance(p, 10, 1.0, 8)
    assert half.done == pytest.approx(8 * 10)
    full, _ = advance(p, 10, 1.0)
    assert full.done == pytest.approx(16 * 10)
    assert advance(p, 10, 1.0, 32)[0].done == pytest.approx(16 * 10)  # never more than all
    assert advance(p, 10, 1.0, 0)[0].done == 0.0


def test_a_shrunk_job_checkpoints_what_its_replicas_did() -> None:
    p = Progress(work=1e6, gpus=16, checkpoint_s=100)
    p, taken = advance(p, 250, 1.0, 8)
    assert taken == 2 and p.saved == pytest.approx(8 * 200) and p.done == pytest.approx(2000)
    assert evict(p).lost == pytest.approx(8 * 50)


def test_it_finishes_when_the_work_is_done_later_than_at_full_size() -> None:
    p = Progress(work=16 * 100, gpus=16, checkpoint_s=0)
    p, _ = advance(p, 100, 0.8, 16)  # capped: 80 % of its work
    assert not p.finished
    p, _ = advance(p, 40, 1.0, 8)  # shrunk to half: 40 s for the last 320
    assert p.finished


# ---- the driver ------------------------------------------------------------------------------

def pod(i: int, node: str | None, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"twin-00001-{i}", "namespace": "research",
                         "uid": f"u{i}", "labels": {"batch.kubernetes.io/job-name":
                                                    "twin-00001"}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def wl(name: str = "job-twin-00001-a", created: str = "1970-01-12T13:46:40Z",
       finished: bool = False) -> dict[str, Any]:
    conds = [{"type": "Admitted", "status": "True",
              "lastTransitionTime": "1970-01-12T13:46:42Z"}]
    if finished:
        conds.append({"type": "Finished", "status": "True"})
    return {"metadata": {"name": name, "namespace": "research", "creationTimestamp": created,
                         "ownerReferences": [{"kind": "Job", "name": "twin-00001"}]},
            "status": {"conditions": conds}}


def elastic_driver(job: T.TraceJob | None = None) -> Driver:
    j = job or replace(elastic_job(), checkpoint_s=0, runtime=60_000.0)
    d = Driver({j.name: j}, time_scale=60.0, t0=T0, event_start=2.0, event_end=6.0)
    d.node_rack = {f"n{i}": "r1" for i in range(8)}
    d.rack_trays = {"r1": 18}
    d.sizes = {16: 1.0}
    return d


def test_a_shrink_is_no_eviction_and_the_job_runs_on_at_the_rate_of_its_replicas() -> None:
    d = elastic_driver()
    full = [pod(i, f"n{i}") for i in range(4)]
    d.observe(T0, full, [wl()])
    d.observe(T0 + 1.0, full, [wl()])  # 60 trace s on 16 GPUs
    assert d.progress["twin-00001"].done == pytest.approx(16 * 60)
    d.observe(T0 + 2.0, full, [wl()])  # the event begins
    shrunk = full[:2]  # m2g set parallelism 2: the Job controller removed two pods
    d.observe(T0 + 3.0, shrunk, [wl()])
    d.observe(T0 + 4.0, shrunk, [wl()])
    rec = d.records["twin-00001"]
    assert rec.evictions == 0 and rec.stops == [] and rec.lost == 0.0
    assert d.progress["twin-00001"].done == pytest.approx(16 * 60 * 2 + 8 * 60 * 2)
    assert rec.event_shrunk_s == pytest.approx(120.0)
    # grown back: Kueue admits a new slice; its new pods wait (gated) until then
    grow = [*shrunk, pod(2, None, "Pending"), pod(3, None, "Pending")]
    d.observe(T0 + 5.0, grow, [wl(), wl("job-twin-00001-b", "1970-01-12T13:46:50Z")])
    assert d.running["twin-00001"] and rec.restarts == 0
    back = [*shrunk, pod(4, "n4"), pod(5, "n5")]
    slices = [wl(finished=True), wl("job-twin-00001-b", "1970-01-12T13:46:50Z")]
    d.observe(T0 + 6.0, back, slices)
    assert rec.restarts == 0 and rec.runs == [["n0", "n1", "n2", "n3", "n4", "n5"]]
    row = {"event_stops": rec.event_stops, "event_shrunk_s": rec.event_shrunk_s,
           "event_capped_s": 0.0}
    assert loss_class(row) == "shrunk"


def test_the_current_slice_is_the_one_checkpoints_go_to() -> None:
    j = replace(elastic_job(), checkpoint_s=60, runtime=60_000.0)
    d = elastic_driver(j)
    pods = [pod(i, f"n{i}") for i in range(4)]
    old, new = wl(finished=True), wl("job-twin-00001-b", "1970-01-12T13:46:50Z")
    d.observe(T0, pods, [new, old])
    w = d.observe(T0 + 1.5, pods, [old, new])
    assert [c[1] for c in w.checkpoints] == ["job-twin-00001-b"]


def test_below_its_minimum_an_elastic_job_has_stopped() -> None:
    d = elastic_driver(replace(elastic_job(), checkpoint_s=0, runtime=60_000.0))
    full = [pod(i, f"n{i}") for i in range(4)]
    d.observe(T0, full, [wl()])
    d.observe(T0 + 1.0, full, [wl()])
    d.observe(T0 + 2.0, full[:1], [wl()])  # one pod of a minimum of two: paused or evicted
    rec = d.records["twin-00001"]
    assert rec.evictions == 1 and rec.lost == pytest.approx(16 * 60)


def test_a_fixed_job_losing_a_pod_has_stopped() -> None:
    d = elastic_driver(replace(elastic_job(), min_pods=0, checkpoint_s=0, runtime=60_000.0))
    full = [pod(i, f"n{i}") for i in range(4)]
    d.observe(T0, full, [wl()])
    d.observe(T0 + 1.0, full, [wl()])
    d.observe(T0 + 2.0, full[:2], [wl()])
    assert d.records["twin-00001"].evictions == 1


def test_a_shrunk_job_completes_on_the_pods_it_has() -> None:
    d = elastic_driver(replace(elastic_job(), checkpoint_s=0, runtime=60.0))
    two = [pod(i, f"n{i}") for i in range(2)]
    d.observe(T0, two, [wl()])
    w = d.observe(T0 + 2.0, two, [wl()])  # 120 trace s on 8 GPUs: its 16 × 60 done
    assert sorted(p for _, p in w.complete_pods) == ["twin-00001-0", "twin-00001-1"]
    done = [pod(i, f"n{i}", "Succeeded") for i in range(2)]
    w = d.observe(T0 + 3.0, done, [wl(finished=True)])
    assert w.delete_jobs == [("research", "twin-00001")]
    assert d.records["twin-00001"].finished == 3.0


def test_the_report_counts_the_elastic_jobs_the_driver_saw_shrunk() -> None:
    assert elastic_figures([{"min_pods": 0}]) is None  # --no-elastic: no section
    jobs = [{"min_pods": 2, "running_at_event_start": True, "event_shrunk_s": 120.0},
            {"min_pods": 2, "running_at_event_start": True, "event_shrunk_s": 0.0},
            {"min_pods": 1, "running_at_event_start": False, "event_shrunk_s": 30.0},
            {"min_pods": 0, "running_at_event_start": True, "event_shrunk_s": 0.0}]
    assert elastic_figures(jobs) == {"jobs": 3, "runningAtEventStart": 2, "shrunkInEvent": 2,
                                     "shrunkSeconds": 150.0}
