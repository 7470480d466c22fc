"""Chaos on the controller process itself: ``m2g run`` killed with SIGKILL.

Two replicas of ``m2g run --leader-elect`` run as processes of their own (as the Deployment's
two pods would), reading rack power from a Prometheus stand-in that follows the pods
(chaos_helpers). The leader is killed with SIGKILL three times, at seeded random points: in
the reconcile that answers four new workloads and lowers a quota, in the middle of a paced
shed (a grid event that needs two paced pauses) and in the middle of the restore after it.
After each kill a new replica is started under a new name, as a Deployment replaces a pod.

Invariants, checked after each kill and at the end (docs/reliability.md counts them): the
other replica takes the Lease within the lease duration plus two retry periods and is ready;
no shed is lost or made twice (every spec.active flip and shed-at stamp of every Workload is
recorded from a watch); each shed workload is restored exactly once; no workload is answered
Ready against the policy while the event is active; and at the end a fresh controller, never
disturbed, would write nothing: quotas, sheds and answers are what it decides.

A second case kills the leader **between two cap lifts**: a grid event caps three flexible
jobs through the node agent (in this process, fake NVML), one cap a ramp step; the event
ends and the caps are lifted one a step (the most recent first, ~10 s apart); the leader is
killed at a seeded point after the first lift. Invariants: the successor lifts the other
caps, paced from the first lift's stamp (``m2g.io/power-cap-at`` with no cap); every capped
node is back at full power with no GPUPowerLimit left; each job's cap only went down until
it was lifted once (its ``m2g.io/power-cap`` went none → cap(s) → none, one lift stamp and no
``restored-at``, one PowerCapLifted Event); no node capped again after its lift (the limit in force, sampled from
the fake NVML); nothing paused; and a fresh controller would write nothing.

A third case kills **every** replica while the caps are in force and brings a successor only
once the caps' lease has run out (shortened to 30 s through the site configuration,
``planner.capLeaseSeconds``; the agent's grace 5 s): the agents restore full power on their
own, then two new replicas start. With the grid event over by then, the successor records each
lapsed cap as lifted (one PowerCapLifted Event saying it lapsed), releases every GPUPowerLimit
and never caps a node again; with the event still on, it caps anew from full power, within the
ramp (at most ``maxStepKw`` of caps at a time, plans paced by ``rampKwPerSecond``), and lifts
them once the event ends. Either way: nothing paused, full power and no GPUPowerLimit at the
end, and a fresh controller would write nothing.

``M2G_CHAOS_SEED=<n>`` replays a schedule (the seed is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import test_controller_e2e as ctl
from chaos_helpers import (
    Fleet,
    Replica,
    WorkloadRecorder,
    chaos_seed,
    lease_holder,
    pod_power_prometheus,
    site_file,
    undone,
)
from e2e_helpers import Cluster, unique
from test_curtail_e2e import delete_all_limits, fake_watts, limits, nodes_of, running_agent
from test_node_agent_e2e import running_agent as node_agent

from m2g.config import load_site_config
from m2g.k8s import client as k
from m2g.k8s.annotations import SHED_AT
from m2g.model.inputs import WorkloadKind
from m2g.model.plan import Plan
from m2g.planner.config import PlannerConfig
from m2g.planner.curves import kind_curve
from m2g.policy import make_runtime
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.nodeagent import Agent
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

pytestmark = pytest.mark.e2e

#: m2g run's Lease (m2g.k8s.leader's defaults): a follower takes over once the record has not
#: changed for the lease duration by its own clock, observed at most a retry period late and
#: acted on at most one retry period later.
LEASE_SECONDS, RETRY_SECONDS = 15.0, 2.0
TAKEOVER_BOUND = LEASE_SECONDS + 2 * RETRY_SECONDS + 2.0  # + API round trips
#: Slow pacing: one 20.8 kW workload per ~10 s; no GPU caps (no node agent here).
PLANNER = {"rampKwPerSecond": 2.1, "maxStepKw": 25.0, "settleSeconds": 3.0,
           "shedSavingFraction": 1.0, "minShedSeconds": 5.0, "powerCaps": False}
XID = {"key": "nvidia.com/gpu-xid", "value": "79", "effect": "NoSchedule"}


class Kills:
    """Kill the leading replica, check the takeover, start a replacement."""

    def __init__(self, cluster: Cluster, fleet: Fleet) -> None:
        self.cluster, self.fleet = cluster, fleet
        self.count = 0
        self.takeovers: list[float] = []

    def holder(self) -> str:
        return lease_holder(self.cluster, self.fleet.namespace, self.fleet.lease)

    async def first_leader(self) -> str:
        for rep in (self.fleet.start("m2g-0"), self.fleet.start("m2g-1")):
            await self.ready(rep)
        return str(await ctl.until("a leader", lambda: (
            (h := self.holder()) in self.fleet.replicas and h), timeout=30))

    async def ready(self, rep: Replica) -> None:
        """Wait until ``rep`` is ready and has read the Lease: only a replica that has watched
        the Lease unchanged for a lease duration may take it (by its own clock), so a kill
        before that would measure the newcomer's start-up, not the takeover."""
        await ctl.until(f"{rep.identity} ready", lambda: rep.ready()[0] == 200, timeout=90)
        await asyncio.sleep(RETRY_SECONDS)

    async def kill_leader(self, why: str) -> str:
        old = self.holder()
        victim = self.fleet.replicas[old]
        assert victim.alive(), f"the leader {old} died by itself:\n{self.fleet.tails()}"
        t0 = time.monotonic()
        victim.kill9()
        self.count += 1
        # the Deployment's new pod starts at once (it cannot lead before it has watched the
        # Lease for a lease duration; either survivor taking it is a takeover)
        fresh = self.fleet.start(f"m2g-{len(self.fleet.replicas)}")
        new = str(await ctl.until(f"another replica to take the Lease ({why})", lambda: (
            (h := self.holder()) and h != old and h), timeout=TAKEOVER_BOUND + 15))
        took = time.monotonic() - t0
        self.takeovers.append(took)
        assert took <= TAKEOVER_BOUND, f"{new} took the Lease {took:.1f}s after the kill"
        assert new in self.fleet.replicas and self.fleet.replicas[new].alive()
        leader = self.fleet.replicas[new]
        await ctl.until(f"{new} ready and counting itself the leader", lambda: (
            leader.ready()[0] == 200 and leader.metric("m2g_leader") == 1.0), timeout=15)
        await self.ready(fresh)
        return new


