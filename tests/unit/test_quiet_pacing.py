"""Pacing while quiet (docs/controllers.md "Pacing while quiet"): outside grid events and
curtailment, a pod's change or a Workload's that awaits no admission check waits for
``quiet_interval_seconds``; an admission waiting on m2g's answer, any other kind, and every
change once the factory is not quiet, start a reconcile at once."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from m2g.k8s.cache import WatchCache
from m2g.k8s.kai import KaiSync
from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, MaintenanceWindow
from m2g.model.inputs import WorkloadView
from m2g.model.plan import CapAction, CheckUpdate, Plan
from m2g.model.powerlimit import LimitSpec, NodeLimitState
from m2g.planner.config import PlannerConfig
from m2g.testing.kube import FakeKube
from m2g_controllers.manager import Manager, awaits_check, lazy_change, quiet
from m2g_controllers.run import parse
from m2g_controllers.wiring import K8sCluster
from tests.unit.test_manager import NOW, CountingCluster, manager

POD = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}}


def workload_obj(*states: str, conditions: tuple[str, ...] = ("QuotaReserved",)
                 ) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns"},
            "status": {"conditions": [{"type": c, "status": "True"} for c in conditions],
                       "admissionChecks": [{"name": f"c{i}", "state": s}
                                           for i, s in enumerate(states)]}}


def test_which_changes_may_wait() -> None:
    assert lazy_change("pods", POD)
    assert lazy_change("workloads", workload_obj("Ready"))
    assert lazy_change("workloads", {"metadata": {"name": "w"}})  # no check yet
    assert not lazy_change("workloads", workload_obj("Ready", "Pending"))  # awaits an answer
    # Kueue lists the checks, Pending, on a queued Workload before it reserves quota (and
    # rewrites its status on every scheduling attempt): nothing for m2g to answer yet
    assert lazy_change("workloads", workload_obj("Pending", conditions=()))
    assert lazy_change("workloads", workload_obj(
        "Pending", conditions=("QuotaReserved", "Admitted")))
    for kind in ("nodes", "grid_events", "cluster_queues", "gpu_power_limits", ""):
        assert not lazy_change(kind, POD)
    assert awaits_check(workload_obj("Pending")) and not awaits_check(None)


def snap(*workloads: WorkloadState, **factory: Any) -> ClusterSnapshot:
    return ClusterSnapshot(FactorySnapshot(now=NOW, **factory), workloads)


def running(**kw: Any) -> WorkloadState:
    return WorkloadState("ns", "w", WorkloadView(name="w", gpus=8), Phase.ADMITTED, **kw)


def test_quiet_is_nothing_curtailed_held_or_near() -> None:
    assert quiet(snap(running()), Plan())
    assert quiet(snap(), Plan(checks=(CheckUpdate("ns", "w", "m2g", CheckState.READY, "ok"),)))
    assert not quiet(snap(), Plan(checks=(
        CheckUpdate("ns", "w", "m2g", CheckState.RETRY, "site headroom"),)))
    assert not quiet(snap(), Plan(caps=(CapAction("ns", "w", 0.5, 3.0, "grid"),)))
    for kw in ({"shed_by_m2g": True}, {"power_cap": 0.5}, {"resized_at": NOW},
               {"drained_for": "maintenance/x"}):
        assert not quiet(snap(running(**kw)), Plan()), kw
    soon = GridEvent("e", NOW + timedelta(seconds=200), NOW + timedelta(hours=1),
                     target_kw=100.0)
    later = GridEvent("e", NOW + timedelta(seconds=400), NOW + timedelta(hours=1),
                      target_kw=100.0)
    over = GridEvent("e", NOW - timedelta(hours=1), NOW - timedelta(seconds=1),
                     target_kw=100.0)
    assert not quiet(snap(grid_events=(soon,)), Plan())
    assert quiet(snap(grid_events=(later, over)), Plan())
    window = MaintenanceWindow("m", NOW - timedelta(minutes=1), NOW + timedelta(minutes=5))
    assert not quiet(snap(maintenance=(window,)), Plan())
    limited = ClusterSnapshot(FactorySnapshot(now=NOW), (), node_limits={
        "n": NodeLimitState("n", LimitSpec("n", fraction=0.5))})
    assert not quiet(limited, Plan())
    released = ClusterSnapshot(FactorySnapshot(now=NOW), (), node_limits={
        "n": NodeLimitState("n", LimitSpec("n", fraction=1.0))})
    assert quiet(released, Plan())


async def running_manager(c: CountingCluster, **kw: Any) -> tuple[Manager, asyncio.Event,
                                                                   asyncio.Task[None]]:
    m = manager(c, resync_seconds=60.0, **kw)
    c.began = lambda: m.state.began_at
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    m.kick()
    await until(lambda: len(c.starts) == 1 and m.state.last_ok is not None)
    return m, stop, task


async def until(cond: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


async def stopped(m: Manager, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    m.kick()
    await asyncio.wait_for(task, 5)


async def test_while_quiet_pod_changes_wait_and_an_admission_does_not() -> None:
    c = CountingCluster()
    c.workloads = []  # nothing waits: the first plan answers nothing, the factory is quiet
    m, stop, task = await running_manager(c, quiet_interval_seconds=30.0)
    assert m.state.quiet
    reg = m.metrics.registry
    assert reg.get_sample_value("m2g_quiet") == 1
    for _ in range(20):
        m.changed("MODIFIED", "ns/p", POD, "pods")
        m.changed("MODIFIED", "ns/w", workload_obj("Ready"), "workloads")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert len(c.starts) == 1  # none of them started a reconcile (30 s to go)
    assert m.state.lazy_since is not None
    assert reg.get_sample_value("m2g_lazy_changes_total") == 40  # each counted as it waited
    m.changed("MODIFIED", "ns/w", workload_obj("Pending"), "workloads")  # an admission
    assert reg.get_sample_value("m2g_lazy_changes_total") == 40  # not one that waits
    await until(lambda: len(c.starts) == 2)  # at once, not in 30 s
    await until(lambda: m.state.busy_since is None and not m.state.dirty.is_set())
    assert m.state.lazy_since is None  # that reconcile saw the waiting changes too
    await stopped(m, stop, task)


async def test_lazy_changes_coalesce_into_one_reconcile_after_the_interval() -> None:
    c = CountingCluster()
    c.workloads = []
    m, stop, task = await running_manager(c, quiet_interval_seconds=0.3)
    first = asyncio.get_running_loop().time()
    for _ in range(10):
        m.changed("MODIFIED", "ns/p", POD, "pods")
        await asyncio.sleep(0.01)
    await until(lambda: len(c.starts) == 2)
    await asyncio.sleep(0.4)
    assert len(c.starts) == 2  # ten changes, one reconcile
    assert c.starts[1] >= first + 0.3 - 0.005
    await stopped(m, stop, task)


@pytest.mark.parametrize("interval", [0.0, 30.0])
async def test_pod_changes_reconcile_at_once_when_not_quiet_or_not_asked(
        interval: float) -> None:
    """A waiting admission check the plan answers Rejected (not quiet), or no quiet
    interval: a pod's change starts a reconcile at once."""
    c = CountingCluster()  # its workload "huge" is rejected: the factory is not quiet
    if not interval:
        c.workloads = []
    m, stop, task = await running_manager(c, quiet_interval_seconds=interval)
    assert m.state.quiet == (not interval)  # quiet, but no interval asked
    assert m.metrics.registry.get_sample_value("m2g_quiet") == (0 if interval else 1)
    m.changed("MODIFIED", "ns/p", POD, "pods")
    await until(lambda: len(c.starts) == 2)
    assert m.metrics.registry.get_sample_value("m2g_lazy_changes_total") == 0
    await stopped(m, stop, task)


