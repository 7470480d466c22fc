"""The control loop with a fake cluster: leadership, shadow mode, policy rejection, retries."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from m2g.config.checks import CheckConfig, CheckSetup
from m2g.model.cluster import (
    CheckState,
    ClusterSnapshot,
    Phase,
    QueueState,
    Rejected,
    WorkloadState,
)
from m2g.model.factory import FactorySnapshot, MaintenanceWindow, Node, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.model.plan import Plan
from m2g.policy import make_runtime
from m2g_controllers.manager import Manager, clock_from, utcnow
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import LoadResult, PolicyStore
from m2g_controllers.run import make_clock, parse

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


def policy_obj(name: str, when: str) -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "Policy", "metadata": {"name": name},
            "spec": {"stage": "Admission", "rules": [
                {"name": "big", "when": when, "decision": "Reject", "message": "too big"}]}}


class FakeCluster:
    def __init__(self) -> None:
        self.policies = [policy_obj("size", "workload.gpus > 64")]
        self.applied: list[tuple[Plan, bool]] = []
        self.statuses: list[LoadResult] = []
        self.reported: list[Rejected] = []
        self.marked: list[tuple[Rejected, ...]] = []  # each leader reconcile's left-out set
        self.mark_fails = False
        self.activated: list[str] = []
        self.setups: dict[str, CheckSetup] = {}
        self.checks: dict[str, dict[str, Any] | None] = {}
        self.workloads = [("huge", "m2g-policy")]
        self.fail_next = 0

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("apiserver unreachable")
        ws = tuple(WorkloadState("t", name, WorkloadView(name=name, gpus=128), Phase.RESERVED,
                                 check=check, check_state=CheckState.PENDING)
                   for name, check in self.workloads)
        return ClusterSnapshot(FactorySnapshot(now=now), ws)

    def policy_objects(self) -> list[dict[str, Any]]:
        return self.policies

    async def apply(self, plan: Plan, *, shadow: bool) -> list[str]:
        self.applied.append((plan, shadow))
        return []

    async def policy_status(self, result: LoadResult) -> None:
        self.statuses.append(result)

    async def report_rejected(self, rejected: Sequence[Rejected]) -> None:
        self.reported.extend(rejected)

    async def mark_rejected(self, rejected: Sequence[Rejected]) -> None:
        if self.mark_fails:
            raise ConnectionError("apiserver unreachable")
        self.marked.append(tuple(rejected))

    def m2g_checks(self) -> dict[str, dict[str, Any] | None]:
        return self.checks

    async def ensure_checks(self, setups: Mapping[str, CheckSetup]) -> None:
        self.activated += [n for n, s in setups.items() if s.active]
        self.setups = dict(setups)


def manager(cluster: FakeCluster, **kw: Any) -> Manager:
    return Manager(cluster, PolicyStore(make_runtime("cel-expr-python")), Metrics(),
                   clock=lambda: NOW, **kw)


async def test_reconcile_answers_pending_checks() -> None:
    c = FakeCluster()
    plan = await manager(c).reconcile()
    assert plan is not None and plan.checks[0].state is CheckState.REJECTED
    assert c.applied[0][1] is False and c.activated == ["m2g-policy"]
    assert c.statuses[0].accepted


async def test_every_check_of_m2g_is_answered_each_with_its_policy_selection() -> None:
    c = FakeCluster()
    c.policies.append(policy_obj("huge-only", "workload.gpus > 100000"))
    ref = {"apiGroup": "m2g.io", "kind": "AdmissionCheckConfig"}
    c.checks = {"m2g-policy": None, "m2g-inference": {**ref, "name": "lenient"},
                "m2g-typo": {**ref, "name": "nope"}, "m2g-ghost": {**ref, "name": "ghost"}}
    c.workloads = [("a", "m2g-policy"), ("b", "m2g-inference"), ("c", "m2g-typo")]
    m = manager(c, check_configs={"lenient": CheckConfig(policies=("huge-only",)),
                                  "ghost": CheckConfig(policies=("deleted",))})
    plan = await m.reconcile()
    assert plan is not None
    answers = {u.name: (u.check, u.state) for u in plan.checks}
    # the default check: every policy (size rejects 128 GPUs); m2g-inference: only huge-only
    assert answers == {"a": ("m2g-policy", CheckState.REJECTED),
                       "b": ("m2g-inference", CheckState.READY)}  # m2g-typo: not answered
    assert c.activated == ["m2g-inference", "m2g-policy"]
    typo, ghost = c.setups["m2g-typo"], c.setups["m2g-ghost"]
    assert (typo.active, typo.reason) == (False, "BadParametersRef")
    assert "no admissionChecks.configs entry 'nope'" in typo.message
    assert "configured: ghost, lenient" in typo.message
    assert not ghost.active and "not loaded: deleted" in ghost.message


async def test_broken_policy_keeps_the_last_good_set() -> None:
    c = FakeCluster()
    m = manager(c)
    await m.reconcile()
    c.policies = [policy_obj("size", "workload.gpus > 64.5")]  # int vs double: a type error
    plan = await m.reconcile()
    assert plan is not None and plan.checks[0].state is CheckState.REJECTED  # old set decided
    partial = c.statuses[-1]  # the broken object keeps its last good version
    assert partial.accepted and partial.invalid == {"Policy/size"}
    assert "no matching overload" in partial.summary()
    assert m.metrics.policy_errors._value.get() == 1
    await m.reconcile()  # unchanged objects: nothing rebuilt, counted or re-reported
    assert m.metrics.policy_errors._value.get() == 1 and len(c.statuses) == 2


async def test_one_broken_policy_object_does_not_freeze_the_others() -> None:
    """Per-object isolation: another Policy's update takes effect beside a broken one; a new
    broken object stays out; a problem of the whole set (no policy at all) rejects it whole."""
    c = FakeCluster()
    m = manager(c)
    await m.reconcile()
    c.policies = [policy_obj("size", "workload.gpus > 64.5"),  # broken update: old stays
                  policy_obj("tiny", "workload.gpus > 0"),  # a new good one: in force
                  policy_obj("typo", "workload.gpuz > 1")]  # a new broken one: out
    plan = await m.reconcile()
    assert plan is not None
    assert sorted(m.store.policy_set.names()) == ["size", "tiny"]
    assert c.statuses[-1].invalid == {"Policy/size", "Policy/typo"}
    c.policies = [policy_obj("size", "workload.gpus > 64")]
    await m.reconcile()
    assert list(m.store.policy_set.names()) == ["size"] and not c.statuses[-1].problems
    c.policies = []  # an empty set is a problem of the set: rejected whole, the set stays
    await m.reconcile()
    assert not c.statuses[-1].accepted and list(m.store.policy_set.names()) == ["size"]


async def test_shadow_mode_and_followers_write_nothing() -> None:
    c = FakeCluster()
    await manager(c, shadow=True).reconcile()
    assert c.applied[0][1] is True and c.activated == [] and c.statuses == []
    c2 = FakeCluster()
    await manager(c2, is_leader=lambda: False).reconcile()
    assert c2.applied == [] and c2.activated == []


async def test_a_set_loaded_by_a_follower_gets_its_status_once_it_leads() -> None:
    """The first load races the Lease: the policy status is written when this replica
    leads, once, not only at the set's next change."""
    c = FakeCluster()
    leading = False
    m = manager(c, is_leader=lambda: leading)
    await m.reconcile()
    assert c.statuses == []  # a follower writes nothing
    leading = True
    await m.reconcile()
    await m.reconcile()
    assert len(c.statuses) == 1 and c.statuses[0].accepted


