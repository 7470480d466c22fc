"""One default namespace for every command: what ``m2g workloads``/``explain`` read (the
cluster read path) and what ``m2g submit`` writes into its manifests come from the same
function, ``m2g.k8s.kubeconfig.context_namespace`` — also under ``--context`` naming a context
that is not the current one (kr8s's own ``namespace`` is the current context's there)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from m2g.k8s.build import ClusterObjects
from m2g.k8s.kubeconfig import context_namespace
from m2g.k8s.snapshot import Listed
from m2g_cli import cluster
from m2g_cli.app import app
from tests.unit.cli_kubeconfig import cli_kubeconfig

POLICIES = Path(__file__).parents[2] / "policies"
CONTEXTS = {"dev": "research", "prod": "production", "bare": None}


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return cli_kubeconfig(tmp_path, monkeypatch, CONTEXTS, "dev")


class _Kube:
    """What connect returns: kr8s's view of the namespace is the current context's."""

    namespace = "research"

    async def list(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"items": []}

    async def close(self) -> None:
        return None


def _read_path_namespace(monkeypatch: pytest.MonkeyPatch, cfg: Path, ctx: str | None) -> str:
    async def connect(*_: Any, **__: Any) -> _Kube:
        return _Kube()

    async def list_objects(*_: Any) -> Listed:
        return Listed(ClusterObjects())

    monkeypatch.setattr(cluster.k, "connect", connect)
    monkeypatch.setattr(cluster, "list_objects", list_objects)
    return asyncio.run(cluster.read(str(cfg), ctx)).namespace


def _submit_namespace(cfg: Path, ctx: str | None) -> str:
    args = ["submit", "llama31-8b-finetune", "--dry-run", "--kubeconfig", str(cfg),
            "--policies", str(POLICIES), *(["--context", ctx] if ctx else [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return str(yaml.safe_load(result.stdout)["metadata"]["namespace"])


@pytest.mark.parametrize("ctx", [None, "dev", "prod", "bare"])
def test_read_commands_and_submit_default_to_the_same_namespace(
        monkeypatch: pytest.MonkeyPatch, kubeconfig: Path, ctx: str | None) -> None:
    expected = CONTEXTS[ctx or "dev"] or "default"
    assert context_namespace(str(kubeconfig), ctx) == expected
    assert _submit_namespace(kubeconfig, ctx) == expected
    assert _read_path_namespace(monkeypatch, kubeconfig, ctx) == expected
