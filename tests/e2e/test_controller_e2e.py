"""The m2g controllers against real Kueue: admission checks, derating, shedding, bad policy pushes.

Each test runs the real control loop (m2g_controllers: watch caches, planner, applier) in this
process against the local control plane. Power comes from a small model of the rack draw —
idle kW plus 1.3 kW per GPU of every running pod on the rack, read from the same pod cache — so
shedding closes the loop the way the telemetry simulator does, without a Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Cluster, Obj, condition, unique
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from m2g.k8s import client as k
from m2g.planner.config import PlannerConfig
from m2g.policy import make_runtime
from m2g.testing import kit
from m2g.testing.kit import standard_policies
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
CHECK = "m2g-e2e"
RACK_LABEL = "network.topology.nvidia.com/accelerator"

POLICIES = standard_policies("e2e")


# ---- setup helpers ---------------------------------------------------------------------


def factory_flavor(cluster: Cluster) -> str:
    """The ResourceFlavor of the small factory (its nodes' GPU product)."""
    flavors = cluster.custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                        "resourceflavors")["items"]
    names = [f["metadata"]["name"] for f in flavors if f["metadata"]["name"] == "gb200"]
    assert names, "the small factory's ResourceFlavor gb200 is missing"
    return names[0]


def make_queue(cluster: Cluster, namespace: str, flavor: str, gpus: int) -> str:
    cq = unique("e2e-m2g-cq")
    cluster.create_kueue("clusterqueues", kit.cluster_queue(cq, namespace, flavor, gpus, CHECK))
    cluster.create_kueue("localqueues", kit.local_queue(namespace, cq), namespace=namespace)
    return cq


def job(name: str, gpus: int, tier: int) -> Obj:
    """A Job of ``gpus`` GPUs as pods of one 4-GPU tray each."""
    pods = max(1, gpus // 4)
    return kit.job(name, tier, pods, gpus // pods)


def workload_of(cluster: Cluster, namespace: str, job_name: str) -> Obj | None:
    for wl in cluster.workloads(namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("name") == job_name for o in owners):
            return wl
    return None


def admitted(cluster: Cluster, namespace: str) -> int:
    """How many of the namespace's Workloads Kueue has admitted."""
    return len([w for w in cluster.workloads(namespace)
                if (c := condition(w, "Admitted")) and c["status"] == "True"])


def check_state(wl: Obj | None) -> str:
    for entry in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == CHECK:
            return str(entry.get("state"))
    return ""


async def until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def modelled_power(rack_of_node: dict[str, str], inlet: dict[str, float] | None = None
                   ) -> Callable[[K8sCluster], Any]:
    """Rack kW = idle + 1.3 kW per GPU of the running pods on the rack; inlet 24 °C unless
    ``inlet`` says otherwise (m2g.testing.kit)."""
    return kit.modelled_power(rack_of_node, inlet)


@contextlib.asynccontextmanager
async def running_m2g(kubeconfig: Path, policy_dir: Path | None,
                      power: Callable[[K8sCluster], Any] | None = None,
                      config: PlannerConfig | None = None,
                      decision_log: Any = None, **manager_args: Any) -> AsyncIterator[Manager]:
    """The control loop in this process; ``manager_args``: more of ``Manager``'s options."""
    kube = await k.connect(kubeconfig)
    cluster = K8sCluster(kube, readings=power)
    manager = Manager(cluster, PolicyStore(make_runtime()), Metrics(),
                      config=config or PlannerConfig(check_name=CHECK), resync_seconds=1.0,
                      policy_dir=policy_dir, decision_log=decision_log, **manager_args)
    stop = asyncio.Event()
    await cluster.start(manager.kick)
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager
    finally:
        stop.set()
        manager.kick()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 40)  # a reconcile may wait on its requests (30 s)
        await cluster.stop()
        await kube.close()



def grid_event(cluster: Cluster, target_kw: float, minutes: int = 60) -> str:
    name = unique("e2e-dr")
    start = datetime.now(UTC) - timedelta(minutes=1)
    cluster.custom.create_cluster_custom_object(
        "m2g.io", "v1alpha1", "gridevents", kit.grid_event(name, start, minutes, target_kw))
    cluster.cleanup.append(lambda: _delete(cluster, "gridevents", name))
    return name


def site_with_budget(cluster: Cluster, budget_kw: float) -> dict[str, str]:
    """A site budget (a PowerDomain of level Site); returns node → rack of the factory."""
    site = unique("e2e-site")
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "powerdomains", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain", "metadata": {"name": site},
        "spec": {"level": "Site", "budgetKw": budget_kw}})
    cluster.cleanup.append(lambda: _delete(cluster, "powerdomains", site))
    return {n.metadata.name: n.metadata.labels[RACK_LABEL]
            for n in cluster.core.list_node(label_selector="m2g.io/factory=small").items}


