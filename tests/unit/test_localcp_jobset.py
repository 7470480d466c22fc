"""The JobSet controller as a component of the local control plane (kind-e2e/localcp/jobset.py).

Upstream's files are read from the JobSet module; these tests give the functions a module tree
of the same shape (tmp_path) so they run without the Go module cache, and check what the
control plane builds from it: the webhooks as JobSet's kustomization renders them (the pod
webhooks limited to JobSet's pods, or every pod of the cluster would need JobSet up), each
pointing at 127.0.0.1 with our CA; the Configuration with every server on 127.0.0.1; the
component in the start order, built by default; Kueue integrating JobSet.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcp import UserError, controlplane, jobset, kueue
from localcp.paths import BINARIES, KIND_E2E, TOOLS, RunPaths, read_versions
from localcp.pki import ensure_pki

POD_SELECTOR = {"matchExpressions": [
    {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}


def _hook(name: str, path: str, resource: str) -> dict[str, Any]:
    return {"admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "name": name,
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                         "path": path}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": [resource]}]}


def _module(root: Path) -> Path:
    """A JobSet module tree with upstream's layout (config/components/{crd,webhook})."""
    crd = root / "config/components/crd/bases"
    crd.mkdir(parents=True)
    (crd / "jobset.x-k8s.io_jobsets.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": jobset.CRD_NAME}}))
    hooks = root / "config/components/webhook"
    (hooks / "patches").mkdir(parents=True)
    docs = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [_hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                            "jobsets"), _hook("mpod.kb.io", "/mutate--v1-pod", "pods")]},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [_hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                            "jobsets"), _hook("vpod.kb.io", "/validate--v1-pod", "pods")]},
    ]
    (hooks / "manifests.yaml").write_text(yaml.safe_dump_all(docs))
    for kind, doc in (("mutating", docs[0]), ("validating", docs[1])):
        pod = dict(doc["webhooks"][1], objectSelector=POD_SELECTOR)
        (hooks / f"patches/{kind}-patch.yaml").write_text(yaml.safe_dump(
            [{"op": "replace", "path": "/webhooks/1", "value": pod}]))
    (hooks / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["manifests.yaml", "service.yaml"],
        "patches": [{"path": f"patches/{kind}-patch.yaml",
                     "target": {"kind": f"{kind.capitalize()}WebhookConfiguration",
                                "name": f"{kind}-webhook-configuration"}}
                    for kind in ("mutating", "validating")]}))
    return root


def test_webhooks_point_at_127_0_0_1_with_our_ca_and_only_jobset_pods(tmp_path: Path) -> None:
    hooks = jobset.webhook_configurations(b"CA PEM", 9444, _module(tmp_path))
    assert [h["metadata"]["name"] for h in hooks] == [
        "m2g-jobset-mutating-webhook-configuration", "m2g-jobset-validating-webhook-configuration"]
    urls = []
    for h in hooks:
        assert h["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "m2g-localcp"}
        for w in h["webhooks"]:
            assert base64.b64decode(w["clientConfig"]["caBundle"]) == b"CA PEM"
            assert "service" not in w["clientConfig"]
            urls.append(w["clientConfig"]["url"])
            if w["rules"][0]["resources"] == ["pods"]:
                assert w["objectSelector"] == POD_SELECTOR, w["name"]
            else:
                assert "objectSelector" not in w
    assert urls == ["https://127.0.0.1:9444/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                    "https://127.0.0.1:9444/mutate--v1-pod",
                    "https://127.0.0.1:9444/validate-jobset-x-k8s-io-v1alpha2-jobset",
                    "https://127.0.0.1:9444/validate--v1-pod"]


@pytest.mark.parametrize("op", [
    {"op": "add", "path": "/webhooks/1", "value": {}},
    {"op": "replace", "path": "/webhooks/7", "value": {}},
    {"op": "replace", "path": "/metadata/name", "value": "x"},
])
def test_an_unexpected_upstream_patch_is_a_one_line_error(tmp_path: Path,
                                                         op: dict[str, Any]) -> None:
    root = _module(tmp_path)
    (root / "config/components/webhook/patches/mutating-patch.yaml").write_text(
        yaml.safe_dump([op]))
    with pytest.raises(UserError, match="unexpected patch in JobSet's webhook kustomization"):
        jobset.webhook_configurations(b"x", 1, root)


def test_crds_are_read_from_the_module(tmp_path: Path) -> None:
    assert [c["metadata"]["name"] for c in jobset.crds(_module(tmp_path))] == [jobset.CRD_NAME]
    with pytest.raises(UserError, match="no JobSet CRD found"):
        jobset.crds(tmp_path / "empty")


def test_the_configuration_serves_everything_on_127_0_0_1_with_our_certs(tmp_path: Path) -> None:
    ports = {"jobset_webhook": 1001, "jobset_metrics": 1002, "jobset_health": 1003}
    cfg = yaml.safe_load(Path(jobset.config(tmp_path, tmp_path / "certs", ports)).read_text())
    assert (cfg["apiVersion"], cfg["kind"]) == ("config.jobset.x-k8s.io/v1alpha1",
                                                "Configuration")
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 1001,
                              "certDir": str(tmp_path / "certs")}
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:1002"
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:1003"
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["leaderElection"] == {"leaderElect": False}
    # flags would override the Configuration (main.go: flags set win): none of those is passed
    cmd = jobset.command(Path("/bin/jobset"), "/cfg.yaml", Path("/kc"))
    assert cmd[:3] == ["/bin/jobset", "--config=/cfg.yaml", "--kubeconfig=/kc"]
    assert not [a for a in cmd if a.startswith(("--metrics-bind-address", "--leader-elect",
                                                "--health-probe-bind-address"))]


