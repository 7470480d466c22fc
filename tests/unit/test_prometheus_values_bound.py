"""A Prometheus answer of more than ``max_values_per_series`` JSON values a series
(``prometheus.maxValuesPerSeries``, 64) is read no further: that signal reads as missing with one
line, a log line and a counted metric, and the other signals are read as usual. The series bound
(``maxSeries``) counts objects only, so before this bound ONE series whose ``value`` was an array
of 16 million numbers (61 MiB, within the byte bound too) was downloaded and decoded whole:
seconds of CPU and ~700 MiB an answer (bench/signal_series.py ``--array``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from m2g.config import SiteConfigError
from m2g.config.site import load_site_config
from m2g.signals.config import MAX_VALUES_PER_SERIES, SignalConfig, SignalName
from m2g.signals.prometheus import (
    PermanentError,
    TooManyValuesError,
    fetch_signals,
)
from m2g.signals.reader import read_signals
from tests.unit.prom_answers import GPU_QUERY, cli_readings, controller_reads, vector
from tests.unit.prom_answers import client as _client
from tests.unit.prom_answers import site as _site


def _gpus(n: int, labels: int = 0, value: str = "500") -> bytes:
    """n GPU series (4 a node) as Prometheus writes them, each with ``labels`` extra labels."""
    extra = "".join(f',"l{j}":"v"' for j in range(labels))
    return vector([f'{{"metric":{{"Hostname":"n{i // 4}","gpu":"{i % 4}"{extra}}},'
                    f'"value":[1000,"{value}"]}}' for i in range(n)])


#: One GPU series, hostile in one way each: what the series bound let through whole.
HOSTILE = {
    "a value of 1,000 numbers": '"value":[' + ",".join(["0.5"] * 1000) + "]",
    "values: 400 samples": '"values":[' + ",".join(['[1000,"1"]'] * 400) + "]",
    "a metric of 400 labels": '"metric":{' + ",".join(f'"l{j}":"v"' for j in range(400))
                              + '},"value":[1000,"1"]',
}


def _hostile(kind: str, stamps: bool) -> bytes:
    good = [f'{{"metric":{{"Hostname":"n0","gpu":"{g}"}},'
            f'"value":[1000,"{995 if stamps else 500}"]}}' for g in range(3)]
    head = "" if kind.startswith("a metric") else '"metric":{"Hostname":"n0","gpu":"3"},'
    return vector([*good, "{" + head + HOSTILE[kind] + "}"])


@pytest.mark.parametrize("kind", sorted(HOSTILE))
async def test_one_series_of_too_many_values_fails_that_signal_alone(kind: str) -> None:
    """Beside three good series, within the byte and series bounds: before, read whole (the
    hostile series INVALID, the others used); now the signal reads as missing, unread."""
    client = _client(_site(lambda stamps: _hostile(kind, stamps)))
    assert client.max_values_per_series == MAX_VALUES_PER_SERIES == 64
    readings = await read_signals(client, SignalConfig())
    gpu = readings.status[SignalName.GPU_POWER_W]
    assert (gpu.error or "").startswith(
        "Prometheus at http://prom:9090 answered with more than 64 JSON values a series "
        "(maxValuesPerSeries; over ")
    assert (gpu.error or "").endswith("); the signal reads as missing")
    assert SignalName.GPU_POWER_W in readings.stale_signals
    node = readings.nodes.get("n0")
    assert node is None or node.power_w.value is None  # its three good GPUs unread too
    # the other signals read as usual
    assert readings.racks["r0"].power_kw.value == pytest.approx(5.0)
    assert not readings.status[SignalName.RACK_POWER_KW].error


@pytest.mark.parametrize(("labels", "refused"), [(59, False), (60, True)])
async def test_series_of_up_to_59_labels_fit_the_default(labels: int, refused: bool) -> None:
    """A series is 5 JSON values and one a label: 1,000 series of 59 labels (Hostname, gpu
    and 57 more) are read, of 60 refused — the bound grows with the series counted."""
    fetched = await fetch_signals(_client(_site(lambda stamps: _gpus(
        1000, labels - 2, "995" if stamps else "500"))), SignalConfig())
    gpu = fetched[SignalName.GPU_POWER_W]
    assert isinstance(gpu.error, TooManyValuesError) is refused
    assert len(gpu.samples) == (0 if refused else 1000)


class EndlessArray(httpx.AsyncByteStream):
    """One series whose ``value`` never ends; counts the chunks read of it."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield (b'{"status":"success","data":{"resultType":"vector","result":['
               b'{"metric":{"Hostname":"n0","gpu":"0"},"value":[')
        while True:
            self.sent += 1
            yield b"0.5," * 16384


