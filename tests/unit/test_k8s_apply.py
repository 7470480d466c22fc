"""m2g.k8s.apply against the in-memory FakeKube: idempotence, conflicts, dry run."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

import m2g.k8s.convert as cv
from m2g.k8s.apply import MAX_CHECK_MESSAGE, Applier
from m2g.k8s.client import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    EVENTS,
    POLICIES,
    WORKLOADS,
    Conflict,
    Kube,
    PermanentError,
)
from m2g.model.cluster import CheckState
from m2g.model.plan import CheckUpdate, Plan, QuotaUpdate, ShedAction, StopUpdate, WeightUpdate
from m2g.testing.kube import FakeKube

T0 = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def setup(dry_run: bool = False) -> tuple[FakeKube, Applier, Clock]:
    kube, clock = FakeKube(), Clock()
    kube.put(WORKLOADS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                         "metadata": {"name": "w", "namespace": "ns", "uid": "u1"},
                         "spec": {"active": True},
                         "status": {"admissionChecks": [
                             {"name": "other", "state": "Pending", "message": ""},
                             {"name": "m2g", "state": "Pending", "message": "",
                              "lastTransitionTime": "2026-11-29T22:00:00Z"}]}})
    kube.put(CLUSTER_QUEUES, {"metadata": {"name": "cq"}, "spec": {"resourceGroups": [
        {"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [
            {"name": "a", "resources": [{"name": "cpu", "nominalQuota": "10"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": "72"}]},
            {"name": "b", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "36"}]}]}]}})
    return kube, Applier(cast(Kube, kube), dry_run=dry_run, clock=clock), clock


def check(kube: FakeKube, name: str = "m2g") -> dict[str, Any]:
    entries = kube.stored(WORKLOADS, "w", "ns")["status"]["admissionChecks"]
    return next(e for e in entries if e["name"] == name)


async def test_check_update_is_idempotent_and_keeps_transition_time() -> None:
    kube, ap, clock = setup()
    u = CheckUpdate("ns", "w", "m2g", CheckState.RETRY, "grid event", requeue_after_seconds=600)
    assert await ap.apply_check(u)
    assert check(kube) == {"name": "m2g", "state": "Retry", "message": "grid event",
                           "requeueAfterSeconds": 600,
                           "lastTransitionTime": "2026-11-29T23:00:00Z"}
    assert check(kube, "other")["state"] == "Pending"  # others' entries untouched
    writes = len(kube.writes())
    assert not await ap.apply_check(u)  # same again: nothing written
    assert len(kube.writes()) == writes
    clock.now += timedelta(minutes=5)
    assert await ap.apply_check(CheckUpdate("ns", "w", "m2g", CheckState.RETRY, "still"))
    assert check(kube)["lastTransitionTime"] == "2026-11-29T23:00:00Z"  # same state
    assert "requeueAfterSeconds" not in check(kube)
    assert await ap.apply_check(CheckUpdate("ns", "w", "m2g", CheckState.READY, "x" * 40000))
    assert check(kube)["lastTransitionTime"] == "2026-11-29T23:05:00Z"
    assert len(check(kube)["message"].encode()) <= MAX_CHECK_MESSAGE


async def test_quota_records_base_once_and_removes_it_on_restore() -> None:
    kube, ap, _ = setup()
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 48, 72, "derate"))
    cq = kube.stored(CLUSTER_QUEUES, "cq")
    flavors = cq["spec"]["resourceGroups"][0]["flavors"]
    assert flavors[0]["resources"] == [{"name": "cpu", "nominalQuota": "10"},
                                       {"name": "nvidia.com/gpu", "nominalQuota": "48"}]
    assert flavors[1]["resources"][0]["nominalQuota"] == "36"
    assert cq["metadata"]["annotations"]["m2g.io/base-quota.a"] == "72"
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 24, 72, "more"))
    assert kube.stored(CLUSTER_QUEUES, "cq")["metadata"]["annotations"][
        "m2g.io/base-quota.a"] == "72"  # the platform's value, not m2g's 48
    assert not await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 24, 72, "same"))
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 72, 72, "restore"))
    annotations = kube.stored(CLUSTER_QUEUES, "cq")["metadata"]["annotations"]
    assert "m2g.io/base-quota.a" not in annotations
    assert annotations["m2g.io/quota-changed-at"] == "2026-11-29T23:00:00Z"


async def test_a_quota_changed_by_someone_else_becomes_the_new_base() -> None:
    """A forced GitOps sync writes a new platform quota over m2g's derate: m2g adopts it as the
    base instead of derating from the stale recorded one."""
    kube, ap, _ = setup()
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 48, 72, "derate"))
    annotations = kube.stored(CLUSTER_QUEUES, "cq")["metadata"]["annotations"]
    assert (annotations["m2g.io/base-quota.a"], annotations["m2g.io/quota-set.a"]) == ("72", "48")
    cq = kube.stored(CLUSTER_QUEUES, "cq")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = "100"
    kube.put(CLUSTER_QUEUES, cq)  # the platform raised the quota in Git and force-synced
    assert cv.cluster_queue(kube.stored(CLUSTER_QUEUES, "cq")).quotas[0].base == 100
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 66, 100, "derate"))
    annotations = kube.stored(CLUSTER_QUEUES, "cq")["metadata"]["annotations"]
    assert (annotations["m2g.io/base-quota.a"], annotations["m2g.io/quota-set.a"]) == ("100", "66")
    assert await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 100, 100, "restore"))
    annotations = kube.stored(CLUSTER_QUEUES, "cq")["metadata"]["annotations"]
    assert not any(k.startswith(("m2g.io/base-quota.", "m2g.io/quota-set.")) for k in annotations)


async def test_quota_retries_on_conflict_and_reports_unknown_flavor() -> None:
    kube, ap, _ = setup()
    kube.fail_next = [Conflict("modified", 409, "Conflict")] * 2
    assert await ap.apply_quota(QuotaUpdate("cq", "b", "nvidia.com/gpu", 18, 36, "derate"))
    assert kube.stored(CLUSTER_QUEUES, "cq")["spec"]["resourceGroups"][0]["flavors"][1][
        "resources"][0]["nominalQuota"] == "18"
    result = await ap.apply_core(Plan(quotas=(
        QuotaUpdate("cq", "zzz", "nvidia.com/gpu", 1, 1, "x"),)))
    assert len(result.errors) == 1 and isinstance(result.errors[0][1], PermanentError)


async def test_m2g_lifts_the_stop_policy_it_set_and_only_that() -> None:
    """m2g lifts only a stopPolicy it set itself: the Hold it writes is recorded on the
    ClusterQueue (m2g.io/stop-policy-set), read back as m2g's, and removed when lifted. Before,
    nothing recorded it, so a Hold m2g set for unhealthy GPUs was never lifted when they
    recovered (the chart e2e's queues stayed held)."""
    kube, ap, _ = setup()
    assert not cv.cluster_queue(kube.stored(CLUSTER_QUEUES, "cq")).stop_set_by_m2g
    await ap.apply_stop(StopUpdate("cq", "Hold", "health-quota: 108 of 144 GPUs unhealthy"))
    held = kube.stored(CLUSTER_QUEUES, "cq")
    assert held["spec"]["stopPolicy"] == "Hold"
    assert held["metadata"]["annotations"]["m2g.io/stop-policy-set"] == "Hold"
    assert cv.cluster_queue(held).stop_set_by_m2g
    await ap.apply_stop(StopUpdate("cq", "None", "no Capacity policy asks to stop"))
    lifted = kube.stored(CLUSTER_QUEUES, "cq")
    assert lifted["spec"]["stopPolicy"] == "None"
    assert "m2g.io/stop-policy-set" not in (lifted["metadata"].get("annotations") or {})
    assert not cv.cluster_queue(lifted).stop_set_by_m2g
    # someone else's stopPolicy (an operator's HoldAndDrain over m2g's Hold) is not m2g's
    other = copy.deepcopy(held)
    other["spec"]["stopPolicy"] = "HoldAndDrain"
    assert not cv.cluster_queue(other).stop_set_by_m2g


async def test_stop_weight_and_shed_restore() -> None:
    kube, ap, _ = setup()
    plan = Plan(stops=(StopUpdate("cq", "Hold", "maintenance"),),
                weights=(WeightUpdate("cq", 1.5, "night"),),
                sheds=(ShedAction("ns", "w", False, 120.0, "grid event ev-1"),))
    result = await ap.apply_core(plan)
    assert not result.errors and result.written == 3
    cq = kube.stored(CLUSTER_QUEUES, "cq")
    assert cq["spec"]["stopPolicy"] == "Hold" and cq["spec"]["fairSharing"]["weight"] == "1.5"
    wl = kube.stored(WORKLOADS, "w", "ns")
    assert wl["spec"]["active"] is False
    assert wl["metadata"]["annotations"] == {"m2g.io/shed-at": "2026-11-29T23:00:00Z",
                                             "m2g.io/shed-reason": "grid event ev-1"}
    events = [o for (plural, _, _), o in kube.objects.items() if plural == EVENTS.plural]
    assert [(e["reason"], e["type"], e["regarding"]["name"]) for e in events] == \
        [("Shed", "Warning", "w")]
    again = await ap.apply_core(plan)
    assert again.written == 0  # idempotent
    await ap.apply_shed(ShedAction("ns", "w", True, 120.0, "event over"))
    wl = kube.stored(WORKLOADS, "w", "ns")
    # the restore's own time stays: the ramp counts from it (a successor's too)
    assert wl["spec"]["active"] is True
    assert wl["metadata"]["annotations"] == {"m2g.io/restored-at": "2026-11-29T23:00:00Z"}
    await ap.apply_shed(ShedAction("ns", "w", False, 120.0, "grid event ev-2"))
    notes = kube.stored(WORKLOADS, "w", "ns")["metadata"]["annotations"]
    # the last restore's time stays through a shed: one shed again soon after it waits
    # the full min_shed_seconds (no early restore: m2g.planner.shedding.settled)
    assert notes["m2g.io/restored-at"] == "2026-11-29T23:00:00Z" and "m2g.io/shed-at" in notes


async def test_restore_leaves_workloads_m2g_did_not_shed() -> None:
    kube, ap, _ = setup()
    await kube.patch(WORKLOADS, "w", {"spec": {"active": False}}, namespace="ns")
    assert not await ap.apply_shed(ShedAction("ns", "w", True, 0, "restore"))
    assert kube.stored(WORKLOADS, "w", "ns")["spec"]["active"] is False


async def test_dry_run_writes_only_events() -> None:
    kube, ap, _ = setup(dry_run=True)
    before = {k: dict(v) for k, v in kube.objects.items()}
    result = await ap.apply_core(Plan(
        checks=(CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok"),),
        quotas=(QuotaUpdate("cq", "a", "nvidia.com/gpu", 1, 72, "x"),),
        sheds=(ShedAction("ns", "w", False, 1, "x"),)))
    assert [r.action for r in result.records] == ["quota", "shed", "check"]
    assert not any(r.written for r in result.records)
    assert {v for v, _, _ in kube.writes()} == set()
    assert kube.objects == before
    await ap.emit_event(kube.stored(WORKLOADS, "w", "ns"), "WouldShed", "shadow")
    assert any(p == EVENTS.plural for p, _, _ in kube.objects)


async def test_admission_check_created_and_kept_active() -> None:
    kube, ap, _ = setup()
    assert await ap.ensure_admission_check_active("m2g")
    ac = kube.stored(ADMISSION_CHECKS, "m2g")
    assert ac["spec"]["controllerName"] == "m2g.io/policy"
    assert ac["status"]["conditions"][0]["status"] == "True"
    assert not await ap.ensure_admission_check_active("m2g")
    kube.put(ADMISSION_CHECKS, {"metadata": {"name": "theirs"},
                                "spec": {"controllerName": "kueue.x-k8s.io/provisioning"}})
    try:
        await ap.ensure_admission_check_active("theirs")
    except PermanentError as exc:
        assert "provisioning" in str(exc)
    else:
        raise AssertionError("expected PermanentError")


async def test_policy_status_conditions() -> None:
    kube, ap, clock = setup()
    kube.put(POLICIES, {"metadata": {"name": "p", "generation": 3}, "spec": {}})
    assert await ap.set_policy_status("p", accepted=False, ready=False, reason="CompileError",
                                      message="undeclared reference to 'x'")
    conds = {c["type"]: c for c in kube.stored(POLICIES, "p")["status"]["conditions"]}
    assert conds["Accepted"]["status"] == "False" and conds["Ready"]["observedGeneration"] == 3
    assert not await ap.set_policy_status("p", accepted=False, ready=False,
                                          reason="CompileError",
                                          message="undeclared reference to 'x'")
    clock.now += timedelta(minutes=1)
    assert await ap.set_policy_status("p", accepted=True, ready=True, reason="Compiled",
                                      message="ok")
    conds = {c["type"]: c for c in kube.stored(POLICIES, "p")["status"]["conditions"]}
    assert conds["Ready"]["lastTransitionTime"] == "2026-11-29T23:01:00Z"
    assert not await ap.set_policy_status("missing", accepted=True, ready=True, reason="R",
                                          message="")


async def test_pod_set_updates_are_pruned_so_reapplying_is_a_no_op() -> None:
    kube, ap, _ = setup()
    u = CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok", pod_set_updates=(
        {"name": "main", "labels": {"network.topology.nvidia.com/accelerator": "rack-000"}, "annotations": {},
         "tolerations": []},))
    assert await ap.apply_check(u)
    assert check(kube)["podSetUpdates"] == [{"name": "main",
                                             "labels": {"network.topology.nvidia.com/accelerator": "rack-000"}}]
    assert not await ap.apply_check(u)


