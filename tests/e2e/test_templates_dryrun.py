"""Every rendered template against the real API server (server-side dry-run, dryRun=All).

The local control plane serves batch/v1 and the Kueue and KAI CRDs only. Manifests of APIs
whose CRD is absent (JobSet, PyTorchJob, TrainJob, LeaderWorkerSet) are skipped with that
reason; every template that can render to an indexed batch/v1 Job is validated as one, always.
With Kueue running, its Job webhooks take part in the dry-run too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, Cluster, wait_until
from kubernetes import client
from typer.testing import CliRunner

from m2g.model import labels as L
from m2g.templates import WorkloadApi, render
from m2g.templates.loader import load_all
from m2g_cli.app import app
from m2g_cli.templates_apply import ClusterError, connect, create, serves

pytestmark = pytest.mark.e2e

TEMPLATES = load_all(REPO / "templates")
CASES = [(n, a.value) for n, t in sorted(TEMPLATES.items()) for a in t.spec.apis]
JOB_CASES = [(n, a) for n, a in CASES if a == WorkloadApi.JOB.value]
DRY_NS = "default"  # a dry-run persists nothing, so no namespace of its own is needed


@pytest.fixture(scope="module")
def api(kubeconfig: Path) -> client.ApiClient:
    return connect(str(kubeconfig))


def dry_run(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    if not serves(api, obj["apiVersion"], obj["kind"]):
        pytest.skip(f"{obj['kind']} ({obj['apiVersion']}) is not served: its CRD is not "
                    "installed on this control plane")
    return create(api, obj, dry_run=True)


def test_the_job_api_is_always_covered() -> None:
    assert {n for n, _ in JOB_CASES} >= {"llama31-8b-finetune", "llama31-70b-sft",
                                         "llama31-405b-pretrain", "rack-benchmark",
                                         "batch-synthetic-data"}


@pytest.mark.parametrize(("name", "api_kind"), CASES)
def test_rendered_manifests_pass_server_side_dry_run(api: client.ApiClient, name: str,
                                                     api_kind: str) -> None:
    rendered = render(TEMPLATES[name], {"api": api_kind}, namespace=DRY_NS, queue="default")
    for obj in rendered.objects:
        out = dry_run(api, obj)
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == obj["metadata"]["name"]
        labels = out["metadata"].get("labels", {})
        assert labels.items() >= obj["metadata"]["labels"].items()
    workload = create(api, rendered.workload, dry_run=True)
    assert workload["metadata"]["annotations"][L.ESTIMATED_KW] == f"{rendered.sizing.kw:g}"


@pytest.mark.parametrize(("name", "api_kind"), JOB_CASES)
def test_job_pod_templates_keep_the_tas_annotations(api: client.ApiClient, name: str,
                                                    api_kind: str) -> None:
    rendered = render(TEMPLATES[name], {"api": api_kind}, namespace=DRY_NS)
    out = dry_run(api, rendered.workload)
    sent = rendered.workload["spec"]["template"]["metadata"]["annotations"]
    got = out["spec"]["template"]["metadata"]["annotations"]
    assert got.items() >= sent.items()
    assert out["spec"]["suspend"] is True
    assert out["spec"]["completions"] == rendered.sizing.pods


def test_the_server_really_validates(api: client.ApiClient) -> None:
    """A dry-run is not a no-op: a bad label value is refused with one line."""
    obj = render(TEMPLATES["rack-benchmark"], namespace=DRY_NS).workload
    obj["metadata"]["labels"][L.FLEX_TIER] = "not a label value"
    with pytest.raises(ClusterError, match=r"^rejected \(422\): Job\.batch \"rack-benchmark\" "
                                           r"is invalid"):
        create(api, obj, dry_run=True)


def test_submit_server_dry_run_through_the_cli(kubeconfig: Path) -> None:
    result = CliRunner().invoke(app, [
        "submit", "rack-benchmark", "--server-dry-run", "--kubeconfig", str(kubeconfig),
        "--templates-dir", str(REPO / "templates")])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("validated (server dry-run) Job/rack-benchmark in namespace "
                                    "default, queue default: 72 GPUs in 18 pods")


def test_submit_to_a_missing_crd_is_one_line(kubeconfig: Path, api: client.ApiClient) -> None:
    if serves(api, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"):
        pytest.skip("LeaderWorkerSet is installed here")
    result = CliRunner().invoke(app, [
        "submit", "agentic-coder", "--server-dry-run", "--kubeconfig", str(kubeconfig),
        "--templates-dir", str(REPO / "templates")])
    assert result.exit_code == 1
    assert result.stderr == ("error: the API server does not serve LeaderWorkerSet "
                             "(leaderworkerset.x-k8s.io/v1); is its CRD installed?\n")


def test_kueue_reads_the_topology_request(cluster: Cluster, namespace: str,
                                          api: client.ApiClient) -> None:
    """Created for real (suspended): Kueue's Workload carries our TAS request and slices."""
    rendered = render(TEMPLATES["llama31-405b-pretrain"],
                      {"api": "Job", "priority": "", "dp": "2"}, namespace=namespace)
    for obj in rendered.objects:
        create(api, obj)

    def workload() -> dict[str, Any] | None:
        items = cluster.workloads(namespace)
        return items[0] if items else None

    wl = wait_until("Kueue to create the Workload", workload, timeout=60)
    podset = wl["spec"]["podSets"][0]
    assert podset["count"] == rendered.sizing.pods == 32
    request = podset["topologyRequest"]
    assert request["required"] == "m2g.io/block"
    assert request["podSetSliceRequiredTopology"] == "nvidia.com/gpu.clique"
    assert request["podSetSliceSize"] == 16
