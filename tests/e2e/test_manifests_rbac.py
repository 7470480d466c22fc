"""The controller's least-privilege RBAC (deploy/controller/rbac.yaml), tested as the
ServiceAccount itself: a token from the TokenRequest API in a kubeconfig of its own, so the API
server authenticates and authorizes exactly what a pod of the Deployment would.

* ``kubectl auth can-i`` (SelfSubjectAccessReview) for every verb m2g needs: yes; and for
  secrets, deployments, deleting workloads, updating or deleting nodes, other namespaces' Leases: no;
* real requests: reads work, forbidden writes come back 403;
* the real controller (``m2g run --leader-elect``) runs with it: it takes the Lease, creates
  its AdmissionCheck and keeps it Active, serves /readyz, and logs no 403.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, unique, wait_until
from manifests_helpers import (
    Applied,
    apply_crds,
    controller,
    denied_lines,
    http_get,
    kubectl,
    objects,
    render,
)
from manifests_helpers import sa_kubeconfig as sa_kubeconfig_file

pytestmark = pytest.mark.e2e

NS = "m2g-system"
SA = f"system:serviceaccount:{NS}:m2g"


@pytest.fixture(scope="module")
def sa_kubeconfig(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The m2g CRDs, namespace, ServiceAccount and RBAC applied; a kubeconfig holding a
    short-lived token of the ServiceAccount."""
    applied = Applied(kubeconfig)
    try:
        apply_crds(applied)
        keep = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                "RoleBinding"}
        docs = [o for o in objects(render("deploy/controller")) if o["kind"] in keep]
        applied.apply(yaml.safe_dump_all(docs))
        path = sa_kubeconfig_file(kubeconfig, tmp_path_factory.mktemp("rbac") / "m2g.kubeconfig")
        who = kubectl(path, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
        assert who.stdout == SA
        yield path
    finally:
        applied.delete()


# (verb, resource, namespace or None)
ALLOWED = [
    *[(v, r, None) for r in ("nodes", "pods") for v in ("get", "list", "watch")],
    ("patch", "nodes", None),  # m2g's own maintenance and thermal taints
    *[(v, "workloads.kueue.x-k8s.io", "default") for v in ("get", "list", "watch", "patch")],
    ("patch", "workloads.kueue.x-k8s.io/status", "default"),
    *[(v, "jobs.batch", "default") for v in ("get", "patch")],  # right-sizing elastic Jobs
    *[(v, "clusterqueues.kueue.x-k8s.io", None)
      for v in ("get", "list", "watch", "patch", "update")],
    *[(v, f"{r}.kueue.x-k8s.io", None) for v in ("get", "list", "watch")
      for r in ("resourceflavors", "cohorts", "topologies")],
    ("list", "localqueues.kueue.x-k8s.io", None),
    *[(v, "admissionchecks.kueue.x-k8s.io", None) for v in ("get", "list", "watch", "create")],
    *[(v, "admissionchecks.kueue.x-k8s.io/status", None) for v in ("patch", "update")],
    *[(v, f"{r}.m2g.io", None) for v in ("get", "list", "watch")
      for r in ("gridevents", "maintenancewindows", "powerdomains", "policies",
                "tenantpolicies", "reservations", "capacityplans")],
    *[(v, f"{r}.m2g.io/status", None) for v in ("patch", "update")
      for r in ("gridevents", "maintenancewindows", "powerdomains", "policies",
                "tenantpolicies", "reservations")],
    ("create", "leases.coordination.k8s.io", NS),
    ("get", "leases.coordination.k8s.io/m2g-controller", NS),
    ("update", "leases.coordination.k8s.io/m2g-controller", NS),
    ("create", "events.events.k8s.io", "default"), ("patch", "events.events.k8s.io", "default"),
    ("create", "events", "default"),
    *[(v, r, None) for v in ("get", "list", "watch", "patch")
      for r in ("topologies.kai.scheduler", "queues.scheduling.run.ai")],
    ("create", "topologies.kai.scheduler", None),
    ("delete", "topologies.kai.scheduler/nvl72", None),
]

DENIED = [
    ("get", "secrets", NS), ("list", "secrets", None), ("get", "configmaps", NS),
    ("create", "deployments.apps", NS), ("patch", "deployments.apps", NS),
    ("delete", "workloads.kueue.x-k8s.io", "default"),
    ("create", "workloads.kueue.x-k8s.io", "default"),
    ("update", "workloads.kueue.x-k8s.io", "default"),
    ("update", "nodes", None), ("delete", "nodes", None), ("create", "nodes", None),
    ("delete", "pods", "default"),
    ("create", "pods", "default"), ("create", "pods/eviction", "default"),
    ("delete", "clusterqueues.kueue.x-k8s.io", None),
    ("create", "clusterqueues.kueue.x-k8s.io", None),
    ("delete", "admissionchecks.kueue.x-k8s.io", None),
    ("patch", "admissionchecks.kueue.x-k8s.io", None),
    ("patch", "resourceflavors.kueue.x-k8s.io", None),
    ("patch", "localqueues.kueue.x-k8s.io", "default"),
    ("patch", "cohorts.kueue.x-k8s.io", None),
    ("create", "policies.m2g.io", None), ("patch", "policies.m2g.io", None),
    ("create", "tenantpolicies.m2g.io", "default"), ("patch", "tenantpolicies.m2g.io", "default"),
    ("delete", "gridevents.m2g.io", None),
    ("create", "jobs.batch", "default"), ("delete", "jobs.batch", "default"),
    ("list", "jobs.batch", "default"),
    ("create", "leases.coordination.k8s.io", "default"),
    ("get", "leases.coordination.k8s.io/kube-scheduler", "kube-system"),
    ("update", "leases.coordination.k8s.io/someone-else", NS),
    ("delete", "leases.coordination.k8s.io", NS),
    ("create", "clusterroles.rbac.authorization.k8s.io", None),
    ("create", "rolebindings.rbac.authorization.k8s.io", NS),
    ("impersonate", "serviceaccounts", NS), ("create", "serviceaccounts/token", NS),
    ("delete", "queues.scheduling.run.ai", None),
    ("create", "queues.scheduling.run.ai", None), ("update", "queues.scheduling.run.ai", None),
    ("update", "topologies.kai.scheduler", None),
    ("delete", "topologies.kai.scheduler/someone-elses", None),
    ("create", "podgroups.scheduling.run.ai", "default"),
    ("create", "namespaces", None),
]


def can_i(sa: Path, verb: str, resource: str, namespace: str | None) -> str:
    resource, _, sub = resource.partition("/")
    if sub in ("status", "eviction", "token"):  # a subresource, not an object's name
        args = ["auth", "can-i", verb, resource, f"--subresource={sub}"]
    else:
        args = ["auth", "can-i", verb, f"{resource}/{sub}" if sub else resource]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    return kubectl(sa, *args, check=False).stdout.strip()


@pytest.mark.parametrize(("verb", "resource", "namespace"), ALLOWED)
def test_allowed(sa_kubeconfig: Path, verb: str, resource: str, namespace: str | None) -> None:
    assert can_i(sa_kubeconfig, verb, resource, namespace) == "yes"


@pytest.mark.parametrize(("verb", "resource", "namespace"), DENIED)
def test_denied(sa_kubeconfig: Path, verb: str, resource: str, namespace: str | None) -> None:
    assert can_i(sa_kubeconfig, verb, resource, namespace) == "no"


def test_real_requests(sa_kubeconfig: Path) -> None:
    assert kubectl(sa_kubeconfig, "get", "nodes", "-o", "name").stdout.strip()
    kubectl(sa_kubeconfig, "get", "workloads.kueue.x-k8s.io", "-A")
    kubectl(sa_kubeconfig, "get", "clusterqueues.kueue.x-k8s.io,policies.m2g.io")
    for args in (["get", "secrets", "-n", NS],
                 ["delete", "workloads.kueue.x-k8s.io/any", "-n", "default"],
                 ["delete", "node", "m2g-e2e-no-such-node"],
                 ["create", "deployment", "x", "-n", NS, "--image=busybox"],
                 ["create", "configmap", "x", "-n", NS]):
        out = kubectl(sa_kubeconfig, *args, check=False)
        assert out.returncode != 0 and "forbidden" in out.stderr.lower(), args


def test_the_controller_runs_with_it(kubeconfig: Path, sa_kubeconfig: Path,
                                     tmp_path: Path) -> None:
    """``m2g run`` as the ServiceAccount: Lease, AdmissionCheck Active, /readyz, no 403."""
    check = unique("m2g-rbac-e2e")
    lease = "leases.coordination.k8s.io/m2g-controller"
    had_lease = kubectl(kubeconfig, "get", lease, "-n", NS, check=False).returncode == 0
    log = tmp_path / "m2g.log"
    try:
        # the shipped policies from their folder: this cluster may hold no Policy objects, and an
        # empty policy set is refused (it would admit everything); Policies are still watched
        with controller(sa_kubeconfig, log, "--identity", "e2e-rbac", "--check-name", check,
                        "--policies", str(REPO / "policies")) as url:
            wait_until("m2g to lead", lambda: "m2g_leader 1.0" in http_get(
                f"{url}/metrics")[1], timeout=60)
            holder = kubectl(kubeconfig, "get", lease, "-n", NS, "-o",
                             "jsonpath={.spec.holderIdentity}").stdout
            assert holder == "e2e-rbac"
            wait_until(f"AdmissionCheck {check} to be Active", lambda: kubectl(
                kubeconfig, "get", f"admissionchecks.kueue.x-k8s.io/{check}", "-o",
                "jsonpath={.status.conditions[?(@.type=='Active')].status}",
                check=False).stdout == "True", timeout=60)
            time.sleep(2)  # a few more reconciles
    finally:
        kubectl(kubeconfig, "delete", f"admissionchecks.kueue.x-k8s.io/{check}",
                "--ignore-not-found", check=False)
        if not had_lease:
            kubectl(kubeconfig, "delete", lease, "-n", NS, "--ignore-not-found", check=False)
    assert not denied_lines(log), denied_lines(log)[:5]
