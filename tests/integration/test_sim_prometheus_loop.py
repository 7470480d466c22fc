"""The closed signal loop without a cluster: simulator → real Prometheus scrape → adapter.

The adapter reads with the Deployment's site configuration (deploy/controller/site-config.yaml,
the path a real site configures: DCGM series per GPU, PDU and rack-sensor series per rack). A
fake node/pod source stands in for the API server (the e2e suite uses the real one).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus.server import PrometheusServer

from m2g.config import load_site_config
from m2g.model import labels as L
from m2g.signals import PrometheusClient, SignalConfig, SignalName, build_readings
from m2g.signals.prometheus import fetch_signals
from m2g.signals.readings import Expected, Freshness
from m2g.sim.faults import Fault, FaultKind
from m2g_controllers.simulator import Simulator, make_server

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
PD_LABEL = "example.com/power-domain"  # the site's own: no standard label exists


class Source:
    def __init__(self) -> None:
        self.node_objs: list[Obj] = [
            {"metadata": {"name": f"gpu-r00{r}-n0{i}", "labels": {
                L.RACK: f"rack-00{r}", PD_LABEL: "pd-00", L.BLOCK: "block-00"}}}
            for r in range(2) for i in range(2)]
        self.pod_objs: list[Obj] = [{
            "metadata": {"name": "train", "namespace": "ns",
                         "labels": {L.WORKLOAD_KIND: "training"}},
            "spec": {"nodeName": "gpu-r000-n00",
                     "containers": [{"resources": {"limits": {L.GPU_RESOURCE: "4"}}}]},
            "status": {"phase": "Running"}}]

    async def nodes(self) -> list[Obj]:
        return self.node_objs

    async def pods(self) -> list[Obj]:
        return self.pod_objs


@pytest.fixture
def sim_and_prometheus(tmp_path: Path, h200_prometheus: PrometheusServer,
                       ) -> Iterator[tuple[Simulator, PrometheusServer]]:
    """(depends on h200_prometheus only for its skip/fail-when-absent logic)"""
    offset = [0.0]  # the simulator's clock runs ahead when a test moves it
    sim = Simulator(Source(), clock=lambda: time.time() + offset[0], log=lambda _: None,
                    labels=L.TopologyLabels(power_domain=PD_LABEL))
    sim.offset = offset  # type: ignore[attr-defined]
    asyncio.run(sim.tick())
    srv = make_server(sim, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{srv.server_address[1]}"
    with PrometheusServer(tmp_path, sim_targets=[target], scrape_interval="1s") as prom:
        yield sim, prom
    srv.shutdown()
    srv.server_close()


async def read_until(prom: PrometheusServer, cfg: SignalConfig, want: Any,
                     timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        client = PrometheusClient(prom.url, http)
        while True:
            now = time.time()
            fetched = await fetch_signals(client, cfg, now)
            readings = build_readings({n: f.samples for n, f in fetched.items()}, now, cfg,
                                      expected=Expected(racks=("rack-000", "rack-001"),
                                                        gpus_per_node=4))
            if want(readings) or time.monotonic() > deadline:
                return readings
            await asyncio.sleep(0.5)


async def test_simulated_power_and_faults_reach_the_adapter(
        sim_and_prometheus: tuple[Simulator, PrometheusServer]) -> None:
    sim, prom = sim_and_prometheus
    site = load_site_config(REPO / "deploy" / "controller" / "site-config.yaml")
    cfg = site.signal_config().model_copy(update={"url": prom.url})
    r = await read_until(prom, cfg, lambda r: len(r.nodes) == 4
                         and r.racks["rack-001"].power_kw.value is not None)
    busy, idle = r.nodes["gpu-r000-n00"].power_w, r.nodes["gpu-r001-n01"].power_w
    assert busy.freshness is Freshness.FRESH and busy.age_seconds < 5
    assert busy.value is not None and idle.value is not None
    assert busy.value > 4 * idle.value
    r0, r1 = r.racks["rack-000"].power_kw.value, r.racks["rack-001"].power_kw.value
    assert r0 is not None and r1 is not None and r0 > r1 + 3.0
    assert r.domains["pd-00"].power_kw.value == pytest.approx(r0 + r1, rel=0.01)
    # the rack is the sum of its 8 power shelves (aggregate: sum), in kW (scale 0.001)
    assert r.status[SignalName.RACK_POWER_KW].fresh == 2
    assert r0 == pytest.approx(sim.state.racks["rack-000"].power_kw, rel=0.01)  # type: ignore[union-attr]

    sim.add_fault(Fault(kind=FaultKind.COOLING_DEGRADED, rack="rack-001", delta_c=12))
    sim.offset[0] += 120.0  # type: ignore[attr-defined]  # one coolant time constant later
    state = await sim.tick()
    r = await read_until(prom, cfg, lambda r: (r.racks["rack-001"].coolant_c.value or 0) > 35)
    exported = state.racks["rack-001"].coolant_c
    assert exported > 30 + 12 * 0.632 - 0.01  # ≥ one time constant (plus the real seconds)
    assert r.racks["rack-001"].coolant_c.value == pytest.approx(exported, abs=0.01)
    assert r.racks["rack-000"].coolant_c.value == pytest.approx(30.0)
    assert r.status[SignalName.RACK_INLET_C].fresh == 2
