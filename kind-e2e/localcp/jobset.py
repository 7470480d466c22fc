"""The JobSet controller (sigs.k8s.io/jobset) outside a cluster: its v1alpha2 CRD, its
Configuration, and its webhooks registered with the API server as 127.0.0.1 URLs.

JobSet makes one child Job per replicated job replica (and a headless Service); Kueue's
``jobset.x-k8s.io/jobset`` integration suspends a JobSet until it is admitted and then injects
the node selectors of its topology assignment into the child Jobs' pod templates. Everything
upstream is read from the JobSet module in the Go module cache (the wrapper module
kind-e2e/tools/jobset pins it); nothing is copied into the repository.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from localcp import UserError
from localcp.gomod import ensure_module
from localcp.kube import Kube, Obj, on_localhost
from localcp.paths import read_versions
from localcp.pki import write_atomic

NAMESPACE = "jobset-system"
WEBHOOK_PREFIX = "m2g-jobset-"
CRD_NAME = "jobsets.jobset.x-k8s.io"
#: Kueue's integration name for JobSet (its Configuration's integrations.frameworks)
KUEUE_FRAMEWORK = "jobset.x-k8s.io/jobset"
_WEBHOOKS = "config/components/webhook"
_CONFIGS = ("mutating-webhook-configuration", "validating-webhook-configuration")


def jobset_dir() -> Path:
    return ensure_module("sigs.k8s.io/jobset", read_versions()["JOBSET_VERSION"], "jobset")


def crds(root: Path | None = None) -> list[Obj]:
    """The CRDs of config/components/crd/bases (one: jobsets.jobset.x-k8s.io)."""
    base = (root or jobset_dir()) / "config/components/crd/bases"
    out: list[Obj] = []
    for path in sorted(base.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text())
                   if d and d.get("kind") == "CustomResourceDefinition")
    if not out:
        raise UserError(f"no JobSet CRD found under {base}")
    return out


def config(run_root: Path, cert_dir: Path, ports: dict[str, int]) -> str:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1) for running out of cluster:
    every server on 127.0.0.1, our certificates (no internal cert rotation: it would need the
    in-cluster Secret and Service), no leader election. Returns the file's path."""
    cfg: dict[str, Any] = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": "127.0.0.1", "port": ports["jobset_webhook"],
                    "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['jobset_metrics']}",
                    "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['jobset_health']}"},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 300, "burst": 500},
    }
    path = run_root / "jobset.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def command(binary: Path, config_file: str, kubeconfig: Path) -> list[str]:
    """The controller's command line (flags left unset so the Configuration's values hold)."""
    return [str(binary), f"--config={config_file}", f"--kubeconfig={kubeconfig}",
            "--zap-devel=false", "--zap-log-level=info"]


def install_certs(pki: Path, cert_dir: Path) -> None:
    """The machine's webhook serving pair (SAN 127.0.0.1; pki.ensure_serving_pki) as
    tls.crt/tls.key in the run's JobSet certDir (webhook and metrics servers)."""
    try:
        cert_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(cert_dir / "tls.crt", (pki / "webhook.crt").read_bytes())
        write_atomic(cert_dir / "tls.key", (pki / "webhook.key").read_bytes(), 0o600)
    except OSError as exc:
        raise UserError(f"cannot write JobSet's certificates to {cert_dir} "
                        f"({exc.strerror})") from exc


def _patched(doc: Obj, patches: list[Obj]) -> Obj:
    """Apply upstream's kustomize JSON patches (``replace /webhooks/<i>`` only) to ``doc``."""
    obj = copy.deepcopy(doc)
    for op in patches:
        parts = str(op.get("path", "")).strip("/").split("/")
        if op.get("op") != "replace" or len(parts) != 2 or parts[0] != "webhooks" \
                or not parts[1].isdigit() or int(parts[1]) >= len(obj.get("webhooks", [])):
            raise UserError(f"unexpected patch in JobSet's webhook kustomization: {op}")
        obj["webhooks"][int(parts[1])] = copy.deepcopy(op["value"])
    return obj


def webhook_configurations(ca_pem: bytes, port: int, root: Path | None = None) -> list[Obj]:
    """JobSet's webhook manifests as its kustomization renders them (the pod webhooks limited
    to pods labelled ``jobset.sigs.k8s.io/jobset-name``), every clientConfig rewritten to
    ``https://127.0.0.1:<port><path>`` with our CA bundle, renamed with a prefix."""
    base = (root or jobset_dir()) / _WEBHOOKS
    kust = yaml.safe_load((base / "kustomization.yaml").read_text())
    patches: dict[str, list[Obj]] = {}
    for entry in kust.get("patches") or []:
        target = str(entry.get("target", {}).get("name", ""))
        patches.setdefault(target, []).extend(
            yaml.safe_load((base / entry["path"]).read_text()) or [])
    bundle = base64.b64encode(ca_pem).decode()
    out: list[Obj] = []
    for doc in yaml.safe_load_all((base / "manifests.yaml").read_text()):
        if not doc:
            continue
        name = str(doc["metadata"]["name"])
        out.append(on_localhost(_patched(doc, patches.get(name, [])), WEBHOOK_PREFIX + name,
                                port, bundle))
    return out


def delete_webhooks(kube: Kube) -> None:
    """Remove our webhook configurations (before JobSet stops: they are failurePolicy Fail)."""
    for kind, name in zip(("mutatingwebhookconfigurations", "validatingwebhookconfigurations"),
                          _CONFIGS, strict=True):
        kube.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_PREFIX}{name}")
