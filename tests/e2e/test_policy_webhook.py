"""The Policy admission webhook on the real API server: ``m2g run --webhook-port`` serves
m2g's policy compiler over HTTPS and the ValidatingWebhookConfiguration of deploy/webhook
(its rules, match condition, failurePolicy and timeout as shipped; only clientConfig points at
https://127.0.0.1:PORT, as the local control plane has no Service network) makes the API
server call it:

* a Policy with bad CEL (a type error, a syntax error), over the allocation bound, or a
  TenantPolicy with a type error is refused at ``kubectl apply`` time with the compiler's line;
  a good Policy and a good TenantPolicy are stored; a good Policy changed to bad is refused;
* with the webhook down, creating a Policy is refused (fail closed) while deleting one, a
  label-only change and a ConfigMap are not blocked.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, unique
from manifests_helpers import Applied, _free_port, apply_crds, controller, kubectl, objects, render

pytestmark = pytest.mark.e2e

GOOD = yaml.safe_load((REPO / "policies" / "grid-demand-response" / "policy.yaml").read_text())


def _serving_pair(directory: Path) -> bytes:
    """tls.crt/tls.key for 127.0.0.1 in ``directory``; returns the CA's PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.x509.oid import ExtendedKeyUsageOID
    from localcp.pki import issue

    ca = issue("m2g-webhook-e2e-ca")
    cert, key = issue("m2g-webhook", ca=ca, eku=(ExtendedKeyUsageOID.SERVER_AUTH,),
                      sans=(x509.IPAddress(ipaddress.ip_address("127.0.0.1")),))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert.public_bytes(ser.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    return ca[0].public_bytes(ser.Encoding.PEM)


def _configuration(name: str, port: int, ca: bytes) -> dict[str, Any]:
    (vwc,) = (o for o in objects(render("deploy/overlays/webhook"))
              if o["kind"] == "ValidatingWebhookConfiguration")
    vwc["metadata"] = {"name": name}  # no cert-manager here: the CA is given directly
    (hook,) = vwc["webhooks"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate-policy",
                            "caBundle": base64.b64encode(ca).decode()}
    return vwc


@pytest.fixture(scope="module")
def served(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The CRDs, m2g run with the webhook, and the configuration naming it; yields the run's
    log. The configuration is deleted last thing (it would refuse every Policy write)."""
    tmp = tmp_path_factory.mktemp("webhook")
    ca = _serving_pair(tmp / "certs")
    port = _free_port()
    applied = Applied(kubeconfig)
    vwc = _configuration(unique("m2g-policy-compiler"), port, ca)
    kubectl(kubeconfig, "create", "namespace", "m2g-system", check=False)
    log = tmp / "m2g-run.log"
    try:
        apply_crds(applied)
        with controller(kubeconfig, log, "--identity", "webhook-e2e", "--policies",
                        str(REPO / "policies"), "--webhook-port", str(port), "--webhook-host",
                        "127.0.0.1", "--webhook-cert-dir", str(tmp / "certs")):
            kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(vwc))
            yield log
    finally:
        kubectl(kubeconfig, "delete", "validatingwebhookconfiguration",
                vwc["metadata"]["name"], "--ignore-not-found", check=False)
        for kind in ("policies.m2g.io", "tenantpolicies.m2g.io"):
            kubectl(kubeconfig, "delete", kind, "-A", "-l", "m2g-e2e=webhook",
                    "--ignore-not-found", check=False)
        applied.delete()


def _policy(name: str, when: str | None = None) -> dict[str, Any]:
    obj = copy.deepcopy(GOOD)
    obj["metadata"] = {"name": name, "labels": {"m2g-e2e": "webhook"}}
    if when is not None:
        obj["spec"]["rules"][0]["when"] = when
    return obj


def _apply(kubeconfig: Path, obj: dict[str, Any]) -> tuple[int, str]:
    out = kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(obj),
                  check=False)
    return out.returncode, out.stderr


def _refused(kubeconfig: Path, obj: dict[str, Any], *words: str) -> str:
    code, err = _apply(kubeconfig, obj)
    assert code != 0, f"{obj['metadata']['name']} was stored"
    assert "denied the request" in err and "m2g's policy compiler refuses this" in err, err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err
    gone = kubectl(kubeconfig, "get", f"{obj['kind'].lower()}s.m2g.io", *(
        ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []),
        obj["metadata"]["name"], check=False)
    assert gone.returncode != 0  # nothing stored
    return err


def test_a_good_policy_is_stored_and_bad_ones_are_refused_at_apply_time(
        kubeconfig: Path, served: Path) -> None:
    good = unique("webhook-good")
    assert _apply(kubeconfig, _policy(good)) == (0, "")
    _refused(kubeconfig, _policy(unique("webhook-types"), "grid.event.level + 'x'"),
             "/defer-during-dr: when:", "no matching overload for '_+_'")
    _refused(kubeconfig, _policy(unique("webhook-syntax"), "grid.event.active &&"),
             "Syntax error")
    bomb = _policy(unique("webhook-bomb"))
    literal = "x" * 10_000
    bomb["spec"]["variables"] = [{"name": "v0", "expression": f"workload.name + '{literal}'"}] + [
        {"name": f"v{i}", "expression": f"variables.v{i - 1} + variables.v{i - 1}"}
        for i in range(1, 14)]
    bomb["spec"]["rules"][0]["when"] = "size(variables.v13) < 0"
    _refused(kubeconfig, bomb, "may allocate")
    # a good Policy changed to bad keeps its good spec
    changed = _policy(good, "grid.event.level + 'x'")
    code, err = _apply(kubeconfig, changed)
    assert code != 0 and "no matching overload" in err, err
    stored = json.loads(kubectl(kubeconfig, "get", "policies.m2g.io", good, "-o",
                                "json").stdout)
    assert stored["spec"]["rules"][0]["when"] == GOOD["spec"]["rules"][0]["when"]
    assert "webhook denied" in served.read_text()  # m2g run logged its denials


def test_tenant_policies_are_checked_the_same_way(kubeconfig: Path, served: Path) -> None:
    ns = unique("webhook-tenant")
    kubectl(kubeconfig, "create", "namespace", ns)
    try:
        tenant = {"apiVersion": "m2g.io/v1alpha1", "kind": "TenantPolicy",
                  "metadata": {"name": "cap", "namespace": ns,
                               "labels": {"m2g-e2e": "webhook"}},
                  "spec": {"stage": "Admission", "rules": [
                      {"name": "big", "when": "workload.gpus > 8", "decision": "Reject",
                       "message": "at most 8 GPUs"}]}}
        assert _apply(kubeconfig, tenant)[0] == 0
        # (one that admits the CRD itself refuses: decision is Defer or Reject there)
        typo = copy.deepcopy(tenant)
        typo["metadata"]["name"] = "typo"
        typo["spec"]["rules"][0]["when"] = "workload.gpus > '8'"
        _refused(kubeconfig, typo, "TenantPolicy/", "/big: when:", "no matching overload")
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)


def test_with_the_webhook_down_only_policy_writes_are_refused(
        kubeconfig: Path, served: Path, tmp_path: Path) -> None:
    """Fail closed, and only for m2g's Policies: a second configuration names a port nobody
    serves."""
    ca = _serving_pair(tmp_path / "certs")
    vwc = _configuration(unique("m2g-policy-compiler-down"), _free_port(), ca)
    name = unique("webhook-down")
    kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(_policy(name)))
    cm = unique("webhook-cm")
    try:
        kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=json.dumps(vwc))
        code, err = _apply(kubeconfig, _policy(unique("webhook-new")))
        assert code != 0 and "failed calling webhook" in err, err
        # a spec change of a stored one too
        code, err = _apply(kubeconfig, _policy(name, "grid.event.active"))
        assert code != 0 and "failed calling webhook" in err, err
        # not blocked: a label-only change, a delete, anything that is not a Policy
        kubectl(kubeconfig, "label", "policies.m2g.io", name, "team=x")
        kubectl(kubeconfig, "create", "configmap", cm, "-n", "default")
        kubectl(kubeconfig, "delete", "policies.m2g.io", name)
    finally:
        kubectl(kubeconfig, "delete", "validatingwebhookconfiguration",
                vwc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl(kubeconfig, "delete", "policies.m2g.io", name, "--ignore-not-found",
                check=False)
        kubectl(kubeconfig, "delete", "configmap", cm, "-n", "default", "--ignore-not-found",
                check=False)
