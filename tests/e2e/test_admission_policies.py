"""The ValidatingAdmissionPolicies of deploy/admission-policies, enforced by the real API server:

* m2g's shed bookkeeping on a Workload (m2g.io/shed-at, shed-reason, drained-for) cannot be
  added, changed or removed by a tenant who may edit Workloads — only by m2g's ServiceAccount
  (a TokenRequest token, as the Deployment's pod has); other annotations stay the tenant's;
* m2g's ServiceAccount may change only m2g.io/ taints and annotations on a Node: another
  controller's taint, a label, a cordon are refused, with the policy's message;
* a Policy or TenantPolicy that m2g's compiler would refuse for its structure (duplicate rule
  names, a field of another stage, a rule without its stage's payload, ...) is refused at
  create time, and every shipped Policy passes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, unique, wait_until
from manifests_helpers import Applied, kubectl, objects, render, sa_kubeconfig

pytestmark = pytest.mark.e2e

TENANT = "m2g-e2e-tenant@example.com"
SHED_AT = "m2g.io/shed-at"


def _tenant_rbac(name: str) -> str:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
                       "verbs": ["get", "list", "create", "update", "patch", "delete"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": TENANT}]}
    return yaml.safe_dump_all([role, binding])


@pytest.fixture(scope="module")
def guarded(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """m2g's namespace, ServiceAccount and RBAC, a tenant's Workload rights and the admission
    policies applied; yields a kubeconfig of m2g's ServiceAccount."""
    applied = Applied(kubeconfig)
    try:
        keep = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                "RoleBinding"}
        docs = [o for o in objects(render("deploy/controller")) if o["kind"] in keep]
        applied.apply(yaml.safe_dump_all(docs))
        applied.apply(_tenant_rbac("m2g-e2e-tenant"))
        applied.apply(render("deploy/admission-policies"))
        yield sa_kubeconfig(kubeconfig, tmp_path_factory.mktemp("vap") / "m2g.kubeconfig")
    finally:
        applied.delete()


def _workload(name: str, annotations: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotations:
        meta["annotations"] = annotations
    return json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
        "spec": {"queueName": "m2g-e2e-none", "podSets": [{
            "name": "main", "count": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}]}})


def _as_tenant(kubeconfig: Path, *args: str, stdin: str | None = None) -> Any:
    return kubectl(kubeconfig, f"--as={TENANT}", *args, stdin=stdin, check=False)


def _annotate(name: str, value: str | None) -> str:
    return json.dumps({"metadata": {"annotations": {SHED_AT: value}}})


def _denied(out: Any, *words: str) -> bool:
    text = out.stderr.lower()
    return out.returncode != 0 and "denied" in text and all(w.lower() in text for w in words)


