"""Kueue outside a cluster: its configuration, its v1beta2 CRDs and its webhooks registered
with the API server as 127.0.0.1 URLs (so an un-suspended Job is suspended as in a cluster)."""

from __future__ import annotations

import base64
import copy
import os
from pathlib import Path
from typing import Any

import yaml

from localcp import UserError, jobset
from localcp.gomod import ensure_module
from localcp.kube import Kube, Obj, on_localhost
from localcp.paths import KIND_E2E, read_versions
from localcp.pki import VISIBILITY_SERVICE, write_atomic

NAMESPACE = "kueue-system"
WEBHOOK_PREFIX = "m2g-kueue-"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # hard-coded in cmd/kueue/main.go
VISIBILITY_CERTS = Path("/visibility")  # hard-coded in pkg/visibility/server.go
VISIBILITY_APISERVICE = "v1beta2.visibility.kueue.x-k8s.io"
SHIPPED_CONFIG = KIND_E2E.parent / "kueue-config" / "kueue-manager" / \
    "controller_manager_config.yaml"


def kueue_dir() -> Path:
    return ensure_module("sigs.k8s.io/kueue", read_versions()["KUEUE_VERSION"], "kueue")


def crds() -> list[Obj]:
    """The 11 CRDs of config/components/crd/bases (v1beta2 storage; no conversion webhook)."""
    out: list[Obj] = []
    for path in sorted((kueue_dir() / "config/components/crd/bases").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def config(run_root: Path, cert_dir: Path, ports: dict[str, int]) -> str:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for running out of cluster."""
    cfg: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}",
                    "enableClusterQueueResources": True},
        "webhook": {"host": "127.0.0.1", "port": ports["kueue_webhook"],
                    "certDir": str(cert_dir)},
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": ports["kueue_visibility"]},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 300, "burst": 500},
        # JobSet: its controller runs beside Kueue (localcp.jobset), so Kueue suspends a JobSet
        # until admitted and places its child Jobs' pods where it admitted it
        "integrations": {"frameworks": ["batch/job", jobset.KUEUE_FRAMEWORK]},
        # the shipped Configuration's fair sharing, so ClusterQueue weights act here as on a site
        "fairSharing": shipped_config()["fairSharing"],
        # elastic Jobs (m2g's right-sizing, docs/curtailment.md) on the factory's TAS flavor:
        # ElasticJobsViaWorkloadSlices is Beta and on in v0.19; with TAS it also needs this
        # alpha gate (Kueue's flavor assigner and TAS snapshot only read it for elastic
        # workloads: every other workload is placed as before)
        "featureGates": {"ElasticJobsViaWorkloadSlicesWithTAS": True, **feature_gates()},
    }
    workers = os.environ.get("M2G_KUEUE_CONTROLLER", "").strip()
    if workers not in ("", "shipped"):
        raise UserError(f"M2G_KUEUE_CONTROLLER: {workers!r} is not 'shipped' (or unset)")
    if workers == "shipped":
        # the shipped Configuration's workers per kind (Job 5, Workload 10); unset: one each
        cfg["controller"] = shipped_config()["controller"]
    path = run_root / "kueue.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def feature_gates(env: str | None = None) -> dict[str, bool]:
    """Extra Kueue feature gates from ``$M2G_KUEUE_FEATURE_GATES`` (``Name=true,Other=false``:
    for an experiment, e.g. ``SchedulingEquivalenceHashing=false``; unset: none)."""
    raw = os.environ.get("M2G_KUEUE_FEATURE_GATES", "") if env is None else env
    out: dict[str, bool] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or value.strip().lower() not in ("true", "false"):
            raise UserError(f"M2G_KUEUE_FEATURE_GATES: {part!r} is not Name=true or Name=false")
        out[name.strip()] = value.strip().lower() == "true"
    return out


def log_level(env: str | None = None) -> str:
    """Kueue's ``--zap-log-level`` from ``$M2G_KUEUE_LOG_LEVEL`` (default ``info``; ``2`` or
    ``3``: the scheduler's V(2)/V(3) lines, e.g. "Bulk-moved equivalent workloads")."""
    raw = (os.environ.get("M2G_KUEUE_LOG_LEVEL", "") if env is None else env).strip() or "info"
    if raw not in ("debug", "info", "error") and not (raw.isdigit() and 0 < int(raw) <= 10):
        raise UserError(f"M2G_KUEUE_LOG_LEVEL: {raw!r} is not debug, info, error or 1-10")
    return raw


def shipped_config() -> Obj:
    """kueue-config/kueue-manager/controller_manager_config.yaml: Kueue's Configuration for a
    site m2g governs (fair sharing on)."""
    data: Obj = yaml.safe_load(SHIPPED_CONFIG.read_text())
    return data


def install_certs(pki: Path, cert_dir: Path) -> None:
    """The webhook pair as tls.crt/tls.key in certDir and in Kueue's two hard-coded paths
    (metrics server, visibility server); both are read when internal cert management is off.
    The pair is the same for every control plane on the machine (pki.ensure_serving_pki), and
    is written atomically and only when it differs, so a running Kueue never reloads another's."""
    for target in (cert_dir, METRICS_CERTS, VISIBILITY_CERTS):
        try:
            target.mkdir(parents=True, exist_ok=True)
            write_atomic(target / "tls.crt", (pki / "webhook.crt").read_bytes())
            write_atomic(target / "tls.key", (pki / "webhook.key").read_bytes(), 0o600)
        except OSError as exc:
            raise UserError(f"cannot write Kueue's certificates to {target} ({exc.strerror}): "
                            "Kueue reads them from that fixed path; run as root or make "
                            f"{METRICS_CERTS} and {VISIBILITY_CERTS} writable") from exc


def webhook_configurations(ca_pem: bytes, port: int) -> list[Obj]:
    """Kueue's webhook manifests with every clientConfig rewritten to
    ``https://127.0.0.1:<port><path>`` and our CA bundle, renamed with a prefix."""
    source = kueue_dir() / "config/components/webhook/manifests.yaml"
    bundle = base64.b64encode(ca_pem).decode()
    out: list[Obj] = []
    for doc in yaml.safe_load_all(source.read_text()):
        if not doc:
            continue
        out.append(on_localhost(copy.deepcopy(doc), WEBHOOK_PREFIX + doc["metadata"]["name"],
                                port, bundle))
    return out


def delete_webhooks(kube: Kube) -> None:
    """Remove our webhook configurations (before Kueue stops: most are failurePolicy Fail)."""
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for name in ("mutating-webhook-configuration", "validating-webhook-configuration"):
            kube.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_PREFIX}{name}")


def visibility_objects(ca_pem: bytes, port: int) -> list[Obj]:
    """Service + APIService routing visibility.kueue.x-k8s.io/v1beta2 to Kueue on 127.0.0.1.

    The aggregator resolves an ExternalName Service to ``https://<externalName>:<port>`` and
    checks the certificate for ``<service>.<namespace>.svc`` (a SAN of our webhook cert).
    """
    label = {"app.kubernetes.io/managed-by": "m2g-localcp"}
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE, "labels": label},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": VISIBILITY_APISERVICE, "labels": label},
         "spec": {"group": "visibility.kueue.x-k8s.io", "version": "v1beta2",
                  "groupPriorityMinimum": 100, "versionPriority": 100,
                  "caBundle": base64.b64encode(ca_pem).decode(),
                  "service": {"namespace": NAMESPACE, "name": VISIBILITY_SERVICE,
                              "port": port}}},
    ]
