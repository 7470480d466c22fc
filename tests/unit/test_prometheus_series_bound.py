"""A Prometheus answer of more than ``max_series`` series (``prometheus.maxSeries``) is read no
further: that signal reads as missing with one line, a log line and a counted metric, and the
other signals are read as usual. Before the bound, a hostile answer of 1.8 million tiny series
(within the 64 MiB byte bound) cost 28 s of CPU and 1.6 GiB to decode and read, and the read
then overran the controller's 10 s bound: every signal missing (bench/signal_series.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from m2g.config import SiteConfigError
from m2g.config.site import load_site_config
from m2g.signals.config import MAX_SERIES, SignalConfig, SignalName
from m2g.signals.prometheus import PrometheusClient, TooManySeriesError, fetch_signals
from m2g.signals.reader import read_signals
from tests.unit.prom_answers import GPU_QUERY, Handler, cli_readings, controller, site, vector
from tests.unit.prom_answers import client as bounded


def _gpus(n: int, key: str = "metric", value: str = "500") -> bytes:
    """n GPU series (4 a node), each as Prometheus writes it."""
    return vector([f'{{"{key}":{{"Hostname":"n{i // 4}","gpu":"{i % 4}"}},'
                    f'"value":[1000,"{value}"]}}' for i in range(n)])


def _site(gpus: int, key: str = "metric") -> Handler:
    """GPU power answered with ``gpus`` series (its query and its timestamp(): scraped at
    995), every other signal with one rack's series."""
    return site(lambda stamps: _gpus(gpus, key, "995" if stamps else "500"))


def _client(handler: Handler, max_series: int) -> PrometheusClient:
    return bounded(handler, max_series=max_series)


@pytest.mark.parametrize(("series", "refused"), [(12, False), (13, True)])
async def test_an_answer_over_the_bound_fails_that_signal_alone(series: int,
                                                               refused: bool) -> None:
    readings = await read_signals(_client(_site(series), max_series=12), SignalConfig())
    gpu = readings.status[SignalName.GPU_POWER_W]
    assert (gpu.error == "Prometheus at http://prom:9090 answered with more than 12 series "
            "(maxSeries; over 26 JSON objects); the signal reads as missing") is refused
    assert (SignalName.GPU_POWER_W in readings.stale_signals) is refused
    assert (readings.nodes["n2"].power_w.value if not refused else None) == (
        None if refused else 2000.0)
    # the other signals read as usual
    assert readings.racks["r0"].power_kw.value == pytest.approx(5.0)
    assert not readings.status[SignalName.RACK_POWER_KW].error


class TinySeries(httpx.AsyncByteStream):
    """An answer of tiny series that never ends; counts the chunks read of it."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"status":"success","data":{"resultType":"vector","result":['
        while True:
            self.sent += 1
            yield b'{"metric":{},"value":[1000,"1"]},' * 1000


async def test_the_answer_is_read_no_further_than_the_bound() -> None:
    """Refused while it downloads, long before the byte bound (64 MiB) or any decoding: the
    1,000-series bound stops it in its second chunk of 1,000 series."""
    body = TinySeries()
    client = _client(lambda _: httpx.Response(200, stream=body), max_series=1000)
    assert client.max_response_bytes == 64 << 20
    with pytest.raises(TooManySeriesError, match=r"more than 1,000 series \(maxSeries"):
        await client.query(GPU_QUERY)
    assert body.sent == 2


async def test_escaped_keys_do_not_hide_series() -> None:
    """``"\\u006detric"`` decodes to ``"metric"``: counting the key's text would miss those
    series; every series is still two JSON objects, and objects have no escape."""
    assert b'"metric"' not in _gpus(13, key="\\u006detric")
    fetched = await fetch_signals(_client(_site(13, key="\\u006detric"), 12), SignalConfig())
    assert isinstance(fetched[SignalName.GPU_POWER_W].error, TooManySeriesError)
    ok = await fetch_signals(_client(_site(12, key="\\u006detric"), 12), SignalConfig())
    assert len(ok[SignalName.GPU_POWER_W].samples) == 12


def test_the_site_config_sets_the_bound(tmp_path: Path) -> None:
    from m2g_controllers import run

    f = tmp_path / "site.yaml"
    f.write_text("prometheus: {url: 'http://prom:9090', maxSeries: 5000}\n")
    assert load_site_config(f).signal_config().max_series == 5000
    settings = run.resolve(run.parse(["--config", str(f), "--prometheus", "http://x:9090"]), {})
    assert run.signal_config(settings).max_series == 5000
    # the default: 1,400 racks of 72 GPUs (100,800 series of a GPU signal) fit
    assert run.signal_config(run.resolve(run.parse([]), {})).max_series == MAX_SERIES
    assert 1400 * 72 <= MAX_SERIES < 2 * 1400 * 72
    f.write_text("prometheus: {maxSeries: 0}\n")
    with pytest.raises(SiteConfigError, match=r"site.yaml:1: prometheus.maxSeries"):
        load_site_config(f)


async def test_the_controller_logs_once_counts_each_refusal_and_exports_the_status(
        caplog: pytest.LogCaptureFixture) -> None:
    """m2g run's reader: one warning when the signal starts being refused (not one a read),
    ``m2g_signal_answers_refused_total{signal,bound}`` each read, the signal's status in
    ``m2g_signal_query_failed`` / ``m2g_signal_stale``, one line when it reads again."""
    from prometheus_client import generate_latest

    answer = {"gpus": 13}
    http = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda req: _site(answer["gpus"])(req)))
    cluster, metrics = controller(http, SignalConfig(max_series=12))
    caplog.set_level(logging.INFO, logger="m2g.wiring")
    try:
        for _ in range(2):
            readings = await cluster._read_now()
            assert readings is not None and "r0" in readings.racks
        text = generate_latest(metrics.registry).decode()
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["signal gpu_power_w reads as missing (the fail-safe rules apply): "
                          "Prometheus at http://prom:9090 answered with more than 12 series "
                          "(maxSeries; over 26 JSON objects); the signal reads as missing"]
        assert ('m2g_signal_answers_refused_total{bound="maxSeries",signal="gpu_power_w"} 2.0'
                in text)
        assert 'm2g_signal_query_failed{signal="gpu_power_w"} 1.0' in text
        assert 'm2g_signal_query_failed{signal="rack_power_kw"} 0.0' in text
        assert 'm2g_signal_stale{signal="gpu_power_w"} 1.0' in text
        answer["gpus"] = 12
        caplog.clear()
        await cluster._read_now()
        assert [r.getMessage() for r in caplog.records] == ["signal gpu_power_w reads again"]
        assert 'm2g_signal_query_failed{signal="gpu_power_w"} 0.0' in generate_latest(
            metrics.registry).decode()
    finally:
        await http.aclose()


async def test_the_cli_reads_with_the_site_bound(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``m2g signals`` / ``explain`` read with the site configuration's ``maxSeries`` too."""
    warnings: list[str] = []
    readings = await cli_readings("prometheus: {url: 'http://prom:9090', maxSeries: 12}\n",
                                  _site(13), tmp_path, monkeypatch, warnings)
    assert "more than 12 series" in (readings.status[SignalName.GPU_POWER_W].error or "")
    assert readings.racks["r0"].power_kw.last_value == pytest.approx(5.0)  # read (old: stale)
    assert not readings.status[SignalName.RACK_POWER_KW].error
