"""A factory state as Prometheus metrics: DCGM exporter names and labels per GPU, the facility
series a site's DCIM would give (per power shelf, per rack sensor, per power domain; the names
m2g reads by default, so ``m2g run`` reads the simulator as it reads a real site) and the active
faults (``m2g_sim_*``, the simulator's own).

``FactoryCollector`` reads the current state through a callable at scrape time, so the exporter
registers it once; ``render(state)`` is the same text for one state (tests, debugging).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from m2g.signals.config import (
    FACILITY_DOMAIN_POWER,
    FACILITY_PDU_POWER,
    FACILITY_RACK_COOLANT,
    FACILITY_RACK_INLET,
)
from m2g.sim.model import FactoryState

#: The DCGM exporter's labels (field-notes §8.1), with its pod mapping (``pod``, ``namespace``,
#: ``container``: empty while a GPU is idle, which Prometheus stores as absent).
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
              "container", "namespace", "pod")
PDU_LABELS = ("rack", "pdu", "power_domain")
RACK_LABELS = ("rack", "power_domain")
#: A GB300 NVL72 rack is fed by 8 power shelves (field-notes §7); each reads an equal share.
POWER_SHELVES_PER_RACK = 8


def _gpu_labels(index: int, uuid: str, product: str, node: str, pod: str) -> list[str]:
    namespace, _, name = pod.rpartition("/")  # PodLoad names are "namespace/name"
    return [str(index), uuid, f"00000000:{index + 1:02X}:00.0", f"nvidia{index}", product, node,
            "main" if pod else "", namespace, name]


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
                labels = _gpu_labels(g.index, g.uuid, node.product, name, g.pod)
                power.add_metric(labels, round(g.power_w, 3))
                temp.add_metric(labels, round(g.temp_c, 2))
                xid.add_metric(labels, float(g.xid))
        yield from (power, temp, xid)
        yield from _facility(state)

        faults = GaugeMetricFamily("m2g_sim_fault_active", "Injected faults (1 = active).",
                                   labels=("kind", "target"))
        for f in state.faults:
            faults.add_metric([str(f.kind), f.target], 1.0)
        yield faults
        yield GaugeMetricFamily("m2g_sim_state_timestamp_seconds",
                                "Simulated time of the last model step (Unix s).",
                                value=state.time)


def _facility(state: FactoryState) -> Iterator[GaugeMetricFamily]:
    """The facility series m2g reads by default (m2g.signals.config.FACILITY_*), as a DCIM /
    BMS exporter would give them: PDU power, rack inlet, coolant supply, power-domain feeds."""
    pdu = GaugeMetricFamily(FACILITY_PDU_POWER, "Input power of a rack power shelf (W).",
                            labels=PDU_LABELS)
    inlet = GaugeMetricFamily(FACILITY_RACK_INLET, "Rack air inlet temperature (°C).",
                              labels=RACK_LABELS)
    coolant = GaugeMetricFamily(FACILITY_RACK_COOLANT,
                                "Coolant supply temperature at the rack (°C).", labels=RACK_LABELS)
    for r in state.racks.values():
        share = round(r.power_kw * 1000.0 / POWER_SHELVES_PER_RACK, 2)
        for shelf in range(POWER_SHELVES_PER_RACK):
            pdu.add_metric([r.name, f"{r.name}-ps{shelf}", r.power_domain], share)
        inlet.add_metric([r.name, r.power_domain], round(r.inlet_c, 3))
        coolant.add_metric([r.name, r.power_domain], round(r.coolant_c, 3))
    domain = GaugeMetricFamily(FACILITY_DOMAIN_POWER, "IT power of a power domain (W).",
                               labels=("power_domain",))
    for name, kw in state.domains.items():
        domain.add_metric([name], round(kw * 1000.0, 1))
    yield from (pdu, inlet, coolant, domain)


def render(state: FactoryState) -> bytes:
    """The Prometheus text exposition of one state."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FactoryCollector(lambda: state))
    return generate_latest(registry)
