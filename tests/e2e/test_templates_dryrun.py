"""Every rendered template against the real API server (server-side dry-run, dryRun=All).

The local control plane serves batch/v1 and the Kueue and KAI CRDs only. Manifests of APIs
whose CRD is absent (JobSet, PyTorchJob, TrainJob, LeaderWorkerSet) are skipped with that
reason; every template that can render to an indexed batch/v1 Job is validated as one, always.
With Kueue running, its Job webhooks take part in the dry-run too.

``M2G_E2E_EXTRA_CRDS=/folder`` installs the CustomResourceDefinitions found in that folder's
*.yaml files first (they stay installed), so the other APIs are validated as well; see
docs/templates.md ("Validated against the API server") for where to get them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, Cluster, condition, unique, wait_until
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from template_runs import hosts_of
from typer.testing import CliRunner

from m2g.model import labels as L
from m2g.templates import WorkloadApi, render
from m2g.templates.loader import load_all
from m2g_cli.app import app, kubectl_forms
from m2g_cli.templates_apply import ClusterError, Submitter, connect, create, serves

pytestmark = pytest.mark.e2e

TEMPLATES = load_all(REPO / "templates")
CASES = [(n, a.value) for n, t in sorted(TEMPLATES.items()) for a in t.spec.apis]
JOB_CASES = [(n, a) for n, a in CASES if a == WorkloadApi.JOB.value]
DRY_NS = "default"  # a dry-run persists nothing, so no namespace of its own is needed


@pytest.fixture(scope="module")
def submitter(kubeconfig: Path) -> Iterator[Submitter]:
    """The CLI's own connection (m2g.k8s's client), as ``m2g submit`` uses it."""
    extra = os.environ.get("M2G_E2E_EXTRA_CRDS")
    if extra:
        install_crds(config.new_client_from_config(config_file=str(kubeconfig)), Path(extra))
    api = connect(str(kubeconfig))
    yield api
    api.close()


def install_crds(official: client.ApiClient, folder: Path) -> None:
    """Create every CRD in ``folder`` (an existing one is kept) and wait until Established."""
    ext = client.ApiextensionsV1Api(official)
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            name = doc["metadata"]["name"]
            wait_until(f"CRD {name} to be established", lambda n=name: _established(ext, n))


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True"
               for c in (crd.status.conditions or []))


def dry_run(submitter: Submitter, obj: dict[str, Any]) -> dict[str, Any]:
    if not serves(submitter, obj["apiVersion"], obj["kind"]):
        pytest.skip(f"{obj['kind']} ({obj['apiVersion']}) is not served: its CRD is not "
                    "installed on this control plane")
    return create(submitter, obj, dry_run=True)


def test_the_job_api_is_always_covered() -> None:
    assert {n for n, _ in JOB_CASES} >= {"llama31-8b-finetune", "llama31-70b-sft",
                                         "llama31-405b-pretrain", "rack-benchmark",
                                         "batch-synthetic-data"}


@pytest.mark.parametrize(("name", "api_kind"), CASES)
def test_rendered_manifests_pass_server_side_dry_run(submitter: Submitter, name: str,
                                                     api_kind: str) -> None:
    rendered = render(TEMPLATES[name], {"api": api_kind}, namespace=DRY_NS, queue="default")
    for obj in rendered.objects:
        out = dry_run(submitter, obj)
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == obj["metadata"]["name"]
        labels = out["metadata"].get("labels", {})
        assert labels.items() >= obj["metadata"]["labels"].items()
    workload = create(submitter, rendered.workload, dry_run=True)
    assert workload["metadata"]["annotations"][L.ESTIMATED_KW] == f"{rendered.sizing.kw:g}"


@pytest.mark.parametrize(("name", "api_kind"), JOB_CASES)
def test_job_pod_templates_keep_the_tas_annotations(submitter: Submitter, name: str,
                                                    api_kind: str) -> None:
    rendered = render(TEMPLATES[name], {"api": api_kind}, namespace=DRY_NS)
    out = dry_run(submitter, rendered.workload)
    sent = rendered.workload["spec"]["template"]["metadata"]["annotations"]
    got = out["spec"]["template"]["metadata"]["annotations"]
    assert got.items() >= sent.items()
    assert out["spec"]["suspend"] is True
    assert out["spec"]["completions"] == rendered.sizing.pods


def test_the_server_really_validates(submitter: Submitter) -> None:
    """A dry-run is not a no-op: a bad label value is refused with one line."""
    obj = render(TEMPLATES["rack-benchmark"], namespace=DRY_NS).workload
    obj["metadata"]["labels"][L.FLEX_TIER] = "not a label value"
    with pytest.raises(ClusterError, match=r"^rejected \(422\): Job\.batch \"rack-benchmark\" "
                                           r"is invalid"):
        create(submitter, obj, dry_run=True)


def test_submit_server_dry_run_through_the_cli(kubeconfig: Path) -> None:
    """kubectl's spelling, as the console script rewrites it (m2g_cli.app.kubectl_forms)."""
    result = CliRunner().invoke(app, kubectl_forms([
        "submit", "rack-benchmark", "--dry-run=server", "--kubeconfig", str(kubeconfig),
        "--templates-dir", str(REPO / "templates")]))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("validated (server dry-run) Job/rack-benchmark in namespace "
                                    "default, queue default: 72 GPUs in 18 pods")