def test_tenant_cannot_forge_shed_bookkeeping(kubeconfig: Path, guarded: Path) -> None:
    forged = unique("m2g-e2e-forged")
    try:
        # the policy takes effect a moment after it is created: retry the first refusal (an
        # attempt made before it did creates the Workload, which the finally removes, so that
        # no later test that lists every namespace finds it)
        wait_until("the workload policy to refuse a forged shed-at", lambda: _denied(
            _as_tenant(kubeconfig, "create", "-f", "-",
                       stdin=_workload(forged, {SHED_AT: "2099-01-01T00:00:00Z"})),
            "m2g-workload-bookkeeping", SHED_AT), timeout=60)
    finally:
        kubectl(kubeconfig, "delete", "-n", "default", f"workloads.kueue.x-k8s.io/{forged}",
                "--ignore-not-found", check=False)

    name = unique("m2g-e2e-wl")
    ok = _as_tenant(kubeconfig, "create", "-f", "-", stdin=_workload(name))
    assert ok.returncode == 0, ok.stderr
    try:
        ref = ["-n", "default", f"workloads.kueue.x-k8s.io/{name}"]
        out = _as_tenant(kubeconfig, "patch", *ref, "--type=merge",
                         "-p", _annotate(name, "2099-01-01T00:00:00Z"))
        assert _denied(out, SHED_AT), out.stderr
        other = _as_tenant(kubeconfig, "annotate", *ref, "team.example.com/owner=alice")
        assert other.returncode == 0, other.stderr  # the tenant's own annotations stay theirs

        # m2g itself sheds: it may set the bookkeeping; the tenant then may not clear it
        m2g = kubectl(guarded, "patch", *ref, "--type=merge",
                      "-p", _annotate(name, "2026-12-01T10:00:00Z"), check=False)
        assert m2g.returncode == 0, m2g.stderr
        cleared = _as_tenant(kubeconfig, "patch", *ref, "--type=merge",
                             "-p", _annotate(name, None))
        assert _denied(cleared, SHED_AT), cleared.stderr
        moved = _as_tenant(kubeconfig, "annotate", "--overwrite", *ref,
                           f"{SHED_AT}=2099-01-01T00:00:00Z")
        assert _denied(moved, SHED_AT), moved.stderr
        live = kubectl(kubeconfig, "get", *ref, "-o", "json").stdout
        assert json.loads(live)["metadata"]["annotations"][SHED_AT] == "2026-12-01T10:00:00Z"
        # an update that leaves the bookkeeping as it is passes (Kueue's own updates do this)
        again = _as_tenant(kubeconfig, "annotate", "--overwrite", *ref,
                           "team.example.com/owner=bob")
        assert again.returncode == 0, again.stderr
        restored = kubectl(guarded, "patch", *ref, "--type=merge", "-p", _annotate(name, None),
                           check=False)
        assert restored.returncode == 0, restored.stderr
    finally:
        kubectl(kubeconfig, "delete", "-n", "default", f"workloads.kueue.x-k8s.io/{name}",
                "--ignore-not-found", check=False)


def _node(kubeconfig: Path) -> dict[str, Any]:
    nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json").stdout)["items"]
    node: dict[str, Any] = nodes[0]
    return node


def _patch_taints(sa: Path, kubeconfig: Path, extra: dict[str, str]) -> Any:
    """m2g's own patch shape (k8s/apply.py): the Node's whole spec.taints as a merge patch
    with a resourceVersion precondition."""
    node = _node(kubeconfig)
    taints = [*(node["spec"].get("taints") or []), extra]
    return kubectl(sa, "patch", "node", node["metadata"]["name"], "--type=merge", "-p",
                   json.dumps({"metadata": {"resourceVersion": node["metadata"][
                       "resourceVersion"]}, "spec": {"taints": taints}}), check=False)


@pytest.mark.usefixtures("clean_taints")
def test_m2g_changes_only_its_own_node_fields(kubeconfig: Path, guarded: Path) -> None:
    name = _node(kubeconfig)["metadata"]["name"]
    wait_until("the node policy to refuse a foreign taint", lambda: _denied(
        _patch_taints(guarded, kubeconfig, {"key": "example.com/other", "effect": "NoSchedule"}),
        "m2g-node-writes", "own taints"), timeout=60)
    own = _patch_taints(guarded, kubeconfig, {"key": "m2g.io/maintenance", "value": "e2e",
                                              "effect": "NoSchedule"})
    assert own.returncode == 0, own.stderr
    label = kubectl(guarded, "label", "node", name, "example.com/rack=r99", check=False)
    assert _denied(label, "labels"), label.stderr
    cordon = kubectl(guarded, "patch", "node", name, "--type=merge",
                     "-p", '{"spec":{"unschedulable":true}}', check=False)
    assert _denied(cordon, "cordon"), cordon.stderr
    foreign = kubectl(guarded, "annotate", "node", name, "example.com/note=x", check=False)
    assert _denied(foreign, "annotations"), foreign.stderr
    mine = kubectl(guarded, "annotate", "node", name, "m2g.io/e2e-note=x", check=False)
    assert mine.returncode == 0, mine.stderr
    kubectl(kubeconfig, "annotate", "node", name, "m2g.io/e2e-note-", check=False)
    live = json.loads(kubectl(kubeconfig, "get", "node", name, "-o", "json").stdout)
    assert "example.com/rack" not in live["metadata"].get("labels", {})
    assert not live["spec"].get("unschedulable")


# ---- m2g-policy-structure: the first gate for Policy objects ----------------------------------