def shed(cluster: Cluster, namespace: str, names: list[str]) -> list[str]:
    return sorted(n for n in names if (wl := ctl.workload_of(cluster, namespace, n))
                  and wl["spec"].get("active") is False)


def restored(cluster: Cluster, namespace: str, name: str) -> bool:
    wl = ctl.workload_of(cluster, namespace, name) or {}
    return (wl.get("spec") or {}).get("active", True) is not False and \
        SHED_AT not in ((wl.get("metadata") or {}).get("annotations") or {})


def gpu_quota(cluster: Cluster, cq: str) -> int:
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", cq)
    res = obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return int(next(r for r in res if r["name"] == "nvidia.com/gpu")["nominalQuota"])


async def fresh_plan(kubeconfig: Path, policy_dir: Path, config: PlannerConfig,
                     racks: dict[str, str]) -> Plan:
    """What a controller that was never disturbed decides now (a follower: it writes
    nothing), from the same policies, configuration and power model."""
    kube = await k.connect(kubeconfig)
    cluster = K8sCluster(kube, readings=ctl.modelled_power(racks), instance="fresh")
    manager = Manager(cluster, PolicyStore(make_runtime()), Metrics(), config=config,
                      policy_dir=policy_dir, is_leader=lambda: False)
    try:
        await cluster.start(manager.kick)
        plan = await manager.reconcile()
        assert plan is not None
        return plan
    finally:
        await cluster.stop()
        await kube.close()


async def converged(kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
                    config: PlannerConfig, racks: dict[str, str], timeout: float = 60.0) -> None:
    """Wait until the cluster is what a fresh controller decides (it would write nothing):
    what the survivors have had the time to decide must equal an undisturbed decision."""
    deadline = time.monotonic() + timeout
    while True:
        plan = await fresh_plan(kubeconfig, policy_dir, config, racks)
        left = await asyncio.to_thread(undone, cluster, namespace, plan)
        if not left:
            return
        assert time.monotonic() < deadline, f"not what a fresh controller decides: {left}"
        await asyncio.sleep(2)