def _delete(cluster: Cluster, plural: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        cluster.custom.delete_cluster_custom_object("m2g.io", "v1alpha1", plural, name)


# ---- the scenarios ------------------------------------------------------------------------

async def test_grid_event_defers_flexible_work_and_admits_firm_work(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 64)
    event = grid_event(cluster, target_kw=10_000.0)
    async with running_m2g(kubeconfig, policy_dir):
        cluster.batch.create_namespaced_job(namespace, job("firm", 8, tier=0))
        cluster.batch.create_namespaced_job(namespace, job("flex", 8, tier=2))
        admitted = await until("the firm job's workload to be admitted", lambda: (
            (wl := workload_of(cluster, namespace, "firm")) and condition(wl, "Admitted")
            and condition(wl, "Admitted")["status"] == "True" and wl))
        assert check_state(admitted) == "Ready"
        flex = await until("m2g to defer the flexible job", lambda: (
            (wl := workload_of(cluster, namespace, "flex")) and check_state(wl) in
            ("Retry", "Pending") and "grid event" in str(wl.get("status")) and wl))
        assert event in str(flex["status"])
        adm = condition(flex, "Admitted")
        assert adm is None or adm["status"] != "True"


async def test_node_failure_derates_the_queue(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    flavor = factory_flavor(cluster)
    nodes = [n for n in cluster.core.list_node(label_selector="m2g.io/factory=small").items]
    assert len(nodes) >= 18
    total = sum(int(n.status.allocatable.get(GPU, "0")) for n in nodes)
    cq = make_queue(cluster, namespace, flavor, total)
    victim = nodes[0].metadata.name
    async with running_m2g(kubeconfig, policy_dir) as manager:
        await until("a first reconcile", lambda: manager.state.reconciles > 0)
        cluster.core.patch_node(victim, {"spec": {"taints": [
            {"key": "nvidia.com/gpu-xid", "value": "79", "effect": "NoSchedule"}]}})
        try:
            def quota() -> int:
                obj = cluster.custom.get_cluster_custom_object(
                    "kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)
                res = obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
                return int(next(r for r in res if r["name"] == GPU)["nominalQuota"])
            derated = await until("the ClusterQueue's GPU quota to drop",
                                  lambda: quota() < total and quota(), timeout=30)
            gpus_per_node = int(nodes[0].status.allocatable[GPU])
            assert derated == total - gpus_per_node  # only this queue shares the flavor
        finally:
            cluster.core.patch_node(victim, {"spec": {"taints": None}})


async def test_grid_event_sheds_flexible_running_work_then_restores_it(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    # the modelled power has no per-GPU idle: shedding saves the whole estimate here
    cfg = PlannerConfig(check_name=CHECK, ramp_kw_per_second=1000.0, settle_seconds=5.0,
                        shed_saving_fraction=1.0, min_shed_seconds=5.0)
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), cfg):
        for name, tier in (("firm", 0), ("flex1", 1), ("flex3", 3)):
            cluster.batch.create_namespaced_job(namespace, job(name, 16, tier=tier))
        await until("three workloads admitted", lambda: admitted(cluster, namespace) == 3)
        # 2 racks idle 40 kW + 48 GPUs x 1.3 = 102.4 kW; a limit of 85 kW is 17.4 kW short:
        # the tier-3 job (16 GPUs, 20.8 kW) alone covers it
        grid_event(cluster, target_kw=85.0)
        shed = await until("m2g to shed the tier-3 workload", lambda: (
            (wl := workload_of(cluster, namespace, "flex3")) and
            wl["spec"].get("active") is False and wl))
        assert "m2g.io/shed-at" in shed["metadata"].get("annotations", {})
        firm = workload_of(cluster, namespace, "firm")
        assert firm is not None and firm["spec"].get("active", True) is True
        flex1 = workload_of(cluster, namespace, "flex1")
        assert flex1 is not None and flex1["spec"].get("active", True) is True  # one was enough
        # the event ends: m2g brings the work back
        for ev in cluster.custom.list_cluster_custom_object(
                "m2g.io", "v1alpha1", "gridevents")["items"]:
            if ev["spec"].get("programName") == "e2e":
                _delete(cluster, "gridevents", ev["metadata"]["name"])
        await until("m2g to restore the shed workload", lambda: (
            (wl := workload_of(cluster, namespace, "flex3")) and
            wl["spec"].get("active", True) is True and wl), timeout=60)


async def test_broken_policy_push_keeps_the_last_good_set(
        kubeconfig: Path, cluster: Cluster, namespace: str, m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 64)
    good = unique("e2e-policy")
    body = yaml.safe_load(POLICIES["dr.yaml"])
    body["metadata"]["name"] = good
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "policies", body)
    cluster.cleanup.append(lambda: _delete(cluster, "policies", good))
    event = grid_event(cluster, target_kw=10_000.0)
    async with running_m2g(kubeconfig, None) as manager:
        await until("the policy to be Accepted", lambda: any(
            c.get("type") == "Accepted" and c.get("status") == "True"
            for c in (cluster.custom.get_cluster_custom_object(
                "m2g.io", "v1alpha1", "policies", good).get("status") or {}).get(
                "conditions") or []))
        broken = unique("e2e-broken")
        bad = yaml.safe_load(POLICIES["dr.yaml"])
        bad["metadata"]["name"] = broken
        bad["spec"]["rules"][0]["when"] = "workload.gpus * 1.5 > 2.0"  # int * double
        cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "policies", bad)
        cluster.cleanup.append(lambda: _delete(cluster, "policies", broken))

        def rejected() -> Obj | None:
            obj = cluster.custom.get_cluster_custom_object("m2g.io", "v1alpha1", "policies",
                                                           broken)
            conds = (obj.get("status") or {}).get("conditions") or []
            return next((c for c in conds if c.get("type") == "Accepted"
                         and c.get("status") == "False"), None)
        cond = await until("the broken Policy to be rejected in its status", rejected)
        assert "no matching overload" in cond["message"]
        assert manager.store.policy_set is not None
        assert manager.store.policy_set.names() == [good]  # the last good set is in force
        # the broken object freezes no other update: the good one's new version takes effect
        before = manager.store.version
        cluster.custom.patch_cluster_custom_object(
            "m2g.io", "v1alpha1", "policies", good,
            {"metadata": {"annotations": {"e2e": "touched"}},
             "spec": {"description": "updated beside a broken Policy"}})
        await until("the good Policy's update to be in force",
                    lambda: manager.store.version != before)
        assert manager.store.policy_set.names() == [good]
        cluster.batch.create_namespaced_job(namespace, job("flex", 8, tier=2))
        await until("the good set (still in force) to defer the flexible job", lambda: (
            (wl := workload_of(cluster, namespace, "flex")) and event in str(wl.get("status"))))


