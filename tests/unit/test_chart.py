"""The Helm chart charts/m2g: it lints, renders, and renders the same objects as the kustomize
tree deploy/ (which stays first-class); its values do what values.yaml says.

Rendering uses the cached helm of kind-e2e (``kind-e2e/tools/build.sh helm``) or one on PATH,
and kubectl for kustomize; the tests that need them are skipped without them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "m2g"
sys.path.insert(0, str(REPO / "kind-e2e"))

from localcp.paths import binary  # noqa: E402

Obj = dict[str, Any]
MONITORING = ["--set", "monitoring.serviceMonitor.enabled=true",
              "--set", "monitoring.prometheusRule.enabled=true",
              "--set", "monitoring.dashboard.enabled=true"]


def _tool(name: str) -> str:
    local = binary(name)
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"no {name} (build it: kind-e2e/tools/build.sh {name})")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([_tool("helm"), *args], capture_output=True, text=True, check=False,
                         env={"HOME": "/tmp/m2g-helm-home", "PATH": "/usr/bin:/bin",
                              "HELM_CACHE_HOME": "/tmp/m2g-helm-cache",
                              "HELM_CONFIG_HOME": "/tmp/m2g-helm-config",
                              "HELM_DATA_HOME": "/tmp/m2g-helm-data"})
    if check:
        assert out.returncode == 0, out.stderr
    return out


def template(*values: str, namespace: str = "m2g-system") -> list[Obj]:
    out = helm("template", "m2g", str(CHART), "--namespace", namespace, *values)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kustomize(folder: Path) -> list[Obj]:
    out = subprocess.run([_tool("kubectl"), "kustomize", str(folder)], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def key(obj: Obj) -> tuple[str, str, str]:
    name = obj["metadata"]["name"]
    if obj["kind"] == "ConfigMap" and name.startswith("m2g-config-"):
        name = "m2g-config"  # kustomize's content-hash suffix
    return obj["kind"], name, obj["metadata"].get("namespace", "")


def squeeze(value: Any) -> Any:
    """Strings with runs of whitespace collapsed: kustomize's YAML writer turns a folded
    scalar's more-indented line break into two (the CEL text means the same)."""
    if isinstance(value, dict):
        return {k: squeeze(v) for k, v in value.items()}
    if isinstance(value, list):
        return [squeeze(v) for v in value]
    return " ".join(value.split()) if isinstance(value, str) else value


def essence(obj: Obj) -> Obj:
    """What must agree: everything but labels, annotations and the ConfigMap's hashed name."""
    out = copy.deepcopy(obj)
    if out["kind"] == "Policy":
        out["spec"] = squeeze(out["spec"])
    meta = out["metadata"]
    for field in ("labels", "annotations"):
        meta.pop(field, None)
    if out["kind"] == "Deployment":
        pod = out["spec"]["template"]
        pod["metadata"].pop("annotations", None)
        pod["metadata"]["labels"].pop("app.kubernetes.io/part-of", None)
        for vol in pod["spec"]["volumes"]:
            if "configMap" in vol:
                vol["configMap"]["name"] = "m2g-config"
    if out["kind"] == "ConfigMap":
        meta["name"] = key(obj)[1]
        out["data"] = {k: yaml.safe_load(v) if k.endswith(".yaml") else
                       json.loads(v) if k.endswith(".json") else v
                       for k, v in out["data"].items()}
    return out


def by_key(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in objs}


