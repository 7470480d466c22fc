"""The install of docs/deploy.md, end to end, with the real controller acting under its RBAC.

kueue-config/overlays/nvl72, deploy/crds and deploy/overlays/default are applied as a user
would; ``m2g run`` then runs exactly as the Deployment's command, but as a local process
authenticated with a token of the ServiceAccount (the Deployment's pods cannot run on the
factory's GPU-only KWOK nodes). With the Policy objects of deploy/policies it must: lead, make
m2g-policy Active so that the ClusterQueues become Active, answer a tenant job's admission check
with a policy's verdict and an Event, and never be refused by the API server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import condition, unique, wait_until
from manifests_helpers import (
    QUEUES,
    Applied,
    apply_crds,
    controller,
    denied_lines,
    http_get,
    job,
    kubectl,
    render,
    sa_kubeconfig,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """docs/deploy.md §2 (acting): kueue-config, CRDs, deploy; yields the SA's kubeconfig."""
    applied = Applied(kubeconfig)
    try:
        applied.apply(render("kueue-config/overlays/nvl72"))
        apply_crds(applied)
        applied.apply(render("deploy/overlays/default"))
        yield sa_kubeconfig(kubeconfig, tmp_path_factory.mktemp("install") / "m2g.kubeconfig")
    finally:
        applied.delete()


def get_json(kubeconfig: Path, *args: str) -> Any:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def test_m2g_governs_the_tenant_queues_under_its_rbac(
        kubeconfig: Path, installed: Path, tmp_path: Path) -> None:
    policies = len(get_json(kubeconfig, "policies.m2g.io")["items"])
    assert policies >= 10
    log = tmp_path / "m2g.log"
    ns, name = "research", unique("install")
    try:
        with controller(installed, log, "--identity", "e2e-install") as url:
            wait_until("m2g to lead with every policy loaded", lambda: (
                "m2g_leader 1.0" in (m := http_get(f"{url}/metrics")[1])
                and f"m2g_policies_loaded {float(policies)}" in m), timeout=60)
            for queue in QUEUES:
                wait_until(f"{queue} to be Active", lambda q=queue: (
                    (c := condition(get_json(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{q}"),
                                    "Active")) and c["status"] == "True"), timeout=60)
            kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(job(name, ns)))

            def answered() -> dict[str, Any] | None:
                for wl in get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", ns)["items"]:
                    if not any(o.get("name") == name
                               for o in wl["metadata"].get("ownerReferences", [])):
                        continue
                    for check in wl.get("status", {}).get("admissionChecks", []):
                        if check["name"] == "m2g-policy" and check["state"] != "Pending":
                            found: dict[str, Any] = check
                            return found
                return None

            check = wait_until("m2g to answer the job's admission check", answered, timeout=90)
            assert check["state"] in ("Ready", "Retry", "Rejected")
            assert check["message"]
            wait_until("m2g's Event about it (written after the check)", lambda: any(
                e.get("reportingController") == "m2g.io/policy" for e in get_json(
                    kubeconfig, "events.events.k8s.io", "-n", ns)["items"]), timeout=30)
    finally:
        kubectl(kubeconfig, "delete", f"jobs.batch/{name}", "-n", ns, "--ignore-not-found",
                "--cascade=background", check=False)
    assert not denied_lines(log), denied_lines(log)[:5]
