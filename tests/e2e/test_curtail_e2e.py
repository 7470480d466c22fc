"""Graded curtailment end to end on the local control plane: a grid event caps the GPUs of a
flex-2 job through the node agent (fake NVML) before any job is paused; the cap is lifted
after the event; with the controller gone mid-event, the agent restores full power after the
lease (docs/curtailment.md, docs/node-agent.md).

The controller runs in this process (as in test_controller_e2e) with the modelled rack power
of m2g.testing.kit, which follows what the agent reports in force; the agent runs in this
process too, one fake agent per GPU node (``m2g node-agent --all-nodes --nvml fake``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from e2e_helpers import Cluster, Obj, unique
from kubernetes.client.exceptions import ApiException
from test_controller_e2e import (
    CHECK,
    _delete,
    admitted,
    factory_flavor,
    job,
    make_queue,
    modelled_power,
    running_m2g,
    site_with_budget,
    until,
    workload_of,
)
from test_node_agent_e2e import running_agent as node_agent

from m2g.planner.config import PlannerConfig
from m2g_controllers.nodeagent import Agent

pytestmark = pytest.mark.e2e
G, V, P = "m2g.io", "v1alpha1", "gpupowerlimits"
LEASE, GRACE = 8.0, 3.0
CFG = PlannerConfig(check_name=CHECK, ramp_kw_per_second=1000.0, settle_seconds=5.0,
                    shed_saving_fraction=1.0, min_shed_seconds=5.0, cap_lease_seconds=LEASE)


def event(cluster: Cluster, target_kw: float, ends_in: float) -> str:
    """A capacity-limit GridEvent that started a minute ago and ends ``ends_in`` s from now."""
    name = unique("e2e-cap")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    cluster.custom.create_cluster_custom_object(G, V, "gridevents", {
        "apiVersion": f"{G}/{V}", "kind": "GridEvent", "metadata": {"name": name},
        "spec": {"programName": "e2e", "eventID": name, "intervals": [{
            "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration": f"PT{60 + int(ends_in)}S",
            "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": target_kw}}]}})
    cluster.cleanup.append(lambda: _delete(cluster, "gridevents", name))
    return name


def limits(cluster: Cluster) -> dict[str, Obj]:
    items = cluster.custom.list_cluster_custom_object(G, V, P)["items"]
    return {o["metadata"]["name"]: o for o in items}


def delete_all_limits(cluster: Cluster) -> None:
    for name in limits(cluster):
        with contextlib.suppress(ApiException):
            cluster.custom.delete_cluster_custom_object(G, V, P, name)


@contextlib.asynccontextmanager
async def running_agent(kubeconfig: Path) -> AsyncIterator[Agent]:
    async with node_agent(kubeconfig, grace=GRACE, min_interval=1.0) as agent:
        yield agent


def fake_watts(agent: Agent, nodes: list[str]) -> set[float]:
    return {d.limit_w for n in nodes if (c := agent.cores.get(n))
            for d in c.backend.devices()}


def nodes_of(cluster: Cluster, namespace: str, job_name: str) -> list[str]:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}")
    return sorted({p.spec.node_name for p in pods.items if p.spec.node_name})


def active(cluster: Cluster, namespace: str, name: str) -> bool:
    wl = workload_of(cluster, namespace, name)
    return bool(wl) and (wl or {})["spec"].get("active", True) is not False


async def start_capped(cluster: Cluster, namespace: str, kubeconfig: Path) -> list[str]:
    """Two jobs running (firm 16 GPUs, flex-2 16 GPUs); returns the flex job's nodes."""
    for name, tier in (("firm", 0), ("flex2", 2)):
        cluster.batch.create_namespaced_job(namespace, job(name, 16, tier=tier))
    await until("both workloads admitted", lambda: admitted(cluster, namespace) == 2)
    return await until("the flex job's pods bound", lambda: (
        n if len(n := nodes_of(cluster, namespace, "flex2")) == 4 else None))


async def test_a_grid_event_caps_a_flex_job_before_pausing_and_lifts_it_after(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    cluster.cleanup.append(lambda: delete_all_limits(cluster))
    async with running_agent(kubeconfig) as agent, \
            running_m2g(kubeconfig, policy_dir, modelled_power(racks), CFG) as manager:
        flex_nodes = await start_capped(cluster, namespace, kubeconfig)
        # 2 racks idle 40 kW + 32 GPUs x 1.3 = 81.6 kW; a limit of 78 kW is 3.6 kW short: the
        # flex-2 job's caps cover it (0.75 saves ~5 kW) without pausing anything
        ends_in = 45.0
        event(cluster, target_kw=78.0, ends_in=ends_in)
        t0 = time.monotonic()
        capped = await until("the agent to report the flex job's GPUs capped", lambda: (
            (ls := limits(cluster)) and all(
                (ls.get(n, {}).get("status") or {}).get("phase") == "Applied"
                for n in flex_nodes) and ls), timeout=40)
        fractions = {capped[n]["spec"]["fraction"] for n in flex_nodes}
        assert len(fractions) == 1 and 0.5 <= fractions.pop() < 1.0
        watts = fake_watts(agent, flex_nodes)
        assert len(watts) == 1 and watts.pop() < 1400.0
        assert set(capped) == set(flex_nodes)  # the firm job's nodes are never capped
        wl = workload_of(cluster, namespace, "flex2") or {}
        assert "m2g.io/power-cap" in wl["metadata"]["annotations"]
        # the capped draw meets the target: nothing is paused during the event
        while time.monotonic() - t0 < ends_in - 5:
            assert active(cluster, namespace, "flex2") and active(cluster, namespace, "firm")
            await asyncio.sleep(2)
        assert manager.state.reconciles > 0
        await until("the cap lifted after the event", lambda: not limits(cluster),
                    timeout=60)
        await until("full power on the flex job's GPUs",
                    lambda: fake_watts(agent, flex_nodes) == {1400.0}, timeout=20)
        wl = workload_of(cluster, namespace, "flex2") or {}
        notes = wl["metadata"]["annotations"]
        assert "m2g.io/power-cap" not in notes and float(notes["m2g.io/flex-used-seconds"]) > 0


async def test_with_the_controller_gone_the_agent_restores_full_power_after_the_lease(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    cluster.cleanup.append(lambda: delete_all_limits(cluster))
    async with running_agent(kubeconfig) as agent:
        async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), CFG):
            flex_nodes = await start_capped(cluster, namespace, kubeconfig)
            event(cluster, target_kw=78.0, ends_in=600)
            await until("the caps in force", lambda: (
                (w := fake_watts(agent, flex_nodes)) and max(w) < 1400.0), timeout=40)
        stopped = time.monotonic()  # the controller is gone mid-event; nobody renews
        expires = max(datetime.fromisoformat(o["spec"]["expiresAt"].replace("Z", "+00:00"))
                      for o in limits(cluster).values())
        await until("the agent to restore full power", lambda: fake_watts(
            agent, flex_nodes) == {1400.0}, timeout=LEASE + GRACE + 20)
        waited = time.monotonic() - stopped
        assert datetime.now(UTC) > expires  # not before the lease ran out
        assert waited <= LEASE + GRACE + 10, waited
        # the agent restores the GPUs, then reports it: its status write follows the watts
        await until("the limits' status Expired", lambda: {
            (o.get("status") or {}).get("phase") for o in limits(cluster).values()
        } == {"Expired"}, timeout=15)
