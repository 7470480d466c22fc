"""Signal sanity: impossible values and timestamps are INVALID (the fail-safe of missing), a
malformed Prometheus answer never raises out of the reader, 429/5xx are retried with backoff."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from m2g.signals import PrometheusClient, RetryableError, SignalConfig
from m2g.signals.config import SignalName
from m2g.signals.exposition import SignalStatusCollector, status_lines
from m2g.signals.prometheus import PermanentError, RateLimitedError, fetch_signals
from m2g.signals.reader import read_signals
from m2g.signals.readings import (
    Expected,
    Freshness,
    admission_headroom,
    build_readings,
    may_shed,
)
from m2g.signals.sample import Sample
from m2g.signals.sanity import MAX_FUTURE_SECONDS

NOW = 1_000_000.0


def rack(value: float, age: float = 5.0, name: str = "r0") -> Sample:
    return Sample({"rack": name}, value, NOW - age)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, -500.0, 2_001.0])
def test_impossible_rack_power_is_invalid_and_fails_safe(value: float) -> None:
    r = build_readings({SignalName.RACK_POWER_KW: [rack(value)]}, NOW,
                       expected=Expected(racks=("r0",)))
    power = r.racks["r0"].power_kw
    assert power.freshness is Freshness.INVALID and power.value is None
    assert admission_headroom(power, 150.0) == 0.0  # no headroom: new work waits
    assert may_shed(power, 100.0) is False  # and nothing is shed on it
    st = r.status[SignalName.RACK_POWER_KW]
    assert (st.invalid, st.fresh) == (1, 0) and SignalName.RACK_POWER_KW in r.stale_signals


def test_plausible_values_stay_fresh() -> None:
    r = build_readings({SignalName.RACK_POWER_KW: [rack(0.0), rack(140.0, name="r1")]}, NOW)
    assert [x.power_kw.value for x in r.racks.values()] == [0.0, 140.0]


def test_future_timestamps() -> None:
    slight = build_readings({SignalName.RACK_POWER_KW: [rack(100.0, -MAX_FUTURE_SECONDS / 2)]},
                            NOW)
    assert slight.racks["r0"].power_kw.value == 100.0  # clock skew: counts as new
    far = build_readings({SignalName.RACK_POWER_KW: [rack(100.0, -3600)]}, NOW)
    assert far.racks["r0"].power_kw.freshness is Freshness.INVALID
    nan_ts = build_readings({SignalName.RACK_POWER_KW: [Sample({"rack": "r0"}, 1.0, math.nan)]},
                            NOW)
    assert nan_ts.racks["r0"].power_kw.freshness is Freshness.INVALID


def test_a_future_sample_does_not_hide_the_good_one() -> None:
    r = build_readings({SignalName.RACK_POWER_KW: [rack(100.0, 5), rack(1.0, -86_400)]}, NOW)
    assert r.racks["r0"].power_kw.value == 100.0


def test_one_invalid_gpu_spoils_its_node() -> None:
    samples = [Sample({"Hostname": "n1", "gpu": str(g)}, v, NOW - 2)
               for g, v in enumerate([700.0, 700.0, math.inf, 700.0])]
    r = build_readings({SignalName.GPU_POWER_W: samples}, NOW,
                       expected=Expected(nodes=("n1",), gpus_per_node=4))
    assert r.nodes["n1"].power_w.freshness is Freshness.INVALID
    assert r.status[SignalName.GPU_POWER_W].invalid == 1


def test_invalid_is_visible_in_status_and_metrics() -> None:
    r = build_readings({SignalName.RACK_POWER_KW: [rack(math.inf)]}, NOW)
    line = next(x for x in status_lines(r) if x.startswith("rack_power_kw"))
    assert "invalid 1" in line and "FAIL-SAFE" in line
    series = {(s.labels["signal"], s.labels["freshness"]): s.value
              for fam in SignalStatusCollector(lambda: r).collect() for s in fam.samples
              if fam.name == "m2g_signal_series"}
    assert series[("rack_power_kw", "invalid")] == 1.0


# ---- the reader never raises ----------------------------------------------------------------


def answer(result: Any) -> httpx.Response:
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return httpx.Response(200, content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"})


async def no_sleep(seconds: float) -> None:
    pass


def client(handler: Any, **kw: Any) -> PrometheusClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return PrometheusClient("http://prom:9090", http, clock=lambda: NOW, sleep=no_sleep, **kw)


#: Answers whose elements cannot be told apart (no map, labels not a map of strings): the
#: whole signal is an error.
MALFORMED: list[Any] = [
    [{"metric": "rack", "value": [NOW, "1"]}],
    [{"metric": ["rack"], "value": [NOW, "1"]}],
    [{"metric": {"rack": 7}, "value": [NOW, "1"]}],
    [{"metric": {"rack": None}, "value": [NOW, "1"]}],
    [{"value": [NOW, "1"]}],
    [None],
    ["x"],
    {"a": 1},
    42,
]


@pytest.mark.parametrize("result", MALFORMED)
async def test_malformed_answers_are_one_signal_error(result: Any) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "facility_pdu_power_watts" in q:
            return answer(result)
        return answer([])

    with pytest.raises(PermanentError):
        await client(handler).query("facility_pdu_power_watts")
    out = await fetch_signals(client(handler), SignalConfig())
    assert not out[SignalName.RACK_POWER_KW].ok
    assert all(f.ok for n, f in out.items() if n != SignalName.RACK_POWER_KW)
    r = await read_signals(client(handler), SignalConfig(), Expected(racks=("r0",)))
    assert r.racks["r0"].power_kw.freshness is Freshness.MISSING
    assert "\n" not in r.status[SignalName.RACK_POWER_KW].error


#: A sample's ``value`` that is not what Prometheus writes (a JSON list ``[time, "number"]``):
#: malformed for its own series only.
MALFORMED_VALUES: list[Any] = [
    "12",  # unpacked as a pair: time 1, value 2 kW, read as fresh
    {"1": 0, "7": 0},  # a map unpacked as its keys: 7 kW
    [NOW, 12],  # a bare number: Prometheus always writes a string
    [str(NOW), "12"],  # the time as a string
    [NOW, "12", "x"],
    [NOW],
    [],
    None,
    "1",
    [NOW, ["1"]],
    [NOW, True],
    [True, "12"],
    [{"t": 1}, "1"],
    [NOW, None],
    # what Python's float() reads but no Prometheus writes (Go's FormatFloat: ASCII only):
    # "\u0665\u0660" read as 50 kW, "5_000" as 5,000 (the probe rerun)
    [NOW, "\u0665\u0660"],
    [NOW, "5_000"],
    [NOW, " 5"],
    [NOW, "infinity"],
    ["\u0661\u0668e8", "5"],
    [10 ** 400, "5"],
]


@pytest.mark.parametrize("value", MALFORMED_VALUES)
@pytest.mark.parametrize("in_stamps", [False, True])
async def test_a_malformed_value_spoils_its_own_series_only(value: Any, in_stamps: bool) -> None:
    """r0's ``value`` malformed (in the answer, or in the answer of ``timestamp(q)``): r0 reads
    INVALID (the fail-safe of missing, counted in the status), r1 is used as it is, nothing
    raises. Unpacked as any pair, ``"12"`` read as a fresh 2 kW; and any other malformed
    value made the whole signal (every rack) missing."""
    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "facility_pdu_power_watts" not in q:
            return answer([])
        stamps = q.startswith("timestamp(")
        good = str(NOW - 5) if stamps else "12000"
        r0 = value if stamps == in_stamps else [NOW, good]
        return answer([{"metric": {"rack": "r0"}, "value": r0},
                       {"metric": {"rack": "r1"}, "value": [NOW, good]}])

    samples = await client(handler).query("facility_pdu_power_watts")
    assert [s.labels["rack"] for s in samples] == ["r0", "r1"]
    out = await fetch_signals(client(handler), SignalConfig())
    assert all(f.ok for f in out.values())
    r = await read_signals(client(handler), SignalConfig(), Expected(racks=("r0", "r1")))
    assert r.racks["r0"].power_kw.freshness is Freshness.INVALID
    assert r.racks["r0"].power_kw.value is None
    assert r.racks["r1"].power_kw.value == 12.0  # W → kW
    assert r.racks["r1"].power_kw.freshness is Freshness.FRESH
    st = r.status[SignalName.RACK_POWER_KW]
    assert (st.fresh, st.invalid, st.missing, st.error) == (1, 1, 0, "")
    line = next(x for x in status_lines(r) if x.startswith("rack_power_kw"))
    assert "invalid 1" in line and "FAIL-SAFE" in line


async def test_a_scalar_must_be_a_time_and_a_string_too() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        body = {"status": "success", "data": {"resultType": "scalar", "result": "12"}}
        return httpx.Response(200, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})

    with pytest.raises(PermanentError):
        await client(handler).query("scalar(up)")


async def test_a_huge_number_reads_invalid_not_an_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "facility_pdu_power_watts" in q:
            value = str(NOW) if q.startswith("timestamp(") else "1" * 400  # float: inf
            return answer([{"metric": {"rack": "r0"}, "value": [NOW, value]}])
        return answer([])

    r = await read_signals(client(handler), SignalConfig(), Expected(racks=("r0",)))
    assert r.racks["r0"].power_kw.freshness is Freshness.INVALID


async def test_a_non_prometheus_error_inside_the_client_is_contained() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise RuntimeError("boom\nsecond line")

    r = await read_signals(client(handler), SignalConfig(), Expected(racks=("r0",)))
    assert all(st.error and "\n" not in st.error for st in r.status.values())


# ---- retries --------------------------------------------------------------------------------


async def test_429_and_5xx_are_retried_with_backoff_and_jitter() -> None:
    calls: list[int] = []
    waits: list[float] = []
    codes = [429, 503, 200]

    def handler(req: httpx.Request) -> httpx.Response:
        code = codes[len(calls)]
        calls.append(code)
        if code == 200:
            return answer([{"metric": {"rack": "r0"}, "value": [NOW, "12"]}])
        return httpx.Response(code, headers={"retry-after": "0.7"} if code == 429 else {})

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    c = client(handler, backoff_seconds=0.2, retries=2)
    c.sleep = sleep
    c.jitter = lambda: 0.25
    samples = await c.query("up")
    assert calls == [429, 503, 200] and samples[0].value == 12.0
    assert waits == [pytest.approx(0.7), pytest.approx(0.2 * 2 * 0.75)]  # Retry-After, then 2x


async def test_retries_are_bounded_and_429_is_not_permanent() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        return httpx.Response(429, headers={"retry-after": "3600"})

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    c = client(handler, retries=3, max_backoff_seconds=1.5)
    c.sleep = sleep
    with pytest.raises(RateLimitedError) as info:
        await c.query("up")
    assert isinstance(info.value, RetryableError) and n == 4
    assert waits == [1.5, 1.5, 1.5]  # a server's Retry-After is capped


async def test_timeouts_are_not_retried_at_once() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        raise httpx.ReadTimeout("slow", request=req)

    with pytest.raises(RetryableError, match="timed out"):
        await client(handler).query("up")
    assert n == 1


async def test_permanent_errors_are_not_retried() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data",
                                         "error": "parse"})

    with pytest.raises(PermanentError):
        await client(handler).query("up{")
    assert n == 1


# ---- value × scrape stamp: every pairing through the reader ---------------------------------
#
# ``query_with_age`` pairs each sample of ``q`` with ``timestamp(q)`` at the same instant. Every
# kind of value meets every kind of stamp answer for rack r0 (rack_power_kw, in W: scale 0.001,
# bounds 0 … 2,000 kW); only a plausible value with a known, recent stamp may read as fresh.
# Rack r1 is good in every answer and must read fresh whatever r0 does.

GOOD_VALUES = {"normal": "140000", "zero": "0", "minus-zero": "-0", "tiny": "1e-300",
               "top": "1999999"}
BAD_VALUES = {"NaN": "NaN", "+Inf": "+Inf", "-Inf": "-Inf", "1e300": "1e300",
              "negative": "-500", "-1e300": "-1e300", "over-bound": "2000001",
              "overflow": "1" * 400, "tiny-negative": "-1e-300"}

R0 = {"__name__": "facility_pdu_power_watts", "rack": "r0", "pdu": "a"}
R1 = {"__name__": "facility_pdu_power_watts", "rack": "r1", "pdu": "a"}


def _stamp(labels: dict[str, str], value: Any) -> dict[str, Any]:
    return {"metric": {k: v for k, v in labels.items() if k != "__name__"},
            "value": [NOW, value if isinstance(value, str) else repr(value)]}


#: r0's part of the ``timestamp(q)`` answer: a list of elements (r1's stamp is always there).
FRESH_STAMPS: dict[str, list[dict[str, Any]]] = {
    "past": [_stamp(R0, NOW - 5)],
    "now": [_stamp(R0, NOW)],
    "within-skew": [_stamp(R0, NOW + MAX_FUTURE_SECONDS / 2)],
}
OLD_STAMPS: dict[str, list[dict[str, Any]]] = {
    "an-hour-ago": [_stamp(R0, NOW - 3600)],
    "negative": [_stamp(R0, -5.0)],
}
GARBAGE_STAMPS: dict[str, list[dict[str, Any]]] = {
    "missing": [],
    "other-labels": [_stamp({**R0, "pdu": "b"}, NOW - 5)],
    "future": [_stamp(R0, NOW + 3600)],
    "just-past-skew": [_stamp(R0, NOW + MAX_FUTURE_SECONDS + 1)],
    "1e300": [_stamp(R0, "1e300")],
    "NaN": [_stamp(R0, "NaN")],
    "+Inf": [_stamp(R0, "+Inf")],
    "-Inf": [_stamp(R0, "-Inf")],
    "conflicting": [_stamp(R0, NOW - 5), _stamp(R0, NOW - 7)],
}
STAMPS = {**FRESH_STAMPS, **OLD_STAMPS, **GARBAGE_STAMPS}
VALUES = {**GOOD_VALUES, **BAD_VALUES}
PAIRINGS = [(v, s) for v in VALUES for s in STAMPS]


def test_the_pairings_are_exhaustive() -> None:
    assert len(PAIRINGS) == 14 * 14 == 196


@pytest.mark.parametrize(("value_kind", "stamp_kind"), PAIRINGS)
async def test_no_garbage_pairing_reads_fresh(value_kind: str, stamp_kind: str) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        if "facility_pdu_power_watts" not in q:
            return answer([])
        if q.startswith("timestamp("):
            return answer([*STAMPS[stamp_kind], _stamp(R1, NOW - 2)])
        return answer([{"metric": R0, "value": [NOW, VALUES[value_kind]]},
                       {"metric": R1, "value": [NOW, "100000"]}])

    r = await read_signals(client(handler), SignalConfig(), Expected(racks=("r0", "r1")))
    power = r.racks["r0"].power_kw
    if value_kind in GOOD_VALUES and stamp_kind in FRESH_STAMPS:
        assert power.freshness is Freshness.FRESH
        assert power.value == float(VALUES[value_kind]) * 0.001
    else:
        want = (Freshness.STALE if value_kind in GOOD_VALUES and stamp_kind in OLD_STAMPS
                else Freshness.INVALID)
        assert (power.freshness, power.value) == (want, None)
        assert admission_headroom(power, 1_000.0) == 0.0  # no headroom: new work waits
        assert may_shed(power, 0.0) is False  # and nothing is shed on it
        assert SignalName.RACK_POWER_KW in r.stale_signals
    other = r.racks["r1"].power_kw
    assert (other.freshness, other.value, other.age_seconds) == (Freshness.FRESH, 100.0, 2.0)