async def test_the_cluster_names_the_kind_of_a_watched_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def synced(*_: Any) -> bool:
        return True

    async def probe(*_: Any) -> bool:
        return False

    monkeypatch.setattr(WatchCache, "start", lambda self: None)  # no API server here
    monkeypatch.setattr(WatchCache, "wait_synced", synced)
    monkeypatch.setattr(KaiSync, "probe", probe)
    seen: list[tuple[Any, ...]] = []
    cluster = K8sCluster(FakeKube())  # type: ignore[arg-type]
    await cluster.start(lambda *a: seen.append(a))
    cluster.caches["workloads"].apply_event({"type": "ADDED", "object": {
        "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7"}}})
    cluster.caches["pods"].apply_event({"type": "ADDED", "object": {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "8"}}})
    cluster.policies.apply_event({"type": "ADDED", "object": {
        "metadata": {"name": "p", "resourceVersion": "9"}}})
    assert [a[:2] + a[3:] for a in seen] == [("ADDED", "ns/w", "workloads"),
                                             ("ADDED", "ns/p", "pods"),
                                             ("ADDED", "p")]  # not a WATCHED kind: no name


def test_quiet_reconcile_interval_flag() -> None:
    assert parse([]).quiet_reconcile_interval == 2.0
    assert parse(["--quiet-reconcile-interval", "0"]).quiet_reconcile_interval == 0.0
    for bad in ("-1", "61", "soon"):
        with pytest.raises(SystemExit):
            parse(["--quiet-reconcile-interval", bad])


async def test_never_quiet_with_nvlink_preplace() -> None:
    """A waiting elastic job is placed before Kueue reserves it: its changes never wait."""
    c = CountingCluster()
    c.workloads = []
    m, stop, task = await running_manager(c, quiet_interval_seconds=30.0,
                                          config=PlannerConfig(nvlink_preplace=True))
    assert not m.state.quiet
    m.changed("MODIFIED", "ns/w", workload_obj("Pending", conditions=()), "workloads")
    await until(lambda: len(c.starts) == 2)
    await stopped(m, stop, task)
