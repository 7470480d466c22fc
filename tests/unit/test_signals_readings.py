"""Samples → readings: ages, aggregation, and the fail-safe staleness rule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from m2g.signals import Sample, SignalConfig, SignalName, build_readings
from m2g.signals.config import SignalConfigError, load_signal_config
from m2g.signals.readings import (
    Expected,
    Freshness,
    SignalReading,
    admission_headroom,
    gpu_failed,
    may_shed,
    thermal_headroom,
)

NOW = 10_000.0


def gpu(node: str, idx: int, value: float, age: float) -> Sample:
    return Sample({"Hostname": node, "gpu": str(idx), "UUID": f"GPU-{node}-{idx}"}, value,
                  NOW - age)


def test_node_power_is_the_sum_of_fresh_gpus() -> None:
    samples = {SignalName.GPU_POWER_W: [gpu("n1", i, 1000.0 + i, age=5 + i) for i in range(4)]}
    r = build_readings(samples, NOW, expected=Expected(nodes=("n1",), gpus_per_node=4))
    p = r.nodes["n1"].power_w
    assert p.freshness is Freshness.FRESH
    assert p.value == pytest.approx(4006.0)
    assert p.age_seconds == pytest.approx(8.0)  # the oldest GPU's age


def test_one_stale_gpu_makes_the_node_stale_and_a_missing_one_missing() -> None:
    samples = {SignalName.GPU_POWER_W: [gpu("n1", 0, 900, 5), gpu("n1", 1, 900, 500),
                                        gpu("n2", 0, 900, 5)]}
    r = build_readings(samples, NOW, expected=Expected(nodes=("n1", "n2", "n3"),
                                                       gpus_per_node=2))
    n1, n2, n3 = (r.nodes[n].power_w for n in ("n1", "n2", "n3"))
    assert n1.freshness is Freshness.STALE and n1.value is None
    assert n1.age_seconds == pytest.approx(500) and n1.last_value == pytest.approx(1800)
    assert n2.freshness is Freshness.MISSING  # GPU 1 never reported
    assert n3.freshness is Freshness.MISSING and math.isinf(n3.age_seconds)
    st = r.status[SignalName.GPU_POWER_W]
    assert (st.fresh, st.stale, st.missing) == (2, 1, 3)
    assert SignalName.GPU_POWER_W in r.stale_signals


def test_newest_duplicate_wins_and_unlabelled_series_are_ignored() -> None:
    samples = {SignalName.RACK_POWER_KW: [
        Sample({"rack": "rack-000"}, 100.0, NOW - 50), Sample({"rack": "rack-000"}, 120.0, NOW - 2),
        Sample({"other": "x"}, 1.0, NOW)]}
    r = build_readings(samples, NOW, expected=Expected(racks=("rack-000", "rack-001")))
    assert r.racks["rack-000"].power_kw.value == 120.0
    assert r.racks["rack-001"].power_kw.freshness is Freshness.MISSING
    assert r.racks["rack-000"].inlet_c.freshness is Freshness.MISSING


def test_domain_and_xid() -> None:
    samples = {
        SignalName.DOMAIN_POWER_KW: [Sample({"power_domain": "pd-00"}, 480.0, NOW - 1)],
        SignalName.GPU_XID: [gpu("n1", 0, 0, 1), gpu("n1", 3, 79, 1), gpu("n2", 0, 79, 1000)],
    }
    r = build_readings(samples, NOW)
    assert r.domains["pd-00"].power_kw.value == 480.0
    assert r.nodes["n1"].xid_gpus == ("3",) and r.nodes["n1"].xid.value == 79
    assert gpu_failed(r.nodes["n1"].xid) is True
    assert r.nodes["n2"].xid_gpus == () and gpu_failed(r.nodes["n2"].xid) is None  # stale


def test_fail_safe_rule() -> None:
    fresh = SignalReading.of(90.0, 10, 60)
    stale = SignalReading.of(90.0, 61, 60)
    missing = SignalReading.missing(60)
    assert admission_headroom(fresh, 100) == 10.0
    assert admission_headroom(stale, 1000) == 0.0 and admission_headroom(missing, 1000) == 0.0
    assert may_shed(SignalReading.of(120, 1, 60), 100)
    assert not may_shed(SignalReading.of(120, 61, 60), 100)  # never shed on stale data
    assert not may_shed(missing, 0)
    assert thermal_headroom(SignalReading.of(30, 1, 60), 45) == 15.0
    assert thermal_headroom(stale, 45) == 0.0
    assert SignalReading.of(1.0, -5, 60).age_seconds == 0.0


def test_config_defaults_partial_override_and_errors(tmp_path: Path) -> None:
    assert SignalConfig().spec(SignalName.GPU_POWER_W).query == "DCGM_FI_DEV_POWER_USAGE"
    f = tmp_path / "signals.yaml"
    f.write_text("url: http://prom:9090\nsignals:\n  rack_inlet_c:\n    max_age_seconds: 15\n")
    cfg = load_signal_config(f)
    assert cfg.spec(SignalName.RACK_INLET_C).max_age_seconds == 15
    assert cfg.spec(SignalName.RACK_INLET_C).query == "facility_rack_inlet_temperature_celsius"
    with pytest.raises(Exception):  # noqa: B017 - frozen
        cfg.url = "x"  # type: ignore[misc]
    f.write_text("signals:\n  rack_power:\n    query: x\n")
    with pytest.raises(SignalConfigError, match="rack_power") as info:
        load_signal_config(f)
    assert "\n" not in str(info.value)
    f.write_text("signals: [\n")
    with pytest.raises(SignalConfigError, match="invalid YAML at line"):
        load_signal_config(f)
    with pytest.raises(SignalConfigError, match="No such file"):
        load_signal_config(tmp_path / "nope.yaml")


def test_status_metrics_and_lines() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from m2g.signals.exposition import SignalStatusCollector, status_lines

    r = build_readings({SignalName.GPU_POWER_W: [gpu("n1", 0, 500, 3), gpu("n2", 0, 500, 300)]},
                       NOW, errors={SignalName.RACK_POWER_KW: "Prometheus at x is unreachable"})
    reg = CollectorRegistry()
    reg.register(SignalStatusCollector(lambda: r))
    text = generate_latest(reg).decode()
    assert 'm2g_signal_age_seconds{signal="gpu_power_w"} 300.0' in text
    assert 'm2g_signal_series{freshness="stale",signal="gpu_power_w"} 1.0' in text
    assert 'm2g_signal_query_failed{signal="rack_power_kw"} 1.0' in text
    assert 'm2g_signal_stale{signal="gpu_power_w"} 1.0' in text
    lines = status_lines(r)
    assert len(lines) == len(SignalName)
    assert lines[0].startswith("gpu_power_w") and "FAIL-SAFE" in lines[0]
    rack_line = next(x for x in lines if x.startswith("rack_power_kw"))
    assert "unreachable" in rack_line and "oldest ∞" in rack_line


def test_pdus_of_a_rack_sum_and_sensors_max_and_one_stale_part_spoils_the_sum() -> None:
    cfg = SignalConfig.model_validate({"signals": {
        "rack_power_kw": {"query": "pdu_w", "keyLabel": "rack", "aggregate": "sum",
                          "scale": 0.001},
        "rack_inlet_c": {"query": "inlet", "aggregate": "max"}}})

    def pdu(rack: str, n: int, watts: float, age: float) -> Sample:
        return Sample({"rack": rack, "pdu": f"{rack}-ps{n}"}, watts, NOW - age)

    samples = {
        SignalName.RACK_POWER_KW: [pdu("r0", i, 16.0, 5 + i) for i in range(8)]
        + [pdu("r1", 0, 16.0, 5), pdu("r1", 1, 16.0, 500)],
        SignalName.RACK_INLET_C: [Sample({"rack": "r0", "sensor": s}, t, NOW - 3)
                                  for s, t in (("top", 31.0), ("bottom", 27.5))]}
    # the scale is applied by fetch_signals; here the readings see kW already and sum them
    r = build_readings(samples, NOW, cfg, Expected(racks=("r0", "r1", "r2")))
    assert r.racks["r0"].power_kw.value == pytest.approx(128)
    assert r.racks["r0"].power_kw.age_seconds == pytest.approx(12)  # the oldest PDU
    assert r.racks["r1"].power_kw.freshness is Freshness.STALE  # a partial sum under-reports
    assert r.racks["r2"].power_kw.freshness is Freshness.MISSING
    assert r.racks["r0"].inlet_c.value == 31.0


def test_config_accepts_camel_case_and_merges_it_with_the_defaults() -> None:
    cfg = SignalConfig.model_validate({"timeoutSeconds": 2, "signals": {
        "gpu_power_w": {"maxAgeSeconds": 15}}})
    spec = cfg.spec(SignalName.GPU_POWER_W)
    assert (spec.query, spec.max_age_seconds, cfg.timeout_seconds) == (
        "DCGM_FI_DEV_POWER_USAGE", 15, 2)