def test_chart_files_are_fresh_copies_of_deploy() -> None:
    out = subprocess.run(["bash", str(CHART / "sync.sh"), "--check"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr


WEBHOOK = ["--set", "webhook.enabled=true"]


@pytest.mark.parametrize("values", [[], MONITORING, ["--set", "shadow=true",
                                                     "--set", "namespace.create=true"],
                                    WEBHOOK, [*WEBHOOK, "--set", "webhook.certManager.enabled=false"]])
def test_helm_lint(values: list[str]) -> None:
    out = helm("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out.stdout, out.stdout


def same_as_kustomize(values: list[str], overlay: str) -> dict[tuple[str, str, str], Obj]:
    """The chart rendered with ``values`` is deploy/overlays/``overlay`` with the admission
    policies, object for object (in essence); the chart's objects by key."""
    chart = by_key(template(*values))
    kust = by_key(kustomize(REPO / "deploy" / "overlays" / overlay)
                  + kustomize(REPO / "deploy" / "admission-policies"))
    # The chart leaves the namespace to Helm (--create-namespace, or namespace.create=true).
    kust.pop(("Namespace", "m2g-system", ""))
    assert sorted(chart) == sorted(kust)
    for k, want in kust.items():
        assert essence(chart[k]) == essence(want), k
    return chart


def test_chart_renders_what_kustomize_renders() -> None:
    same_as_kustomize(MONITORING, "monitoring")


def test_chart_with_the_webhook_renders_what_kustomize_renders() -> None:
    """webhook.enabled=true is deploy/overlays/webhook (the Component deploy/webhook)."""
    chart = same_as_kustomize(WEBHOOK, "webhook")
    assert chart[("ValidatingWebhookConfiguration", "m2g-policy-compiler", "")]["metadata"][
        "annotations"]["cert-manager.io/inject-ca-from"] == "m2g-system/m2g-webhook"


def test_the_webhook_is_fail_closed_bounded_and_matches_only_m2g_policies() -> None:
    from m2g_controllers import run, webhook

    (vwc,) = (o for o in kustomize(REPO / "deploy" / "overlays" / "webhook")
              if o["kind"] == "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    # the API server waits longer than m2g's compile bound, which answers (refuses) first
    assert hook["timeoutSeconds"] > run.parse([]).webhook_timeout == \
        webhook.COMPILE_TIMEOUT_SECONDS
    assert hook["rules"] == [{"apiGroups": ["m2g.io"], "apiVersions": ["*"],
                              "operations": ["CREATE", "UPDATE"],
                              "resources": ["policies", "tenantpolicies"], "scope": "*"}]
    assert hook["clientConfig"]["service"]["path"] == webhook.PATH
    assert "object.spec != oldObject.spec" in hook["matchConditions"][0]["expression"]
    dep = deployment(template(*WEBHOOK))
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--webhook-port", "9443"]
    assert {"name": "webhook-certs", "mountPath": run.WEBHOOK_CERT_DIR,
            "readOnly": True} in container["volumeMounts"]
    (netpol,) = (o for o in template(*WEBHOOK) if o["kind"] == "NetworkPolicy")
    assert {"ports": [{"port": "webhook", "protocol": "TCP"}]} in netpol["spec"]["ingress"]


def test_the_webhook_without_cert_manager_gets_a_pair_helm_made() -> None:
    x509 = pytest.importorskip("cryptography.x509")
    import base64

    objs = by_key(template(*WEBHOOK, "--set", "webhook.certManager.enabled=false"))
    assert ("Certificate", "m2g-webhook", "m2g-system") not in objs
    secret = objs[("Secret", "m2g-webhook-tls", "m2g-system")]
    vwc = objs[("ValidatingWebhookConfiguration", "m2g-policy-compiler", "")]
    assert "cert-manager.io/inject-ca-from" not in vwc["metadata"].get("annotations", {})
    bundle = vwc["webhooks"][0]["clientConfig"]["caBundle"]
    assert bundle == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(bundle))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "m2g-webhook.m2g-system.svc" in names.get_values_for_type(x509.DNSName)


def test_every_object_carries_the_part_of_label_and_a_sync_wave() -> None:
    waves: dict[str, set[str]] = {}
    for obj in template(*MONITORING):
        meta = obj["metadata"]
        assert meta["labels"]["app.kubernetes.io/part-of"] == "m2g", key(obj)
        waves.setdefault(meta["annotations"]["argocd.argoproj.io/sync-wave"], set()).add(
            obj["kind"])
    assert waves["-2"] == {"CustomResourceDefinition"}
    assert "Policy" in waves["1"] and "Deployment" in waves["0"]
    assert not waves["1"] & waves["-2"]
    plain = template(*MONITORING, "--set", "argocd.syncWaves=false")
    assert not any("argocd.argoproj.io/sync-wave" in (o["metadata"].get("annotations") or {})
                   for o in plain)


def test_kustomize_carries_the_same_sync_waves() -> None:
    chart = by_key(template(*MONITORING))
    for obj in kustomize(REPO / "deploy" / "overlays" / "monitoring"):
        wave = (obj["metadata"].get("annotations") or {}).get("argocd.argoproj.io/sync-wave")
        if obj["kind"] in ("CustomResourceDefinition", "Policy", "ServiceMonitor",
                           "PrometheusRule") or key(obj)[1] == "m2g-grafana-dashboard":
            assert wave == chart[key(obj)]["metadata"]["annotations"][
                "argocd.argoproj.io/sync-wave"], key(obj)


def deployment(objs: list[Obj]) -> Obj:
    (dep,) = (o for o in objs if o["kind"] == "Deployment")
    return dep


def test_values_image_by_digest_replicas_shadow_and_args() -> None:
    digest = "sha256:" + "ab" * 32
    dep = deployment(template("--set", f"image.digest={digest}", "--set", "replicas=3",
                              "--set", "shadow=true", "--set", "extraArgs={--log-level,debug}"))
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/m2g/m2g@{digest}"
    assert dep["spec"]["replicas"] == 3
    assert container["command"][-3:] == ["--shadow", "--log-level", "debug"]
    tagged = deployment(template("--set", "image.tag=9.9.9", "--set", "image.repository=r/m2g"))
    assert tagged["spec"]["template"]["spec"]["containers"][0]["image"] == "r/m2g:9.9.9"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    default = deployment(template())["spec"]["template"]["spec"]["containers"][0]["image"]
    assert default == f"ghcr.io/m2g/m2g:{chart['appVersion']}"


def test_values_config_replaces_the_site_configuration_and_rolls_the_pods() -> None:
    objs = template("--set", "config.prometheus.url=http://thanos:9090")
    (cm,) = (o for o in objs if o["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == {
        "prometheus": {"url": "http://thanos:9090"}}
    rolled = deployment(objs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert rolled != deployment(template())["spec"]["template"]["metadata"]["annotations"][
        "checksum/config"]
    own = template("--set", "existingConfigMap=site-m2g")
    assert not any(o["kind"] == "ConfigMap" for o in own)
    vols = deployment(own)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "site-m2g"}} in vols


def test_values_switch_parts_off() -> None:
    kinds = {o["kind"] for o in template(
        "--set", "crds.install=false", "--set", "policies.install=false",
        "--set", "userRoles.enabled=false", "--set", "networkPolicy.enabled=false",
        "--set", "podDisruptionBudget.enabled=false", "--set", "priorityClass.create=false",
        "--set", "admissionPolicies.enabled=false")}
    assert kinds == {"ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role",
                     "RoleBinding", "Deployment", "Service"}


def test_another_namespace_moves_every_namespaced_object_and_the_bindings() -> None:
    objs = template("--set", "namespace.create=true", namespace="ai-ops")
    text = yaml.safe_dump_all(objs)
    assert "m2g-system" not in text
    ns = next(o for o in objs if o["kind"] == "Namespace")
    assert ns["metadata"]["name"] == "ai-ops"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objs:
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "ai-ops"


def test_kustomize_namespace_moves_everything(tmp_path: Path) -> None:
    """A kustomization with ``namespace:`` over deploy/ installs m2g into another namespace
    with nothing left pointing at m2g-system (bindings, the ServiceMonitor, the Lease)."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "ai-ops",
        "resources": [os.path.relpath(REPO / "deploy" / "overlays" / "monitoring", tmp_path)]}))
    objs = kustomize(tmp_path)
    assert "m2g-system" not in yaml.safe_dump_all(objs)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
                      "CustomResourceDefinition", "Policy"}
    for obj in objs:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == "ai-ops", key(obj)
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "ai-ops", key(obj)
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"} == {"ai-ops"}


def test_user_roles_aggregate_to_view_and_edit() -> None:
    roles = {o["metadata"]["name"]: o for o in template() if o["kind"] == "ClusterRole"}
    viewer, user = roles["m2g-viewer"], roles["m2g-user"]
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert user["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in user["metadata"]["labels"]
    for role in (viewer, user):  # read-only, but for a tenant's own TenantPolicies
        verbs = {v for rule in role["rules"] for v in rule["verbs"]
                 if rule["resources"] != ["tenantpolicies"]}
        assert verbs == {"get", "list", "watch"}, role["metadata"]["name"]
    (tenant,) = (r for r in user["rules"] if r["resources"] == ["tenantpolicies"])
    assert "create" in tenant["verbs"] and "tenantpolicies" not in str(
        [r for r in viewer["rules"] if set(r["verbs"]) - {"get", "list", "watch"}])


def test_flux_and_argocd_examples_order_the_pieces() -> None:
    flux = list(yaml.safe_load_all((REPO / "deploy" / "gitops" / "flux" / "m2g.yaml")
                                   .read_text()))
    ks = {d["metadata"]["name"]: d["spec"] for d in flux if d["kind"] == "Kustomization"}
    assert ks["m2g"]["dependsOn"] == [{"name": "m2g-crds"}]
    assert ks["kueue-config"]["dependsOn"] == [{"name": "m2g"}]
    for spec in ks.values():
        assert (REPO / spec["path"]).is_dir(), spec["path"]
    check = ks["kueue-config"]["healthCheckExprs"][0]
    assert check["kind"] == "AdmissionCheck" and "Active" in check["current"]
    argo = list(yaml.safe_load_all((REPO / "deploy" / "gitops" / "argocd" / "m2g.yaml")
                                   .read_text()))
    waves = {d["metadata"]["name"]: int(d["metadata"]["annotations"][
        "argocd.argoproj.io/sync-wave"]) for d in argo}
    assert waves["m2g"] < waves["kueue-config"]
    for app in argo:
        assert (REPO / app["spec"]["source"]["path"]).is_dir()
    kueue = kustomize(REPO / "kueue-config" / "overlays" / "nvl72")
    wave = {o["kind"]: int((o["metadata"].get("annotations") or {}).get(
        "argocd.argoproj.io/sync-wave", "0")) for o in kueue}
    assert wave["AdmissionCheck"] < wave["ClusterQueue"] < wave["LocalQueue"]