async def test_restart_mid_shed_converges_without_duplicate_actions(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    # a slow ramp: one 20.8 kW workload per ~10 s, so the restart lands between two sheds
    slow = PlannerConfig(check_name=CHECK, ramp_kw_per_second=2.1, max_step_kw=25.0,
                         settle_seconds=3.0, shed_saving_fraction=1.0)
    names = [f"flex{i}" for i in range(4)]
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), slow):
        for i, name in enumerate(names):
            cluster.batch.create_namespaced_job(namespace, job(name, 16, tier=1 + i % 3))
        await until("four workloads admitted", lambda: admitted(cluster, namespace) == 4)
        # idle 40 + 64 GPUs x 1.3 = 123.2 kW; limit 85 kW: 38.2 kW short = two workloads
        grid_event(cluster, target_kw=85.0)

        def shed() -> list[str]:
            return sorted(n for n in names if (wl := workload_of(cluster, namespace, n))
                          and wl["spec"].get("active") is False)
        first = await until("the first shed", shed)
        assert len(first) == 1
    # "killed": the first controller is gone; a new one starts from the cluster's state alone
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), slow):
        both = await until("the second shed, by the restarted controller",
                           lambda: len(s := shed()) == 2 and s, timeout=60)
        await asyncio.sleep(8)  # and then nothing more: the shortfall is covered
        assert shed() == both
        assert set(first) < set(both)
        stamps = {n: workload_of(cluster, namespace, n)["metadata"]["annotations"][
            "m2g.io/shed-at"] for n in both}
        assert len(set(stamps.values())) == 2  # two separate, paced actions


