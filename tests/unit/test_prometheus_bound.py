"""A Prometheus answer larger than ``max_response_bytes`` (or one that never ends) is read no
further: that signal is missing with one line (the reader's fail-safe), never a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from m2g.signals.config import SignalConfig, SignalName
from m2g.signals.prometheus import PrometheusClient, fetch_signals

OK = (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"rack":"r0"},'
      b'"value":[1000,"5"]}]}}')


class Endless(httpx.AsyncByteStream):
    """A body that never ends; counts what was read of it."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += 1
            yield b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * 65536


async def _no_sleep(_: float) -> None:
    return None


def _client(handler: httpx.MockTransport, limit: int) -> PrometheusClient:
    return PrometheusClient("http://prom:9090", httpx.AsyncClient(transport=handler),
                            clock=lambda: 1000.0, sleep=_no_sleep, max_response_bytes=limit)


async def test_an_endless_answer_is_cut_at_the_bound_and_the_signal_is_missing() -> None:
    body = Endless()
    client = _client(httpx.MockTransport(lambda _: httpx.Response(200, stream=body)), 1 << 20)
    fetched = await fetch_signals(client, SignalConfig())
    assert all(not f.ok for f in fetched.values())
    err = str(fetched[SignalName.RACK_POWER_KW].error)
    assert err == ("Prometheus at http://prom:9090 answered with more than 1,048,576 bytes "
                   "(maxResponseBytes); the signal reads as missing")
    # each query read up to the bound (17 chunks of 64 KiB), not on and on
    assert body.sent <= 17 * 2 * len(SignalConfig().signals)


async def test_an_answer_within_the_bound_reads_as_before() -> None:
    client = _client(httpx.MockTransport(lambda _: httpx.Response(200, content=OK)), len(OK))
    samples = await client.query("up")
    assert [(s.labels, s.value) for s in samples] == [({"rack": "r0"}, 5.0)]
    small = _client(httpx.MockTransport(lambda _: httpx.Response(200, content=OK)), len(OK) - 1)
    fetched = await fetch_signals(small, SignalConfig())
    assert "more than" in str(fetched[SignalName.RACK_POWER_KW].error)