async def test_run_loop_retries_after_a_failure() -> None:
    c = FakeCluster()
    c.fail_next = 1
    m = manager(c, resync_seconds=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    m.kick()
    for _ in range(100):
        if c.applied:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert c.applied, "the loop should recover after the failed snapshot"
    assert m.ready() == (True, "ok")
    assert m.metrics.reconciles.labels("error")._value.get() == 1


class NodeLeverCluster(FakeCluster):
    """A hot rack and a maintenance window under way on it, with one workload running there."""

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        window = MaintenanceWindow("mw", now - timedelta(minutes=1), now + timedelta(hours=1),
                                   racks=("r0",))
        factory = FactorySnapshot(now=now, racks=(Rack("r0", "b", "pd", thermal_alarm=True),),
                                  nodes=(Node("n0", "r0"),), maintenance=(window,))
        w = WorkloadState("t", "run", WorkloadView(name="run", gpus=4), Phase.ADMITTED)
        return ClusterSnapshot(factory, (w,), placements={"t/run": ("n0",)})


async def test_taints_and_drains_are_counted() -> None:
    m = manager(NodeLeverCluster())
    plan = await m.reconcile()
    assert plan is not None and [a.drain for a in plan.sheds] == ["maintenance/mw"]
    assert m.metrics.shed_actions.labels("drain")._value.get() == 1
    for key in ("m2g.io/maintenance", "m2g.io/thermal"):
        assert m.metrics.taint_changes.labels(key, "add")._value.get() == 1


# ---- the clock is injected: the hour the policies see is the test's, never the wall clock's --

FAIRNESS = Path(__file__).resolve().parents[2] / "policies" / "fairness-time-of-day"


class QueueCluster(FakeCluster):
    """Two ClusterQueues at Kueue's default weight, one per tenant class of the policy."""

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        return ClusterSnapshot(FactorySnapshot(now=now), queues=(
            QueueState("prod-training", weight=1.0), QueueState("research-llm", weight=1.0)))


@pytest.mark.parametrize(("now", "want"), [
    # 2026-12-01 is a Tuesday: business hours give production weight 3, research 0.5
    (datetime(2026, 12, 1, 10, 0, tzinfo=UTC), {"prod-training": 3.0, "research-llm": 0.5}),
    # the same day at 23:00: research weight 4, production stays at 1 (no update)
    (datetime(2026, 12, 1, 23, 0, tzinfo=UTC), {"research-llm": 4.0}),
    # Sunday 03:00 (the CLI goldens' --clock-start): research's night wins, production 1
    (datetime(2026, 11, 29, 3, 0, tzinfo=UTC), {"research-llm": 4.0}),
], ids=["tuesday-10h", "tuesday-23h", "sunday-03h"])
async def test_fairness_weights_follow_the_injected_clock(now: datetime,
                                                          want: dict[str, float]) -> None:
    m = Manager(QueueCluster(), PolicyStore(make_runtime("cel-expr-python")), Metrics(),
                clock=lambda: now, policy_dir=FAIRNESS)
    plan = await m.reconcile()
    assert plan is not None and {w.cluster_queue: w.weight for w in plan.weights} == want


def test_clock_from_starts_at_its_start_and_advances_with_monotonic_time() -> None:
    ticks = iter([100.0, 100.0, 130.5])
    clock = clock_from(datetime(2026, 12, 1, 10, 0, tzinfo=UTC), lambda: next(ticks))
    assert clock() == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert clock() == datetime(2026, 12, 1, 10, 0, 30, 500000, tzinfo=UTC)
    with pytest.raises(ValueError, match="no time zone"):
        clock_from(datetime(2026, 12, 1, 10, 0))


def test_run_clock_start_option() -> None:
    args = parse(["--clock-start", "2026-11-29T03:00:00Z"])
    before = make_clock(args)()
    assert before - datetime(2026, 11, 29, 3, 0, tzinfo=UTC) < timedelta(seconds=5)
    assert make_clock(parse(["--clock-start", "2026-11-29T04:00:00+01:00"]))().hour == 3
    assert make_clock(parse([])) is utcnow
    for bad in ("2026-11-29T03:00:00", "tomorrow"):
        with pytest.raises(SystemExit):
            parse(["--clock-start", bad])


async def test_policies_compile_off_the_event_loop() -> None:
    c = FakeCluster()
    m = manager(c)
    threads: list[int] = []
    load = m.store.load_objects

    def spy(objects: list[dict[str, Any]]) -> LoadResult:
        threads.append(threading.get_ident())
        return load(objects)

    m.store.load_objects = spy  # type: ignore[method-assign]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    loop_thread = threading.get_ident()
    task = asyncio.create_task(ticker())
    await m.load_policies()
    task.cancel()
    assert threads and threads[0] != loop_thread
    assert ticks > 1  # the loop ran other work while the set compiled


async def test_no_policies_in_the_cluster_decides_nothing() -> None:
    c = FakeCluster()
    c.policies = []
    m = manager(c)
    result = await m.load_policies()
    assert not result.accepted and "an empty policy set would admit everything" in \
        result.summary()
    try:
        await m.reconcile()
    except RuntimeError as exc:
        assert "policy set rejected" in str(exc)
    else:
        raise AssertionError("a reconcile without policies must not decide")
    assert c.applied == []


# ---- readiness means it (docs/controllers.md, "Readiness") --------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class RackCluster(FakeCluster):
    """A factory of one rack whose power reading is fresh while ``fresh`` is set."""

    fresh = True

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        snap = await super().snapshot(now)
        power = Reading(90.0 if self.fresh else None, 5.0 if self.fresh else float("inf"))
        rack = Rack("r0", "b0", "pd0", power_kw=power, cap_kw=120)
        return dataclasses.replace(snap, factory=FactorySnapshot(now=now, racks=(rack,)))


async def test_readyz_fails_when_reconciles_keep_failing() -> None:
    c, clock = FakeCluster(), Clock()
    m = Manager(c, PolicyStore(make_runtime("cel-expr-python")), Metrics(), clock=clock,
                resync_seconds=0.01, unready_failing_seconds=120)
    await m.reconcile()
    assert m.ready() == (True, "ok")
    c.fail_next = 10_000
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    m.kick()
    for _ in range(500):
        if m.state.failing_since is not None:
            break
        await asyncio.sleep(0.01)
    assert m.ready()[0] is True  # a failure is not yet a reason: transient API errors happen
    clock.now += timedelta(seconds=121)
    ok, why = m.ready()
    assert not ok and "reconciles failing for 121s" in why and "apiserver unreachable" in why
    assert m.metrics.ready._value.get() == 0
    c.fail_next = 0
    stop.set()
    m.kick()
    await asyncio.wait_for(task, 10)
    await m.reconcile()
    assert m.ready() == (True, "ok") and m.metrics.ready._value.get() == 1


async def test_readyz_fails_when_all_power_signals_stay_stale() -> None:
    c, clock = RackCluster(), Clock()
    m = Manager(c, PolicyStore(make_runtime("cel-expr-python")), Metrics(), clock=clock,
                unready_stale_seconds=300)
    await m.reconcile()
    c.fresh = False
    clock.now += timedelta(seconds=299)
    await m.reconcile()
    assert m.ready()[0] is True
    clock.now += timedelta(seconds=2)
    await m.reconcile()
    ok, why = m.ready()
    assert not ok and "no fresh power signal for 301s" in why
    c.fresh = True
    await m.reconcile()
    assert m.ready() == (True, "ok")


async def test_no_signal_source_no_staleness_verdict() -> None:
    c, clock = RackCluster(), Clock()
    c.fresh = False
    m = Manager(c, PolicyStore(make_runtime("cel-expr-python")), Metrics(), clock=clock)
    await m.reconcile()
    clock.now += timedelta(hours=2)
    await m.reconcile()
    assert m.ready() == (True, "ok")


class RejectingCluster(FakeCluster):
    rejected: tuple[Rejected, ...] = (Rejected("GridEvent", "far", "ValueError: start ..."),)

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        snap = await super().snapshot(now)
        return dataclasses.replace(snap, rejected=self.rejected)


async def test_objects_left_out_are_counted_and_decisions_go_on() -> None:
    c = RejectingCluster()
    m = manager(c)
    plan = await m.reconcile()
    assert plan is not None and plan.checks  # the rest is decided
    assert m.metrics.rejected.labels("GridEvent")._value.get() == 1
    c.rejected = ()
    await m.reconcile()
    assert m.metrics.rejected.labels("GridEvent")._value.get() == 0


async def test_objects_left_out_get_one_event_from_the_leader_only() -> None:
    """An Event per object left out, from the leader only, again only when its reason
    changes; a healed object that breaks again is reported again."""
    c = RejectingCluster()
    leading = False
    m = manager(c, is_leader=lambda: leading)
    await m.reconcile()
    assert c.reported == []  # a follower emits nothing
    leading = True
    await m.reconcile()
    await m.reconcile()
    assert [(r.kind, r.name) for r in c.reported] == [("GridEvent", "far")]
    c.rejected = (Rejected("GridEvent", "far", "ValueError: other"),)
    await m.reconcile()
    assert [r.reason for r in c.reported] == ["ValueError: start ...", "ValueError: other"]
    c.rejected = ()
    await m.reconcile()
    c.rejected = (Rejected("GridEvent", "far", "ValueError: other"),)
    await m.reconcile()
    assert len(c.reported) == 3


async def test_the_leader_hands_every_left_out_object_to_the_conditions_each_reconcile(
        ) -> None:
    """The adapter writes the Accepted condition from the whole left-out set (it clears the
    objects no longer in it), from the leader only; a failure there fails no reconcile."""
    c = RejectingCluster()
    leading = False
    m = manager(c, is_leader=lambda: leading)
    await m.reconcile()
    assert c.marked == []  # a follower writes no condition
    leading = True
    await m.reconcile()
    await m.reconcile()
    assert c.marked == [c.rejected, c.rejected]
    c.rejected = ()
    await m.reconcile()
    assert c.marked[-1] == ()  # fixed: handed over empty, so the adapter clears it
    c.mark_fails = True
    plan = await m.reconcile()
    assert plan is not None and m.ready() == (True, "ok")


async def test_only_the_leader_counts_decisions() -> None:
    """Followers decide (to be warm) but count nothing: two replicas' counters summed in
    Prometheus would double every decision."""
    leading = False
    c = FakeCluster()
    m = manager(c, is_leader=lambda: leading)
    await m.reconcile()
    assert m.metrics.decisions.labels("Rejected", "size")._value.get() == 0
    leading = True
    await m.reconcile()
    assert m.metrics.decisions.labels("Rejected", "size")._value.get() == 1


async def test_forecast_metrics_are_set_once_per_period() -> None:
    clock = [NOW]
    c = FakeCluster()
    m = Manager(c, PolicyStore(make_runtime("cel-expr-python")), Metrics(),
                clock=lambda: clock[0])
    await m.reconcile()
    reg = m.metrics.registry
    labels = {"domain": "site", "hours_ahead": "0", "bound": "central"}
    assert reg.get_sample_value("m2g_forecast_kilowatts", labels) == 0.0  # no nodes, no draw
    m.metrics.forecast_kw.labels("site", "0", "central").set(-1)
    clock[0] = NOW + timedelta(seconds=60)
    await m.reconcile()
    assert reg.get_sample_value("m2g_forecast_kilowatts", labels) == -1  # not recomputed yet
    clock[0] = NOW + timedelta(seconds=301)
    await m.reconcile()
    assert reg.get_sample_value("m2g_forecast_kilowatts", labels) == 0.0
    assert reg.get_sample_value("m2g_forecast_kilowatts",
                                {**labels, "hours_ahead": "23"}) is not None


class HangingCluster(FakeCluster):
    """An API server that takes connections and never answers (its etcd paused)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = asyncio.Event()
        self.entered = asyncio.Event()

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        if self.hang.is_set():
            self.entered.set()
            await asyncio.Event().wait()  # until cancelled
        return await super().snapshot(now)


async def test_readyz_fails_when_a_reconcile_hangs_beyond_the_bound() -> None:
    """A reconcile that never returns is no failure (nothing is raised), yet m2g decides
    nothing meanwhile: /readyz says so after the same bound (before, it said ok for as long
    as the request hung)."""
    c, clock = HangingCluster(), Clock()
    m = Manager(c, PolicyStore(make_runtime("cel-expr-python")), Metrics(), clock=clock,
                resync_seconds=0.01, unready_failing_seconds=120)
    await m.reconcile()
    c.hang.set()
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    m.kick()
    await asyncio.wait_for(c.entered.wait(), 10)
    clock.now += timedelta(seconds=100)
    assert m.ready() == (True, "ok")  # a slow reconcile within the bound
    clock.now += timedelta(seconds=21)
    ok, why = m.ready()
    assert not ok and "a reconcile has not finished for 121s (bound 120s)" in why
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    c.hang.clear()
    m.state.busy_since = None  # the loop is gone; a new one reconciles
    await m.reconcile()
    assert m.ready() == (True, "ok")


class FailingPreemptionCluster(FakeCluster):
    """Over the site's limit, with a Preemption policy whose score errors for every workload
    (m2g never sheds or caps on an error)."""

    def __init__(self) -> None:
        super().__init__()
        self.policies = [{"apiVersion": "m2g.io/v1alpha1", "kind": "Policy",
                          "metadata": {"name": "shed"}, "spec": {"stage": "Preemption",
                                                                 "rules": [{
                              "name": "odd", "when": "true",
                              "score": "double(100 / (workload.gpus - workload.gpus))"}]}}]

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        from tests.unit.test_curtail import factory
        from tests.unit.test_resize import job, snap

        return snap(factory(900.0), job("a"), job("b"))


async def test_drawing_work_a_preemption_policy_fails_on_is_a_metric() -> None:
    """It was said only in the plan's line: nothing to alert on while a shortfall stayed
    uncovered (deploy/monitoring/prometheusrule.yaml: M2GPreemptionPolicyFailing)."""
    m = manager(FailingPreemptionCluster())
    plan = await m.reconcile()
    assert plan is not None and not plan.sheds and not plan.caps
    assert plan.preemption_failed == 2
    assert m.metrics.preemption_failed._value.get() == 2


class CountingCluster(FakeCluster):
    """Records when each reconcile began, as the manager's pacing counts it (``began``: the
    manager's ``state.began_at``; the loop's clock, the same monotonic clock, without one).
    The snapshot's own call time is not it: under load the snapshot of one reconcile starts
    later after its beginning than the next one's, and the gap between two snapshots came out
    0.188 s with a 0.2 s interval kept."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[float] = []
        self.began: Callable[[], float | None] = lambda: None

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        began = self.began()
        self.starts.append(began if began is not None else asyncio.get_running_loop().time())
        return await super().snapshot(now)


