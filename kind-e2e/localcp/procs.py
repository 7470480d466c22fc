"""Process supervision: start a component detached, record its pid, wait until it is ready,
stop it by pid. Failures name the component and show the tail of its log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localcp import UserError
from localcp.paths import RunPaths


@dataclass
class Component:
    """One process of the control plane."""

    name: str
    argv: list[str]
    ready: Callable[[], bool]
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "    (no log file)"
    return "\n".join("    " + line[:300] for line in text[-lines:]) or "    (empty log)"


def _pid_file(run: RunPaths, name: str) -> Path:
    return run.pids / f"{name}.pid"


def read_pid(run: RunPaths, name: str) -> int | None:
    """The pid of a running component, or None (a stale pid file is ignored)."""
    try:
        pid_text, exe = _pid_file(run, name).read_text().split("\n", 1)
        pid = int(pid_text)
    except (FileNotFoundError, ValueError):
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None
    if state == "Z":
        return None
    # guards against a recycled pid; args[1] is the script when the "binary" is a #! script
    return pid if exe.strip() in args[:2] else None


def start(run: RunPaths, comp: Component) -> int:
    """Start ``comp`` in its own session with output to its log; returns the pid."""
    exe = comp.argv[0]
    if not Path(exe).exists():
        raise UserError(f"{comp.name}: binary {exe} not found; run `make cluster-build` first")
    run.logs.mkdir(parents=True, exist_ok=True)
    run.pids.mkdir(parents=True, exist_ok=True)
    log = run.log(comp.name)
    with log.open("ab") as out:
        out.write(f"\n==== {time.strftime('%F %T')} {' '.join(comp.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            comp.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=run.root, env={**os.environ, **comp.env},
        )
    _pid_file(run, comp.name).write_text(f"{proc.pid}\n{exe}\n")
    # Between fork and exec /proc/<pid>/cmdline is still Python's: wait for the exec so that
    # read_pid (which checks the command line against recycled pids) sees the component.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and proc.poll() is None:
        if read_pid(run, comp.name) is not None:
            break
        time.sleep(0.01)
    return proc.pid


def wait_ready(run: RunPaths, comp: Component) -> float:
    """Wait until ``comp.ready()``; returns seconds waited. Raises UserError naming the
    component and showing the tail of its log if it exits or times out."""
    t0 = time.monotonic()
    log = run.log(comp.name)
    while True:
        if read_pid(run, comp.name) is None:
            raise UserError(f"{comp.name} exited during start-up; last lines of {log}:\n"
                            + log_tail(log))
        try:
            if comp.ready():
                return time.monotonic() - t0
        except Exception:
            pass
        if time.monotonic() - t0 > comp.timeout:
            raise UserError(f"{comp.name} did not become ready in {comp.timeout:.0f}s; "
                            f"last lines of {log}:\n" + log_tail(log))
        time.sleep(0.25)


def stop(run: RunPaths, name: str, grace: float = 15.0) -> bool:
    """SIGTERM the component's process group, SIGKILL after ``grace``; True if it ran."""
    pid = read_pid(run, name)
    _pid = _pid_file(run, name)
    if pid is None:
        _pid.unlink(missing_ok=True)
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and read_pid(run, name) is not None:
        _reap(pid)
        time.sleep(0.1)
    if read_pid(run, name) is not None:
        _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
        _reap(pid)
    _pid.unlink(missing_ok=True)
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the component leads its own session/group
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pick_port(preferred: int, taken: set[int]) -> int:
    """``preferred`` if it is free (0: none), else a free ephemeral port; never one in
    ``taken``."""
    if preferred and preferred not in taken and port_free(preferred):
        return preferred
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port
    raise UserError(f"no free port found (wanted {preferred})")


def tls_ok(port: int, ctx: ssl.SSLContext, host: str = "127.0.0.1") -> bool:
    """A TLS handshake to ``host:port`` verified with ``ctx`` (i.e. our CA) succeeds."""
    try:
        with socket.create_connection((host, port), timeout=2) as raw, \
                ctx.wrap_socket(raw, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