async def test_apply_status_of_an_m2g_object() -> None:
    from m2g.k8s.client import GRID_EVENTS

    kube, ap, _ = setup()
    kube.put(GRID_EVENTS, {"metadata": {"name": "ev"}, "spec": {"eventID": "e"}})
    status = {"phase": "Active", "observedBaselineKw": 1200.0}
    assert await ap.apply_status(GRID_EVENTS, "ev", status)
    assert kube.stored(GRID_EVENTS, "ev")["status"] == status
    assert not await ap.apply_status(GRID_EVENTS, "ev", {"phase": "Active"})
    shadow = Applier(cast(Kube, kube), dry_run=True)
    assert not await shadow.apply_status(GRID_EVENTS, "ev", {"phase": "Completed"})
    assert kube.stored(GRID_EVENTS, "ev")["status"]["phase"] == "Active"
    assert shadow.records[-1].detail == "phase" and not shadow.records[-1].written


async def test_a_retried_quota_change_is_recorded_once() -> None:
    kube, ap, _ = setup()
    kube.fail_next = [None, Conflict("modified", 409, "Conflict")]  # the patch conflicts once
    result = await ap.apply_core(Plan(quotas=(QuotaUpdate("cq", "a", "nvidia.com/gpu", 8, 72,
                                                          "derate"),)))
    assert not result.errors and result.written == 1 and len(result.records) == 1


