"""Processes of the demo: start in their own process group, wait for readiness, stop cleanly.

Every failure the demo expects is a ``DemoError``: one line naming the component and its log,
plus the last lines of that log; ``run_demo.main`` prints it without a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DemoError(Exception):
    """An expected failure: printed as one line (plus a log tail), exit code 1."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + ln[:240] for ln in text)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET without proxies; (0, b"") when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except OSError:
        return 0, b""


def http_json(url: str, timeout: float = 2.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        return None
    with contextlib.suppress(ValueError):
        return json.loads(body)
    return None


@dataclass
class Proc:
    """One supervised process (its own session, so a group signal reaches its children)."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **self.env})
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def failure(self, what: str) -> DemoError:
        return DemoError(f"{self.name} {what}; last lines of {self.log}:\n{tail(self.log)}")

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if not self.alive():
                code = self.popen.returncode if self.popen else "?"
                raise self.failure(f"exited with code {code} during start-up")
            if time.monotonic() > deadline:
                raise self.failure(f"did not become ready in {timeout:.0f}s")
            time.sleep(0.3)

    def stop(self, grace: float = 10.0) -> None:
        if not self.alive() or self.popen is None:
            return
        stop_group(self.popen.pid, grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)


def stop_group(pgid: int, grace: float = 10.0) -> None:
    """SIGTERM to the process group ``pgid``, SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # a zombie leader still counts; look for a live member
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
