"""JobSet on the kind path: installed in the cluster by kind-e2e/kind/install.sh from
``python kind-e2e/localcp jobset-manifests`` (config/default of the JobSet module that
kind-e2e/tools/jobset/go.sum pins, the controller image at that version), it runs the
repository's JobSet templates through Kueue and m2g as the local control plane's JobSet process
does.

Only against a kind cluster: ``M2G_E2E_KUBECONFIG`` set to its kubeconfig (a node whose
providerID is ``kind://…``); skipped otherwise, since the local control plane runs JobSet as a
process, not from these manifests. Needs Go and kubectl (the render), like install.sh.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Cluster, wait_until
from kubernetes import config
from localcp import jobset_install
from localcp.paths import read_versions
from manifests_helpers import exists, get_json, objects, ref
from template_runs import JOBSET_TEMPLATES, TEMPLATES, run_template

from m2g.templates import render

EXTERNAL = os.environ.get("M2G_E2E_KUBECONFIG", "")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not EXTERNAL, reason="M2G_E2E_KUBECONFIG is not set: these tests check JobSet as "
    "kind-e2e/kind/install.sh installs it in a kind cluster (the local control plane runs "
    "JobSet as a process)")]
IMAGE = f"{jobset_install.IMAGE}:{read_versions()['JOBSET_VERSION']}"


@pytest.fixture(scope="module")
def kind(kubeconfig: Path) -> Path:
    """The kubeconfig, once its cluster is known to be kind's (else the module is skipped)."""
    nodes = (get_json(kubeconfig, "nodes") or {}).get("items", [])
    if not any(str(n.get("spec", {}).get("providerID", "")).startswith("kind://")
               for n in nodes):
        pytest.skip(f"M2G_E2E_KUBECONFIG={EXTERNAL} is not a kind cluster (no node with a "
                    f"kind:// providerID); make one with kind-e2e/kind/install.sh")
    return kubeconfig


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return objects(jobset_install.manifests())


def test_the_cluster_runs_the_pinned_jobset_as_rendered(kind: Path,
                                                        rendered: list[dict[str, Any]]) -> None:
    missing = [" ".join(ref(o)) for o in rendered if not exists(kind, o)]
    assert not missing, f"not installed (run kind-e2e/kind/install.sh): {missing}"
    (dep,) = [o for o in rendered if o["kind"] == "Deployment"]
    name, ns = dep["metadata"]["name"], dep["metadata"]["namespace"]

    def available() -> dict[str, Any] | None:
        live = get_json(kind, f"deployments.apps/{name}", "-n", ns) or {}
        ok = (live.get("status") or {}).get("availableReplicas", 0) >= 1
        return live if ok else None

    live = wait_until(f"{ns}/{name} to be available", available, timeout=180)
    assert [c["image"] for c in live["spec"]["template"]["spec"]["containers"]] == [IMAGE]

    def ca_injected() -> bool:  # JobSet's own certificate management filled the bundles in
        return all(hook.get("clientConfig", {}).get("caBundle")
                   for o in rendered if o["kind"].endswith("WebhookConfiguration")
                   for hook in (get_json(kind, *ref(o)) or {}).get("webhooks", [{}]))

    wait_until("JobSet's webhooks to carry its CA", ca_injected, timeout=120)


def test_a_jobset_template_runs_with_the_in_cluster_controller(kind: Path,
                                                              labels_queue: str) -> None:
    """The smallest JobSet template, as test_real_labels_e2e runs every one: admitted on the
    first try with m2g's check Ready, its child Jobs made by the in-cluster controller, every
    pod Running where Kueue placed it. (Its own client: the suite's session one would be made
    before ``kind`` could skip.)"""
    name = min(JOBSET_TEMPLATES, key=lambda n: (render(TEMPLATES[n]).sizing.gpus, n))
    cluster = Cluster(config.new_client_from_config(config_file=str(kind)))
    run_template(kind, cluster, labels_queue, name, "JobSet", "--set", "scheduler=default",
                 "--set", "priority=")
