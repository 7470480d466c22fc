"""Grid paths against real Kueue v0.19: a deferral that ends with its event, percentage events.

Runs the real control loop in this process (as test_controller_e2e does) against the local
control plane, with the modelled rack power of that file.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Cluster, Obj, condition, unique
from test_controller_e2e import (
    CHECK,
    _delete,
    factory_flavor,
    job,
    make_queue,
    running_m2g,
    until,
    workload_of,
)

from m2g.planner.config import PlannerConfig
from m2g_cli.report_cmd import read_table
from m2g_cli.report_view import summary
from m2g_controllers.decisionlog import DecisionLog

pytestmark = pytest.mark.e2e


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def short_event(cluster: Cluster, ends_in: float, payload: Obj | None = None,
                **spec: Any) -> str:
    """A GridEvent that started a minute ago and ends ``ends_in`` seconds from now."""
    name = unique("e2e-dr")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    length = 60 + int(ends_in) + 1
    body = {"programName": "e2e", "eventID": name, **spec,
            "intervals": [{"start": _time(start), "duration": f"PT{length}S",
                           "payload": payload or {"type": "SIMPLE", "value": 2}}]}
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "gridevents", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent", "metadata": {"name": name},
        "spec": body})
    cluster.cleanup.append(lambda: _delete(cluster, "gridevents", name))
    return name


def entry(wl: Obj | None) -> Obj:
    for e in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if e.get("name") == CHECK:
            return dict(e)
    return {}


async def test_a_deferral_turns_ready_when_the_event_ends_without_an_eviction(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    """m2g defers (Retry, requeueAfterSeconds 30: the e2e-dr policy) during an event that ends
    ~8 s later. When it ends, m2g answers Ready while Kueue still holds the quota; Kueue v0.19.2
    then admits the workload at its requeueAt without evicting it (no Evicted condition, no
    retryCount) — before, it stayed Retry until Kueue evicted, requeued and reserved again."""
    make_queue(cluster, namespace, factory_flavor(cluster), 64)
    event = short_event(cluster, ends_in=8)
    cfg = PlannerConfig(check_name=CHECK, max_retry_hold_seconds=30)
    async with running_m2g(kubeconfig, policy_dir, config=cfg):
        cluster.batch.create_namespaced_job(namespace, job("flex", 8, tier=2))
        deferred = await until("m2g to defer the flexible job", lambda: (
            (wl := workload_of(cluster, namespace, "flex")) and entry(wl).get("state") == "Retry"
            and wl))
        assert event in entry(deferred)["message"]
        retry_at = datetime.fromisoformat(entry(deferred)["lastTransitionTime"])
        ready = await until("m2g to answer Ready once the event is over", lambda: (
            (wl := workload_of(cluster, namespace, "flex")) and entry(wl).get("state") == "Ready"
            and wl), timeout=40)
        ready_at = datetime.fromisoformat(entry(ready)["lastTransitionTime"])
        # answered on m2g's own time (the event's end + a reconcile), not at Kueue's requeue
        assert ready_at < retry_at + timedelta(seconds=25), (retry_at, ready_at)
        reserved = condition(ready, "QuotaReserved")
        assert reserved is not None and reserved["status"] == "True"  # never released
        admitted = await until("Kueue to admit it", lambda: (
            (wl := workload_of(cluster, namespace, "flex")) and (c := condition(wl, "Admitted"))
            and c["status"] == "True" and wl), timeout=60)
        assert condition(admitted, "Evicted") is None  # no eviction, no second reservation
        assert not entry(admitted).get("retryCount")
        admitted_at = datetime.fromisoformat(condition(admitted, "Admitted")["lastTransitionTime"])
        print(f"Retry {retry_at:%T}, Ready {ready_at:%T}, Admitted {admitted_at:%T} "
              f"(requeueAt {retry_at + timedelta(seconds=30):%T})")


async def test_the_deferral_message_says_the_real_time_left(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None) -> None:
    """The shipped grid-demand-response policy, an event ending in a few seconds: the message
    names those seconds (never the 900 s fallback), and Kueue's requeue follows them."""
    from e2e_helpers import REPO
    src = REPO / "policies" / "grid-demand-response" / "policy.yaml"
    (tmp_path / "dr.yaml").write_text(src.read_text())
    make_queue(cluster, namespace, factory_flavor(cluster), 64)
    short_event(cluster, ends_in=5)
    async with running_m2g(kubeconfig, tmp_path):
        cluster.batch.create_namespaced_job(namespace, job("flex", 8, tier=2))
        wl = await until("m2g to defer the flexible job", lambda: (
            (w := workload_of(cluster, namespace, "flex")) and entry(w).get("state") == "Retry"
            and w))
        e = entry(wl)
        assert "900" not in e["message"], e["message"]
        left = int(e["message"].split("waits until it ends in ")[1].split(" s")[0])
        # asked retryGraceSeconds longer (5): m2g's Ready at the end reaches Kueue before
        # its requeue evicts the workload
        assert 1 <= left <= 7 and e["requeueAfterSeconds"] == left + 5
        await until("the job admitted after the event", lambda: (
            (w := workload_of(cluster, namespace, "flex")) and (c := condition(w, "Admitted"))
            and c["status"] == "True"), timeout=60)


