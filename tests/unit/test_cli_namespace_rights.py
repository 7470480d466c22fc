"""An ML engineer with rights in one namespace only (``edit`` bound there by a RoleBinding: no
Nodes, no cluster-wide lists, none of Kueue's or m2g's cluster-scoped objects) can still run
``m2g explain`` and ``m2g submit --dry-run`` (issue 10, "Roles for people"): the namespaced
kinds are read in the namespace, the rest left out with one warning, and a ClusterQueue the
reader may not see is not called missing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from typer.testing import CliRunner

from m2g.k8s import client as k
from m2g.k8s.snapshot import WATCHED, list_objects
from m2g.testing.kube import FakeKube
from m2g_cli import cluster
from m2g_cli.app import app
from tests.unit.cli_kubeconfig import cli_kubeconfig

POLICIES = Path(__file__).parents[2] / "policies"
NS = "research"
WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
    "metadata": {"name": "train-1", "namespace": NS, "uid": "u1",
                 "creationTimestamp": "2026-12-04T10:00:00Z",
                 "labels": {"kueue.x-k8s.io/queue-name": "default"}},
    "spec": {"queueName": "default", "podSets": [{
        "name": "main", "count": 1, "template": {"spec": {"containers": [{
            "name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}}]},
    "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                               "reason": "Pending", "message": "waiting"}]}}
LOCAL_QUEUE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "default", "namespace": NS},
               "spec": {"clusterQueue": "research"}}


class NamespaceRightsKube(FakeKube):
    """An API server answering as it answers a user with ``edit`` in ``NS`` only: a list in
    every namespace or of a cluster-scoped kind is 403, a list in ``NS`` is allowed."""

    def __init__(self, allowed: str | None = NS) -> None:
        super().__init__()
        self.lists: list[tuple[str, str | None]] = []
        self.allowed = allowed

    async def list(self, res: k.Resource, namespace: str | None = None,
                   params: Any = None) -> k.Obj:
        self.lists.append((res.plural, namespace))
        if namespace is None or namespace != self.allowed:
            where = f"in the namespace {namespace!r}" if namespace else "at the cluster scope"
            raise k.PermanentError(f"{res.plural} is forbidden: User \"ml\" cannot list "
                                   f"resource \"{res.plural}\" {where}", 403, "Forbidden")
        return {"items": [o for (plural, ns, _), o in self.objects.items()
                          if plural == res.plural and ns == namespace]}

    async def request(self, method: str, path: str, **_: Any) -> k.Obj:  # KAI discovery
        raise k.ResourceMissing(f"{path} not served", 404, "NotFound")

    async def close(self) -> None:
        return None


def _kube(allowed: str | None = NS) -> NamespaceRightsKube:
    kube = NamespaceRightsKube(allowed)
    kube.put(k.WORKLOADS, WORKLOAD)
    kube.put(k.LOCAL_QUEUES, LOCAL_QUEUE)
    return kube


async def test_list_objects_reads_the_namespace_when_every_namespace_is_forbidden() -> None:
    kube = _kube()
    listed = await list_objects(cast(k.Kube, kube), NS)
    assert set(listed.objects.workloads) == {f"{NS}/train-1"}
    assert set(listed.objects.local_queues) == {f"{NS}/default"}
    assert {"workloads", "pods", "local_queues"} <= listed.namespace_only
    assert {"nodes", "cluster_queues", "resource_flavors", "admission_checks"} <= \
        listed.forbidden
    assert not listed.namespace_only & listed.forbidden
    assert len(listed.warnings) == 2, listed.warnings
    assert "in namespace research only" in listed.warnings[0]
    assert "nodes" in listed.warnings[1] and "clusterqueues.kueue.x-k8s.io" in listed.warnings[1]
    # without a namespace (the controller's way) a 403 is still an error
    with pytest.raises(k.PermanentError):
        await list_objects(cast(k.Kube, _kube()))
    assert set(WATCHED) == set(listed.namespace_only | listed.forbidden)


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = cli_kubeconfig(tmp_path, monkeypatch, {"ml": NS}, "ml")

    async def connect(*_: Any, **__: Any) -> NamespaceRightsKube:
        return _kube()

    monkeypatch.setattr(cluster.k, "connect", connect)
    return path


def test_explain_works_with_namespace_rights_only(kubeconfig: Path) -> None:
    result = CliRunner().invoke(app, ["explain", "train-1", "--kubeconfig", str(kubeconfig),
                                      "--policies", str(POLICIES)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "train-1" in result.stdout
    assert "forbidden" not in result.stdout
    # the queue it cannot see is not reported as missing
    assert "does not exist" not in result.stdout
    assert "no rights to read nodes" in result.stderr


def test_explain_json_names_no_kueue_blocker_it_cannot_see(kubeconfig: Path) -> None:
    result = CliRunner().invoke(app, ["explain", f"{NS}/train-1", "--kubeconfig",
                                      str(kubeconfig), "--policies", str(POLICIES), "-o",
                                      "json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "ClusterQueue" not in str(yaml.safe_load(result.stdout).get("blockers"))


def test_submit_dry_run_decides_with_namespace_rights_only(kubeconfig: Path) -> None:
    result = CliRunner().invoke(app, ["submit", "llama31-8b-finetune", "--dry-run",
                                      "--kubeconfig", str(kubeconfig), "--policies",
                                      str(POLICIES)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert yaml.safe_load(result.stdout)["metadata"]["namespace"] == NS
    assert "no admission decision" not in result.stderr, result.stderr
    assert "no factory state read" not in result.stderr, result.stderr
    assert "m2g would decide now" in result.stderr, result.stderr
    assert "no rights to read nodes" in result.stderr


def test_unreadable_policies_name_the_fix(kubeconfig: Path) -> None:
    """The cluster's Policy objects are cluster-scoped: without --policies there is nothing
    to evaluate, and the line says what to pass (submit still prints the manifests)."""
    result = CliRunner().invoke(app, ["submit", "llama31-8b-finetune", "--dry-run",
                                      "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "no admission decision: no rights to read the cluster's Policy objects" in \
        result.stderr and "--policies DIR" in result.stderr
    result = CliRunner().invoke(app, ["explain", "train-1", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "no rights to read the cluster's Policy objects" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_read_path_lists_in_the_namespace_it_was_given(kubeconfig: Path) -> None:
    view = asyncio.run(cluster.read(str(kubeconfig), None, namespace=NS))
    assert set(view.objects.workloads) == {f"{NS}/train-1"}
    assert {"cluster_queues", "topologies", "policies"} <= view.forbidden


async def test_a_user_with_no_rights_at_all_gets_the_403() -> None:
    """Not even the namespace's Workloads: the 403 is the answer (exit 1, one line), not an
    empty table under warnings."""
    with pytest.raises(k.PermanentError, match="workloads is forbidden"):
        await list_objects(cast(k.Kube, _kube(allowed=None)), NS)


def test_explain_with_no_rights_at_all_is_one_line_exit_1(
        kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def connect(*_: Any, **__: Any) -> NamespaceRightsKube:
        return _kube(allowed=None)

    monkeypatch.setattr(cluster.k, "connect", connect)
    result = CliRunner().invoke(app, ["explain", "train-1", "--kubeconfig", str(kubeconfig),
                                      "--policies", str(POLICIES)])
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, \
        result.stderr
    assert "forbidden" in result.stderr
