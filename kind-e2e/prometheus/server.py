"""Start and stop a local ``prometheus`` (Debian package) on 127.0.0.1.

Use ``PrometheusServer`` as a context manager in tests, or ``argv`` + ``write_config`` + ``ready``
to supervise it elsewhere (e.g. as a localcp ``Component``). Retention defaults to 100 years
so that backfilled blocks are never dropped whatever the recording date.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import string
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from prometheus import PrometheusFailed, PrometheusUnavailable

TEMPLATE = Path(__file__).with_name("prometheus.yml.tmpl")


def binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; ``$M2G_PROMETHEUS_BIN`` (a folder) wins."""
    folder = os.environ.get("M2G_PROMETHEUS_BIN")
    found = str(Path(folder) / name) if folder else shutil.which(name)
    if not found or not Path(found).exists():
        raise PrometheusUnavailable(
            f"`{name}` not found: install Debian's prometheus package "
            "(apt-get install -y prometheus) or set M2G_PROMETHEUS_BIN")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, port: int, sim_targets: list[str] | None = None,
                 scrape_interval: str = "5s") -> Path:
    """Render prometheus.yml.tmpl to ``path`` (``sim_targets`` like ``127.0.0.1:9400``)."""
    text = string.Template(TEMPLATE.read_text()).substitute(
        port=port, scrape_interval=scrape_interval, sim_targets=json.dumps(sim_targets or []))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def argv(config: Path, tsdb: Path, port: int, retention: str = "100y") -> list[str]:
    return [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
            "--log.level=warn"]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join("    " + ln[:300] for ln in path.read_text().splitlines()[-lines:])
    except OSError:
        return "    (no log)"


@dataclass
class PrometheusServer:
    """A prometheus process in its own process group; stopped on exit from the ``with``."""

    workdir: Path
    sim_targets: list[str] = field(default_factory=list)
    port: int = 0
    scrape_interval: str = "5s"
    timeout: float = 30.0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tsdb(self) -> Path:
        return self.workdir / "tsdb"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self) -> PrometheusServer:
        self.port = self.port or free_port()
        config = write_config(self.workdir / "prometheus.yml", self.port, self.sim_targets,
                              self.scrape_interval)
        self.tsdb.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv(config, self.tsdb, self.port), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while not ready(self.url):
            if self.proc.poll() is not None:
                raise PrometheusFailed(f"prometheus exited with {self.proc.returncode} during "
                                       f"start-up; last lines of {self.log}:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusFailed(f"prometheus not ready in {self.timeout:.0f}s; last "
                                       f"lines of {self.log}:\n{_tail(self.log)}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
