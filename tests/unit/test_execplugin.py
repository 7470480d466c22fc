"""Kubeconfig exec credential plugins (m2g.k8s.execplugin): a bound on their time and output,
the plugin killed with its children when the bound or the caller gives up, one line naming it.

No test measures time: a plugin that never exits either ends in the documented error (the
fix) or holds the test until a guard (120 s) gives up (without it). That the plugin and its
child have ended is learnt from the kernel (a pidfd becomes readable when its process
exits), not by looking at /proc at some instant: the group's SIGKILL is delivered at once but
a grandchild nobody waits for dies a moment later."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from m2g.k8s import client as c
from m2g.k8s import execplugin

M2G = str(Path(sys.executable).parent / "m2g")


#: the most a test waits for a plugin to end or to start (a guard, not an assertion)
GUARD = 120.0


def _pidfds(pids: list[int]) -> list[int]:
    """A pidfd per process still there (one already reaped has ended: none)."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    return fds


def _all_end(pids: list[int] | None = None, fds: list[int] | None = None) -> bool:
    """Whether every process (``pids``, or already opened ``fds``) has ended or ends within
    GUARD seconds: the kernel makes a pidfd readable when its process exits (a zombie nobody
    reaped has ended)."""
    waiting = set(fds if fds is not None else _pidfds(pids or []))
    try:
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [], GUARD)
            if not ready:
                return False
            waiting -= set(ready)
        return True
    finally:
        for fd in fds if fds is not None else []:
            os.close(fd)


def _plugin(tmp_path: Path, body: str) -> Path:
    """A plugin script: writes its own pid and its child's to ``pids`` (whole, by a rename),
    then ``body``."""
    script = tmp_path / "plugin.sh"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {tmp_path}/pids.new\n"
                      f"mv {tmp_path}/pids.new {tmp_path}/pids\n{body}\n")
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
    assert _all_end(_pids(tmp_path))


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
    assert _all_end(_pids(tmp_path))


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
    assert _all_end(_pids(tmp_path))


async def _started(tmp_path: Path, call: asyncio.Future[str]) -> list[int]:
    """The plugin's pids once it has written them (the call still running)."""
    for _ in range(int(GUARD * 100)):
        if (tmp_path / "pids").exists():
            return _pids(tmp_path)
        assert not call.done(), call.result()
        await asyncio.sleep(0.01)
    raise AssertionError("the plugin did not start")


async def test_cancelling_the_call_kills_the_plugin_and_its_children(tmp_path: Path) -> None:
    """The caller gives up (connect's 30 s bound on the first request, Ctrl-C) long before
    the plugin's own bound: the plugin's whole process group is killed, not left running."""
    script = _plugin(tmp_path, "wait")
    call = asyncio.ensure_future(execplugin.run_plugin(str(script), timeout=600))
    fds = _pidfds(await _started(tmp_path, call))
    assert len(fds) == 2  # the plugin and its child, both running
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, GUARD)
    assert _all_end(fds=fds)


def _locked_plugin(tmp_path: Path) -> Path:
    """A plugin that takes a lock on ``lock`` (fd 9, which its child inherits), then starts a
    child and waits: the lock is free again only once the plugin and its child have ended."""
    script = tmp_path / "plugin.sh"
    script.write_text(f"#!/bin/sh\nexec 9>>{tmp_path}/lock\nflock 9\nsleep 600 &\nwait\n")
    script.chmod(0o755)
    (tmp_path / "lock").touch()
    return script


def _lock_freed(path: Path) -> bool:
    """Whether the lock on ``path`` is free or frees within GUARD (a guard, not a timing)."""
    with path.open("a") as f:
        for _ in range(int(GUARD * 20)):
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                time.sleep(0.05)
    return False


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs util-linux's flock(1)")
@pytest.mark.parametrize("steps", range(8))
async def test_cancelling_while_the_plugin_starts_ends_the_call_and_the_plugin(
        tmp_path: Path, steps: int) -> None:
    """The caller gives up while asyncio is still starting the plugin (``steps`` turns of the
    loop after the call): before the fix a cancellation during asyncio's own spawn left the
    plugin's child holding the pipes and the call never ended (the guard's TimeoutError; about
    one call in three at steps 1–3), with the child left running. Three calls a step."""
    script = _locked_plugin(tmp_path)
    for _ in range(3):
        call = asyncio.ensure_future(execplugin.run_plugin(str(script), timeout=600))
        for _ in range(steps):
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, GUARD)
        assert _lock_freed(tmp_path / "lock")


#: an endless printer with a pipe of 1 MiB (F_SETPIPE_SZ), always full: when m2g stops
#: reading, far more than asyncio's 128 KiB is still to read
FLOOD = (f"exec {sys.executable} -c 'import fcntl, os\nfcntl.fcntl(1, 1031, 1 << 20)\n"
         "while True: os.write(1, b\"x\" * 65536)'")


async def test_a_plugin_that_prints_more_than_1_mib_is_killed(tmp_path: Path) -> None:
    """An endless printer (within its time bound: 600 s): read up to MAX_OUTPUT, then the
    plugin and its child are killed and the error is one line. Without the bound the read
    never ends; and without closing the pipes m2g stopped reading, asyncio's wait() never
    returned (a paused pipe's end is never seen) — the guard's TimeoutError fails either."""
    script = _plugin(tmp_path, FLOOD)
    with pytest.raises(execplugin.ExecPluginError) as err:
        await asyncio.wait_for(execplugin.run_plugin(str(script), timeout=600), GUARD)
    assert str(err.value) == f"exec plugin {script} printed more than 1,048,576 bytes; killed it"
    assert _all_end(_pids(tmp_path))


@pytest.mark.parametrize("extra", [0, 1])
async def test_the_output_bound_is_exactly_1_mib(tmp_path: Path, extra: int) -> None:
    """MAX_OUTPUT bytes are credentials (returned whole); one byte more is refused."""
    size = execplugin.MAX_OUTPUT + extra
    assert execplugin.MAX_OUTPUT == 1 << 20
    script = _plugin(tmp_path, f"head -c {size} /dev/zero | tr '\\0' x\nkill $!")
    call = execplugin.run_plugin(str(script), timeout=600)
    if extra:
        with pytest.raises(execplugin.ExecPluginError, match="printed more than 1,048,576"):
            await asyncio.wait_for(call, GUARD)
    else:
        assert await asyncio.wait_for(call, GUARD) == "x" * size
    assert _all_end(_pids(tmp_path))