@pytest.mark.parametrize("interval", [0.0, 0.2])
async def test_changes_coalesce_into_one_reconcile_per_min_interval(interval: float) -> None:
    """A kick every 10 ms for 0.6 s: with ``min_interval_seconds`` the reconciles start at
    least that far apart (the kicks meanwhile coalesce), and one follows the last kick."""
    c = CountingCluster()
    m = manager(c, resync_seconds=60.0, min_interval_seconds=interval)
    c.began = lambda: m.state.began_at
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    last_kick = 0.0
    for _ in range(60):
        m.kick()
        last_kick = asyncio.get_running_loop().time()
        await asyncio.sleep(0.01)
    for _ in range(200):
        if c.starts and c.starts[-1] >= last_kick and not m.state.dirty.is_set():
            break
        await asyncio.sleep(0.01)
    stop.set()
    m.kick()  # wakes the loop to see the stop
    await asyncio.wait_for(task, 5)
    gaps = [b - a for a, b in zip(c.starts, c.starts[1:], strict=False)]
    assert c.starts[-1] >= last_kick  # the last change is not lost
    if interval:
        assert gaps and min(gaps) >= interval - 0.005
        assert len(c.starts) <= 1 + (c.starts[-1] - c.starts[0]) / (interval - 0.005)
    else:
        assert len(c.starts) > 10  # no pacing: a reconcile as soon as the last one ends


def test_min_reconcile_interval_flag() -> None:
    assert parse(["--min-reconcile-interval", "0.5"]).min_reconcile_interval == 0.5
    assert parse([]).min_reconcile_interval == 0.25
    for bad in ("-1", "nan", "61", "soon"):
        with pytest.raises(SystemExit):
            parse(["--min-reconcile-interval", bad])


async def test_every_reconcile_plans_with_the_managers_one_plan_memo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Manager keeps one PlanMemo (m2g.planner.memo) and hands it to every plan."""
    import m2g_controllers.manager as mgr
    seen: list[object] = []
    real = mgr.make_plan

    def spy(*a: Any, **k: Any) -> Plan:
        seen.append(k.get("memo"))
        return real(*a, **k)

    monkeypatch.setattr(mgr, "make_plan", spy)
    m = manager(FakeCluster())
    await m.reconcile()
    await m.reconcile()
    assert len(seen) == 2 and seen[0] is m.plan_memo and seen[1] is m.plan_memo
