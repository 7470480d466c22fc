"""The admin kubeconfig (the shape envtest writes), used by every component and the tests."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, pki: Path, server: str, name: str = "m2g-dev") -> None:
    """Write a kubeconfig for user admin (system:masters) with embedded certificates."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {
                "server": server, "certificate-authority-data": _b64(pki / "ca.crt")}},
        ],
        "users": [
            {"name": "admin", "user": {
                "client-certificate-data": _b64(pki / "admin.crt"),
                "client-key-data": _b64(pki / "admin.key"),
            }},
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
