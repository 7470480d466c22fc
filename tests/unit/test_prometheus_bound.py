"""A Prometheus answer larger than ``max_response_bytes`` (or one that never ends) is read no
further: that signal is missing with one line (the reader's fail-safe), never a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from m2g.config import SiteConfigError
from m2g.signals import prometheus
from m2g.signals.config import SignalConfig, SignalName
from m2g.signals.prometheus import PARSE_CHUNK, PrometheusClient, fetch_signals

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


async def test_an_answer_of_many_series_is_read_in_steps_the_event_loop_runs_between(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer of 200,000 series took over 20 s of CPU to read in one go: the lease renewal,
    the admission answers and the watches waited for all of it, and the controller's 10 s
    bound on a read could not stop it. It is read in steps of ``PARSE_CHUNK`` series with the
    event loop free in between, and a read cancelled in the middle stops at the next step."""
    n = 5 * PARSE_CHUNK
    result = ",".join(f'{{"metric":{{"rack":"r{i}"}},"value":[1000,"5"]}}' for i in range(n))
    body = (b'{"status":"success","data":{"resultType":"vector","result":[' + result.encode()
            + b"]}}")
    client = _client(httpx.MockTransport(lambda _: httpx.Response(200, content=body)),
                     len(body))
    parsed = 0
    real = prometheus._pair

    def counting(value: Any) -> tuple[float, float] | None:
        nonlocal parsed
        parsed += 1
        return real(value)

    monkeypatch.setattr(prometheus, "_pair", counting)
    seen: list[int] = []

    async def other_work() -> None:
        while True:
            seen.append(parsed)
            await asyncio.sleep(0)

    beside = asyncio.create_task(other_work())
    samples = await client.query("up")
    beside.cancel()
    assert len(samples) == n and samples[-1].labels["rack"] == f"r{n - 1}"
    assert len({x for x in seen if 0 < x < n}) >= 4  # other work ran between the steps
    parsed = 0
    read = asyncio.create_task(client.query("up"))
    for _ in range(100_000):  # until the answer is being read
        if parsed:
            break
        await asyncio.sleep(0)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert 0 < parsed < n  # read no further than the step it was in


async def test_the_answers_of_one_read_are_read_one_after_the_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Read side by side, the 14 answers of a read each took a step in turn, so the event loop
    waited for 14 steps at a time (1.3 s at 20,000 series a signal); one at a time, it waits
    for one."""
    n = 3 * PARSE_CHUNK

    def handler(req: httpx.Request) -> httpx.Response:
        name = req.url.params["query"]
        result = ",".join(f'{{"metric":{{"rack":"{name}{i}"}},"value":[1000,"5"]}}'
                          for i in range(n))
        return httpx.Response(200, content=b'{"status":"success","data":{"resultType":'
                              b'"vector","result":[' + result.encode() + b"]}}")

    client = _client(httpx.MockTransport(handler), 1 << 24)
    order: list[str] = []
    real = prometheus._labels

    def labels(metric: Any) -> dict[str, str] | None:
        order.append(str(metric["rack"])[0])  # which answer is being read
        return real(metric)

    monkeypatch.setattr(prometheus, "_labels", labels)
    a, b = await asyncio.gather(client.query("a"), client.query("b"))
    assert len(a) == len(b) == n
    assert "".join(order) in ("a" * n + "b" * n, "b" * n + "a" * n)


async def test_the_readings_are_built_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the readings is ~1 s of CPU at 20,000 series a signal: a worker thread does it
    (the event loop's thread only switches to it)."""
    import threading

    from m2g.signals import reader

    threads: list[int] = []
    real = reader.build_readings

    def noting(*args: Any, **kw: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kw)

    monkeypatch.setattr(reader, "build_readings", noting)
    client = _client(httpx.MockTransport(lambda _: httpx.Response(200, content=OK)), len(OK))
    readings = await reader.read_signals(client, SignalConfig())
    assert readings.racks["r0"].power_kw.last_value == pytest.approx(0.005)
    assert threads and threading.get_ident() not in threads


# ---- m2g run: prometheus.maxResponseBytes from the site config reaches its reader -----------

def _big_answer() -> bytes:
    """A well-formed answer of ~4 KiB: one rack's power, padded with more racks."""
    result = ",".join(f'{{"metric":{{"rack":"r{i}"}},"value":[1000,"5"]}}' for i in range(100))
    return (b'{"status":"success","data":{"resultType":"vector","result":[' + result.encode()
            + b"]}}")


def test_run_takes_max_response_bytes_from_the_site_config(tmp_path: Path) -> None:
    from m2g_controllers import run

    f = tmp_path / "site.yaml"
    f.write_text("prometheus: {url: 'http://from-file:9090', maxResponseBytes: 2048}\n")
    settings = run.resolve(run.parse(["--config", str(f), "--prometheus", "http://flag:9090"]),
                           {})
    signals = run.signal_config(settings)
    assert (signals.url, signals.max_response_bytes) == ("http://flag:9090", 2048)
    assert run.signal_config(run.resolve(run.parse([]), {})).max_response_bytes == 64 << 20
    f.write_text("prometheus: {maxResponseBytes: 12}\n")  # below 1 KiB: refused with its line
    with pytest.raises(SiteConfigError, match=r"site.yaml:1: prometheus.maxResponseBytes"):
        run.resolve(run.parse(["--config", str(f)]), {})


@pytest.mark.parametrize(("limit", "read"), [(2048, False), (64 << 20, True)])
async def test_the_controllers_reader_stops_at_the_configured_bound(limit: int,
                                                                     read: bool) -> None:
    """K8sCluster (what m2g run reads with) asks Prometheus with the configured bound: a
    4 KiB answer is read under the default and cut (the signal missing) under 2 KiB."""
    from m2g.testing.kube import FakeKube
    from m2g_controllers.wiring import K8sCluster

    body = _big_answer()
    assert 2048 < len(body) < 64 << 20
    http = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda _: httpx.Response(200, content=body)))
    cluster = K8sCluster(FakeKube(), prometheus="http://prom:9090",  # type: ignore[arg-type]
                         signal_config=SignalConfig(max_response_bytes=limit), http=http,
                         signal_refresh_seconds=0)
    try:
        readings = await cluster._read_now()
    finally:
        await http.aclose()
    assert readings is not None
    status = readings.status[SignalName.RACK_POWER_KW]
    assert ("more than 2,048 bytes" in (status.error or "")) is not read
    assert ("r7" in readings.racks) is read