async def test_leader_failover(kubeconfig: Path, cluster: Cluster, namespace: str,
                               policy_dir: Path, m2g_crds: None) -> None:
    from m2g.k8s.leader import LeaderElector

    make_queue(cluster, namespace, factory_flavor(cluster), 64)
    kube_a, kube_b = await k.connect(kubeconfig), await k.connect(kubeconfig)
    electors = {name: LeaderElector(kube, "m2g-e2e", namespace, name, lease_duration=4.0,
                                    renew_deadline=3.0, retry_period=0.5)
                for name, kube in (("a", kube_a), ("b", kube_b))}
    stops = {n: asyncio.Event() for n in electors}
    managers, tasks = {}, []
    try:
        for name, kube in (("a", kube_a), ("b", kube_b)):
            c = K8sCluster(kube, instance=name)
            m = Manager(c, PolicyStore(make_runtime()), Metrics(),
                        config=PlannerConfig(check_name=CHECK), resync_seconds=1.0,
                        policy_dir=policy_dir, is_leader=lambda e=electors[name]: e.is_leader)
            await c.start(m.kick)
            managers[name] = m
            tasks.append(asyncio.create_task(electors[name].run(stops[name])))
            tasks.append(asyncio.create_task(m.run(stops[name])))
        leader = await until("one leader", lambda: [n for n, e in electors.items()
                                                     if e.is_leader])
        assert len(leader) == 1
        lead, follow = leader[0], "b" if leader[0] == "a" else "a"
        cluster.batch.create_namespaced_job(namespace, job("one", 4, tier=0))
        await until("the leader to answer the check", lambda: check_state(
            workload_of(cluster, namespace, "one")) == "Ready")
        follower_cluster = managers[follow].cluster
        assert isinstance(follower_cluster, K8sCluster)
        assert follower_cluster.applier.records == []  # the follower wrote nothing
        stops[lead].set()  # the leader dies without releasing its Lease
        await until("the follower to take over", lambda: electors[follow].is_leader,
                    timeout=20)
        cluster.batch.create_namespaced_job(namespace, job("two", 4, tier=0))
        await until("the new leader to answer", lambda: check_state(
            workload_of(cluster, namespace, "two")) == "Ready", timeout=30)
    finally:
        for s in stops.values():
            s.set()
        for m in managers.values():
            m.kick()
        await asyncio.gather(*tasks, return_exceptions=True)
        for m in managers.values():
            assert isinstance(m.cluster, K8sCluster)
            await m.cluster.stop()
        await kube_a.close()
        await kube_b.close()


THERMAL = {
    "thermal-capacity.yaml": """
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {name: e2e-thermal-capacity}
spec:
  stage: Capacity
  rules:
    - name: hot-racks-out
      when: "topology.racks.exists(r, r.thermal.alarm)"
      quota: "flavor.healthyGpus - 72 * size(topology.racks.filter(r, r.thermal.alarm))"
      message: "racks in thermal alarm give no quota"
""",
    "thermal-placement.yaml": """
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {name: e2e-thermal-placement}
spec:
  stage: Admission
  rules:
    - name: avoid-hot-racks
      when: "topology.racks.exists(r, r.thermal.alarm) && topology.racks.exists(r, !r.thermal.alarm)"
      decision: Admit
      podSetUpdates:
        nodeSelector:
          "${site.labels.rack}": "topology.racks.filter(r, !r.thermal.alarm)[0].name"
      messageExpression: "'placed on ' + topology.racks.filter(r, !r.thermal.alarm)[0].name + ': other racks are in thermal alarm'"
""",
}


