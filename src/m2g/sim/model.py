"""The simulated factory's state and its pure ``step``.

``step(state, pods_by_node, now)`` assigns each node's GPUs to the pods running there (in pod
name order, as many GPUs as each requests), computes every GPU's power from the pod's workload
kind and the node's power cap (``PowerModel``), advances the temperatures by ``now − state.time``
(``ThermalModel``) and sums rack and power-domain kW:

    rack kW   = Σ its GPUs' W / 1000 + nodes × node_overhead_kw   (IT power, no PUE)
    domain kW = Σ its racks' kW

Nothing here reads a clock or the cluster: the exporter passes ``now`` and the pods.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from m2g.model.inputs import WorkloadKind
from m2g.sim.faults import Fault, cap_fraction, cooling_delta, failed_xid
from m2g.sim.power import PowerModel
from m2g.sim.thermal import ThermalModel, relax

DEFAULT_PRODUCT = "NVIDIA GB300"
# GB300 NVL72 ≈ 130 kW: 72 GPUs × 1.4 kW × 0.957 (pre-training at full cap) = 96.5 kW, the
# remaining ≈ 33.5 kW (Grace CPUs, memory, NICs, NVLink switch trays, fans, power conversion)
# spread over the 18 trays: 1.85 kW each (assumption, docs/signals.md).
NODE_OVERHEAD_KW = 1.85


@dataclass(frozen=True)
class NodeInfo:
    """A simulated tray, from its Kubernetes node labels."""

    name: str
    rack: str
    power_domain: str = ""
    block: str = ""
    clique: str = ""
    gpus: int = 4
    product: str = DEFAULT_PRODUCT


@dataclass(frozen=True)
class PodLoad:
    """A running pod as the model sees it: its kind and how many GPUs it holds."""

    name: str
    kind: WorkloadKind
    gpus: int


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    power_w: float
    temp_c: float
    xid: int = 0
    pod: str = ""  # the pod holding the GPU, "" when idle


@dataclass(frozen=True)
class RackState:
    name: str
    power_domain: str
    block: str
    clique: str
    power_kw: float
    inlet_c: float
    coolant_c: float


@dataclass(frozen=True)
class SimParams:
    power: PowerModel = field(default_factory=PowerModel)
    thermal: ThermalModel = field(default_factory=ThermalModel)
    node_overhead_kw: float = NODE_OVERHEAD_KW


@dataclass(frozen=True)
class FactoryState:
    """Everything the exporter shows, at ``time`` (Unix seconds)."""

    time: float
    nodes: Mapping[str, NodeInfo]
    gpus: Mapping[str, tuple[GpuState, ...]]
    racks: Mapping[str, RackState]
    domains: Mapping[str, float]  # power domain → kW
    faults: tuple[Fault, ...] = ()


def gpu_uuid(node: str, index: int) -> str:
    """A stable, DCGM-looking UUID for a simulated GPU."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'm2g-sim/{node}/{index}')}"


def initial_state(nodes: Iterable[NodeInfo], now: float, params: SimParams | None = None,
                  faults: Sequence[Fault] = ()) -> FactoryState:
    """Every node idle and every temperature at its idle steady state."""
    p = params or SimParams()
    state = FactoryState(now, {n.name: n for n in nodes}, {}, {}, {}, tuple(faults))
    return _settle(state, p)


def _settle(state: FactoryState, p: SimParams) -> FactoryState:
    """Idle steady state for nodes/racks that have no history yet (dt = 0)."""
    return _advance(state, {}, state.time, p)


def with_nodes(state: FactoryState, nodes: Iterable[NodeInfo],
               params: SimParams | None = None) -> FactoryState:
    """The same factory with this node list: known nodes keep their temperatures, new ones
    start idle and settled, vanished ones are dropped."""
    p = params or SimParams()
    node_map = {n.name: n for n in nodes}
    kept = {k: v for k, v in state.gpus.items() if k in node_map}
    racks = {n.rack for n in node_map.values()}
    base = replace(state, nodes=node_map, gpus=kept,
                   racks={k: v for k, v in state.racks.items() if k in racks})
    return _advance(base, {}, state.time, p)