def m2g_events(cluster: Cluster, namespace: str, reason: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in cluster.core.list_namespaced_event(namespace).items:
        if e.reason == reason and e.reporting_component == "m2g.io/policy":
            out[e.involved_object.name] = out.get(e.involved_object.name, 0) + 1
    return out


async def test_kill_9_of_the_leading_m2g_run_mid_reconcile_mid_shed_and_mid_restore(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    rng = chaos_seed()
    # in the admission reconcile, during the two paced sheds, during the restores
    delays = [rng.uniform(0.0, 3.0), rng.uniform(0.0, 12.0), rng.uniform(0.0, 6.0)]
    print("kill delays (s):", [round(d, 2) for d in delays])
    cq = ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    out = tmp_path_factory.mktemp("kill")  # not under the policy folder: m2g reads it all
    site = site_file(out / "site.yaml", ctl.CHECK, PLANNER)
    config = load_site_config(site).planner_config(PlannerConfig(check_name=ctl.CHECK))
    victim = sorted(racks)[0]
    names = [f"flex{i}" for i in range(4)]
    with pod_power_prometheus(cluster, racks) as prom, \
            WorkloadRecorder(cluster, namespace, ctl.CHECK) as rec:
        fleet = Fleet(kubeconfig, site, policy_dir, namespace, unique("m2g-kill"), out, prom)
        kills = Kills(cluster, fleet)
        try:
            await kills.first_leader()
            # 1. mid-reconcile: four answers and a quota derate (a node's GPUs fail)
            cluster.core.patch_node(victim, {"spec": {"taints": [XID]}})
            for i, name in enumerate(names):
                cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=1 + i % 3))
            await asyncio.sleep(delays[0])
            await kills.kill_leader("mid-reconcile")
            await ctl.until("four workloads answered Ready", lambda: all(ctl.check_state(
                ctl.workload_of(cluster, namespace, n)) == "Ready" for n in names), timeout=90)
            await ctl.until("the quota derated by the failed node's GPUs",
                        lambda: gpu_quota(cluster, cq) == 140, timeout=30)
            await ctl.until("the four jobs running", lambda: len(cluster.core.list_namespaced_pod(
                namespace, field_selector="status.phase=Running").items) == 16, timeout=60)
            # 2. mid-shed: 40 kW idle + 64 x 1.3 = 123.2 kW, limit 85: two paced pauses
            event = ctl.grid_event(cluster, target_kw=85.0)
            event_on = time.monotonic()
            cluster.batch.create_namespaced_job(namespace, ctl.job("late", 4, tier=2))
            await asyncio.sleep(delays[1])
            await kills.kill_leader("mid-shed")
            both = await ctl.until("two workloads shed", lambda: len(
                s := shed(cluster, namespace, names)) == 2 and s, timeout=120)
            await asyncio.sleep(8)  # and nothing more: the shortfall is covered
            assert shed(cluster, namespace, names) == both
            # 3. mid-restore: the event ends
            ctl._delete(cluster, "gridevents", event)
            event_off = time.monotonic()
            await asyncio.sleep(delays[2])
            await kills.kill_leader("mid-restore")
            await ctl.until("both shed workloads restored", lambda: all(
                restored(cluster, namespace, n) for n in both), timeout=120)
            await asyncio.sleep(4)
            # invariants over the whole run
            for n in names:
                want = [True, False, True] if n in both else [True]
                assert rec.flips(n) == want, f"{n}: spec.active went {rec.flips(n)}"
            stamps = [rec.stamps(n) for n in both]
            assert [len(s) for s in stamps] == [1, 1], f"a shed stamped twice: {stamps}"
            assert stamps[0] != stamps[1], "the two sheds were not paced apart"
            back = sorted(t for n in both if (t := rec.turned(n, True)) is not None)
            # 20.8 kW at 2.1 kW/s: ~10 s apart (before the lift's stamp: the same second)
            assert len(back) == 2 and back[1] - back[0] >= 5.0, f"restores not paced: {back}"
            assert not rec.ready_between("late", event_on, event_off), \
                "a flex-2 workload was admitted while the grid event was active"
            assert any(s.check == "Retry" and event_on <= s.at <= event_off
                       for s in rec.seen.get("late", [])), "the flex-2 job was never answered"
            for reason in ("Shed", "Restored"):
                counts = m2g_events(cluster, namespace, reason)
                assert all(v == 1 for v in counts.values()) and set(counts) <= {
                    ctl.workload_of(cluster, namespace, n)["metadata"]["name"] for n in both}, \
                    f"{reason} Events: {counts}"
            assert gpu_quota(cluster, cq) == 140
            await converged(kubeconfig, cluster, namespace, policy_dir, config, racks)
            live = fleet.live()
            assert len(live) == 2, f"a replica died by itself:\n{fleet.tails()}"
            await ctl.until("exactly one replica leading, all ready", lambda: sorted(
                r.metric("m2g_leader") or 0.0 for r in live) == [0.0, 1.0] and all(
                r.ready()[0] == 200 for r in live), timeout=15)
            assert kills.count == 3
            print("takeovers (s):", [round(t, 1) for t in kills.takeovers])
        finally:
            fleet.stop_all()
            cluster.core.patch_node(victim, {"spec": {"taints": None}})