async def test_many_workload_changes_in_parallel_each_once() -> None:
    kube, _, _ = setup()
    for i in range(40):
        kube.put(WORKLOADS, {"metadata": {"name": f"w{i}", "namespace": "ns"},
                             "spec": {"active": True}, "status": {}})
    ap = Applier(cast(Kube, kube), parallel=8)
    plan = Plan(checks=tuple(CheckUpdate("ns", f"w{i}", "m2g", CheckState.READY, "ok")
                             for i in range(20)),
                sheds=tuple(ShedAction("ns", f"w{i}", False, 1.0, "grid")
                            for i in range(20, 40)))
    result = await ap.apply_core(plan)
    assert not result.errors and result.written == 40
    assert sorted(r.target for r in result.records) == sorted(f"ns/w{i}" for i in range(40))
    assert all(kube.stored(WORKLOADS, f"w{i}", "ns")["spec"]["active"] is False
               for i in range(20, 40))


async def test_background_events_do_not_hold_up_the_apply() -> None:
    """With ``background_events`` the shed is made and apply_core returns while its Event is
    still being written; ``drain`` waits for it."""
    import asyncio

    kube, _, clock = setup()
    ap = Applier(cast(Kube, kube), clock=clock, background_events=True)
    release = asyncio.Event()
    create = kube.create

    async def slow_create(res: Any, body: Any, namespace: str | None = None,
                          dry_run: bool = False) -> Any:
        if res.plural == EVENTS.plural:
            await release.wait()
        return await create(res, body, namespace, dry_run)

    kube.create = slow_create  # type: ignore[method-assign]

    def events() -> list[str]:
        return [o["reason"] for (plural, _, _), o in kube.objects.items()
                if plural == EVENTS.plural]

    result = await ap.apply_core(Plan(sheds=(ShedAction("ns", "w", False, 12.0, "ev-1"),)))
    assert result.written == 1 and kube.stored(WORKLOADS, "w", "ns")["spec"]["active"] is False
    assert events() == []  # still waiting to be written
    release.set()
    await ap.drain(timeout=5)
    assert events() == ["Shed"]


