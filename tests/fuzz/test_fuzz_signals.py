"""Fuzzing signal parsing and projection: any Prometheus body is samples or one signal's
PermanentError; any samples give readings whose fresh values are finite and in bounds."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from m2g.signals import PrometheusClient, SignalConfig
from m2g.signals.config import SignalName
from m2g.signals.prometheus import PermanentError
from m2g.signals.reader import read_signals
from m2g.signals.readings import Expected, Freshness, build_readings
from m2g.signals.sample import Sample
from m2g.signals.sanity import bounds_of
from tests.fuzz.helpers import NUMBERS, count, json_values

NOW = 1_800_000_000.0
KEYS = st.sampled_from(["status", "data", "resultType", "result", "metric", "value", "rack",
                        "Hostname", "gpu", "__name__", "vector", "scalar", "success"])


@given(json_values(KEYS, leaves=30))
def test_any_query_data(data: Any) -> None:
    count()
    try:
        samples = PrometheusClient._parse(data, "q")
    except PermanentError as exc:
        assert "\n" not in str(exc)
    else:
        for s in samples:
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
            assert isinstance(s.value, float) and isinstance(s.timestamp, float)


LABELS = st.fixed_dictionaries({}, optional={
    "rack": st.sampled_from(["r0", "r1", ""]), "Hostname": st.sampled_from(["n0", "n1"]),
    "gpu": st.sampled_from(["0", "1", "2"]), "power_domain": st.sampled_from(["pd0"])})
TIMES = st.one_of(st.floats(min_value=NOW - 10_000, max_value=NOW + 10_000),
                  st.sampled_from([math.nan, math.inf, -math.inf, 0.0, NOW]))
SAMPLES = st.lists(st.builds(Sample, LABELS, NUMBERS.map(float), TIMES), max_size=12)


@given(st.dictionaries(st.sampled_from(list(SignalName)), SAMPLES, max_size=7))
def test_any_samples(samples: dict[SignalName, list[Sample]]) -> None:
    count()
    r = build_readings(samples, NOW, expected=Expected(nodes=("n0",), racks=("r0",),
                                                       gpus_per_node=2))
    for rack in r.racks.values():
        for name, reading in ((SignalName.RACK_POWER_KW, rack.power_kw),
                              (SignalName.RACK_INLET_C, rack.inlet_c),
                              (SignalName.COOLANT_TEMP_C, rack.coolant_c)):
            if reading.freshness is Freshness.FRESH:
                b = bounds_of(name)
                assert reading.value is not None and b.low <= reading.value <= b.high
            else:
                assert reading.value is None
    for node in r.nodes.values():
        for reading in (node.power_w, node.gpu_temp_max_c, node.xid):
            assert reading.value is None or math.isfinite(reading.value)
    for st_ in r.status.values():
        assert st_.fresh >= 0 and st_.invalid >= 0


async def _no_sleep(seconds: float) -> None:
    pass


@given(st.lists(st.tuples(st.sampled_from([200, 200, 200, 400, 429, 500, 503]),
                          json_values(KEYS, leaves=25)), min_size=1, max_size=4))
def test_read_signals_never_raises(answers: list[tuple[int, Any]]) -> None:
    count()
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        code, body = answers[calls % len(answers)]
        calls += 1
        return httpx.Response(code, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})

    async def go() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        client = PrometheusClient("http://prom", http, clock=lambda: NOW, sleep=_no_sleep)
        r = await read_signals(client, SignalConfig(), Expected(racks=("r0",)))
        assert set(r.status) == set(SignalName)
        await http.aclose()

    asyncio.run(go())
