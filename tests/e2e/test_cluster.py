"""The cluster itself: both Python clients and kubectl work, and the factory looks right."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kr8s
import kr8s.objects
import pytest
from e2e_helpers import Cluster
from localcp.paths import binary

from m2g.model import labels as L

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:Kubernetes version")]


def test_kr8s_lists_factory_nodes(kubeconfig: Path) -> None:
    api = kr8s.api(kubeconfig=str(kubeconfig))
    nodes = [n for n in api.get("nodes", label_selector={"m2g.io/factory": "small"})
             if isinstance(n, kr8s.objects.Node)]
    assert len(nodes) == 36
    assert all(n.raw["status"]["capacity"]["nvidia.com/gpu"] == "4" for n in nodes)


async def test_kr8s_async(kubeconfig: Path) -> None:
    api = await kr8s.asyncio.api(kubeconfig=str(kubeconfig))
    version = await api.version()
    assert version["major"] == "1"


def test_factory_nodes_and_topology(cluster: Cluster) -> None:
    nodes = cluster.core.list_node(label_selector="m2g.io/factory=small").items
    assert len(nodes) == 36
    racks = {n.metadata.labels[L.TOPOGRAPH_ACCELERATOR] for n in nodes}
    cliques = {n.metadata.labels[L.GPU_CLIQUE] for n in nodes}
    assert len(racks) == 2 and len(cliques) == 2
    for node in nodes:
        labels = node.metadata.labels
        assert labels["kubernetes.io/hostname"] == node.metadata.name
        rack = labels[L.TOPOGRAPH_ACCELERATOR]
        assert labels[L.GPU_CLIQUE].endswith("." + str(int(rack[5:])))
        assert {L.TOPOGRAPH_BLOCK, L.GPU_PRODUCT, "nvidia.com/gpu.family"} <= set(labels)
        # labelled as a real GB300 cluster labels its nodes: no m2g topology label
        assert [k for k in labels if k.startswith("m2g.io/")] == ["m2g.io/factory"]
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"
        assert not node.spec.taints
    topo = cluster.custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "topologies", "nvl72")
    assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == [
        L.TOPOGRAPH_BLOCK, L.TOPOGRAPH_ACCELERATOR, L.GPU_CLIQUE, L.HOSTNAME]
    flavor = cluster.custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "resourceflavors", "gb200")
    assert flavor["spec"]["topologyName"] == "nvl72"


def test_kai_crds_served(cluster: Cluster) -> None:
    for group, version, plural in (("scheduling.run.ai", "v2", "queues"),
                                   ("kai.scheduler", "v1alpha1", "topologies")):
        cluster.custom.list_cluster_custom_object(group, version, plural)
    cluster.custom.list_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", "default", "podgroups")


def _kubectl() -> str | None:
    local = binary("kubectl")
    return str(local) if local.exists() else shutil.which("kubectl")


def test_kubectl(kubeconfig: Path) -> None:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("no kubectl (build it: kind-e2e/tools/build.sh kubectl)")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    out = subprocess.run([kubectl, "get", "clusterqueues.kueue.x-k8s.io", "-o", "name"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([kubectl, "get", "nodes", "-l", "m2g.io/factory=small", "-o", "name"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 36
