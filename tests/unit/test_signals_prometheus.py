"""PrometheusClient against canned HTTP answers (httpx.MockTransport): parsing and errors."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from m2g.signals import PermanentError, PrometheusClient, RetryableError, SignalConfig
from m2g.signals.prometheus import BadQueryError, fetch_signals

Handler = Callable[[httpx.Request], httpx.Response]


def vector(*items: tuple[dict[str, str], float, float]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [t, str(v)]} for m, v, t in items]}}


async def no_sleep(seconds: float) -> None:
    """Retries back off without waiting in unit tests."""


def make(handler: Handler) -> PrometheusClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return PrometheusClient("http://prom:9090", http, timeout_seconds=1.0, clock=lambda: 1000.0,
                            sleep=no_sleep)


async def test_vector_is_parsed_and_time_is_sent() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=vector(
            ({"__name__": "DCGM_FI_DEV_POWER_USAGE", "Hostname": "n1", "gpu": "0"}, 650.5, 99.0),
            ({"__name__": "DCGM_FI_DEV_POWER_USAGE", "Hostname": "n1", "gpu": "1"}, "NaN", 99.0),
        ))

    samples = await make(handler).query("DCGM_FI_DEV_POWER_USAGE", 99.0)
    assert seen[0].url.path == "/api/v1/query"
    assert seen[0].url.params["time"] == "99.000"
    assert seen[0].url.params["query"] == "DCGM_FI_DEV_POWER_USAGE"
    assert samples[0].value == 650.5 and samples[0].labels["Hostname"] == "n1"
    assert samples[1].value != samples[1].value  # NaN kept by query(), dropped by fetch
    with pytest.raises(TypeError):
        samples[0].labels["x"] = "y"  # type: ignore[index]


async def test_query_with_age_uses_scrape_time() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        labels = {"Hostname": "n1", "gpu": "0"}
        if q.startswith("timestamp("):
            return httpx.Response(200, json=vector((labels, 940.0, 1000.0)))
        return httpx.Response(200, json=vector(({"__name__": "m", **labels}, 5.0, 1000.0)))

    (s,) = await make(handler).query_with_age("m")
    assert s.timestamp == 940.0 and s.value == 5.0


@pytest.mark.parametrize(("stamps", "want"), [
    ([({"rack": "r0"}, 1000.0, 1000.0)], 1000.0),  # an aggregate: stamped with the evaluation
    ([({"rack": "r0"}, 1020.0, 1000.0)], 1020.0),  # clock skew within MAX_FUTURE_SECONDS
    ([], None),  # no stamp for the series
    ([({"rack": "r1"}, 990.0, 1000.0)], None),  # a stamp for another series only
    ([({"rack": "r0"}, 1031.0, 1000.0)], None),  # from the future
    ([({"rack": "r0"}, "NaN", 1000.0)], None),
    ([({"rack": "r0"}, "+Inf", 1000.0)], None),
    ([({"rack": "r0"}, 990.0, 1000.0), ({"rack": "r0"}, 980.0, 1000.0)], None),  # which one?
])
async def test_query_with_age_an_unknown_scrape_time_is_nan(stamps: list[Any],
                                                            want: float | None) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.params["query"].startswith("timestamp("):
            return httpx.Response(200, json=vector(*stamps))
        return httpx.Response(200, json=vector(({"__name__": "m", "rack": "r0"}, 5.0, 1000.0)))

    (s,) = await make(handler).query_with_age("sum by (rack) (m)")
    assert s.value == 5.0
    assert s.timestamp == want if want is not None else math.isnan(s.timestamp)


@pytest.mark.parametrize(("status", "body", "error", "match"), [
    (503, {"status": "error", "errorType": "timeout", "error": "query timed out"},
     RetryableError, "HTTP 503: query timed out"),
    (502, "<html>bad gateway</html>", RetryableError, "HTTP 502"),
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error:\n unexpected"},
     BadQueryError, "bad PromQL 'up{': parse error: unexpected"),
    (422, {"status": "error", "errorType": "execution", "error": "many-to-many"},
     BadQueryError, "many-to-many"),
    (404, "not found", PermanentError, "did not answer with the Prometheus API"),
    (200, {"status": "success", "data": {"resultType": "matrix", "result": []}},
     PermanentError, "instant vector"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"x": 1}]}},
     PermanentError, "malformed"),
])
async def test_errors_are_classified(status: int, body: Any, error: type[Exception],
                                     match: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})

    with pytest.raises(error, match=match) as info:
        await make(handler).query("up{")
    assert "\n" not in str(info.value)
    retryable = isinstance(info.value, RetryableError)
    assert retryable == (error is RetryableError)


async def test_timeouts_and_connection_errors_are_retryable() -> None:
    def timeout(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=req)

    def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(RetryableError, match="timed out after 1s"):
        await make(timeout).query("up")
    with pytest.raises(RetryableError, match="unreachable: connection refused"):
        await make(refused).query("up")


async def test_fetch_signals_isolates_failures_and_scales() -> None:
    cfg = SignalConfig.model_validate({"signals": {
        "rack_power_kw": {"query": "rack_watts", "scale": 0.001},
        "gpu_temp_c": {"query": "broken("}}})

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "broken(" in q:
            return httpx.Response(400, json={"status": "error", "errorType": "bad_data",
                                             "error": "unclosed"})
        if "rack_watts" in q:
            return httpx.Response(200, json=vector(({"rack": "r1"}, 120000.0, 1000.0)))
        return httpx.Response(200, json=vector())

    out = await fetch_signals(make(handler), cfg)
    assert isinstance(out["gpu_temp_c"].error, BadQueryError)  # type: ignore[index]
    assert out["rack_power_kw"].samples[0].value == pytest.approx(120.0)  # type: ignore[index]
    assert out["gpu_power_w"].ok and out["gpu_power_w"].samples == ()  # type: ignore[index]


async def test_read_signals_turns_failures_into_missing_readings() -> None:
    from m2g.signals.reader import read_signals
    from m2g.signals.readings import Expected, Freshness

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "facility_pdu_power_watts" in q:
            return httpx.Response(503, text="down")
        if "DCGM_FI_DEV_POWER_USAGE" in q:
            value = 995.0 if q.startswith("timestamp(") else 700.0  # scraped 5 s ago
            return httpx.Response(200, json=vector(({"Hostname": "n1", "gpu": "0"}, value,
                                                    1000.0)))
        return httpx.Response(200, json=vector())

    r = await read_signals(make(handler), SignalConfig(),
                           Expected(nodes=("n1",), racks=("rack-000",)))
    assert r.now == 1000.0
    assert r.nodes["n1"].power_w.value == 700.0
    assert r.nodes["n1"].power_w.age_seconds == 5.0
    assert r.racks["rack-000"].power_kw.freshness is Freshness.MISSING
    assert "HTTP 503" in r.status["rack_power_kw"].error  # type: ignore[index]
