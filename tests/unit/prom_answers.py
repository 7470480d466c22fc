"""Canned Prometheus answers and readers for the answer-bound tests
(test_prometheus_series_bound, test_prometheus_values_bound): a site whose GPU signal answers
as a test says and every other signal with one rack's series, a client on it with no network
or sleep, and ``m2g run``'s reader (K8sCluster) on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from m2g.signals.config import SignalConfig, SignalName
from m2g.signals.prometheus import PrometheusClient

GPU_QUERY = SignalConfig().signals[SignalName.GPU_POWER_W].query
Handler = Callable[[httpx.Request], httpx.Response]


def vector(elements: list[str]) -> bytes:
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + ",".join(elements).encode() + b"]}}")


def rack(value: str) -> bytes:
    return vector([f'{{"metric":{{"rack":"r0"}},"value":[1000,"{value}"]}}'])


def site(gpus: Callable[[bool], bytes]) -> Handler:
    """GPU power answered with ``gpus(stamps)`` (``stamps``: the ``timestamp()`` query),
    every other signal with one rack's series (scraped at 995)."""
    def handler(req: httpx.Request) -> httpx.Response:
        query = req.url.params["query"]
        stamps = query.startswith("timestamp(")
        if GPU_QUERY in query:
            return httpx.Response(200, content=gpus(stamps))
        return httpx.Response(200, content=rack("995" if stamps else "5000"))
    return handler


async def no_sleep(_: float) -> None:
    return None


def client(handler: Handler, **bounds: int) -> PrometheusClient:
    transport = httpx.MockTransport(handler)
    return PrometheusClient("http://prom:9090", httpx.AsyncClient(transport=transport),
                            clock=lambda: 1000.0, sleep=no_sleep, **bounds)


def controller(http: httpx.AsyncClient, config: SignalConfig) -> tuple[Any, Any]:
    """``m2g run``'s reader on ``http`` and its Metrics (registry: ``.registry``)."""
    from m2g.testing.kube import FakeKube
    from m2g_controllers.metrics import Metrics
    from m2g_controllers.wiring import K8sCluster

    metrics = Metrics()
    return K8sCluster(FakeKube(), prometheus="http://prom:9090",  # type: ignore[arg-type]
                      signal_config=config, http=http, signal_refresh_seconds=0,
                      metrics=metrics), metrics


async def cli_readings(site_yaml: str, handler: Handler, tmp_path: Path,
                       monkeypatch: Any, warnings: list[str] | None = None) -> Any:
    """What ``m2g signals`` / ``explain`` read with the site configuration ``site_yaml``
    (``M2G_CONFIG``) from a Prometheus answering with ``handler``."""
    from m2g.signals import http as signals_http
    from m2g_cli import cluster

    f = tmp_path / "site.yaml"
    f.write_text(site_yaml)
    monkeypatch.setenv("M2G_CONFIG", str(f))
    real = signals_http.make_http_client
    monkeypatch.setattr(cluster, "make_http_client",
                        lambda prom: real(prom, httpx.MockTransport(handler)))
    return await cluster._readings(None, [] if warnings is None else warnings)


async def controller_reads(handler: Handler, config: SignalConfig, caplog: Any,
                           reads: int = 2) -> tuple[list[str], str]:
    """``reads`` reads through ``m2g run``'s reader on a site answering with ``handler``, each
    still reading rack r0: the warnings logged and the metrics text after them."""
    import logging

    from prometheus_client import generate_latest

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    cluster, metrics = controller(http, config)
    caplog.set_level(logging.INFO, logger="m2g.wiring")
    try:
        for _ in range(reads):
            readings = await cluster._read_now()
            assert readings is not None and "r0" in readings.racks
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        return warned, generate_latest(metrics.registry).decode()
    finally:
        await http.aclose()
