"""deploy/ against the real control plane: the CRDs, then the default overlay (controller, RBAC,
PodDisruptionBudget, NetworkPolicy, metrics Service, Policy objects) apply cleanly with
server-side apply and a second apply changes nothing; the Deployment's pods are accepted under
the restricted Pod Security profile of m2g-system; the shadow and monitoring overlays are
accepted too (the ServiceMonitor only where the Prometheus Operator's CRD is installed:
``M2G_E2E_EXTRA_CRDS=/folder`` installs the CRDs of that folder's *.yaml files first and leaves
them installed, as in test_templates_dryrun.py; e.g. prometheus-operator's
``example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml``).

The pods do not run: the Deployment keeps m2g off GPU nodes, and the factory has only those.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import wait_until
from manifests_helpers import Applied, apply_crds, generations, in_sync, kubectl, objects, render

pytestmark = pytest.mark.e2e

NS = "m2g-system"


@pytest.fixture(scope="module")
def deployed(kubeconfig: Path) -> Iterator[str]:
    """deploy/crds, then deploy/overlays/default; deleted afterwards (what was not there)."""
    applied = Applied(kubeconfig)
    try:
        apply_crds(applied)
        text = render("deploy/overlays/default")
        applied.apply(text)
        yield text
    finally:
        applied.delete()


def test_default_overlay_applies_cleanly_and_a_second_apply_is_a_no_op(
        kubeconfig: Path, deployed: str) -> None:
    before = generations(kubeconfig, deployed)
    out = kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=deployed)
    assert out.stderr == ""
    assert generations(kubeconfig, deployed) == before
    diff = in_sync(kubeconfig, deployed)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_the_deployments_pods_pass_restricted_pod_security(
        kubeconfig: Path, deployed: str) -> None:
    def pods() -> list[dict[str, object]]:
        out = kubectl(kubeconfig, "get", "pods", "-n", NS, "-l",
                      "app.kubernetes.io/name=m2g", "-o", "json")
        items: list[dict[str, object]] = json.loads(out.stdout)["items"]
        return items if len(items) == 2 else []

    found = wait_until("the Deployment's two pods to be created", pods, timeout=60)
    assert {p["spec"]["serviceAccountName"] for p in found} == {"m2g"}  # type: ignore[index]
    events = kubectl(kubeconfig, "get", "events", "-n", NS, "-o", "json")
    forbidden = [e["message"] for e in json.loads(events.stdout)["items"]
                 if "violates PodSecurity" in e.get("message", "")]
    assert not forbidden


def test_every_policy_is_installed(kubeconfig: Path, deployed: str) -> None:
    want = {o["metadata"]["name"] for o in objects(deployed) if o["kind"] == "Policy"}
    out = kubectl(kubeconfig, "get", "policies.m2g.io", "-o", "json")
    got = {p["metadata"]["name"] for p in json.loads(out.stdout)["items"]}
    assert len(want) >= 10 and want <= got


def test_shadow_overlay_is_accepted(kubeconfig: Path, deployed: str) -> None:
    text = render("deploy/overlays/shadow")
    kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=text)


def install_extra_crds(kubeconfig: Path, folder: Path) -> None:
    for path in sorted(folder.glob("*.yaml")):
        crds = [o for o in objects(path.read_text()) if o["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(crd))
            kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/{crd['metadata']['name']}")


def test_monitoring_component_is_accepted(kubeconfig: Path, deployed: str) -> None:
    extra = os.environ.get("M2G_E2E_EXTRA_CRDS")
    if extra:
        install_extra_crds(kubeconfig, Path(extra))
    docs = objects(render("deploy/overlays/monitoring"))
    dashboard = [o for o in docs if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"] == "m2g-grafana-dashboard"]
    assert len(dashboard) == 1
    kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-",
            stdin=json.dumps(dashboard[0]))
    served = kubectl(kubeconfig, "api-resources", "--api-group=monitoring.coreos.com",
                     "-o", "name")
    if "servicemonitors.monitoring.coreos.com" not in served.stdout.split():
        pytest.skip("ServiceMonitor: the monitoring.coreos.com CRDs (Prometheus Operator) "
                    "are not installed on this control plane")
    monitors = [o for o in docs if o["kind"] == "ServiceMonitor"]
    kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-",
            stdin=json.dumps(monitors[0]))
