"""Every case of the hostile-input probe (tests/fuzz/cli_probe.py) as a regression test, run
in-process through typer's CliRunner: no traceback, the documented exit code, one ``error:``
line, and no Admit for an input that must not be decided (docs/reliability.md, "The CLI
probe"). ``python -m tests.fuzz.cli_probe`` runs the same cases as subprocesses with time and
memory limits."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g_cli.app import app
from tests.fuzz.cli_probe import Case, all_cases, materialise, verdict

CASES = all_cases()
#: Cases a subprocess runs better: an exec plugin that sleeps for 600 s would hold the test
#: process itself (the subprocess runner checks it with its time limit).
SUBPROCESS_ONLY = {"kubeconfig:queues-exec-sleeps", "kubeconfig:submit-exec-sleeps"}


def _restore(root: Path) -> None:
    """Let pytest remove the case's folder (unreadable files and folders included)."""
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("case", [c for c in CASES if c.id not in SUBPROCESS_ONLY],
                         ids=lambda c: c.id)
def test_probe_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "case"
    argv, env = materialise(case, root)
    if "ro" in case.files:
        (root / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.chdir(root)
    base = {"HOME": str(root), "KUBECONFIG": str(root / "no-kubeconfig"), "NO_COLOR": "1"}
    for key in ("M2G_TEMPLATES", "M2G_PROMETHEUS_URL", "M2G_CONFIG", "KUBERNETES_SERVICE_HOST",
                "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(key, raising=False)
    try:
        res = CliRunner().invoke(app, argv, input=case.stdin, env={**base, **env})
    finally:
        _restore(root)
    exc = res.exception
    leaked = exc is not None and not isinstance(exc, SystemExit)
    kind = "traceback" if leaked else verdict(case, res.exit_code, res.stdout, res.stderr)
    assert kind is None, (f"{case.id}: {kind} (exit {res.exit_code}): {exc!r}\n"
                          f"stdout: {res.stdout[-500:]}\nstderr: {res.stderr[-500:]}")


def test_the_probe_covers_every_entry_point() -> None:
    areas = {c.area for c in CASES}
    assert areas >= {"policy-lint", "policy-test", "policy-eval-dir", "policy-eval-input",
                     "policy-eval-stdin", "policy-examples", "templates", "submit",
                     "kubeconfig", "env", "run-config", "run-options"}
    assert len(CASES) > 900 and len({c.id for c in CASES}) == len(CASES)