def _policy(stage: str, rules: list[dict[str, Any]], kind: str = "Policy") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": unique("m2g-e2e-vap")}
    if kind == "TenantPolicy":
        meta["namespace"] = "default"
    return {"apiVersion": "m2g.io/v1alpha1", "kind": kind, "metadata": meta,
            "spec": {"stage": stage, "rules": rules}}


def _dry_run(kubeconfig: Path, obj: dict[str, Any]) -> Any:
    return kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj),
                   check=False)


def _compiler_refuses(obj: dict[str, Any], tmp_path: Path) -> bool:
    """m2g's own loader on the same object (the gate is a subset of the compiler's checks)."""
    from m2g.policy import load_dir
    from m2g.policy.errors import PolicySetError
    folder = tmp_path / obj["metadata"]["name"]
    folder.mkdir()
    (folder / "policy.yaml").write_text(yaml.safe_dump(obj))
    try:
        load_dir(folder)
    except PolicySetError:
        return True
    return False


ADMIT = {"name": "ok", "when": "true", "decision": "Admit"}
LONG = "workload.gpus > 0 && " * 480 + "true"  # 9,604 characters (the CRD allows 10,240)
BAD_POLICIES = [
    (_policy("Admission", [ADMIT, {**ADMIT, "decision": "Reject"}]), "duplicate rule names: ok"),
    (_policy("Admission", [{**ADMIT, "quota": "10"}]), "not allowed in stage Admission: ok (quota)"),
    (_policy("Admission", [{"name": "typo", "decison": "Reject"}]), "typo (decison)"),
    (_policy("Admission", [{"name": "none", "when": "true"}]), "needs decision"),
    (_policy("Capacity", [{"name": "none", "when": "true"}]), "needs quota or stopPolicy"),
    (_policy("Fairness", [{"name": "w", "weight": "2", "score": "1"}]), "(score)"),
    (_policy("Admission", [{**ADMIT, "decision": "Reject", "requeueAfter": "'1m'"}]),
     "requeueAfter is only for Defer rules"),
    (_policy("Admission", [{**ADMIT, "decision": "Defer", "podSetUpdates": [{"name": "main"}]}]),
     "podSetUpdates are only for Admit rules"),
    (_policy("Admission", [{"name": f"r{i}", "when": LONG, "decision": "Reject"}
                           for i in range(28)]), "at most 262144"),
    (_policy("Admission", [{"name": "t", "decision": "Reject"}, {"name": "t", "decision": "Defer"}],
             "TenantPolicy"), "duplicate rule names: t"),
]


@pytest.mark.parametrize(("obj", "needle"), BAD_POLICIES,
                         ids=[n for _, n in BAD_POLICIES])
def test_the_api_server_refuses_a_structurally_bad_policy(
        kubeconfig: Path, guarded: Path, m2g_crds: None, obj: dict[str, Any], needle: str,
        tmp_path: Path) -> None:
    # the policy takes effect a moment after it is created: the first refusal is waited for
    wait_until("the policy-structure gate", lambda: _denied(
        _dry_run(kubeconfig, obj), "m2g-policy-structure", needle), timeout=60)
    if obj["kind"] == "Policy" and "262144" not in needle:  # the size bound is the gate's own
        assert _compiler_refuses(obj, tmp_path), "the gate refused what m2g's compiler accepts"


def test_every_shipped_policy_passes_the_gate(kubeconfig: Path, guarded: Path,
                                              m2g_crds: None) -> None:
    wait_until("the policy-structure gate", lambda: _denied(
        _dry_run(kubeconfig, BAD_POLICIES[0][0]), "m2g-policy-structure"), timeout=60)
    shipped = [d for f in sorted((REPO / "policies").glob("*/*.yaml"))
               for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "Policy"]
    assert len(shipped) >= 10
    tenant = _policy("Admission", [{"name": "small", "when": "workload.gpus > 8",
                                    "decision": "Reject", "message": "at most 8 GPUs"}],
                     "TenantPolicy")
    for obj in [*shipped, tenant]:
        out = _dry_run(kubeconfig, obj)
        assert out.returncode == 0, (obj["metadata"]["name"], out.stderr)
