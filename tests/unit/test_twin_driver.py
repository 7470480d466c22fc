"""The twin's job driver on hand-made pods: progress, completion, checkpoints, evictions."""

from __future__ import annotations

from typing import Any

from twinkit.driver import DELETE_GRACE_S, LAST_CHECKPOINT, Driver
from twinkit.trace import TraceJob

T0 = 1_000_000.0


def tj(name: str = "twin-00001", gpus: int = 8, runtime: float = 600.0,
       checkpoint_s: int = 120) -> TraceJob:
    return TraceJob(name, "openb-pod", 0.0, runtime, gpus, "fine-tuning", 2, "research",
                    "m2g-fine-tuning", checkpoint_s, False, "", False)


def pod(job: str, i: int, node: str | None, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{job}-{i}", "namespace": "research", "uid": f"{job}-{i}-u",
                         "labels": {"batch.kubernetes.io/job-name": job}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def wl(job: str) -> dict[str, Any]:
    return {"metadata": {"name": f"job-{job}-abc", "namespace": "research",
                         "creationTimestamp": "1970-01-12T13:46:40Z",
                         "ownerReferences": [{"kind": "Job", "name": job}]},
            "status": {"conditions": [{"type": "Admitted", "status": "True",
                                       "lastTransitionTime": "1970-01-12T13:46:42Z"}]}}


def running(job: str = "twin-00001") -> list[dict[str, Any]]:
    return [pod(job, 0, "n1", "Running"), pod(job, 1, "n2", "Running")]


def driver(**kw: Any) -> Driver:
    job = tj(**kw)
    d = Driver({job.name: job}, time_scale=60.0, t0=T0, event_start=3.0, event_end=6.0)
    d.node_rack = {"n1": "r1", "n2": "r1", "n3": "r2"}
    d.rack_trays = {"r1": 18, "r2": 18}
    d.sizes = {8: 1.0}
    return d


def test_a_job_runs_checkpoints_and_completes_through_kwok() -> None:
    d = driver()
    d.observe(T0, running(), [wl("twin-00001")])
    rec = d.records["twin-00001"]
    assert rec.submitted == 0.0 and rec.admitted == 2.0 and rec.runs == [["n1", "n2"]]
    w = d.observe(T0 + 2.5, running(), [wl("twin-00001")])  # 150 trace s: one checkpoint
    assert [c[:2] for c in w.checkpoints] == [("research", "job-twin-00001-abc")]
    assert LAST_CHECKPOINT == "m2g.io/last-checkpoint-time"
    w = d.observe(T0 + 10.0, running(), [wl("twin-00001")])  # 600 trace s in all: done
    assert sorted(w.complete_pods) == [("research", "twin-00001-0"), ("research", "twin-00001-1")]
    done = [pod("twin-00001", i, "n1", "Succeeded") for i in range(2)]
    w = d.observe(T0 + 11.0, done, [finished(wl("twin-00001"))])
    assert w.delete_jobs == [("research", "twin-00001")] and rec.finished == 11.0
    assert rec.evictions == 0


def finished(w: dict[str, Any]) -> dict[str, Any]:
    w["status"]["conditions"].append({"type": "Finished", "status": "True"})
    return w


def test_a_finished_job_is_deleted_only_once_kueue_gave_its_quota_back() -> None:
    d = driver(runtime=60.0)
    d.observe(T0, running(), [wl("twin-00001")])
    d.observe(T0 + 2.0, running(), [wl("twin-00001")])  # 120 trace s: done
    done = [pod("twin-00001", i, "n1", "Succeeded") for i in range(2)]
    w = d.observe(T0 + 3.0, done, [wl("twin-00001")])  # pods done, Workload not Finished
    assert w.delete_jobs == [] and d.records["twin-00001"].finished == 3.0
    w = d.observe(T0 + 4.0, done, [finished(wl("twin-00001"))])
    assert w.delete_jobs == [("research", "twin-00001")]


def test_a_finished_job_kueue_never_marks_is_deleted_after_the_grace() -> None:
    d = driver(runtime=60.0)
    d.observe(T0, running(), [wl("twin-00001")])
    d.observe(T0 + 2.0, running(), [wl("twin-00001")])
    done = [pod("twin-00001", i, "n1", "Succeeded") for i in range(2)]
    d.observe(T0 + 3.0, done, [wl("twin-00001")])
    assert d.observe(T0 + 3.0 + DELETE_GRACE_S - 1, done, [wl("twin-00001")]).delete_jobs == []
    w = d.observe(T0 + 3.0 + DELETE_GRACE_S, done, [wl("twin-00001")])
    assert w.delete_jobs == [("research", "twin-00001")]


def test_an_evicted_job_loses_work_and_restarts() -> None:
    d = driver()
    d.observe(T0, running(), [wl("twin-00001")])
    d.observe(T0 + 3.0, running(), [wl("twin-00001")])  # 180 trace s: checkpoint at 120
    evicted = wl("twin-00001")
    evicted["status"]["conditions"] += [
        {"type": "Evicted", "status": "True", "reason": "Preempted"},
        {"type": "Preempted", "status": "True", "reason": "InClusterQueue"}]
    d.observe(T0 + 4.0, [], [evicted])  # pods gone: evicted (inside the event, 3–6 s)
    rec = d.records["twin-00001"]
    assert rec.evictions == 1 and rec.lost == 8 * 60.0
    assert rec.stops == [[4.0, "Preempted/InClusterQueue"]]
    assert rec.event_stops == ["Preempted/InClusterQueue"]
    assert d.progress["twin-00001"].done == 8 * 120.0
    d.observe(T0 + 5.0, [pod("twin-00001", 0, "n3", "Running"),
                         pod("twin-00001", 1, "n1", "Running")], [wl("twin-00001")])
    assert rec.restarts == 1 and rec.runs[-1] == ["n1", "n3"]


def test_a_failed_tray_stalls_its_job_and_caps_slow_it() -> None:
    d = driver(runtime=6000.0)
    d.observe(T0, running(), [wl("twin-00001")])
    d.observe(T0 + 1.0, running(), [wl("twin-00001")], [{"kind": "tray-failed", "node": "n2"}])
    assert d.progress["twin-00001"].done == 0.0
    d.observe(T0 + 2.0, running(), [wl("twin-00001")],
              [{"kind": "power-cap", "rack": "r1", "fraction": 0.5}])
    assert 0 < d.progress["twin-00001"].done < 8 * 60.0
    rec = d.records["twin-00001"]
    assert rec.event_capped_s == 0.0  # before the event (3–6 s): not counted
    for t in (3.0, 4.0, 5.0):  # 3: the event begins; 4 and 5 inside it
        d.observe(T0 + t, running(), [wl("twin-00001")],
                  [{"kind": "power-cap", "node": "n1", "fraction": 0.7}])
    assert rec.event_capped_s == 2 * 60.0 and rec.event_stalled_s == 0.0 and not rec.stops


def test_event_window_and_allocation_samples() -> None:
    d = driver(runtime=6000.0, checkpoint_s=0)
    d.observe(T0, [pod("twin-00001", 0, "n1", "Running"), pod("twin-00001", 1, "n2",
                                                               "Pending")], [wl("twin-00001")])
    assert d.samples[-1][1] == 8  # bound pods hold their GPUs even before they run
    d.observe(T0 + 3.0, running(), [wl("twin-00001")])
    rec = d.records["twin-00001"]
    assert rec.running_at_event_start and rec.done_at_event_start == 0.0
    d.observe(T0 + 6.0, running(), [wl("twin-00001")])
    assert rec.done_at_event_end == 8 * 180.0  # from t=3 (it started) to t=6
    assert d.samples[-1][2] >= 0.0


def test_an_eviction_between_two_looks_is_still_seen() -> None:
    d = driver()
    d.observe(T0, running(), [wl("twin-00001")])
    d.observe(T0 + 3.0, running(), [wl("twin-00001")])
    fresh = [dict(p, metadata={**p["metadata"], "uid": p["metadata"]["uid"] + "-new"})
             for p in running()]
    d.observe(T0 + 4.0, fresh, [wl("twin-00001")])  # new pods: it was evicted meanwhile
    rec = d.records["twin-00001"]
    assert rec.evictions == 1 and rec.restarts == 1 and len(rec.runs) == 2


def test_the_admission_steps_come_from_the_workloads_own_conditions() -> None:
    d = driver()
    w = wl("twin-00001")
    w["status"] = {"conditions": [{"type": "QuotaReserved", "status": "True",
                                   "lastTransitionTime": "1970-01-12T13:46:41Z"}],
                   "admissionChecks": [{"name": "m2g-policy", "state": "Pending"}]}
    d.observe(T0 + 1.5, [], [w])
    rec = d.records["twin-00001"]
    assert (rec.workload, rec.quota_reserved, rec.check_ready, rec.admitted) == (
        "job-twin-00001-abc", 1.0, None, None)
    w["status"]["admissionChecks"][0].update(state="Ready",
                                             lastTransitionTime="1970-01-12T13:46:43Z")
    w["status"]["conditions"].append({"type": "Admitted", "status": "True",
                                      "lastTransitionTime": "1970-01-12T13:46:45Z"})
    d.observe(T0 + 6.0, running(), [w])
    assert (rec.quota_reserved, rec.check_ready, rec.admitted, rec.bound) == (1.0, 3.0, 5.0, 6.0)
    # a later eviction and re-admission does not move the first admission's steps
    w["status"]["conditions"][0]["lastTransitionTime"] = "1970-01-12T13:47:40Z"
    d.observe(T0 + 61.0, running(), [w])
    assert (rec.quota_reserved, rec.admitted) == (1.0, 5.0)
