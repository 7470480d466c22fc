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
    labels = m["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert set(labels) == {"gpu", "UUID", "device", "modelName", "Hostname"}
    assert labels["modelName"] == "NVIDIA GB300" and labels["UUID"].startswith("GPU-")
    xids = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids[("n1", "3")] == 79 and xids[("n0", "3")] == 0
    (rack_labels, kw), = m["m2g_sim_rack_power_kilowatts"]
    assert rack_labels == {"rack": "rack-000", "power_domain": "pd-00", "block": "block-00",
                           "clique": "uuid.0"}
    assert kw == pytest.approx(sum(power.values()) / 1000 + 2 * 1.85, abs=0.01)
    assert m["m2g_sim_power_domain_power_kilowatts"] == [({"power_domain": "pd-00"},
                                                          pytest.approx(kw))]
    assert m["m2g_sim_rack_inlet_celsius"][0][1] > 25
    assert m["m2g_sim_rack_coolant_supply_celsius"][0][1] == pytest.approx(30)
    assert m["m2g_sim_fault_active"] == [({"kind": "tray-failed", "target": "n1"}, 1.0)]
    assert m["m2g_sim_state_timestamp_seconds"] == [({}, 10.0)]