#: Caps set and lifted one a step: a 16-GPU job capped at 0.75 gives ~4.9 kW, at most one
#: within a 6 kW step, and 0.5 kW/s gives the next step ~10 s after the last cap or lift.
CAPS = {"rampKwPerSecond": 0.5, "maxStepKw": 6.0, "settleSeconds": 5.0,
        "shedSavingFraction": 1.0, "minShedSeconds": 5.0, "powerCaps": True}
FULL_W = 1400.0  # the fake NVML's default limit


@contextlib.asynccontextmanager
async def timed_watts(agent: Agent, period: float = 0.2
                      ) -> AsyncIterator[list[tuple[float, str, float]]]:
    """Every change of a node's GPU limit in force (the lowest of its GPUs) as the fake NVML
    holds it: (monotonic time, node, watts), sampled every ``period``."""
    seen: list[tuple[float, str, float]] = []
    last: dict[str, float] = {}

    async def sample() -> None:
        while True:
            for node, core in list(agent.cores.items()):
                watts = [d.limit_w for d in core.backend.devices()]
                if watts and last.get(node) != min(watts):
                    last[node] = min(watts)
                    seen.append((time.monotonic(), node, min(watts)))
            await asyncio.sleep(period)

    task = asyncio.create_task(sample())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def per_node(changes: list[tuple[float, str, float]]) -> dict[str, list[float]]:
    """``timed_watts``' changes as each node's line: [1400, 1050, 1400] is one cap and one
    lift."""
    out: dict[str, list[float]] = {}
    for _, node, watts in changes:
        out.setdefault(node, []).append(watts)
    return out


def once_down_and_back(line: list[Any], full: Any, top: float) -> bool:
    """``line`` (a cap's values over time, repeats collapsed) starts and ends at ``full``
    (``top`` as a number) and in between only goes down: capped (maybe deeper, step by step),
    then lifted once — never lifted and capped again."""
    if len(line) < 3 or not line[0] == line[-1] == full or full in line[1:-1]:
        return False
    middle = [float(v) for v in line[1:-1]]
    return middle == sorted(middle, reverse=True) and all(v < top for v in middle)


def event_counts(cluster: Cluster, namespace: str, reason: str) -> dict[str, int]:
    """m2g's Events of ``reason`` by Workload, each counted as often as it happened (a
    repeated Event is one object with a count)."""
    out: dict[str, int] = {}
    for e in cluster.core.list_namespaced_event(namespace).items:
        if e.reason == reason and e.reporting_component == "m2g.io/policy":
            name = e.involved_object.name
            out[name] = out.get(name, 0) + max(1, e.count or 1,
                                               (e.series.count if e.series else 0) or 0)
    return out


def caps_in_force(cluster: Cluster, nodes: list[str]) -> bool:
    ls = limits(cluster)
    return all((ls.get(n, {}).get("status") or {}).get("phase") == "Applied" for n in nodes)


