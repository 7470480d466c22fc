"""Fixtures for the end-to-end suite (``pytest -m e2e``).

The suite runs against a real control plane with Kueue and a simulated NVL72 factory:

* by default the local one of kind-e2e/localcp: a running one is reused (found through the run
  directory, ``$M2G_RUN``), otherwise one is started for the session (built first if the cache
  is cold) and stopped at the end; ``M2G_E2E_KEEP=1`` leaves it running;
* with ``M2G_E2E_KUBECONFIG=/path`` any cluster prepared the same way (e.g. the kind path,
  kind-e2e/kind/), which is never started or stopped by the suite.

The local control plane runs the JobSet controller (its CRD is always installed) and gets the
extra CRDs of localcp.extras (LeaderWorkerSet, Kubeflow), installed into a reused one too, so
that every template's dry-run runs, as in CI:
``$M2G_EXTRA_CRDS`` (default ``all``; set it empty for none) says which.

Every test works in its own namespace and deletes it, and the cluster-scoped Kueue objects it
creates, afterwards, so the suite can run again against the same cluster.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, Cluster, condition, install_crds, unique, wait_until
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localcp import UserError, controlplane, factory
from localcp.kube import Kube
from localcp.paths import FACTORIES, run_paths
from manifests_helpers import SITE_CONFIG, controller, get_json, kubectl
from typer.testing import CliRunner

from m2g.model import labels as L
from m2g.testing.kit import standard_policies
from m2g_cli.app import app

E2E_FACTORY = FACTORIES / "small.yaml"
EXTRA_CRDS = os.environ.get("M2G_EXTRA_CRDS", "all")
SMALL_FACTORY_GPUS = 144  # kind-e2e/factories/small.yaml: 2 racks of 72


def _local_cluster_ready() -> bool:
    run = run_paths()
    state = controlplane.load_state(run)
    return bool(state) and all(controlplane.running(run).values())


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    """Path of a kubeconfig for a cluster with Kueue, KWOK and the small factory."""
    external = os.environ.get("M2G_E2E_KUBECONFIG")
    if external:
        yield Path(external)
        return
    started = False
    try:
        if _local_cluster_ready() and _stale_factory():
            # made before the factory carried GFD/Topograph labels: its Topology levels are
            # immutable and its nodes carry the old labels, so start it afresh
            controlplane.down()
        if not _local_cluster_ready():
            controlplane.up(E2E_FACTORY, extra_crds=EXTRA_CRDS)
            started = True
        else:
            _ensure_factory()
            controlplane.ensure_extra_crds(EXTRA_CRDS)
    except UserError as exc:
        pytest.fail(f"local control plane: {exc}", pytrace=False)
    yield run_paths().kubeconfig
    if started and os.environ.get("M2G_E2E_KEEP") != "1":
        controlplane.down()


def _stale_factory() -> bool:
    """A running control plane whose Kueue Topology is not the factory generator's (an older
    factory, e.g. levels m2g.io/block -> m2g.io/rack)."""
    run = run_paths()
    state = controlplane.load_state(run) or {}
    spec = factory.load_spec(E2E_FACTORY)
    want = next(o for o in factory.scheduling_objects(spec) if o["kind"] == "Topology")
    kube = Kube(state["server"], run.pki)
    try:
        have = kube.get(f"/apis/kueue.x-k8s.io/v1beta2/topologies/{spec.topology}")
    finally:
        kube.close()
    return have is not None and have.get("spec", {}).get("levels") != want["spec"]["levels"]


def _ensure_factory() -> None:
    """Apply the small factory to a reused cluster unless all its nodes are there and Ready."""
    run = run_paths()
    state = controlplane.load_state(run) or {}
    spec = factory.load_spec(E2E_FACTORY)
    kube = Kube(state["server"], run.pki)
    try:
        ready = factory.ready_nodes(kube, spec.name)
    finally:
        kube.close()
    if ready != spec.node_count:
        controlplane.apply_factory(E2E_FACTORY)


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> client.ApiClient:
    """An official-client ApiClient for the cluster."""
    return config.new_client_from_config(config_file=str(kubeconfig))


@pytest.fixture
def cluster(api: client.ApiClient) -> Iterator[Cluster]:
    """Helpers; cluster-scoped objects the test created are deleted afterwards."""
    c = Cluster(api)
    yield c
    for undo in reversed(c.cleanup):
        undo()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted (with everything in it) afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"m2g.io/e2e": "true"})))
    yield name
    try:
        cluster.core.delete_namespace(name, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
    # Wait for the namespace to go so that its workloads release the ClusterQueue (whose
    # deletion the fixture `cluster` does next); a stuck namespace is reported, not hidden.
    def gone() -> bool:
        try:
            cluster.core.read_namespace(name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(f"namespace {name} to be deleted", gone, timeout=90)


@pytest.fixture
def clean_taints(cluster: Cluster) -> Iterator[None]:
    """Leave no m2g taint (``m2g.io/*``: maintenance, thermal) on any node after the test,
    whatever happened in it: the next tests share the factory's nodes."""
    yield
    for node in cluster.core.list_node().items:
        taints = node.spec.taints or []
        if any(t.key.startswith("m2g.io/") for t in taints):
            keep = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints
                    if not t.key.startswith("m2g.io/")]
            cluster.core.patch_node(node.metadata.name, {"spec": {"taints": keep or None}})


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A folder with the standard e2e policies (``m2g.testing.kit.standard_policies``)."""
    for name, text in standard_policies("e2e").items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.fixture
def m2g_crds(api: client.ApiClient) -> None:
    """m2g's CRDs installed (or brought up to date) and Established."""
    install_crds(api)


@pytest.fixture(scope="module")
def labels_queue(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace whose LocalQueue ``default`` feeds a ClusterQueue on the factory's flavor
    (all its GPUs) gated by m2g's check, the Topology objects of ``m2g topology generate`` for
    the default label mapping, and ``m2g run`` with the Deployment's site configuration and the
    shipped policies (tests/e2e/test_real_labels_e2e.py, test_kind_jobset.py)."""
    ns, cq = unique("labels"), unique("labels-cq")
    topo = CliRunner().invoke(app, ["topology", "generate", "--config", str(SITE_CONFIG),
                                    "--no-kai"])
    assert topo.exit_code == 0, topo.output
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "admissionChecksStrategy": {"admissionChecks": [{"name": "m2g-policy"}]},
                  "resourceGroups": [{"coveredResources": [L.GPU_RESOURCE], "flavors": [
                      {"name": "gb200", "resources": [{"name": L.GPU_RESOURCE,
                                                       "nominalQuota": str(SMALL_FACTORY_GPUS)}
                                                      ]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "default", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ]
    docs = topo.output + "---\n" + yaml.safe_dump_all(objs)
    kubectl(kubeconfig, "create", "namespace", "m2g-system", check=False)
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=docs)
    log = tmp_path_factory.mktemp("labels") / "m2g-run.log"
    try:
        with controller(kubeconfig, log, "--config", str(SITE_CONFIG), "--identity",
                        "labels-e2e", "--policies", str(REPO / "policies"),
                        "--resync-seconds", "2"):
            wait_until(f"ClusterQueue {cq} to be Active", lambda: (
                (c := condition(get_json(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{cq}")
                                or {}, "Active")) and c["status"] == "True"), timeout=90)
            yield ns
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=true", "--timeout=120s",
                check=False)
        kubectl(kubeconfig, "delete", f"clusterqueues.kueue.x-k8s.io/{cq}", check=False)