def event_status(cluster: Cluster, name: str) -> Obj:
    obj = cluster.custom.get_cluster_custom_object("m2g.io", "v1alpha1", "gridevents", name)
    return dict(obj.get("status") or {})


async def test_a_percentage_event_records_its_baseline_and_sheds_to_it(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path: Path) -> None:
    """A 15 % reduction event starting 8 s from now: m2g samples the draw before the start,
    writes status.observedBaselineKw (the mean over the window before the start) and targetKw, phase Pending → Active
    → Completed, and sheds the tier-3 job to meet the target (before: no baseline, no target,
    nothing shed)."""
    from test_controller_e2e import admitted, modelled_power, site_with_budget
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    # a 5 s baseline window: the samples before the start are all of the three running jobs
    cfg = PlannerConfig(check_name=CHECK, ramp_kw_per_second=1000.0, settle_seconds=5.0,
                        shed_saving_fraction=1.0, min_shed_seconds=5.0,
                        baseline_window_seconds=5.0)
    dlog = DecisionLog(tmp_path / "log")
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), cfg, dlog):
        for name, tier in (("firm", 0), ("flex1", 1), ("flex3", 3)):
            cluster.batch.create_namespaced_job(namespace, job(name, 16, tier=tier))
        await until("three workloads admitted", lambda: admitted(cluster, namespace) == 3)
        # idle 2 x 20 kW + 48 GPUs x 1.3 = 102.4 kW (once the pods run); 15 % off: 87 kW
        await until("the pods to draw", lambda: len([
            p for p in cluster.core.list_namespaced_pod(namespace).items
            if p.status.phase == "Running"]) == 12, timeout=60)
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
        name = unique("e2e-pct")
        cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "gridevents", {
            "apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent", "metadata": {"name": name},
            "spec": {"programName": "e2e", "eventID": name, "targetReductionPercent": 15,
                     "intervals": [{"start": _time(start), "duration": "PT40S",
                                    "payload": {"type": "SIMPLE", "value": 1}}]}})
        cluster.cleanup.append(lambda: _delete(cluster, "gridevents", name))
        pending = await until("the event's status Pending", lambda: (
            (st := event_status(cluster, name)).get("phase") == "Pending" and st))
        assert "observedBaselineKw" not in pending
        active = await until("the baseline recorded at the start", lambda: (
            (st := event_status(cluster, name)).get("observedBaselineKw") and st), timeout=30)
        assert active["phase"] == "Active"
        assert active["observedBaselineKw"] == pytest.approx(102.4, abs=0.01)
        assert active["targetKw"] == pytest.approx(102.4 * 0.85, abs=0.01)
        conds = {c["type"]: c for c in active["conditions"]}
        assert conds["BaselineObserved"]["reason"] == "PreEventMean"
        assert conds["Active"]["status"] == "True"
        shed = await until("m2g to shed the tier-3 workload", lambda: (
            (wl := workload_of(cluster, namespace, "flex3")) and
            wl["spec"].get("active") is False and wl))
        assert "m2g.io/shed-at" in shed["metadata"]["annotations"]
        flex1 = workload_of(cluster, namespace, "flex1")
        assert flex1 is not None and flex1["spec"].get("active", True) is True  # one was enough
        done = await until("the event Completed", lambda: (
            (st := event_status(cluster, name)).get("phase") == "Completed" and st), timeout=60)
        assert done["observedBaselineKw"] == active["observedBaselineKw"]  # measured once
    # the decision log of the same run, as m2g report reads it
    dlog.close()
    report = summary(read_table(tmp_path / "log", "decisions"),
                     read_table(tmp_path / "log", "lifecycle"), 10.0)
    (ev,) = [e for e in report["events"] if e["event"] == name]
    assert ev["baselineKw"] == pytest.approx(102.4, abs=0.01)
    assert ev["targetKw"] == pytest.approx(87.04, abs=0.01)
    assert ev["actions"].get("Preemption/Shed") == 1 and ev["samples"] >= 5
    assert ev["secondsToTarget"] is not None and ev["secondsToTarget"] < 30
    records = report["lifecycle"]["records"]
    assert records["admitted"] >= 3 and records["placed"] >= 3 and records["shed"] == 1