async def test_kill_9_of_the_leading_m2g_run_between_two_cap_lifts(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    rng = chaos_seed()
    delay = rng.uniform(0.0, 6.0)  # after the first lift; the next is ~10 s after it
    print("kill delay after the first lift (s):", round(delay, 2))
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    cluster.cleanup.append(lambda: delete_all_limits(cluster))
    out = tmp_path_factory.mktemp("capkill")
    site = site_file(out / "site.yaml", ctl.CHECK, CAPS)
    config = load_site_config(site).planner_config(PlannerConfig(check_name=ctl.CHECK))
    flex = ["flex0", "flex1", "flex2"]
    async with running_agent(kubeconfig) as agent, timed_watts(agent) as changes:
        with pod_power_prometheus(cluster, racks, caps=True) as prom, \
                WorkloadRecorder(cluster, namespace, ctl.CHECK) as rec:
            fleet = Fleet(kubeconfig, site, policy_dir, namespace, unique("m2g-caps"), out,
                          prom)
            kills = Kills(cluster, fleet)
            try:
                await kills.first_leader()
                await capped_then_lifted_across_a_kill(cluster, namespace, agent, rec, kills,
                                                       flex, delay)
                capped = {n for job in flex for n in nodes_of(cluster, namespace, job)}
                # invariants over the whole run
                for job in flex:
                    caps = rec.caps(job)
                    assert once_down_and_back(caps, "", 1.0), f"{job}: m2g.io/power-cap went {caps}"
                    assert len(rec.lift_stamps(job)) == 1, \
                        f"{job} lifted more than once: {rec.lift_stamps(job)}"
                    assert not rec.restored_stamps(job), f"{job}: a lift read as a restore"
                    assert rec.flips(job) == [True], f"{job} paused: {rec.flips(job)}"
                assert rec.caps("firm") == [""] and rec.flips("firm") == [True]
                back = sorted(t for job in flex if (t := rec.lifted(job)) is not None)
                # ~4.9 kW at 0.5 kW/s: ~10 s apart (the successor counts from the lift's stamp)
                assert all(b - a >= 5.0 for a, b in itertools.pairwise(back)), \
                    f"lifts not paced: {back}"
                names = {ctl.workload_of(cluster, namespace, j)["metadata"]["name"]
                         for j in flex}
                lifted = event_counts(cluster, namespace, "PowerCapLifted")
                assert lifted == dict.fromkeys(names, 1), f"PowerCapLifted Events: {lifted}"
                assert set(event_counts(cluster, namespace, "PowerCapped")) == names
                watts = per_node(changes)
                for node in sorted(capped):
                    line = watts.get(node, [])
                    assert once_down_and_back(line, FULL_W, FULL_W), \
                        f"{node}: the limit in force went {line}"
                await converged(kubeconfig, cluster, namespace, policy_dir, config, racks)
                plan = await fresh_plan(kubeconfig, policy_dir, config, racks)
                assert not plan.caps and not plan.node_limits, (plan.caps, plan.node_limits)
                live = fleet.live()
                assert len(live) == 2, f"a replica died by itself:\n{fleet.tails()}"
                await ctl.until("exactly one replica leading, all ready", lambda: sorted(
                    r.metric("m2g_leader") or 0.0 for r in live) == [0.0, 1.0] and all(
                    r.ready()[0] == 200 for r in live), timeout=15)
                print("takeover (s):", [round(t, 1) for t in kills.takeovers])
            finally:
                fleet.stop_all()


async def capped_then_lifted_across_a_kill(cluster: Cluster, namespace: str, agent: Agent,
                                           rec: WorkloadRecorder, kills: Kills,
                                           flex: list[str], delay: float) -> None:
    """Firm work and three flexible jobs running; a grid event caps the three (one a step);
    it ends; the leader is killed ``delay`` s after the first lift; every cap is lifted and
    every capped node back at full power."""
    cluster.batch.create_namespaced_job(namespace, ctl.job("firm", 16, tier=0))
    for i, name in enumerate(flex):
        cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=2 + i % 2))
    await ctl.until("the four jobs running", lambda: len(cluster.core.list_namespaced_pod(
        namespace, field_selector="status.phase=Running").items) == 16, timeout=90)
    nodes = [n for job in flex for n in nodes_of(cluster, namespace, job)]
    assert len(nodes) == 12
    # 40 kW idle + 64 GPUs x 1.3 = 123.2 kW; a limit of 111 kW: 12.2 kW short, three caps
    # at 0.75 (~4.9 kW each) cover it, one a ramp step (~12 s apart)
    event = ctl.grid_event(cluster, target_kw=111.0)
    await ctl.until("the three jobs capped, the caps in force", lambda: caps_in_force(
        cluster, nodes), timeout=120)
    await asyncio.sleep(4)  # and nothing more: the caps cover the shortfall
    assert all(rec.flips(j) == [True] for j in [*flex, "firm"]), "a job was paused"
    ctl._delete(cluster, "gridevents", event)
    first = await ctl.until("the first cap lifted", lambda: [
        j for j in flex if rec.lifted(j) is not None], timeout=60)
    assert len(first) == 1, f"lifted together: {first}"
    await asyncio.sleep(delay)
    await kills.kill_leader("between two cap lifts")
    await ctl.until("every cap lifted and every GPUPowerLimit released", lambda: all(
        rec.lifted(j) is not None for j in flex) and not limits(cluster), timeout=120)
    await ctl.until("full power on every capped node", lambda: fake_watts(
        agent, nodes) == {FULL_W}, timeout=30)
    await asyncio.sleep(4)  # and nothing more


