"""step(): GPUs assigned to pods, rack and power-domain sums, and injected faults."""

from __future__ import annotations

import pytest

from m2g.model.inputs import WorkloadKind
from m2g.sim.faults import Fault, FaultKind, FaultSpecError, parse_fault
from m2g.sim.model import NODE_OVERHEAD_KW, NodeInfo, PodLoad, initial_state, step, with_faults
from m2g.sim.model import with_nodes as with_node_list
from m2g.sim.power import PowerModel

PM = PowerModel()
IDLE, TRAIN = PM.gpu_watts(None), PM.gpu_watts(WorkloadKind.TRAINING)


def factory() -> list[NodeInfo]:
    return [NodeInfo(f"r{r}-n{i}", f"rack-{r}", "pd-0" if r < 2 else "pd-1")
            for r in range(3) for i in range(2)]


def test_pods_load_their_gpus_and_racks_sum() -> None:
    s = step(initial_state(factory(), 0.0), {
        "r0-n0": [PodLoad("b", WorkloadKind.TRAINING, 2), PodLoad("a", WorkloadKind.INFERENCE, 1),
                  PodLoad("c", WorkloadKind.TRAINING, 4)],  # only 1 of c's 4 GPUs fits
        "ghost": [PodLoad("x", WorkloadKind.TRAINING, 4)],
    }, 5.0)
    g = s.gpus["r0-n0"]
    assert [x.pod for x in g] == ["a", "b", "b", "c"]
    assert g[0].power_w == pytest.approx(PM.gpu_watts(WorkloadKind.INFERENCE))
    assert g[1].power_w == pytest.approx(TRAIN)
    assert all(x.power_w == pytest.approx(IDLE) for x in s.gpus["r0-n1"])
    rack0 = (sum(x.power_w for x in g) + 4 * IDLE) / 1000 + 2 * NODE_OVERHEAD_KW
    assert s.racks["rack-0"].power_kw == pytest.approx(rack0)
    idle_rack = 8 * IDLE / 1000 + 2 * NODE_OVERHEAD_KW
    assert s.racks["rack-1"].power_kw == pytest.approx(idle_rack)
    assert s.domains["pd-0"] == pytest.approx(rack0 + idle_rack)
    assert s.domains["pd-1"] == pytest.approx(idle_rack)
    assert s.time == 5.0


def test_full_gb300_rack_is_about_130_kw() -> None:
    nodes = [NodeInfo(f"n{i}", "rack-0", "pd-0") for i in range(18)]
    s = step(initial_state(nodes, 0), {n.name: [PodLoad("p", WorkloadKind.TRAINING, 4)]
                                       for n in nodes}, 1)
    assert s.racks["rack-0"].power_kw == pytest.approx(130, abs=2)


def test_tray_failure_and_power_caps() -> None:
    busy = {n.name: [PodLoad("p", WorkloadKind.TRAINING, 4)] for n in factory()}
    s = with_faults(initial_state(factory(), 0.0), [
        Fault(kind=FaultKind.TRAY_FAILED, node="r0-n0"),
        Fault(kind=FaultKind.POWER_CAP, rack="rack-1", fraction=0.5),
        Fault(kind=FaultKind.POWER_CAP, node="r2-n1", fraction=0.6),
        Fault(kind=FaultKind.POWER_CAP, node="r2-n1", fraction=0.4),
    ])
    s = step(s, busy, 1.0)
    assert all(g.xid == 79 and g.power_w == pytest.approx(IDLE) for g in s.gpus["r0-n0"])
    assert all(g.xid == 0 and g.power_w == pytest.approx(TRAIN) for g in s.gpus["r0-n1"])
    assert all(g.power_w <= 700.0 * 1.02 for n in ("r1-n0", "r1-n1") for g in s.gpus[n])
    assert all(g.power_w <= 560.0 * 1.02 for g in s.gpus["r2-n1"])  # the tighter cap wins
    assert all(g.power_w == pytest.approx(TRAIN) for g in s.gpus["r2-n0"])
    cleared = step(with_faults(s, []), busy, 2.0)
    assert all(g.xid == 0 and g.power_w == pytest.approx(TRAIN) for g in cleared.gpus["r0-n0"])


def test_with_nodes_keeps_history_and_settles_new_nodes() -> None:
    s = step(initial_state(factory()[:2], 0.0),
             {"r0-n0": [PodLoad("p", WorkloadKind.TRAINING, 4)]}, 100.0)
    hot = s.gpus["r0-n0"][0].temp_c
    s2 = with_node_list(s, [*factory()[:2], NodeInfo("new", "rack-9", "pd-9")])
    assert s2.gpus["r0-n0"][0].temp_c == hot
    assert s2.gpus["new"][0].power_w == pytest.approx(IDLE) and "rack-9" in s2.racks
    assert "r0-n1" not in with_node_list(s2, [NodeInfo("new", "rack-9")]).gpus


@pytest.mark.parametrize(("spec", "match"), [
    ({"kind": "cooling-degraded"}, "needs a rack"),
    ({"kind": "tray-failed", "rack": "rack-0"}, "needs a node"),
    ({"kind": "power-cap", "rack": "a", "node": "b", "fraction": 0.5}, "exactly one"),
    ({"kind": "power-cap", "node": "b", "fraction": 1.5}, "fraction"),
    ({"kind": "meteor", "rack": "a"}, "kind"),
    ({"kind": "tray-failed", "node": "n", "colour": "red"}, "colour"),
    (["tray-failed"], "JSON object"),
])
def test_bad_fault_specs_are_one_line(spec: object, match: str) -> None:
    with pytest.raises(FaultSpecError, match=match) as info:
        parse_fault(spec)
    assert "\n" not in str(info.value)


def test_fault_wire_round_trip() -> None:
    f = parse_fault({"kind": "cooling-degraded", "rack": "rack-0", "deltaC": 8})
    assert f.delta_c == 8 and parse_fault(f.wire()) == f
