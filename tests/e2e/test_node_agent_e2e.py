"""The node agent against the local control plane: GPUPowerLimit objects on real KWOK nodes,
the agent (fleet mode, fake NVML) applying them and reporting status through the API server;
the lease fail-safe and release; the CRD's and the RBAC's trust boundary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Cluster, Obj
from kubernetes.client.exceptions import ApiException
from test_controller_e2e import until

from m2g.k8s import client as k
from m2g.model import labels as L
from m2g_controllers.nodeagent import Agent

pytestmark = pytest.mark.e2e
G, V, P = "m2g.io", "v1alpha1", "gpupowerlimits"


def gpu_node(cluster: Cluster) -> str:
    nodes = cluster.core.list_node(label_selector=L.RACK).items
    return sorted(n.metadata.name for n in nodes)[0]


def put_limit(cluster: Cluster, node: str, fraction: float, lease_s: float) -> None:
    expires = (datetime.now(UTC) + timedelta(seconds=lease_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"apiVersion": f"{G}/{V}", "kind": "GPUPowerLimit", "metadata": {"name": node},
            "spec": {"nodeName": node, "fraction": fraction, "expiresAt": expires,
                     "workloads": ["e2e/job"], "reason": "e2e"}}
    try:
        cluster.custom.create_cluster_custom_object(G, V, P, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        cluster.custom.patch_cluster_custom_object(G, V, P, node, {"spec": body["spec"]})


def delete_limit(cluster: Cluster, node: str) -> None:
    with contextlib.suppress(ApiException):
        cluster.custom.delete_cluster_custom_object(G, V, P, node)


def status(cluster: Cluster, node: str) -> Obj:
    try:
        return dict(cluster.custom.get_cluster_custom_object(G, V, P, node).get("status") or {})
    except ApiException:
        return {}


@contextlib.asynccontextmanager
async def running_agent(kubeconfig: Path, grace: float = 2.0,
                        min_interval: float = 0.5) -> AsyncIterator[Agent]:
    """``m2g node-agent`` for every node (fake NVML) in this process, stopped afterwards."""
    kube = await k.connect(str(kubeconfig))
    agent = Agent(kube, {}, fleet=True, grace=grace, min_interval=min_interval)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(0.5, stop))
    try:
        yield agent
    finally:
        stop.set()
        await task
        await kube.close()


def limits(agent: Agent, node: str) -> list[float]:
    core = agent.cores.get(node)
    return [d.limit_w for d in core.backend.devices()] if core else []


async def test_the_agent_applies_reports_and_releases(
        kubeconfig: Path, cluster: Cluster, m2g_crds: None) -> None:
    node = gpu_node(cluster)
    cluster.cleanup.append(lambda: delete_limit(cluster, node))
    async with running_agent(kubeconfig) as agent:
        put_limit(cluster, node, 0.75, lease_s=300)
        st = await until("the agent to report the cap", lambda: (
            (s := status(cluster, node)).get("phase") == "Applied" and s.get("gpus") and s))
        assert {g["limitWatts"] for g in st["gpus"]} == {1050}
        assert limits(agent, node) == [1050.0] * len(st["gpus"])
        delete_limit(cluster, node)
        await until("the default limit back on release", lambda: limits(agent, node) == [
            1400.0] * len(st["gpus"]))


async def test_an_expired_lease_restores_full_power(
        kubeconfig: Path, cluster: Cluster, m2g_crds: None) -> None:
    """The controller stopped renewing: lease 4 s + grace 2 s, then the defaults."""
    node = gpu_node(cluster)
    cluster.cleanup.append(lambda: delete_limit(cluster, node))
    async with running_agent(kubeconfig, grace=2.0) as agent:
        put_limit(cluster, node, 0.5, lease_s=4)
        await until("the cap applied", lambda: set(limits(agent, node)) == {700.0})
        st = await until("the lease to expire", lambda: (
            (s := status(cluster, node)).get("phase") == "Expired" and s), timeout=30)
        assert {g["limitWatts"] for g in st["gpus"]} == {1400}


def test_the_crd_refuses_a_limit_for_another_node_and_out_of_range(
        cluster: Cluster, m2g_crds: None) -> None:
    bad: list[dict[str, Any]] = [
        {"nodeName": "someone-else", "fraction": 0.5, "expiresAt": "2026-12-01T00:00:00Z"},
        {"nodeName": "n-x", "fraction": 0.01, "expiresAt": "2026-12-01T00:00:00Z"},
    ]
    for spec in bad:
        with pytest.raises(ApiException) as err:
            cluster.custom.create_cluster_custom_object(G, V, P, {
                "apiVersion": f"{G}/{V}", "kind": "GPUPowerLimit",
                "metadata": {"name": "n-x"}, "spec": spec})
        assert err.value.status == 422
