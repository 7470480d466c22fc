"""Where things live: the repo's kind-e2e folder, the build cache and the run directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KIND_E2E = Path(__file__).resolve().parent.parent
TOOLS = KIND_E2E / "tools"
FACTORIES = KIND_E2E / "factories"
MANIFESTS = KIND_E2E / "manifests"


def cache_dir() -> Path:
    """The build cache (Go module cache, Go build cache, binaries): ``$M2G_CACHE``."""
    return Path(os.environ.get("M2G_CACHE", str(Path.home() / ".cache" / "m2g")))


def default_run_dir() -> Path:
    return cache_dir() / "run"


def run_dir() -> Path:
    """State of the running control plane (pids, logs, PKI, kubeconfig): ``$M2G_RUN``."""
    return Path(os.environ.get("M2G_RUN", str(default_run_dir())))


def read_versions() -> dict[str, str]:
    """Parse kind-e2e/versions.env (KEY=VALUE lines, ``#`` comments)."""
    out: dict[str, str] = {}
    for raw in (KIND_E2E / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


# binary name -> key of its version in versions.env
_VERSION_KEY = {
    "etcd": "ETCD_VERSION",
    "kube-apiserver": "KUBERNETES_VERSION",
    "kube-controller-manager": "KUBERNETES_VERSION",
    "kube-scheduler": "KUBERNETES_VERSION",
    "kubectl": "KUBERNETES_VERSION",
    "kwok": "KWOK_VERSION",
    "kueue": "KUEUE_VERSION",
    "jobset": "JOBSET_VERSION",
    "helm": "HELM_VERSION",
}
#: Not built by ``localcp build``/``up``: helm, a tool of the chart's tests
#: (``kind-e2e/tools/build.sh helm``, make test-e2e does it).
TOOL_BINARIES = ("helm",)
#: What the control plane runs (built on demand by ``localcp build``/``up``).
BINARIES = tuple(b for b in _VERSION_KEY if b not in TOOL_BINARIES)


def binary(name: str) -> Path:
    """Path of a cached binary: ``$M2G_CACHE/bin/<name>-<version>/<name>``."""
    version = read_versions()[_VERSION_KEY[name]]
    return cache_dir() / "bin" / f"{name}-{version}" / name


def module_dir(module: str, version: str) -> Path:
    """Directory of a Go module in our module cache (after ``go mod download``).

    Uppercase letters are escaped as ``!x`` the way the Go module cache does it.
    """
    escaped = "".join(f"!{c.lower()}" if c.isupper() else c for c in module)
    return cache_dir() / "gomod" / f"{escaped}@{version}"


@dataclass(frozen=True)
class RunPaths:
    """Files of one running control plane under the run directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def kueue_certs(self) -> Path:
        return self.root / "kueue-webhook-certs"

    @property
    def jobset_certs(self) -> Path:
        return self.root / "jobset-webhook-certs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def run_paths() -> RunPaths:
    return RunPaths(run_dir())
