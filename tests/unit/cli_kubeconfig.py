"""A kubeconfig for CLI tests: contexts on one unreachable cluster, each with its namespace,
and an environment that reads no other kubeconfig, Prometheus or site configuration."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tests.unit.templates_helpers import TEMPLATES


def cli_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   contexts: Mapping[str, str | None], current: str) -> Path:
    """Write it under ``tmp_path`` (``contexts``: name → namespace, None for none)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("M2G_TEMPLATES", str(TEMPLATES))
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "M2G_PROMETHEUS_URL", "M2G_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": "u",
                                             **({"namespace": ns} if ns else {})}}
                     for n, ns in contexts.items()]}))
    return path