def test_certs_are_the_serving_pair(tmp_path: Path) -> None:
    (tmp_path / "webhook.crt").write_bytes(b"CRT")
    (tmp_path / "webhook.key").write_bytes(b"KEY")
    jobset.install_certs(tmp_path, tmp_path / "certs")
    assert (tmp_path / "certs/tls.crt").read_bytes() == b"CRT"
    assert oct((tmp_path / "certs/tls.key").stat().st_mode & 0o777) == "0o600"
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot write JobSet's certificates"):
        jobset.install_certs(tmp_path, tmp_path / "file" / "certs")


def test_kueue_manages_jobsets_of_the_local_control_plane(tmp_path: Path) -> None:
    ports = dict.fromkeys(("kueue_health", "kueue_metrics", "kueue_webhook",
                           "kueue_visibility"), 1)
    cfg = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, ports)).read_text())
    assert cfg["integrations"]["frameworks"] == ["batch/job", "jobset.x-k8s.io/jobset"]


def test_jobset_is_a_component_built_and_started_by_default(tmp_path: Path) -> None:
    assert "jobset" in BINARIES
    assert controlplane.ORDER.index("jobset") > controlplane.ORDER.index("kueue")
    assert {"jobset_webhook", "jobset_metrics", "jobset_health"} <= set(
        controlplane.DEFAULT_PORTS)
    assert len(set(controlplane.DEFAULT_PORTS.values())) == len(controlplane.DEFAULT_PORTS)
    run = RunPaths(tmp_path / "run")
    ensure_pki(run.pki, tmp_path / "serving")
    comp = controlplane.components(run, dict(controlplane.DEFAULT_PORTS))["jobset"]
    assert comp.argv[1:3] == [f"--config={run.root / 'jobset.yaml'}",
                             f"--kubeconfig={run.kubeconfig}"]
    # build.sh builds it with the others when asked for nothing in particular
    text = (TOOLS / "build.sh").read_text()
    (all_line,) = [line for line in text.splitlines() if line.startswith("ALL=")]
    assert "jobset" in all_line.split("=", 1)[1].strip('"').split()


def test_the_wrapper_module_pins_the_version_of_versions_env() -> None:
    gomod = (TOOLS / "jobset" / "go.mod").read_text()
    assert "tool sigs.k8s.io/jobset" in gomod
    want = read_versions()["JOBSET_VERSION"]
    assert f"sigs.k8s.io/jobset {want}" in gomod
    assert f"sigs.k8s.io/jobset {want} h1:" in (TOOLS / "jobset" / "go.sum").read_text()
    # the same JobSet as the one Kueue's integration is built against
    assert f"sigs.k8s.io/jobset {want}" in (TOOLS / "kueue" / "go.mod").read_text()
    out = subprocess.run(["bash", str(TOOLS / "build.sh"), "--path", "jobset"],
                         capture_output=True, text=True, check=True, cwd=KIND_E2E,
                         env={"PATH": "/usr/bin:/bin", "M2G_CACHE": "/nowhere"})
    assert out.stdout.strip() == f"/nowhere/bin/jobset-{want}/jobset"
