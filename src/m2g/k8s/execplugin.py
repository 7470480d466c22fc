"""Kubeconfig ``exec`` credential plugins, run with a bound (kr8s runs them without one).

kr8s runs a kubeconfig user's ``exec`` plugin (``aws eks get-token``, ``kubelogin``,
``gke-gcloud-auth-plugin``, ...) through anyio's ``run_process``, with no time limit; cancelling
it waits for the child, so a plugin that never exits held every m2g command until it did.
``install()`` puts ``run_plugin`` in its place (for the first connection and for kr8s's
re-authentication after a 401 alike): the plugin runs in its own session, with stdin from
``/dev/null`` unless it may prompt on the user's terminal, and

* gets ``EXEC_TIMEOUT`` seconds (``$M2G_EXEC_TIMEOUT`` sets it) to print its credentials;
  then it is killed — its whole process group, so a shell script's children go too — and
  the error is one line naming the plugin (``ExecPluginError``, a ``PermanentError``);
* may print at most ``MAX_OUTPUT`` bytes (more: killed, one line);
* exiting non-zero is one line with the plugin's name, its code and its last stderr line.

Cancelling the caller (the 30 s bound on the first request) kills the plugin the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from m2g.errors import PermanentError

#: Seconds an exec plugin may take to print its credentials (``$M2G_EXEC_TIMEOUT``).
EXEC_TIMEOUT = 20.0
#: The longest bound ``$M2G_EXEC_TIMEOUT`` may set (an interactive login: 10 minutes).
MAX_EXEC_TIMEOUT = 600.0
#: Bytes an exec plugin may print on stdout (an ExecCredential is a few KB).
MAX_OUTPUT = 1 << 20
_STDERR_KEPT = 4096
ENV = "M2G_EXEC_TIMEOUT"


class ExecPluginError(PermanentError):
    """The plugin gave no credentials: it timed out, printed too much, failed or is missing."""


def exec_timeout(environ: Mapping[str, str] | None = None) -> float:
    """The bound from ``$M2G_EXEC_TIMEOUT`` (seconds, > 0, at most 600), else the default;
    a value that is not one is a ``PermanentError`` (one line)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return EXEC_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_EXEC_TIMEOUT):
        raise PermanentError(f"${ENV}={value[:40]!r}: seconds in (0, {MAX_EXEC_TIMEOUT:g}]")
    return seconds


class _KilledChildNoise(logging.Filter):
    """asyncio's child watcher logs "Unknown child process pid N, will report returncode
    255" when a child it watches was reaped before it (seen once in CI after the group kill
    of a plugin m2g had timed out): the plugin is gone and m2g reports it in its own line,
    so that warning is only a second, confusing line on stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unknown child process pid")


logging.getLogger("asyncio").addFilter(_KilledChildNoise())


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is its pid
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the plugin's group, close its pipes and wait for it. The pipes are closed before
    waiting: asyncio's wait() returns only once every pipe has disconnected, and a stdout m2g
    stopped reading (more than MAX_OUTPUT) is paused, so its end was never seen: wait() hung,
    the call failed on the caller's bound instead (50 s), and the transport's finaliser
    printed a traceback on a closed loop."""
    _kill(proc)
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
    with contextlib.suppress(Exception):
        await asyncio.shield(proc.wait())


async def _spawn(name: str, args: tuple[Any, ...], env: Mapping[str, str] | None
                 ) -> asyncio.subprocess.Process:
    """Start the plugin in its own session. A caller that gives up while asyncio is still
    connecting the pipes does not cancel the spawn itself: cancelled there, asyncio killed
    the plugin but not its children, which held the pipes open, and its clean-up waited for
    pipes never connected — the call never ended (1 cancellation in ~3 at that instant,
    Python 3.11). The spawn finishes, then the group is killed and the cancellation goes on."""
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        name, *map(str, args), env=dict(env) if env is not None else None,
        stdin=None if _interactive() else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await _end(await spawn)
        raise
    except OSError as exc:  # missing, not executable: connect says it in one line
        raise ExecPluginError(f"exec plugin {name}: {exc.strerror or exc}") from None


async def _read(stream: asyncio.StreamReader, limit: int, keep_tail: bool) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes (the last ``limit`` with ``keep_tail``) until EOF; and whether
    there was more (stdout: more than it may print)."""
    data = bytearray()
    over = False
    while chunk := await stream.read(65536):
        data += chunk
        if len(data) > limit:
            if not keep_tail:
                return bytes(data[:limit]), True
            del data[:-limit]
            over = True
    return bytes(data), over


def _interactive() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return False


async def run_plugin(command: str, *args: Any, env: Mapping[str, str] | None = None,
                     timeout: float | None = None, **_: Any) -> str:
    """The plugin's stdout (its ExecCredential JSON), within the bound; see the module
    docstring. ``command`` and ``args`` as in the kubeconfig; same signature as kr8s's."""
    bound = exec_timeout() if timeout is None else timeout
    name = str(command)
    proc = await _spawn(name, args, env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(bound):
            out_task = asyncio.ensure_future(_read(proc.stdout, MAX_OUTPUT, False))
            err_task = asyncio.ensure_future(_read(proc.stderr, _STDERR_KEPT, True))
            try:
                out, too_much = await out_task
                if too_much:
                    raise ExecPluginError(f"exec plugin {name} printed more than "
                                         f"{MAX_OUTPUT:,} bytes; killed it")
                err, _cut = await err_task
                code = await proc.wait()
            finally:
                for task in (out_task, err_task):
                    task.cancel()
    except TimeoutError:
        raise ExecPluginError(f"exec plugin {name} gave no credentials within "
                             f"{bound:g}s; killed it (${ENV} sets the bound)") from None
    finally:
        await _end(proc)
    if code != 0:
        last = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
        raise ExecPluginError(f"exec plugin {name} exited with code {code}"
                           + (f": {' '.join(last.split())[:200]}" if last else ""))
    return out.decode("utf-8", "replace")


def install() -> None:
    """Make kr8s run exec plugins with ``run_plugin`` (idempotent). kr8s's ``_auth`` calls
    ``check_output(command, *args, env=env)``; if a kr8s release renames it, the unit test
    ``test_kr8s_runs_exec_plugins_through_m2g`` fails."""
    from kr8s import _auth

    _auth.check_output = run_plugin  # type: ignore[attr-defined]
