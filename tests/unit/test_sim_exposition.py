"""Rendering a factory state as /metrics text (prometheus_client registry + generate_latest)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from m2g.model.inputs import WorkloadKind
from m2g.sim.exposition import render
from m2g.sim.faults import Fault, FaultKind
from m2g.sim.model import NodeInfo, PodLoad, initial_state, step, with_faults


def metrics(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_render_dcgm_and_facility_series() -> None:
    nodes = [NodeInfo("n0", "rack-000", "pd-00", "block-00", "uuid.0", product="NVIDIA GB300"),
             NodeInfo("n1", "rack-000", "pd-00", "block-00", "uuid.0")]
    s = with_faults(initial_state(nodes, 0.0),
                    [Fault(kind=FaultKind.TRAY_FAILED, node="n1")])
    s = step(s, {"n0": [PodLoad("p", WorkloadKind.TRAINING, 4)]}, 10.0)
    m = metrics(render(s))
    power = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_POWER_USAGE"]}
    assert len(power) == 8
    assert power[("n0", "0")] > 1000 > 300 > power[("n1", "0")]
    by_gpu = {(lb["Hostname"], lb["gpu"]): lb for lb, _ in m["DCGM_FI_DEV_GPU_TEMP"]}
    labels = by_gpu[("n0", "0")]
    assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                           "container", "namespace", "pod"}
    assert labels["modelName"] == "NVIDIA GB300" and labels["UUID"].startswith("GPU-")
    assert (labels["pod"], labels["container"]) == ("p", "main")  # DCGM's pod mapping
    assert by_gpu[("n1", "0")]["pod"] == ""  # idle: no pod (Prometheus stores no label)
    xids = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids[("n1", "3")] == 79 and xids[("n0", "3")] == 0
    shelves = m["facility_pdu_power_watts"]
    assert len(shelves) == 8
    assert {lb["pdu"] for lb, _ in shelves} == {f"rack-000-ps{i}" for i in range(8)}
    assert all(lb["rack"] == "rack-000" and lb["power_domain"] == "pd-00" for lb, _ in shelves)
    watts = sum(v for _, v in shelves)
    assert watts == pytest.approx(sum(power.values()) + 2 * 1850, abs=1)
    assert m["facility_power_domain_power_watts"] == [({"power_domain": "pd-00"},
                                                       pytest.approx(watts, abs=1))]
    assert m["facility_rack_inlet_temperature_celsius"][0][1] > 25
    assert m["facility_rack_coolant_supply_temperature_celsius"][0] == (
        {"rack": "rack-000", "power_domain": "pd-00"}, pytest.approx(30))
    assert m["m2g_sim_fault_active"] == [({"kind": "tray-failed", "target": "n1"}, 1.0)]
    assert m["m2g_sim_state_timestamp_seconds"] == [({}, 10.0)]