async def test_a_check_with_bad_parameters_is_set_inactive_and_never_created() -> None:
    kube, ap, _ = setup()
    assert not await ap.ensure_admission_check_active("absent", active=False,
                                                      reason="BadParametersRef", message="x")
    assert not [k for k in kube.objects if "absent" in k]
    kube.put(ADMISSION_CHECKS, {"metadata": {"name": "m2g-inference", "generation": 2},
                                "spec": {"controllerName": "m2g.io/policy"}})
    assert await ap.ensure_admission_check_active("m2g-inference", active=False,
                                                  reason="BadParametersRef", message="no cfg")
    (cond,) = kube.stored(ADMISSION_CHECKS, "m2g-inference")["status"]["conditions"]
    assert (cond["status"], cond["reason"], cond["message"], cond["observedGeneration"]) == (
        "False", "BadParametersRef", "no cfg", 2)
    assert not await ap.ensure_admission_check_active("m2g-inference", active=False,
                                                      reason="BadParametersRef",
                                                      message="no cfg")
    assert await ap.ensure_admission_check_active("m2g-inference")  # fixed: Active again
    (cond,) = kube.stored(ADMISSION_CHECKS, "m2g-inference")["status"]["conditions"]
    assert cond["status"] == "True"


async def test_check_answer_from_the_cached_copy_costs_no_get() -> None:
    kube, ap, _ = setup()
    cached = kube.stored(WORKLOADS, "w", "ns")
    ready = CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok")
    assert await ap.apply_check(ready, cached=cached)
    assert ("get", "workloads", "w") not in kube.calls and check(kube)["state"] == "Ready"
    # the cache lags: its copy still shows Pending, so the server's copy is read and the
    # answer (and its lastTransitionTime) is not written again
    writes = len(kube.writes())
    assert not await ap.apply_check(ready, cached=cached)
    assert ("get", "workloads", "w") in kube.calls and len(kube.writes()) == writes
    # once the cache shows the answer, it is trusted again
    kube.calls.clear()
    assert not await ap.apply_check(ready, cached=kube.stored(WORKLOADS, "w", "ns"))
    assert kube.calls == []


