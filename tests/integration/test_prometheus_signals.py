"""The Prometheus signal adapter against a real Prometheus holding the real H200 readings.

The recording (one H200, 700 W limit) ran idle → full → half → quarter → idle; README numbers:
idle ≈121 W / 40 °C, full ≈690 W / 63 °C, half ≈510 W, quarter ≈340 W.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus.h200 import HOSTNAME, Phase, Row
from prometheus.server import PrometheusServer, free_port

from m2g.signals import (
    PermanentError,
    PrometheusClient,
    RetryableError,
    SignalConfig,
    SignalName,
    build_readings,
)
from m2g.signals.prometheus import BadQueryError, SignalFetch, fetch_signals
from m2g.signals.readings import Freshness, Readings, admission_headroom, may_shed

LEVEL_W = {"idle": 121.0, "full": 690.0, "half": 510.0, "quarter": 340.0}
# one instant reading: duty-cycled phases swing ±30 W around their mean (measured: σ 15–17 W)
INSTANT_TOL = {"idle": 0.03, "full": 0.03, "half": 0.10, "quarter": 0.15}

Data = tuple[list[Row], list[Phase]]


def client(url: str, http: httpx.AsyncClient) -> PrometheusClient:
    return PrometheusClient(url, http, timeout_seconds=5.0, clock=lambda: 0.0)


async def read(server: PrometheusServer, at: float, config: SignalConfig | None = None,
               ) -> tuple[dict[SignalName, SignalFetch], Readings]:
    cfg = config or SignalConfig(url=server.url)
    async with httpx.AsyncClient() as http:
        fetched = await fetch_signals(client(server.url, http), cfg, at)
    errors = {n: str(f.error) for n, f in fetched.items() if f.error}
    readings = build_readings({n: f.samples for n, f in fetched.items()}, at, cfg,
                              errors=errors)
    return fetched, readings


async def test_phase_power_levels(h200_prometheus: PrometheusServer, h200_data: Data) -> None:
    _, phases = h200_data
    for phase in phases:
        at = phase.start + phase.seconds * 0.6
        _, readings = await read(h200_prometheus, at)
        node = readings.nodes[HOSTNAME]
        assert node.power_w.freshness is Freshness.FRESH, phase.name
        assert node.power_w.age_seconds < 1.0  # nvidia-smi sampled every 250 ms
        want = LEVEL_W[phase.name]
        assert node.power_w.value == pytest.approx(want, rel=INSTANT_TOL[phase.name]), phase.name


async def test_configurable_promql_averages_duty_cycled_phases(
        h200_prometheus: PrometheusServer, h200_data: Data) -> None:
    """A site can smooth a signal with its own PromQL; the phase means then match within 3%."""
    _, phases = h200_data
    cfg = SignalConfig.model_validate({"url": h200_prometheus.url, "signals": {
        "gpu_power_w": {"query": "avg_over_time(DCGM_FI_DEV_POWER_USAGE[15s])"}}})
    for phase in phases:
        _, readings = await read(h200_prometheus, phase.start + phase.seconds - 0.5, cfg)
        got = readings.nodes[HOSTNAME].power_w.value
        assert got == pytest.approx(LEVEL_W[phase.name], rel=0.03), phase.name


@pytest.mark.parametrize("promql", [
    "sum by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)",
    "max by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)",
    "avg_over_time(DCGM_FI_DEV_POWER_USAGE[15s])",
    "DCGM_FI_DEV_POWER_USAGE * 1",
    'label_replace(DCGM_FI_DEV_POWER_USAGE, "node", "$1", "Hostname", "(.*)")',
])
async def test_an_aggregating_query_is_stamped_with_the_evaluation_time(
        h200_prometheus: PrometheusServer, h200_data: Data, promql: str) -> None:
    """``timestamp(q)`` of a computed vector answers the evaluation time under q's labels, so
    every sample of such a query pairs with a stamp (age 0) and none reads as unknown."""
    _, phases = h200_data
    at = phases[1].start + 30.0
    async with httpx.AsyncClient() as http:
        samples = await client(h200_prometheus.url, http).query_with_age(promql, at)
    assert samples and all(s.timestamp == pytest.approx(at, abs=1e-3) for s in samples), samples


async def test_a_plain_selector_carries_its_scrape_time(
        h200_prometheus: PrometheusServer, h200_data: Data) -> None:
    rows, _ = h200_data
    at = rows[-1].t + 90  # 90 s after the last scrape, inside the 5 min look-back
    async with httpx.AsyncClient() as http:
        samples = await client(h200_prometheus.url, http).query_with_age(
            "DCGM_FI_DEV_POWER_USAGE", at)
    assert samples and all(s.timestamp == pytest.approx(rows[-1].t, abs=1) for s in samples)


async def test_temperatures(h200_prometheus: PrometheusServer, h200_data: Data) -> None:
    _, phases = h200_data
    idle, full = phases[0], phases[1]
    _, r = await read(h200_prometheus, idle.start + 10)
    assert r.nodes[HOSTNAME].gpu_temp_max_c.value == pytest.approx(40, abs=1)
    _, r = await read(h200_prometheus, full.start + full.seconds - 1)
    assert r.nodes[HOSTNAME].gpu_temp_max_c.value == pytest.approx(63, abs=1.5)
    assert r.nodes[HOSTNAME].xid.value == 0


async def test_after_the_data_ends_the_signal_is_stale_then_missing(
        h200_prometheus: PrometheusServer, h200_data: Data) -> None:
    rows, _ = h200_data
    end = rows[-1].t
    cfg = SignalConfig.model_validate({"url": h200_prometheus.url, "signals": {
        "gpu_power_w": {"max_age_seconds": 30}}})
    _, r = await read(h200_prometheus, end + 90, cfg)  # inside Prometheus's 5 min look-back
    power = r.nodes[HOSTNAME].power_w
    assert power.freshness is Freshness.STALE
    assert power.value is None and power.age_seconds == pytest.approx(90, abs=1)
    assert power.last_value == pytest.approx(121, rel=0.05)
    assert admission_headroom(power, cap=700) == 0.0  # fail-safe: nothing new is admitted
    assert not may_shed(power, cap=100)  # and nothing is shed on stale data
    assert SignalName.GPU_POWER_W in r.stale_signals

    _, r = await read(h200_prometheus, end + 3600)  # past the look-back: no series at all
    assert HOSTNAME not in r.nodes
    assert r.status[SignalName.GPU_POWER_W].missing == 1


async def test_unreachable_prometheus_is_retryable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient() as http:
        with pytest.raises(RetryableError, match="unreachable") as info:
            await client(url, http).query("up", 1.0)
        assert "\n" not in str(info.value)
        fetched = await fetch_signals(client(url, http), SignalConfig(url=url), 1.0)
    assert all(isinstance(f.error, RetryableError) for f in fetched.values())
    readings = build_readings({}, 1.0, errors={n: str(f.error) for n, f in fetched.items()})
    assert set(readings.stale_signals) == set(SignalName)
    assert readings.status[SignalName.RACK_POWER_KW].error.startswith("Prometheus at")


async def test_bad_promql_is_permanent(h200_prometheus: PrometheusServer) -> None:
    async with httpx.AsyncClient() as http:
        c = client(h200_prometheus.url, http)
        with pytest.raises(BadQueryError, match="bad PromQL 'sum by \\(Hostname'") as info:
            await c.query("sum by (Hostname", 1795987650.0)
        assert "\n" not in str(info.value)
        with pytest.raises(PermanentError, match="instant vector"):
            await c.query("DCGM_FI_DEV_POWER_USAGE[1m]", 1795987650.0)
        scalar = await c.query("scalar(DCGM_FI_DEV_POWER_USAGE)", 1795987650.0)
        assert scalar[0].value == pytest.approx(690, rel=0.03)