def with_faults(state: FactoryState, faults: Sequence[Fault]) -> FactoryState:
    return replace(state, faults=tuple(faults))


def step(state: FactoryState, pods_by_node: Mapping[str, Sequence[PodLoad]], now: float,
         params: SimParams | None = None,
         node_caps: Mapping[str, float] | None = None) -> FactoryState:
    """Advance the factory to ``now`` with these pods running (unknown nodes are ignored).
    ``node_caps``: node → the per-GPU power limit in force as a fraction of the default (what
    m2g's node agent reports in its GPUPowerLimit status); with a power-cap fault the tighter
    one holds."""
    return _advance(state, pods_by_node, now, params or SimParams(), node_caps or {})


def _assign(pods: Sequence[PodLoad], count: int) -> list[PodLoad | None]:
    slots: list[PodLoad | None] = []
    for pod in sorted(pods, key=lambda q: q.name):
        slots += [pod] * max(0, pod.gpus)
    slots = slots[:count]
    return slots + [None] * (count - len(slots))


def _advance(state: FactoryState, pods_by_node: Mapping[str, Sequence[PodLoad]], now: float,
             p: SimParams, node_caps: Mapping[str, float] | None = None) -> FactoryState:
    dt = max(0.0, now - state.time)
    th, pm = p.thermal, p.power
    faults = state.faults

    # coolant first: GPUs sit on it
    coolant: dict[str, float] = {}
    for rack in sorted({n.rack for n in state.nodes.values()}):
        target = th.coolant_target(cooling_delta(faults, rack))
        seen = state.racks.get(rack)
        coolant[rack] = target if seen is None else relax(seen.coolant_c, target, dt,
                                                          th.coolant_tau_s)

    gpus: dict[str, tuple[GpuState, ...]] = {}
    rack_w: dict[str, float] = {}
    for name, node in sorted(state.nodes.items()):
        xid = failed_xid(faults, name)
        cap = min(cap_fraction(faults, name, node.rack), (node_caps or {}).get(name, 1.0))
        slots = _assign(pods_by_node.get(name, ()), node.gpus)
        prev = {g.index: g for g in state.gpus.get(name, ())}
        out = []
        for i, pod in enumerate(slots):
            kind = None if (pod is None or xid) else pod.kind
            watts = pm.gpu_watts(kind, cap)
            target = th.gpu_target(coolant[node.rack], watts / pm.tdp_w)
            before = prev.get(i)
            temp = target if before is None else relax(before.temp_c, target, dt, th.gpu_tau_s)
            out.append(GpuState(i, gpu_uuid(name, i), watts, temp, xid,
                                pod.name if pod is not None else ""))
        gpus[name] = tuple(out)
        rack_w[node.rack] = rack_w.get(node.rack, 0.0) + sum(g.power_w for g in out) \
            + p.node_overhead_kw * 1000.0

    racks: dict[str, RackState] = {}
    domains: dict[str, float] = {}
    for rack in sorted(rack_w):
        members = [n for n in state.nodes.values() if n.rack == rack]
        first = min(members, key=lambda n: n.name)
        kw = rack_w[rack] / 1000.0
        target = th.inlet_target(kw, cooling_delta(faults, rack))
        old = state.racks.get(rack)
        inlet = target if old is None else relax(old.inlet_c, target, dt, th.inlet_tau_s)
        racks[rack] = RackState(rack, first.power_domain, first.block, first.clique, kw, inlet,
                                coolant[rack])
        domains[first.power_domain] = domains.get(first.power_domain, 0.0) + kw
    return FactoryState(max(state.time, now), state.nodes, gpus,
                        racks, domains, faults)
