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

``M2G_CHAOS_SEED=<n>`` replays a schedule (the seed is printed).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

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

from m2g.config import load_site_config
from m2g.k8s import client as k
from m2g.k8s.annotations import SHED_AT
from m2g.model.plan import Plan
from m2g.planner.config import PlannerConfig
from m2g.policy import make_runtime
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
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
            # 20.8 kW at 2.1 kW/s: ~10 s apart (before m2g.io/restored-at: the same second)
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
