"""A factory state as Prometheus metrics: DCGM exporter names per GPU, facility series per rack
and power domain (units in the names), and the active faults.

``FactoryCollector`` reads the current state through a callable at scrape time, so the exporter
registers it once; ``render(state)`` is the same text for one state (tests, debugging).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from m2g.sim.model import FactoryState

GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
RACK_LABELS = ("rack", "power_domain", "block", "clique")


class FactoryCollector(Collector):
    """Yields the metrics of ``get_state()`` (nothing while it returns None)."""

    def __init__(self, get_state: Callable[[], FactoryState | None]) -> None:
        self._get_state = get_state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._get_state()
        if state is None:
            return
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
                                  labels=GPU_LABELS)
        temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
                                 labels=GPU_LABELS)
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS",
                                "Value of the last XID error encountered.", labels=GPU_LABELS)
        for name, gpus in state.gpus.items():
            node = state.nodes[name]
            for g in gpus:
                labels = [str(g.index), g.uuid, f"nvidia{g.index}", node.product, name]
                power.add_metric(labels, round(g.power_w, 3))
                temp.add_metric(labels, round(g.temp_c, 2))
                xid.add_metric(labels, float(g.xid))
        yield from (power, temp, xid)

        rack_kw = GaugeMetricFamily("m2g_sim_rack_power_kilowatts",
                                    "Simulated IT power of the rack (kW).", labels=RACK_LABELS)
        inlet = GaugeMetricFamily("m2g_sim_rack_inlet_celsius",
                                  "Simulated rack air inlet temperature (°C).",
                                  labels=RACK_LABELS)
        coolant = GaugeMetricFamily("m2g_sim_rack_coolant_supply_celsius",
                                    "Simulated coolant supply temperature at the rack (°C).",
                                    labels=RACK_LABELS)
        for r in state.racks.values():
            labels = [r.name, r.power_domain, r.block, r.clique]
            rack_kw.add_metric(labels, round(r.power_kw, 4))
            inlet.add_metric(labels, round(r.inlet_c, 3))
            coolant.add_metric(labels, round(r.coolant_c, 3))
        yield from (rack_kw, inlet, coolant)

        domain = GaugeMetricFamily("m2g_sim_power_domain_power_kilowatts",
                                   "Simulated IT power of the power domain (kW).",
                                   labels=("power_domain",))
        for name, kw in state.domains.items():
            domain.add_metric([name], round(kw, 4))
        yield domain

        faults = GaugeMetricFamily("m2g_sim_fault_active", "Injected faults (1 = active).",
                                   labels=("kind", "target"))
        for f in state.faults:
            faults.add_metric([str(f.kind), f.target], 1.0)
        yield faults
        yield GaugeMetricFamily("m2g_sim_state_timestamp_seconds",
                                "Simulated time of the last model step (Unix s).",
                                value=state.time)


def render(state: FactoryState) -> bytes:
    """The Prometheus text exposition of one state."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FactoryCollector(lambda: state))
    return generate_latest(registry)
