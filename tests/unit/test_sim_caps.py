"""The telemetry simulator honours the GPU power limits the node agents report in force."""

from __future__ import annotations

import pytest

from m2g.model.inputs import WorkloadKind
from m2g.sim.model import NodeInfo, PodLoad, initial_state, step
from m2g.sim.power import PowerModel
from m2g_controllers.simulator import node_caps

NODE = NodeInfo("n0", "rack-0", gpus=4)
PODS = {"n0": [PodLoad("t/p", WorkloadKind.TRAINING, 4)]}


def test_a_capped_node_draws_what_the_curve_says() -> None:
    s0 = initial_state([NODE], 0.0)
    full = step(s0, PODS, 10.0)
    capped = step(s0, PODS, 10.0, node_caps={"n0": 0.75})
    w_full, w_cap = full.gpus["n0"][0].power_w, capped.gpus["n0"][0].power_w
    pm = PowerModel()
    assert w_cap == pytest.approx(pm.gpu_watts(WorkloadKind.TRAINING, 0.75))
    assert w_cap / w_full == pytest.approx(0.728 / 0.955, abs=3e-3)  # dvfs_sweep.csv pt_*
    assert capped.racks["rack-0"].power_kw < full.racks["rack-0"].power_kw


def test_caps_come_from_the_agents_status_not_the_spec() -> None:
    objs = [
        {"metadata": {"name": "n0"}, "spec": {"nodeName": "n0", "fraction": 0.5},
         "status": {"gpus": [{"limitWatts": 1050, "defaultWatts": 1400}] * 4}},
        {"metadata": {"name": "n1"}, "spec": {"nodeName": "n1", "fraction": 0.5}},  # not yet
    ]
    assert node_caps(objs) == {"n0": 0.75}
