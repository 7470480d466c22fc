"""kubectl-style label selectors (m2g_cli.selectors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g_cli.app import app
from m2g_cli.selectors import SelectorError, parse_selector

LABELS = {"app": "train", "tier": "2", "m2g.io/workload-kind": "training"}


@pytest.mark.parametrize(("selector", "matches"), [
    ("", True), ("app=train", True), ("app==train", True), ("app!=train", False),
    ("app=serve", False), ("app", True), ("!app", False), ("!missing", True),
    ("tier in (1,2)", True), ("tier notin (1, 2)", False), ("tier in (3)", False),
    ("app=train,tier in (2,3)", True), ("app=train,tier=3", False),
    ("m2g.io/workload-kind=training", True), ("missing!=x", True),
])
def test_selector_matches_like_kubectl(selector: str, matches: bool) -> None:
    assert parse_selector(selector)(LABELS) is matches


@pytest.mark.parametrize("bad", ["app=(x", "tier in (1,2", "a b c", "=x"])
def test_unreadable_selector_is_one_error(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(bad)


@pytest.mark.parametrize(("args", "start"), [
    (["workloads", "-l", "a in (b"], "error: selector 'a in (b': unbalanced '('"),
    (["workloads", "--sort-by", "name"], "error: --sort-by 'name': not a field path"),
    (["queues", "--sort-by", "{.gpus"], "error: --sort-by '{.gpus': not a field path"),
])
def test_bad_selector_or_sort_key_is_exit_2_before_any_cluster_read(
        args: list[str], start: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig anywhere: had the command read the cluster first, it would exit 1."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(start) and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""
