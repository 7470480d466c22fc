"""The telemetry simulator against the local control plane: a pod running on a KWOK node makes
that node draw more than the idle ones, in the /metrics the simulator serves."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Cluster, unique, wait_until
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from m2g.k8s import client as k
from m2g.model import labels as L
from m2g.sim.exposition import render
from m2g_controllers.simulator import KubeSource, Simulator

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:Kubernetes version")]


def gpu_pod(name: str, node: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={L.WORKLOAD_KIND: "training"}),
        spec=client.V1PodSpec(
            node_selector={L.HOSTNAME: node},
            containers=[client.V1Container(
                name="train", image="busybox",
                resources=client.V1ResourceRequirements(
                    limits={L.GPU_RESOURCE: "4"}, requests={L.GPU_RESOURCE: "4"}))]))


async def test_running_pod_draws_power(kubeconfig: Path, cluster: Cluster,
                                       namespace: str) -> None:
    nodes = cluster.core.list_node(label_selector=f"{L.RACK}").items
    target = sorted(n.metadata.name for n in nodes)[0]
    name = unique("sim")
    cluster.core.create_namespaced_pod(namespace, gpu_pod(name, target))
    wait_until(f"pod {name} Running on {target}", lambda: cluster.core.read_namespaced_pod(
        name, namespace).status.phase == "Running", timeout=60)

    kube = await k.connect(kubeconfig)
    sim = Simulator(KubeSource(kube), clock=lambda: 1000.0, log=lambda _: None)
    try:
        state = await sim.tick()
    finally:
        await kube.close()
    power: dict[str, float] = {}
    for fam in text_string_to_metric_families(render(state).decode()):
        if fam.name == "DCGM_FI_DEV_POWER_USAGE":
            for s in fam.samples:
                host = s.labels["Hostname"]
                power[host] = power.get(host, 0.0) + s.value
    assert len(power) == len(nodes)
    idle = [w for n, w in power.items() if n != target]
    assert power[target] > 4 * max(idle)
    assert any(g.pod == f"{namespace}/{name}" for g in state.gpus[target])