#: The caps' lease, shortened so that a successor can come after it ran out within a test
#: (120 s by default), and the agent's grace after it (60 s by default).
CAP_LEASE, AGENT_GRACE = 30.0, 5.0


def lowered_kw(changes: list[tuple[float, str, float]], since: float, window: float
               ) -> float:
    """The most kW the nodes' limits took off the draw within any ``window`` s after
    ``since`` (the modelled draw: 4 GPUs a node at 1.3 kW, the pre-training curve)."""
    power = kind_curve(WorkloadKind.TRAINING).power
    prev: dict[str, float] = {}
    drops: list[tuple[float, float]] = []
    for t, node, watts in changes:
        before = prev.get(node, FULL_W)
        prev[node] = watts
        if t >= since and watts < before:
            drops.append((t, 4 * 1.3 * (power(before / FULL_W) - power(watts / FULL_W))))
    return max((sum(kw for u, kw in drops if t <= u < t + window) for t, _ in drops),
               default=0.0)


def lifted_events(cluster: Cluster, namespace: str) -> dict[str, list[str]]:
    """m2g's PowerCapLifted Events by Workload: their messages."""
    out: dict[str, list[str]] = {}
    for e in cluster.core.list_namespaced_event(namespace).items:
        if e.reason == "PowerCapLifted" and e.reporting_component == "m2g.io/policy":
            out.setdefault(e.involved_object.name, []).append(str(e.message or ""))
    return out


