"""A Prometheus answer of more than ``max_values`` JSON values in all (``prometheus.maxValues``,
4,000,000) is read no further: that signal reads as missing with one line, a log line and a
counted metric, and the other signals are read as usual. The other bounds multiply: 149,998
tiny series leave room for ~9.6 M values in one array (``maxValuesPerSeries`` x the series),
and such an answer — within the byte, series and values-a-series bounds — was decoded and read
whole: ~9-10 s of CPU and +509 MiB (bench/signal_series.py ``--array --padded 149998``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from m2g.config import SiteConfigError
from m2g.config.site import load_site_config
from m2g.signals.config import MAX_VALUES, SignalConfig, SignalName
from m2g.signals.prometheus import (
    PermanentError,
    TooManyAnswerValuesError,
    fetch_signals,
)
from m2g.signals.reader import read_signals
from tests.unit.prom_answers import GPU_QUERY, cli_readings, controller_reads, vector
from tests.unit.prom_answers import client as _client
from tests.unit.prom_answers import site as _site

TINY = '{"metric":{},"value":[1000,"1"]}'


def _values(body: bytes) -> int:
    """The JSON values of an answer as the client counts them: its ``{``, ``[`` and ``,``."""
    return body.count(b"{") + body.count(b"[") + body.count(b",")


def _padded_array(series: int, numbers: int) -> bytes:
    """``series`` tiny series, then one whose ``value`` is an array of ``numbers`` numbers."""
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + (TINY + ",").encode() * series
            + b'{"metric":{},"value":[' + b"0.5," * (numbers - 1) + b"0.5]}]}}")


def _gpus(n: int, labels: int, stamps: bool) -> bytes:
    """n GPU series (4 a node) as Prometheus writes them, each with ``labels`` extra labels."""
    extra = "".join(f',"l{j}":"v"' for j in range(labels))
    value = "995" if stamps else "500"
    return vector([f'{{"metric":{{"Hostname":"n{i // 4}","gpu":"{i % 4}"{extra}}},'
                   f'"value":[1000,"{value}"]}}' for i in range(n)])


async def test_an_answer_within_the_other_bounds_is_refused_over_max_values() -> None:
    """149,998 tiny series and one array of 3.2 M numbers: 17 MiB (under 64 MiB), 149,999
    series (under 150,000), 4.1 M values (under 64 a series: 9.6 M) — over 4 M in all. Before,
    read whole; now the signal reads as missing, and the other signals as usual."""
    answer = _padded_array(149_998, 3_200_000)
    assert len(answer) < 64 << 20 and answer.count(b"{") < 2 * 150_000 + 2
    assert MAX_VALUES < _values(answer) < 64 * 150_000
    client = _client(_site(lambda _: answer))
    assert client.max_values == MAX_VALUES == 4_000_000
    readings = await read_signals(client, SignalConfig())
    gpu = readings.status[SignalName.GPU_POWER_W]
    assert gpu.error == ("Prometheus at http://prom:9090 answered with more than 4,000,000 JSON "
                         "values (maxValues); the signal reads as missing")
    assert SignalName.GPU_POWER_W in readings.stale_signals
    assert readings.racks["r0"].power_kw.value == pytest.approx(5.0)
    assert not readings.status[SignalName.RACK_POWER_KW].error


@pytest.mark.parametrize(("over", "refused"), [(0, False), (1, True)])
async def test_the_bound_is_exact(over: int, refused: bool) -> None:
    """An answer of exactly ``max_values`` values is read, one more refused (here 1,000 GPU
    series of 20 labels, ~25,000 values, with the bound set to what they count)."""
    answers = {s: _gpus(1000, 18, s) for s in (False, True)}
    most = max(_values(a) for a in answers.values())
    client = _client(_site(answers.__getitem__), max_values=most - over)
    gpu = (await fetch_signals(client, SignalConfig()))[SignalName.GPU_POWER_W]
    assert isinstance(gpu.error, TooManyAnswerValuesError) is refused
    assert len(gpu.samples) == (0 if refused else 1000)


#: One series of 61 values (within ``maxValuesPerSeries``: 64): its element and ``metric``, the
#: ``value`` array of 57 numbers, its ``,`` after ``metric`` and the ``,`` after the series.
SERIES_61 = b'{"metric":{},"value":[' + b"0.5," * 56 + b"0.5]},"


class EndlessSeries(httpx.AsyncByteStream):
    """Series of 61 values that never end, 256 a chunk; counts the chunks sent."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"status":"success","data":{"resultType":"vector","result":['  # 5 values
        while True:
            self.sent += 1
            yield SERIES_61 * 256  # 15,616 values, 63 KiB


async def test_the_answer_is_read_no_further_than_the_bound() -> None:
    """Refused while it downloads, in the chunk that passes 4 M values (the 257th, ~16 MiB
    read), long before the series bound (586 chunks) or the byte bound (~1,040)."""
    assert _values(SERIES_61) == 61
    body = EndlessSeries()
    client = _client(lambda _: httpx.Response(200, stream=body))
    with pytest.raises(TooManyAnswerValuesError, match=r"more than 4,000,000 JSON values"):
        await client.query(GPU_QUERY)
    assert body.sent == (MAX_VALUES - 5) // (256 * 61) + 1 == 257


def test_the_site_config_sets_the_bound(tmp_path: Path) -> None:
    from m2g_controllers import run

    f = tmp_path / "site.yaml"
    f.write_text("prometheus: {url: 'http://prom:9090', maxValues: 250000}\n")
    assert load_site_config(f).signal_config().max_values == 250_000
    settings = run.resolve(run.parse(["--config", str(f), "--prometheus", "http://x:9090"]), {})
    assert run.signal_config(settings).max_values == 250_000
    assert run.signal_config(run.resolve(run.parse([]), {})).max_values == MAX_VALUES
    f.write_text("prometheus: {maxValues: 0}\n")
    with pytest.raises(SiteConfigError, match=r"site.yaml:1: prometheus.maxValues"):
        load_site_config(f)


async def test_the_controller_logs_once_and_counts_each_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    """m2g run's reader reads with the configured bound: one warning when the signal starts
    being refused, one count a read in ``m2g_signal_answers_refused_total{bound="maxValues"}``."""
    warned, text = await controller_reads(
        _site(lambda stamps: _gpus(100, 8, stamps)), SignalConfig(max_values=1000), caplog)
    assert len(warned) == 1 and "more than 1,000 JSON values (maxValues)" in warned[0]
    assert ('m2g_signal_answers_refused_total{bound="maxValues",'
            'signal="gpu_power_w"} 2.0' in text)


async def test_the_cli_reads_with_the_site_bound(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``m2g signals`` / ``explain`` read with the site configuration's bound too."""
    readings = await cli_readings(
        "prometheus: {url: 'http://prom:9090', maxValues: 1000}\n",
        _site(lambda stamps: _gpus(100, 8, stamps)), tmp_path, monkeypatch)
    assert readings is not None
    assert "more than 1,000 JSON values (maxValues)" in (
        readings.status[SignalName.GPU_POWER_W].error or "")
    assert not readings.status[SignalName.RACK_POWER_KW].error


async def test_a_range_selector_is_still_named_as_such() -> None:
    """A ``[range]`` selector's answer over this bound (and within the one a series) is named
    by its selector, as before."""
    samples = ",".join(['[1000,"1"]'] * 200)
    matrix = (b'{"status":"success","data":{"resultType":"matrix","result":['
              b'{"metric":{"Hostname":"n0","gpu":"0"},"values":[' + samples.encode() + b"]}]}}")
    client = _client(lambda _: httpx.Response(200, content=matrix), max_values=100,
                     max_values_per_series=1_000_000)
    with pytest.raises(PermanentError, match=r"returned a matrix result; a signal needs an "
                       r"instant vector \(drop any \[range\] selector\)") as info:
        await client.query(GPU_QUERY + "[1m]")
    assert not isinstance(info.value, TooManyAnswerValuesError)
