"""A Prometheus stand-in with fixed readings, for tests whose output must not drift.

It answers the instant-query API (``/api/v1/query``) for the facility series m2g reads by
default (m2g.signals.config): power (one PDU series per rack, W) and inlet per rack, power per
power domain (W), each a constant; ``timestamp(q)`` answers the evaluation time (a reading scraped just now); any other
query an empty vector. With ``DCGM`` series given (keyed "HOSTNAME/GPU"), the DCGM exporter's
GPU series too. ``series`` is read at each request: a test may change it while serving.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping

Series = Mapping[str, Mapping[str, float]]  # metric → {key label value → value}

KEYS = {"facility_pdu_power_watts": "rack", "facility_rack_inlet_temperature_celsius": "rack",
        "facility_rack_coolant_supply_temperature_celsius": "rack",
        "facility_power_domain_power_watts": "power_domain"}
#: NVIDIA DCGM exporter series: one per GPU, keyed "HOSTNAME/GPU" in ``series``.
DCGM = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS")


def _labels(metric: str, key: str) -> dict[str, str]:
    if metric in DCGM:
        host, _, gpu = key.partition("/")
        return {"__name__": metric, "Hostname": host, "gpu": gpu, "UUID": f"GPU-{host}-{gpu}"}
    return {"__name__": metric, KEYS[metric]: key}


def _handler(series: Series) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            params = urllib.parse.parse_qs(url.query)
            query = params.get("query", [""])[0]
            at = float(params.get("time", [str(time.time())])[0])
            stamp = query.startswith("timestamp(") and query.endswith(")")
            metric = query[len("timestamp("):-1] if stamp else query
            result = [{"metric": _labels(metric, key),
                       "value": [at, str(at if stamp else value)]}
                      for key, value in (series.get(metric) or {}).items()]
            body = json.dumps({"status": "success",
                               "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200 if url.path == "/api/v1/query" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def fake_prometheus(series: Series) -> Iterator[str]:
    """Serve ``series`` on a free port of 127.0.0.1; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(series))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