async def test_thermal_alarm_keeps_new_work_off_the_rack_and_derates(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None, clean_taints: None) -> None:
    for name, text in THERMAL.items():
        (tmp_path / name).write_text(text)
    nodes = cluster.core.list_node(label_selector="m2g.io/factory=small").items
    racks = {n.metadata.name: n.metadata.labels[RACK_LABEL] for n in nodes}
    hot = sorted(set(racks.values()))[0]
    total = sum(int(n.status.allocatable.get(GPU, "0")) for n in nodes)
    # A flavor without TAS: Kueue's topology-aware scheduling assigns nodes at quota
    # reservation, before admission checks, so an AdmissionCheck's nodeSelector cannot steer
    # a TAS flavor (there, cordoning or tainting the rack is the lever; docs/controllers.md).
    flavor = unique("e2e-plain")
    cluster.create_kueue("resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": flavor},
        "spec": {"nodeLabels": {"m2g.io/factory": "small"}}})
    cq = make_queue(cluster, namespace, flavor, total)
    async with running_m2g(kubeconfig, tmp_path, modelled_power(racks, {hot: 36.0})):
        def quota() -> int:
            obj = cluster.custom.get_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)
            res = obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
            return int(next(r for r in res if r["name"] == GPU)["nominalQuota"])
        await until("the quota to lose the hot rack", lambda: quota() == total - 72)
        cluster.batch.create_namespaced_job(namespace, job("cool", 8, tier=0))
        wl = await until("the job admitted with m2g's placement", lambda: (
            (w := workload_of(cluster, namespace, "cool")) and check_state(w) == "Ready"
            and w))
        entry = next(e for e in wl["status"]["admissionChecks"] if e["name"] == CHECK)
        placed = entry["podSetUpdates"][0]["nodeSelector"][RACK_LABEL]
        assert placed != hot
        pods = await until("the job's pods to be bound", lambda: [
            p for p in cluster.core.list_namespaced_pod(namespace).items
            if p.spec.node_name] or None)
        assert all(racks[p.spec.node_name] != hot for p in pods)


async def test_a_tenant_policy_tightens_only_its_own_namespace(
        kubeconfig: Path, cluster: Cluster, namespace: str, m2g_crds: None) -> None:
    """A TenantPolicy in one namespace rejects that namespace's 8-GPU job; the same job in
    another namespace is admitted; its status says it is Accepted."""
    other = unique("e2e-other")
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=other, labels={"m2g.io/e2e": "true"})))
    cluster.cleanup.append(lambda: cluster.core.delete_namespace(
        other, propagation_policy="Background"))
    flavor = factory_flavor(cluster)
    make_queue(cluster, namespace, flavor, 64)
    make_queue(cluster, other, flavor, 64)
    platform = yaml.safe_load(POLICIES["dr.yaml"])
    platform["metadata"]["name"] = good = unique("e2e-platform")
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "policies", platform)
    cluster.cleanup.append(lambda: _delete(cluster, "policies", good))
    cluster.custom.create_namespaced_custom_object("m2g.io", "v1alpha1", namespace,
                                                   "tenantpolicies", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "TenantPolicy",
        "metadata": {"name": "team-cap"},
        "spec": {"stage": "Admission", "rules": [{
            "name": "at-most-4", "when": "workload.gpus > 4", "decision": "Reject",
            "message": "this team runs at most 4 GPUs a job"}]}})

    def tenant_accepted() -> bool:
        obj = cluster.custom.get_namespaced_custom_object("m2g.io", "v1alpha1", namespace,
                                                          "tenantpolicies", "team-cap")
        return any(c.get("type") == "Accepted" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])

    async with running_m2g(kubeconfig, None) as manager:
        await until("the TenantPolicy to be Accepted", tenant_accepted)
        assert sorted(manager.store.policy_set.names()) == sorted(
            [good, f"tenant.{namespace}.team-cap"])
        for ns in (namespace, other):
            cluster.batch.create_namespaced_job(ns, job("big", 8, tier=0))
        # Kueue deactivates a workload whose check is Rejected (and then resets the check's
        # state, so the state alone is seen only for a moment); m2g's Event keeps the message
        await until("the tenant's own job to be rejected and deactivated", lambda: (
            (wl := workload_of(cluster, namespace, "big")) and wl["spec"].get("active") is False
            and (condition(wl, "QuotaReserved") or {}).get("status") != "True"))
        await until("m2g's Event with the tenant's message", lambda: any(
            "at most 4 GPUs" in (e.message or "")
            for e in cluster.core.list_namespaced_event(namespace).items))
        await until("the other namespace's job to be admitted", lambda: admitted(
            cluster, other) == 1)
        other_wl = workload_of(cluster, other, "big")
        assert other_wl is not None and other_wl["spec"].get("active", True) is True
