"""Every AdmissionCheck whose controllerName is m2g.io/policy is answered, whatever its name
(Kueue's protocol), each with the policy selection its ``spec.parameters`` name in the site
configuration; a check naming a configuration that does not exist is set Active=False with
reason BadParametersRef (its ClusterQueue admits nothing), and the real controller (``m2g run``
as the Deployment starts it, with a site configuration) does all of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, condition, unique, wait_until
from manifests_helpers import Applied, controller, job, kubectl, objects, render

pytestmark = pytest.mark.e2e

OVERLAY = "kueue-config/overlays/nvl72"
SECOND, BROKEN = "m2g-inference-check", "m2g-broken-check"
REF = {"apiGroup": "m2g.io", "kind": "AdmissionCheckConfig"}


def get_json(kubeconfig: Path, *args: str) -> Any:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def second_queue(overlay: str, cq_name: str, check: str) -> dict[str, Any]:
    """The research ClusterQueue's quota and flavors, gated by ``check`` instead of m2g-policy."""
    research = next(o for o in objects(overlay)
                    if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "research")
    spec = {k: v for k, v in research["spec"].items() if k not in ("cohortName",)}
    spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    spec["namespaceSelector"] = {}  # any namespace (research admits its tenants only)
    return {"apiVersion": research["apiVersion"], "kind": "ClusterQueue",
            "metadata": {"name": cq_name}, "spec": spec}


@pytest.fixture(scope="module")
def setup(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[str, str]]:
    """kueue-config, two more checks of m2g's and a ClusterQueue + LocalQueue per check, and
    m2g run with a site configuration naming the second check's policy selection."""
    overlay = render(OVERLAY)
    ns = unique("acheck")
    cq_ok, cq_bad = unique("second"), unique("broken")
    extra = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
         "metadata": {"name": SECOND},
         "spec": {"controllerName": "m2g.io/policy", "parameters": {**REF, "name": "only-health"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
         "metadata": {"name": BROKEN},
         "spec": {"controllerName": "m2g.io/policy", "parameters": {**REF, "name": "typo"}}},
        second_queue(overlay, cq_ok, SECOND), second_queue(overlay, cq_bad, BROKEN),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "default", "namespace": ns}, "spec": {"clusterQueue": cq_ok}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "broken", "namespace": ns}, "spec": {"clusterQueue": cq_bad}},
    ]
    site = tmp_path_factory.mktemp("acheck") / "site.yaml"
    site.write_text(yaml.safe_dump({"admissionChecks": {"configs": {
        "only-health": {"policies": ["health-admission"]}}}}))
    applied = Applied(kubeconfig)
    log = site.parent / "m2g-run.log"
    kubectl(kubeconfig, "create", "namespace", "m2g-system", check=False)
    try:
        applied.apply(overlay)
        applied.apply(yaml.safe_dump_all(extra))
        with controller(kubeconfig, log, "--config", str(site), "--identity", "acheck-e2e",
                        "--policies", str(REPO / "policies"), "--resync-seconds", "2"):
            yield ns, cq_bad
    finally:
        applied.delete()


def test_a_check_with_its_own_name_is_kept_active_and_answered(
        kubeconfig: Path, setup: tuple[str, str]) -> None:
    ns, _ = setup
    wait_until(f"{SECOND} to be Active", lambda: (
        (c := condition(get_json(kubeconfig, f"admissionchecks.kueue.x-k8s.io/{SECOND}") or {},
                        "Active")) and c["status"] == "True"), timeout=60)
    name = unique("inference")
    kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(job(name, ns)))

    seen: list[dict[str, Any]] = []

    def workload() -> dict[str, Any] | None:
        items = (get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", ns) or {}).get("items")
        mine = [w for w in items or [] if any(o.get("name") == name for o in
                                              w["metadata"].get("ownerReferences", []))]
        wl = mine[0] if mine else None
        seen[:] = [wl] if wl else []
        ok = wl and (c := condition(wl, "Admitted")) and c["status"] == "True"
        return wl if ok else None

    try:
        wl = wait_until("the job to be admitted through the second check", workload, timeout=90)
    except pytest.fail.Exception as exc:  # say where it stopped
        pytest.fail(f"{exc}; workload status: {(seen or [{}])[0].get('status')}",
                    pytrace=False)
    (entry,) = wl["status"]["admissionChecks"]
    assert entry["name"] == SECOND and entry["state"] == "Ready"
    assert "admitted" in entry["message"] or "health-admission" in entry["message"]


def test_a_check_naming_a_missing_config_is_inactive_with_the_reason(
        kubeconfig: Path, setup: tuple[str, str]) -> None:
    _, cq_bad = setup

    def inactive() -> dict[str, Any] | None:
        c = condition(get_json(kubeconfig, f"admissionchecks.kueue.x-k8s.io/{BROKEN}") or {},
                      "Active")
        return c if c and c["status"] == "False" else None

    cond = wait_until(f"{BROKEN} to be set inactive", inactive, timeout=60)
    assert cond["reason"] == "BadParametersRef"
    assert "no admissionChecks.configs entry 'typo'" in cond["message"]
    assert "configured: only-health" in cond["message"]
    wait_until(f"{cq_bad} to be Inactive", lambda: (
        (c := condition(get_json(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{cq_bad}") or {},
                        "Active")) and c["status"] == "False"), timeout=30)
