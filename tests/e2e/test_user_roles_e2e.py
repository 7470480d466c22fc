"""An ML engineer with rights in one namespace only, on the real API server (issue 10, "Roles
for people"): a ServiceAccount token whose only binding is a RoleBinding of Kubernetes' own
``edit`` in its namespace (``m2g-user`` aggregated into it, deploy/controller/user-roles.yaml).
No Nodes, nothing listed in every namespace, none of Kueue's or m2g's cluster-scoped objects.
``m2g explain`` and ``m2g submit --dry-run`` still answer (with ``--policies``, the Policy
objects being cluster-scoped), warning about what they could not read."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, unique, wait_until
from manifests_helpers import Applied, apply_crds, kubectl, sa_kubeconfig

pytestmark = pytest.mark.e2e


def m2g(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from m2g_cli.app import main; main()",
                           *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, check=False, timeout=120,
                          cwd=REPO)


@pytest.fixture(scope="module")
def engineer(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Path, str, str]]:
    """(the engineer's kubeconfig, their namespace, a Job of theirs waiting in Kueue)."""
    ns, cq, name = unique("ml"), unique("ml-cq"), unique("train")
    admin = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "engineer", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "engineer-edit", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "edit"},
         "subjects": [{"kind": "ServiceAccount", "name": "engineer", "namespace": ns}]},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": unique("no-such-flavor"), "resources": [
                          {"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "default", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ]
    applied = Applied(kubeconfig)
    try:
        apply_crds(applied)
        applied.apply((REPO / "deploy" / "controller" / "user-roles.yaml").read_text())
        applied.apply(yaml.safe_dump_all(admin))
        path = sa_kubeconfig(kubeconfig, tmp_path_factory.mktemp("engineer") / "kubeconfig",
                             namespace=ns, name="engineer")
        # edit aggregates m2g-user (Workloads, LocalQueues) once the aggregation controller ran
        wait_until("edit to aggregate m2g-user", lambda: kubectl(
            path, "auth", "can-i", "list", "workloads.kueue.x-k8s.io", "-n", ns,
            check=False).stdout.strip() == "yes", timeout=60)
        assert kubectl(path, "auth", "can-i", "list", "nodes", check=False).stdout.strip() \
            == "no"
        assert kubectl(path, "auth", "can-i", "list", "pods", "-A", check=False
                       ).stdout.strip() == "no"
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": ns,
                            "labels": {"kueue.x-k8s.io/queue-name": "default"}},
               "spec": {"suspend": True, "template": {"spec": {
                   "restartPolicy": "Never", "containers": [{
                       "name": "main", "image": "busybox", "resources": {
                           "requests": {"nvidia.com/gpu": "4"},
                           "limits": {"nvidia.com/gpu": "4"}}}]}}}}
        kubectl(path, "create", "-f", "-", stdin=json.dumps(job))  # as the engineer
        wait_until("Kueue to create the Job's Workload", lambda: json.loads(kubectl(
            kubeconfig, "get", "workloads.kueue.x-k8s.io", "-n", ns, "-o", "json").stdout
        )["items"], timeout=60)
        yield path, ns, name
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)
        applied.delete()


def test_explain_with_namespace_rights_only(engineer: tuple[Path, str, str]) -> None:
    path, ns, name = engineer
    out = m2g(path, "explain", name, "-n", ns, "--policies", str(REPO / "policies"))
    assert out.returncode == 0, out.stderr
    assert f"{ns}/" in out.stdout and "m2g would decide now" in out.stdout, out.stdout
    assert "no rights to read nodes" in out.stderr, out.stderr
    assert f"read in namespace {ns} only" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # the policies are cluster-scoped: without --policies one line says what to pass
    out = m2g(path, "explain", name, "-n", ns)
    assert out.returncode == 1 and "--policies DIR" in out.stderr, out.stderr


def test_submit_dry_run_with_namespace_rights_only(engineer: tuple[Path, str, str]) -> None:
    path, ns, _ = engineer
    out = m2g(path, "submit", "llama31-8b-finetune", "-n", ns, "--dry-run", "--policies",
              str(REPO / "policies"))
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["metadata"]["namespace"] == ns
    assert "m2g would decide now" in out.stderr, out.stderr
    assert "no factory state read" not in out.stderr, out.stderr
    # and the server-side dry run, as the engineer (their rights in their namespace)
    out = m2g(path, "submit", "llama31-8b-finetune", "-n", ns, "--dry-run=server",
              "--set", "api=Job", "--policies", str(REPO / "policies"))
    assert out.returncode == 0, out.stderr


def test_workloads_with_namespace_rights_only(engineer: tuple[Path, str, str]) -> None:
    path, ns, name = engineer
    out = m2g(path, "workloads", "-n", ns)
    assert out.returncode == 0, out.stderr
    assert name in out.stdout, out.stdout
