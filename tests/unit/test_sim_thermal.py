"""The first-order thermal model: time constant, step-size independence, steady states."""

from __future__ import annotations

import math

import pytest

from m2g.model.inputs import WorkloadKind
from m2g.sim.faults import Fault, FaultKind
from m2g.sim.model import NodeInfo, PodLoad, initial_state, step, with_faults
from m2g.sim.thermal import ThermalModel, relax


def test_relax_time_constant_and_step_independence() -> None:
    assert relax(0.0, 10.0, 60.0, 60.0) == pytest.approx(10 * (1 - math.exp(-1)))
    x = 0.0
    for _ in range(12):
        x = relax(x, 10.0, 5.0, 60.0)
    assert x == pytest.approx(relax(0.0, 10.0, 60.0, 60.0))
    assert relax(3.0, 10.0, 0.0, 60.0) == 3.0
    assert relax(3.0, 10.0, 1.0, 0.0) == 10.0


def test_h200_fit_reproduces_idle_and_full_temperatures() -> None:
    t = ThermalModel()
    # the H200 at idle (121 W) and full (690 W) of 700 W, at the fit's 30 °C reference
    assert t.gpu_target(30.0, 121 / 700) == pytest.approx(40, abs=1.0)
    assert t.gpu_target(30.0, 690 / 700) == pytest.approx(63, abs=1.0)


def rack(n: int = 2) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", "rack-0", "pd-0") for i in range(n)]


def test_cooling_fault_raises_inlet_with_the_inlet_time_constant() -> None:
    th = ThermalModel()
    s0 = initial_state(rack(), 0.0)
    base = s0.racks["rack-0"].inlet_c
    s = with_faults(s0, [Fault(kind=FaultKind.COOLING_DEGRADED, rack="rack-0", delta_c=10)])
    s1 = step(s, {}, th.inlet_tau_s)
    assert s1.racks["rack-0"].inlet_c - base == pytest.approx(10 * (1 - math.exp(-1)), abs=0.01)
    assert s1.racks["rack-0"].coolant_c - th.coolant_c == pytest.approx(
        10 * (1 - math.exp(-th.inlet_tau_s / th.coolant_tau_s)), abs=0.01)
    s2 = step(s1, {}, 3600.0)
    assert s2.racks["rack-0"].inlet_c == pytest.approx(base + 10, abs=0.01)
    # and the GPUs on the hotter coolant run hotter
    assert s2.gpus["n0"][0].temp_c == pytest.approx(s0.gpus["n0"][0].temp_c + 10, abs=0.05)


def test_gpu_converges_to_its_load_steady_state() -> None:
    th = ThermalModel()
    s0 = initial_state(rack(1), 0.0)
    pods = {"n0": [PodLoad("p", WorkloadKind.TRAINING, 4)]}
    s1 = step(s0, pods, th.gpu_tau_s)
    g0, g1 = s0.gpus["n0"][0], s1.gpus["n0"][0]
    target = th.gpu_target(th.coolant_c, g1.power_w / 1400.0)
    assert g1.temp_c == pytest.approx(target - (target - g0.temp_c) * math.exp(-1), abs=0.01)
    assert step(s1, pods, 60.0).gpus["n0"][0].temp_c == pytest.approx(target, abs=0.01)
    assert target == pytest.approx(61.7, abs=0.5)
