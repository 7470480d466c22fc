"""JobSet's install manifests for the kind path (``python kind-e2e/localcp jobset-manifests``,
kind-e2e/localcp/jobset_install.py): rendered from the JobSet module that
kind-e2e/tools/jobset/go.sum pins, checked against its ``h1:`` hash, with the manager's image
at the pinned version on upstream's release registry.

A module tree of upstream's shape (tmp_path) covers the rendering and the hash check without
the Go module cache; the real module is rendered when the cache holds it (the local control
plane's build downloads it), since that is what a kind user gets. Rendering needs kubectl.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcp import UserError, gomod, jobset_install
from localcp.__main__ import main
from localcp.paths import binary, module_dir, read_versions

VERSION = read_versions()["JOBSET_VERSION"]
REAL = module_dir(jobset_install.MODULE, VERSION)
PINNED = f"{jobset_install.IMAGE}:{VERSION}"
STAGING = "staging.example/jobset/jobset"


def _need_kubectl() -> None:
    if not binary("kubectl").exists() and shutil.which("kubectl") is None:
        pytest.skip("no kubectl (build it: kind-e2e/tools/build.sh kubectl)")


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _module(root: Path, tag: str = VERSION) -> Path:
    """config/default over a manager component, as upstream lays them out."""
    manager = root / "config/components/manager"
    manager.mkdir(parents=True)
    (manager / "manager.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "controller-manager", "namespace": "system"},
         "spec": {"selector": {"matchLabels": {"app": "m"}}, "template": {
             "metadata": {"labels": {"app": "m"}},
             "spec": {"containers": [{"name": "manager", "image": "controller:latest"}]}}}}))
    (manager / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": ["manager.yaml"],
         "images": [{"name": "controller", "newName": STAGING, "newTag": tag}]}))
    default = root / "config/default"
    default.mkdir(parents=True)
    (default / "kustomization.yaml").write_text(yaml.safe_dump(
        {"namespace": "jobset-system", "namePrefix": "jobset-",
         "resources": ["../components/manager"]}))
    return root


def test_the_manager_image_is_set_to_the_release_registry_at_the_pinned_version(
        tmp_path: Path) -> None:
    _need_kubectl()
    (dep,) = _docs(jobset_install.render(_module(tmp_path / "m"), VERSION))
    assert (dep["metadata"]["name"], dep["metadata"]["namespace"]) == (
        "jobset-controller-manager", "jobset-system")
    assert [c["image"] for c in dep["spec"]["template"]["spec"]["containers"]] == [PINNED]


def test_a_module_whose_manager_names_another_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=re.escape(f"sets tag 'v0.0.1', not the pinned {VERSION}")):
        jobset_install.render(_module(tmp_path / "m", tag="v0.0.1"), VERSION)


def test_a_broken_kustomization_is_a_one_line_error(tmp_path: Path) -> None:
    _need_kubectl()
    root = _module(tmp_path / "m")
    (root / "config/default/kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(UserError, match="kubectl kustomize of JobSet's config/default failed"
                       ) as err:
        jobset_install.render(root, VERSION)
    assert "\n" not in str(err.value)


def test_the_module_must_match_the_hash_go_sum_pins(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = _module(tmp_path / "m")
    good = gomod.dir_hash(root, f"{jobset_install.MODULE}@{VERSION}")
    monkeypatch.setattr(gomod, "ensure_module", lambda *_: root)
    monkeypatch.setattr(gomod, "pinned_hash", lambda *_: good)
    assert gomod.verified_module(jobset_install.MODULE, VERSION, "jobset") == (root, good)
    (root / "config/default/extra.yaml").write_text("kind: Secret\n")  # one file more
    with pytest.raises(UserError, match=r"does not match sigs\.k8s\.io/jobset .* pinned in "
                                        r"kind-e2e/tools/jobset/go\.sum"):
        gomod.verified_module(jobset_install.MODULE, VERSION, "jobset")


def test_the_pinned_hash_is_read_from_the_wrapper_module_s_go_sum() -> None:
    assert gomod.pinned_hash(jobset_install.MODULE, VERSION, "jobset").startswith("h1:")
    with pytest.raises(UserError, match=r"sigs\.k8s\.io/jobset v0\.0\.1 is not pinned in"):
        gomod.pinned_hash(jobset_install.MODULE, "v0.0.1", "jobset")


@pytest.fixture(scope="module")
def real() -> str:
    """``localcp jobset-manifests`` from the real module (skipped when the cache lacks it)."""
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not in the module cache (make up, or localcp build, fetches it)")
    _need_kubectl()
    return jobset_install.manifests()


def test_the_real_module_hashes_to_what_go_sum_pins(real: str) -> None:
    want = gomod.pinned_hash(jobset_install.MODULE, VERSION, "jobset")
    assert gomod.dir_hash(REAL, f"{jobset_install.MODULE}@{VERSION}") == want
    assert real.splitlines()[0] == (
        f"# JobSet {VERSION}: {jobset_install.MODULE}@{VERSION} config/default ({want}, "
        f"kind-e2e/tools/jobset/go.sum), image {PINNED}")


def test_the_real_manifests_install_jobset_as_upstream_ships_it(real: str) -> None:
    docs = _docs(real)
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Namespace", "jobset-system"),
            ("CustomResourceDefinition", "jobsets.jobset.x-k8s.io"),
            ("ServiceAccount", "jobset-controller-manager"),
            ("ClusterRole", "jobset-manager-role"),
            ("ClusterRoleBinding", "jobset-manager-rolebinding"),
            ("ConfigMap", "jobset-manager-config"),
            ("Service", "jobset-webhook-service"),
            ("Secret", "jobset-webhook-server-cert"),
            ("Deployment", "jobset-controller-manager"),
            ("MutatingWebhookConfiguration", "jobset-mutating-webhook-configuration"),
            ("ValidatingWebhookConfiguration", "jobset-validating-webhook-configuration"),
            } <= kinds
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"jobset-system"}
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert [c["image"] for c in dep["spec"]["template"]["spec"]["containers"]] == [PINNED]
    (cfg,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(next(iter(cfg["data"].values())))["internalCertManagement"] == {
        "enable": True}  # JobSet makes its own webhook certificate in the cluster
    for hooks in (d for d in docs if d["kind"].endswith("WebhookConfiguration")):
        for hook in hooks["webhooks"]:
            assert hook["clientConfig"]["service"]["name"] == "jobset-webhook-service"
            assert hook["clientConfig"]["service"]["namespace"] == "jobset-system"
            if hook["rules"][0]["resources"] == ["pods"]:  # only JobSet's pods, not every pod
                assert hook["objectSelector"]["matchExpressions"][0]["key"] == \
                    "jobset.sigs.k8s.io/jobset-name", hook


def test_the_command_prints_the_manifests_or_one_line(real: str,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["jobset-manifests"]) == 0
    assert capsys.readouterr().out == real
    monkeypatch.setattr(gomod, "pinned_hash", lambda *_: "h1:other")
    assert main(["jobset-manifests"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "h1:other" in err