async def test_the_answer_is_read_no_further_than_the_bound() -> None:
    """Refused while it downloads, in the first chunk of the array: long before the byte
    bound (64 MiB) or any decoding."""
    body = EndlessArray()
    client = _client(lambda _: httpx.Response(200, stream=body))
    assert client.max_response_bytes == 64 << 20
    with pytest.raises(TooManyValuesError, match=r"more than 64 JSON values a series"):
        await client.query(GPU_QUERY)
    assert body.sent == 1


async def test_a_lower_bound_refuses_sooner() -> None:
    """``max_values_per_series`` is the client's: 10 labels fit 64, not 12."""
    answer = _site(lambda stamps: _gpus(100, 8, "995" if stamps else "500"))
    assert (await fetch_signals(_client(answer), SignalConfig()))[
        SignalName.GPU_POWER_W].ok
    low = await fetch_signals(_client(answer, max_values_per_series=12), SignalConfig())
    assert isinstance(low[SignalName.GPU_POWER_W].error, TooManyValuesError)


def test_the_site_config_sets_the_bound(tmp_path: Path) -> None:
    from m2g_controllers import run

    f = tmp_path / "site.yaml"
    f.write_text("prometheus: {url: 'http://prom:9090', maxValuesPerSeries: 200}\n")
    assert load_site_config(f).signal_config().max_values_per_series == 200
    settings = run.resolve(run.parse(["--config", str(f), "--prometheus", "http://x:9090"]), {})
    assert run.signal_config(settings).max_values_per_series == 200
    default = run.signal_config(run.resolve(run.parse([]), {}))
    assert default.max_values_per_series == MAX_VALUES_PER_SERIES
    f.write_text("prometheus: {maxValuesPerSeries: 0}\n")
    with pytest.raises(SiteConfigError, match=r"site.yaml:1: prometheus.maxValuesPerSeries"):
        load_site_config(f)


async def test_the_controller_logs_once_and_counts_each_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    """m2g run's reader: one warning when the signal starts being refused, one count a read
    in ``m2g_signal_answers_refused_total{bound="maxValuesPerSeries"}``."""
    warned, text = await controller_reads(
        _site(lambda stamps: _hostile("a value of 1,000 numbers", stamps)), SignalConfig(),
        caplog)
    assert len(warned) == 1 and "more than 64 JSON values a series" in warned[0]
    assert ('m2g_signal_answers_refused_total{bound="maxValuesPerSeries",'
            'signal="gpu_power_w"} 2.0' in text)


async def test_the_cli_reads_with_the_site_bound(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``m2g signals`` / ``explain`` read with the site configuration's bound too."""
    readings = await cli_readings(
        "prometheus: {url: 'http://prom:9090', maxValuesPerSeries: 12}\n",
        _site(lambda stamps: _gpus(8, 8)), tmp_path, monkeypatch)
    assert readings is not None
    assert "more than 12 JSON values" in (readings.status[SignalName.GPU_POWER_W].error or "")
    assert not readings.status[SignalName.RACK_POWER_KW].error


async def test_a_range_selector_is_still_named_as_such() -> None:
    """A ``[range]`` selector's answer is a matrix of many samples a series: over the values
    bound before it is decoded, but the reason given is the selector's, as before."""
    samples = ",".join(['[1000,"1"]'] * 200)
    matrix = (b'{"status":"success","data":{"resultType":"matrix","result":['
              b'{"metric":{"Hostname":"n0","gpu":"0"},"values":[' + samples.encode() + b"]}]}}")
    client = _client(lambda _: httpx.Response(200, content=matrix))
    with pytest.raises(PermanentError, match=r"returned a matrix result; a signal needs an "
                       r"instant vector \(drop any \[range\] selector\)") as info:
        await client.query(GPU_QUERY + "[1m]")
    assert not isinstance(info.value, TooManyValuesError)
