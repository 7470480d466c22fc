"""Chaos on m2g's telemetry: Prometheus answering garbage, hanging, and killed during a grid
event, with ``m2g run`` (a process of its own) deciding on the local control plane.

A Prometheus stand-in serves rack power that follows the pods (chaos_helpers' model) and can
be switched: ``garbage`` answers a rotation of bodies no sensor or Prometheus should send
(+Inf, NaN, 1e300 and negative kW, timestamps an hour in the future, values that are not
numbers, metrics that are not maps, bodies that are not JSON, 500s and 429s); ``hang`` accepts
every connection and answers nothing for longer than m2g's query timeout; ``killed`` closes
the port (connection refused). Four flexible jobs run (123.2 kW) under a 200 kW event target,
so a fresh reading leaves room for a small firm job.

Invariants (docs/reliability.md counts them): the m2g process never dies and its ``/metrics``
and ``/readyz`` keep answering; nothing is shed on garbage (or on any unknown reading): every
running job's ``spec.active`` stays True throughout, from a watch; a firm job submitted in each
phase is answered — Retry, with the fail-safe's "site power unknown" — and never Ready while
the power is unknown; once Prometheus is back m2g reads fresh power and admits a new firm job.
The log holds no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_controller_e2e as ctl
from chaos_helpers import Fleet, WorkloadRecorder, _rack_watts, site_file
from e2e_helpers import Cluster, unique
from fake_prometheus import _labels

pytestmark = pytest.mark.e2e

#: No GPU caps (no node agent here); a ramp that could shed within seconds if m2g believed
#: a reading over the limit.
PLANNER = {"rampKwPerSecond": 50.0, "maxStepKw": 100.0, "settleSeconds": 3.0,
           "shedSavingFraction": 1.0, "minShedSeconds": 5.0, "powerCaps": False}
EVENT_KW = 200.0  # 123.2 kW running, 264 kW with both racks at their 132 kW cap
PHASE_SECONDS = 25.0  # each fault: longer than several reconciles and a 5 s query timeout
AGE = 'm2g_signal_age_seconds{signal="rack_power"}'


def _garbage(metric: str, key: str, at: float) -> list[Any]:
    """One rotation of bad answers (status, body) for a query of ``metric``."""
    def vector(value: Any, stamp: Any = None, labels: Any = None) -> tuple[int, bytes]:
        result = [{"metric": labels if labels is not None else _labels(metric, key),
                   "value": [at if stamp is None else stamp, value]}]
        return 200, json.dumps({"status": "success", "data": {
            "resultType": "vector", "result": result}}).encode()
    return [vector("+Inf"), vector("NaN"), vector("1e300"), vector("-500000"),
            vector("90000", stamp=at + 3600), vector("٥٠٠٠٠"), vector("5_000"),
            vector("90000", labels="not a map"), vector("90000", labels={"rack": 7}),
            (200, b"<html>proxy error</html>"), (200, b'{"status": "success", "data": 7}'),
            (500, b'{"status": "error"}'), (429, b"slow down")]


class Stand:
    """A Prometheus stand-in whose behaviour the test switches: good, garbage, hang."""

    def __init__(self, cluster: Cluster, rack_of: dict[str, str]) -> None:
        self.cluster, self.rack_of = cluster, rack_of
        self.mode = "good"
        self.watts = _rack_watts(cluster, rack_of)
        self.answers = 0
        self.bad = itertools.count()
        self.unhang = threading.Event()
        self.server: http.server.ThreadingHTTPServer | None = None
        self.port = 0
        self._stop = threading.Event()

    def refresh(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                self.watts = _rack_watts(self.cluster, self.rack_of)

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        stand = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                params = urllib.parse.parse_qs(url.query)
                query = params.get("query", [""])[0]
                at = float(params.get("time", [str(time.time())])[0])
                stamp = query.startswith("timestamp(") and query.endswith(")")
                metric = query[len("timestamp("):-1] if stamp else query
                series = {"facility_pdu_power_watts": stand.watts,
                          "facility_rack_inlet_temperature_celsius":
                              dict.fromkeys(stand.watts, 24.0)}.get(metric) or {}
                if stand.mode == "hang":
                    stand.unhang.wait(30)  # m2g gives up after its 5 s query timeout
                    return  # the connection closes without an answer
                if stand.mode == "garbage" and series:
                    bad = _garbage(metric, next(iter(series)), at)
                    code, body = bad[next(stand.bad) % len(bad)]
                else:
                    code = 200 if url.path == "/api/v1/query" else 404
                    body = json.dumps({"status": "success", "data": {
                        "resultType": "vector", "result": [
                            {"metric": _labels(metric, k),
                             "value": [at, str(at if stamp else v)]}
                            for k, v in series.items()]}}).encode()
                stand.answers += 1
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        return Handler

    def start(self) -> str:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """Close the port: every connection refused."""
        self.unhang.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        thread = threading.Thread(target=self.refresh, daemon=True)
        thread.start()
        try:
            yield self.start()
        finally:
            self._stop.set()
            self.kill()
            thread.join(5)


def retry_message(cluster: Cluster, namespace: str, job: str) -> str:
    wl = ctl.workload_of(cluster, namespace, job) or {}
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == ctl.CHECK and entry.get("state") == "Retry":
            return str(entry.get("message") or "")
    return ""


async def test_prometheus_garbage_hanging_and_killed_during_a_grid_event(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    out = tmp_path_factory.mktemp("prom")
    site = site_file(out / "site.yaml", ctl.CHECK, PLANNER)
    names = [f"flex{i}" for i in range(4)]
    stand = Stand(cluster, racks)
    with stand.running() as prom, WorkloadRecorder(cluster, namespace, ctl.CHECK) as rec:
        fleet = Fleet(kubeconfig, site, policy_dir, namespace, unique("m2g-prom"), out, prom)
        rep = fleet.start("m2g-0")
        try:
            await ctl.until("m2g ready", lambda: rep.ready()[0] == 200, timeout=90)
            for i, name in enumerate(names):
                cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=1 + i % 3))
            await ctl.until("four workloads answered Ready", lambda: all(ctl.check_state(
                ctl.workload_of(cluster, namespace, n)) == "Ready" for n in names), timeout=90)
            await ctl.until("the four jobs running", lambda: len(cluster.core.list_namespaced_pod(
                namespace, field_selector="status.phase=Running").items) == 16, timeout=60)
            ctl.grid_event(cluster, target_kw=EVENT_KW)
            # a fresh reading: 123.2 kW under 200 kW, room for a 4-GPU firm job
            cluster.batch.create_namespaced_job(namespace, ctl.job("firm-ok", 4, tier=0))
            await ctl.until("a firm job admitted on a fresh reading", lambda: ctl.check_state(
                ctl.workload_of(cluster, namespace, "firm-ok")) == "Ready", timeout=60)
            outage = time.monotonic()
            firm = []
            for mode in ("garbage", "hang", "killed"):
                if mode == "killed":
                    stand.kill()
                else:
                    stand.mode = mode
                # m2g reads Prometheus in the background: a job submitted before its next read
                # is rightly decided on the last fresh reading; wait until it has read the fault
                await ctl.until(f"m2g to see rack power unknown [{mode}]", lambda: (
                    rep.metric(AGE) or 0.0) > 120.0, timeout=60)
                job = f"firm-{mode}"
                firm.append(job)
                cluster.batch.create_namespaced_job(namespace, ctl.job(job, 4, tier=0))
                msg = await ctl.until(f"{job} answered Retry (site power unknown) [{mode}]",
                                      lambda j=job: "site power unknown" in (
                                          m := retry_message(cluster, namespace, j)) and m,
                                      timeout=90)
                print(f"{mode}: {msg[:160]}")
                await asyncio.sleep(PHASE_SECONDS)
                assert rep.alive(), f"m2g died on Prometheus {mode}:\n{fleet.tails()}"
                assert rep.ready()[0] == 200, f"/readyz after Prometheus {mode}"
                assert rep.metric("m2g_leader") == 1.0
                for n in names:
                    assert rec.flips(n) == [True], f"{n} shed on Prometheus {mode}"
            back = time.monotonic()
            answers = stand.answers
            stand.mode, stand.unhang = "good", threading.Event()
            stand.start()  # the same port: Prometheus restarted
            await ctl.until("m2g to read fresh rack power again", lambda: (
                rep.metric(AGE) or 1e9) <= 120.0, timeout=60)
            # admission resumes: a new firm job fits on the fresh reading. (The held ones come
            # back when Kueue asks again: its Retry backoff grows 60 s x 2^(n-1) per retry,
            # kueue pkg/workload/admissionchecks.go, so not waited for here.)
            cluster.batch.create_namespaced_job(namespace, ctl.job("firm-after", 4, tier=0))
            await ctl.until("a firm job admitted once Prometheus is back", lambda: ctl.check_state(
                ctl.workload_of(cluster, namespace, "firm-after")) == "Ready", timeout=60)
            assert stand.answers > answers
            for j in firm:
                assert not rec.ready_between(j, outage, back), \
                    f"{j} admitted while the site's power was unknown"
            for n in names:
                assert rec.flips(n) == [True], f"{n}: spec.active went {rec.flips(n)}"
            assert rep.alive()
            log = rep.log.read_text(errors="replace")
            assert "Traceback" not in log, fleet.tails()
        finally:
            fleet.stop_all()