async def test_check_reset_by_kueue_is_answered_again() -> None:
    kube, ap, clock = setup()
    ready = CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok")
    assert await ap.apply_check(ready, cached=kube.stored(WORKLOADS, "w", "ns"))
    wl = kube.stored(WORKLOADS, "w", "ns")
    next(e for e in wl["status"]["admissionChecks"] if e["name"] == "m2g")["state"] = "Pending"
    clock.now += timedelta(seconds=30)
    assert await ap.apply_check(ready, cached=copy.deepcopy(wl))
    assert check(kube)["state"] == "Ready"
    assert check(kube)["lastTransitionTime"] == "2026-11-29T23:00:30Z"


async def test_check_answers_do_not_wait_for_quota_writes() -> None:
    kube, ap, _ = setup()
    order: list[str] = []
    gate = asyncio.Event()
    patch, apply = kube.patch, kube.apply

    async def slow_patch(res: Any, name: str, body: Any, **kw: Any) -> Any:
        if res is CLUSTER_QUEUES:
            await gate.wait()  # the quota write hangs until the check is answered
        order.append(f"patch {res.plural}")
        return await patch(res, name, body, **kw)

    async def apply_(res: Any, name: str, body: Any, **kw: Any) -> Any:
        order.append(f"apply {res.plural}")
        gate.set()
        return await apply(res, name, body, **kw)

    kube.patch, kube.apply = slow_patch, apply_  # type: ignore[method-assign]
    result = await asyncio.wait_for(ap.apply_core(Plan(
        quotas=(QuotaUpdate("cq", "a", "nvidia.com/gpu", 48, 72, "derate"),),
        checks=(CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok"),)),
        known=lambda ns, name: kube.stored(WORKLOADS, name, ns)), 10)  # behind it: a hang
    assert not result.errors
    assert order == ["apply workloads", "patch clusterqueues"]
    assert check(kube)["state"] == "Ready"


async def test_every_write_is_handed_to_observe_with_the_answer() -> None:
    """The controller folds what a write answered into its watch cache (read your writes)."""
    kube, ap, _ = setup()
    seen: list[tuple[str, str, str]] = []
    ap.observe = lambda res, o: seen.append((res.plural, o["metadata"]["name"],
                                             o["metadata"]["resourceVersion"]))
    await ap.apply_shed(ShedAction("ns", "w", False, 120.0, "grid event ev-1"))
    shed_rv = kube.stored(WORKLOADS, "w", "ns")["metadata"]["resourceVersion"]
    await ap.apply_check(CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok"))
    await ap.apply_stop(StopUpdate("cq", "Hold", "test"))
    assert seen == [("workloads", "w", shed_rv),
                    ("workloads", "w", kube.stored(WORKLOADS, "w", "ns")["metadata"][
                        "resourceVersion"]),
                    ("clusterqueues", "cq", kube.stored(CLUSTER_QUEUES, "cq")["metadata"][
                        "resourceVersion"])]
    assert seen[0][2] != seen[1][2]
    await ap.apply_shed(ShedAction("ns", "w", False, 120.0, "grid event ev-1"),
                        current=kube.stored(WORKLOADS, "w", "ns"))
    assert len(seen) == 3  # nothing written, nothing observed


async def test_a_shed_whose_answer_was_lost_is_retried_with_the_same_stamp() -> None:
    """The API server applied the shed, the connection was cut before its answer: the
    retry (on a cache that has not seen it) writes the same shed-at, not a second one."""
    kube, ap, clock = setup()
    before = copy.deepcopy(kube.stored(WORKLOADS, "w", "ns"))
    real = kube.patch

    async def lost(*args: Any, **kw: Any) -> Any:
        await real(*args, **kw)
        raise PermanentError("connection reset", 0, "")
    kube.patch = lost  # type: ignore[method-assign]
    with pytest.raises(PermanentError):
        await ap.apply_shed(ShedAction("ns", "w", False, 1, "grid"), current=before)
    stamp = kube.stored(WORKLOADS, "w", "ns")["metadata"]["annotations"]["m2g.io/shed-at"]
    kube.patch = real  # type: ignore[method-assign]
    clock.now += timedelta(seconds=3)
    assert await ap.apply_shed(ShedAction("ns", "w", False, 1, "grid"), current=before)
    assert kube.stored(WORKLOADS, "w", "ns")["metadata"]["annotations"][
        "m2g.io/shed-at"] == stamp
    # once written, a later shed (after a restore) has a stamp of its own
    await ap.apply_shed(ShedAction("ns", "w", True, 1, "over"))
    clock.now += timedelta(seconds=60)
    await ap.apply_shed(ShedAction("ns", "w", False, 1, "grid"))
    assert kube.stored(WORKLOADS, "w", "ns")["metadata"]["annotations"][
        "m2g.io/shed-at"] != stamp


async def test_shadow_mode_says_each_answer_once() -> None:
    """Issue 11: in shadow mode nothing is written, so the Workload never shows m2g's answer
    and every reconcile decided it again — one Event per pending workload per reconcile. Now
    an answer is recorded (and its Event written) when it changes."""
    from m2g.k8s.writer import apply_plan

    kube, ap, _ = setup(dry_run=True)

    def events() -> int:
        return sum(1 for p, _, _ in kube.objects if p == EVENTS.plural)

    retry = Plan(checks=(CheckUpdate("ns", "w", "m2g", CheckState.RETRY, "grid event"),))
    for _ in range(5):
        await apply_plan(ap, retry)
    assert events() == 1
    await apply_plan(ap, Plan(checks=(CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok"),)))
    assert events() == 2
    assert not any(r.written for r in ap.records)


async def test_records_keep_only_the_latest_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller applies a plan every reconcile for the process's life: the applier's
    records are the latest ones, bounded (they grew by every no-op quota, status and check of
    every reconcile before)."""
    import m2g.k8s.apply as apply_mod
    monkeypatch.setattr(apply_mod, "RECORDS_KEPT", 3)
    _, ap, _ = setup()
    for n in range(20):
        await ap.apply_quota(QuotaUpdate("cq", "a", "nvidia.com/gpu", 72 - n % 2, 72, f"r{n}"))
    assert 3 <= len(ap.records) <= 6
    assert [r.detail.split(": ")[-1] for r in ap.records] == [
        f"r{n}" for n in range(20 - len(ap.records), 20)]  # the latest, in order
