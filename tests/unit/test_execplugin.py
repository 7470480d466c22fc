"""Kubeconfig exec credential plugins (m2g.k8s.execplugin): a bound on their time and output,
the plugin killed with its children when the bound or the caller gives up, one line naming it.

No test measures time: a plugin that never exits either ends in the documented error (the
fix) or holds the test until the subprocess guard of ``_m2g`` gives up (without it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from m2g.k8s import client as c
from m2g.k8s import execplugin

M2G = str(Path(sys.executable).parent / "m2g")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _plugin(tmp_path: Path, body: str) -> Path:
    """A plugin script: writes its own pid and its child's to ``pids``, then ``body``."""
    script = tmp_path / "plugin.sh"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {tmp_path}/pids\n{body}\n")
    script.chmod(0o755)
    return script


def _pids(tmp_path: Path) -> list[int]:
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def _kubeconfig(tmp_path: Path, command: Path | str, args: str = "[]") -> Path:
    path = tmp_path / "kc"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\n"
        "users:\n- name: u\n  user:\n    exec:\n"
        "      apiVersion: client.authentication.k8s.io/v1\n"
        f"      command: {command}\n      args: {args}\n"
        "contexts:\n- name: c\n  context: {cluster: k, user: u}\n")
    return path


async def test_a_plugin_that_never_exits_is_killed_with_its_children(tmp_path: Path) -> None:
    script = _plugin(tmp_path, "wait")
    with pytest.raises(execplugin.ExecPluginError) as err:
        await execplugin.run_plugin(str(script), timeout=0.5)
    assert str(err.value) == (f"exec plugin {script} gave no credentials within 0.5s; "
                              "killed it ($M2G_EXEC_TIMEOUT sets the bound)")
    assert not any(_alive(pid) for pid in _pids(tmp_path))


def test_the_bound_comes_from_the_environment() -> None:
    assert execplugin.exec_timeout({}) == execplugin.EXEC_TIMEOUT == 20.0
    assert execplugin.exec_timeout({"M2G_EXEC_TIMEOUT": " 90 "}) == 90.0
    for bad in ("x", "0", "-1", "nan", "inf", "601"):
        with pytest.raises(c.PermanentError, match=r"^\$M2G_EXEC_TIMEOUT="):
            execplugin.exec_timeout({"M2G_EXEC_TIMEOUT": bad})


async def test_kr8s_runs_exec_plugins_through_m2g(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """connect() installs the bounded runner where kr8s looks for it (also used when kr8s
    re-authenticates after a 401), and says which kubeconfig and plugin in one line."""
    from kr8s import _auth

    monkeypatch.setenv("M2G_EXEC_TIMEOUT", "0.5")
    script = _plugin(tmp_path, "wait")
    with pytest.raises(c.PermanentError) as err:
        await asyncio.wait_for(c.connect(str(_kubeconfig(tmp_path, script))), 120)
    assert _auth.check_output is execplugin.run_plugin
    assert str(err.value) == (f"cannot load Kubernetes credentials from {tmp_path}/kc: exec "
                              f"plugin {script} gave no credentials within 0.5s; killed it "
                              "($M2G_EXEC_TIMEOUT sets the bound)")
    assert not any(_alive(pid) for pid in _pids(tmp_path))


def test_m2g_with_a_plugin_that_never_exits_is_one_line_exit_1(tmp_path: Path) -> None:
    """The real CLI in a subprocess (the probe's case): before the fix it waited for the
    plugin (600 s); the guard's limit only stops a hanging test, it is not the assertion."""
    script = _plugin(tmp_path, "exec sleep 600")
    env = {**os.environ, "HOME": str(tmp_path), "M2G_EXEC_TIMEOUT": "1", "NO_COLOR": "1"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.run([M2G, "queues", "--kubeconfig", str(_kubeconfig(tmp_path, script))],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (f"error: cannot load Kubernetes credentials from {tmp_path}/kc: exec "
                           f"plugin {script} gave no credentials within 1s; killed it "
                           "($M2G_EXEC_TIMEOUT sets the bound)\n")
    assert not any(_alive(pid) for pid in _pids(tmp_path))