def test_submit_to_a_missing_crd_is_one_line(kubeconfig: Path, submitter: Submitter) -> None:
    if serves(submitter, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"):
        pytest.skip("LeaderWorkerSet is installed here")
    result = CliRunner().invoke(app, [
        "submit", "agentic-coder", "--server-dry-run", "--kubeconfig", str(kubeconfig),
        "--templates-dir", str(REPO / "templates")])
    assert result.exit_code == 1
    assert result.stderr == ("error: the API server does not serve LeaderWorkerSet "
                             "(leaderworkerset.x-k8s.io/v1); is its CRD installed?\n")


def test_kueue_reads_the_topology_request(cluster: Cluster, namespace: str,
                                          submitter: Submitter) -> None:
    """Created for real (suspended): Kueue's Workload carries our TAS request and slices."""
    rendered = render(TEMPLATES["llama31-405b-pretrain"],
                      {"api": "Job", "priority": "", "dp": "2"}, namespace=namespace)
    for obj in rendered.objects:
        create(submitter, obj)

    def workload() -> dict[str, Any] | None:
        items = cluster.workloads(namespace)
        return items[0] if items else None

    wl = wait_until("Kueue to create the Workload", workload, timeout=60)
    podset = wl["spec"]["podSets"][0]
    assert podset["count"] == rendered.sizing.pods == 32
    request = podset["topologyRequest"]
    assert request["required"] == "network.topology.nvidia.com/block"
    assert request["podSetSliceRequiredTopology"] == "nvidia.com/gpu.clique"
    assert request["podSetSliceSize"] == 16


def _queues(cluster: Cluster, namespace: str, gpus: int) -> None:
    """A ClusterQueue on the factory's TAS flavor (gb200, topology nvl72) and LocalQueue
    ``default`` in ``namespace``."""
    cq = unique("tmpl-cq")
    cluster.create_kueue("clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}},
                 "resourceGroups": [{"coveredResources": [L.GPU_RESOURCE], "flavors": [
                     {"name": "gb200", "resources": [
                         {"name": L.GPU_RESOURCE, "nominalQuota": str(gpus)}]}]}]}})
    cluster.create_kueue("localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"clusterQueue": cq}}, namespace=namespace)


def _submit(kubeconfig: Path, namespace: str, *sets: str) -> None:
    args = ["submit", "rack-benchmark", "-n", namespace, "--kubeconfig", str(kubeconfig),
            "--templates-dir", str(REPO / "templates"), "--set", "scheduler=default",
            "--set", "priority="]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr)


def test_submitted_benchmark_is_admitted_into_one_rack(
        kubeconfig: Path, cluster: Cluster, namespace: str) -> None:
    """m2g submit → Kueue TAS admits the 18-pod gang into one NVL72 rack of the factory."""
    _queues(cluster, namespace, gpus=144)
    _submit(kubeconfig, namespace, "nvlink_level=network.topology.nvidia.com/accelerator")

    def admitted() -> dict[str, Any] | None:
        items = cluster.workloads(namespace)
        ok = items and (condition(items[0], "Admitted") or {}).get("status") == "True"
        return items[0] if ok else None

    wl = wait_until("the benchmark to be admitted", admitted, timeout=90)
    assignment = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    hosts = hosts_of(assignment)
    assert sum(hosts.values()) == 18
    racks = {cluster.core.read_node(h).metadata.labels[L.RACK] for h in hosts}
    assert len(racks) == 1, racks