def cohort_queue(cluster: Cluster, name: str, cohort: str, flavor: str, gpus: int,
                 namespace: str | None = None) -> None:
    """A ClusterQueue of ``gpus`` GPUs in ``cohort`` (no admission check: Kueue alone admits),
    with the LocalQueue "default" of ``namespace`` pointing at it."""
    cluster.create_kueue("clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"cohortName": cohort, "namespaceSelector": {},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                     "flavors": [{"name": flavor, "resources": [
                                         {"name": "cpu", "nominalQuota": "1000"},
                                         {"name": "memory", "nominalQuota": "10000Gi"},
                                         {"name": "nvidia.com/gpu",
                                          "nominalQuota": str(gpus)}]}]}]}})
    if namespace:
        cluster.create_kueue("localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": namespace},
            "spec": {"clusterQueue": name}}, namespace=namespace)


def weighted_share(cluster: Cluster, cq: str) -> int | None:
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", cq)
    share = ((obj.get("status") or {}).get("fairSharing") or {}).get("weightedShare")
    return None if share is None else int(share)


async def test_a_fairness_weight_changes_kueues_fair_share(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None) -> None:
    """With fair sharing on (the local Kueue runs the shipped fairSharing block), a queue that
    borrows 4 of its cohort's 16 lendable GPUs has weightedShare 4 / 16 × 1000 = 250 at the
    default weight; m2g's Fairness policy sets weight 2 and Kueue reports 125 (Kueue admits
    from the lowest share and preempts from the highest). Without the Configuration block
    Kueue reports no fairSharing status at all and ignores the weight."""
    flavor = factory_flavor(cluster)
    cohort, borrower, lender = unique("e2e-co"), unique("e2e-fs-a"), unique("e2e-fs-b")
    cohort_queue(cluster, borrower, cohort, flavor, 8, namespace)
    cohort_queue(cluster, lender, cohort, flavor, 8)
    cluster.batch.create_namespaced_job(namespace, job("wide", 12, tier=0))
    await until("Kueue to admit the 12-GPU job by borrowing", lambda: (
        (wl := workload_of(cluster, namespace, "wide")) and (c := condition(wl, "Admitted"))
        and c["status"] == "True"), timeout=60)
    await until("the default-weight share", lambda: weighted_share(cluster, borrower) == 250,
                timeout=30)
    (tmp_path / "fair.yaml").write_text(f"""
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {{name: e2e-fair}}
spec:
  stage: Fairness
  rules:
    - {{name: double, when: "queue.name == '{borrower}'", weight: 2.0, message: "weight 2"}}
""")
    async with running_m2g(kubeconfig, tmp_path):
        await until("Kueue's share under weight 2", lambda: (
            weighted_share(cluster, borrower) == 125), timeout=30)
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", borrower)
    assert obj["spec"]["fairSharing"]["weight"] == "2"
    assert weighted_share(cluster, lender) == 0  # not borrowing