@pytest.mark.parametrize("event_on", [False, True], ids=["event-over", "event-on"])
async def test_a_successor_after_the_cap_lease_ran_out(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path_factory: pytest.TempPathFactory, event_on: bool) -> None:
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    cluster.cleanup.append(lambda: delete_all_limits(cluster))
    out = tmp_path_factory.mktemp("lapse")
    site = site_file(out / "site.yaml", ctl.CHECK, {**CAPS, "capLeaseSeconds": CAP_LEASE})
    config = load_site_config(site).planner_config(PlannerConfig(check_name=ctl.CHECK))
    assert config.cap_lease_seconds == CAP_LEASE
    flex = ["flex0", "flex1", "flex2"]
    async with node_agent(kubeconfig, grace=AGENT_GRACE, min_interval=1.0) as agent, \
            timed_watts(agent) as changes:
        with pod_power_prometheus(cluster, racks, caps=True) as prom, \
                WorkloadRecorder(cluster, namespace, ctl.CHECK) as rec:
            fleet = Fleet(kubeconfig, site, policy_dir, namespace, unique("m2g-lapse"), out,
                          prom)
            kills = Kills(cluster, fleet)
            try:
                await kills.first_leader()
                event, nodes = await three_capped(cluster, namespace, rec, flex)
                # every replica killed: nobody renews the caps' lease
                for rep in fleet.live():
                    rep.kill9()
                if not event_on:
                    ctl._delete(cluster, "gridevents", event)  # it ends while m2g is away
                expires = max(datetime.fromisoformat(o["spec"]["expiresAt"].replace(
                    "Z", "+00:00")) for o in limits(cluster).values())
                await ctl.until("the agents restored full power (the lease ran out)", lambda: (
                    fake_watts(agent, nodes) == {FULL_W}), timeout=CAP_LEASE + 30)
                assert datetime.now(UTC) > expires, "full power before the lease ran out"

                def phases() -> dict[str, object]:
                    return {n: (o.get("status") or {}).get("phase")
                            for n, o in limits(cluster).items()}

                # the agent restores the GPUs, then writes each status (in parallel, a
                # round trip later): the meter-side fact first, the report after it
                await ctl.until("every capped node reporting Expired", lambda: (
                    set(phases().values()) == {"Expired"}), timeout=20)
                assert set(phases()) == set(nodes), phases()
                assert all(rec.caps(j)[-1] for j in flex), "a record changed with m2g away"
                back_at = time.monotonic()
                # the Deployment's two pods come back
                for rep in (fleet.start("m2g-2"), fleet.start("m2g-3")):
                    await kills.ready(rep)
                await ctl.until("a successor leading", lambda: (
                    (h := kills.holder()) in ("m2g-2", "m2g-3") and h), timeout=60)
                if event_on:
                    await ctl.until("caps in force again", lambda: any(
                        w < FULL_W for w in fake_watts(agent, nodes)), timeout=90)
                    await asyncio.sleep(15)  # the rest of the re-capping, paced
                    ctl._delete(cluster, "gridevents", event)
                await ctl.until("every cap lifted and every GPUPowerLimit released", lambda: (
                    all(not rec.caps(j)[-1] for j in flex) and not limits(cluster)),
                    timeout=150)
                await ctl.until("full power on every capped node", lambda: fake_watts(
                    agent, nodes) == {FULL_W}, timeout=30)
                await asyncio.sleep(6)  # and nothing more
                # invariants
                for job in [*flex, "firm"]:
                    assert rec.flips(job) == [True], f"{job} paused: {rec.flips(job)}"
                assert rec.caps("firm") == [""]
                names = {j: ctl.workload_of(cluster, namespace, j)["metadata"]["name"]
                         for j in flex}
                events = lifted_events(cluster, namespace)
                by_node = per_node(changes)
                if not event_on:
                    # no node capped again, and the lapsed caps recorded lifted, once
                    for node in nodes:
                        line = by_node.get(node, [])
                        assert once_down_and_back(line, FULL_W, FULL_W), \
                            f"{node}: capped again after the lease ran out: {line}"
                    for job in flex:
                        caps = rec.caps(job)
                        assert once_down_and_back(caps, "", 1.0), f"{job}: cap went {caps}"
                        assert len(rec.lift_stamps(job)) == 1, rec.lift_stamps(job)
                        assert not rec.restored_stamps(job), rec.restored_stamps(job)
                        msgs = events.get(names[job], [])
                        assert len(msgs) == 1 and "lapsed" in msgs[0], f"{job}: {msgs}"
                else:
                    # capped anew from full power, within the ramp: never more than one
                    # step's kW (maxStepKw) taken off within 2 s — the next step comes ≥ 5 s
                    # later (old code: every cap put back at once, its lease renewed)
                    most = lowered_kw(changes, back_at, 2.0)
                    assert most <= CAPS["maxStepKw"] + 0.5, f"{most:.1f} kW capped at once"
                    assert any(t >= back_at and w < FULL_W for t, _, w in changes), \
                        "nothing capped anew while the event was on"
                    for node in nodes:
                        assert by_node.get(node, [FULL_W])[-1] == FULL_W
                await converged(kubeconfig, cluster, namespace, policy_dir, config, racks)
                plan = await fresh_plan(kubeconfig, policy_dir, config, racks)
                assert not plan.caps and not plan.node_limits, (plan.caps, plan.node_limits)
                live = fleet.live()
                assert len(live) == 2, f"a replica died by itself:\n{fleet.tails()}"
                await ctl.until("exactly one replica leading, all ready", lambda: sorted(
                    r.metric("m2g_leader") or 0.0 for r in live) == [0.0, 1.0] and all(
                    r.ready()[0] == 200 for r in live), timeout=15)
                print("caps by job:", {j: rec.caps(j) for j in flex},
                      "lifted events:", {j: len(events.get(names[j], [])) for j in flex})
            finally:
                fleet.stop_all()


async def three_capped(cluster: Cluster, namespace: str, rec: WorkloadRecorder,
                       flex: list[str]) -> tuple[str, list[str]]:
    """Firm work and three flexible jobs running, a grid event that caps the three (one a
    step), the caps in force: the event's name and the capped nodes."""
    cluster.batch.create_namespaced_job(namespace, ctl.job("firm", 16, tier=0))
    for i, name in enumerate(flex):
        cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=2 + i % 2))
    await ctl.until("the four jobs running", lambda: len(cluster.core.list_namespaced_pod(
        namespace, field_selector="status.phase=Running").items) == 16, timeout=90)
    nodes = [n for job in flex for n in nodes_of(cluster, namespace, job)]
    assert len(nodes) == 12
    event = ctl.grid_event(cluster, target_kw=111.0)  # 12.2 kW short: three caps
    await ctl.until("the three jobs capped, the caps in force", lambda: caps_in_force(
        cluster, nodes), timeout=120)
    await asyncio.sleep(4)
    assert all(rec.flips(j) == [True] for j in [*flex, "firm"]), "a job was paused"
    return event, nodes
