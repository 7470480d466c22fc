"""The simulator process's wiring: node/pod conversion, ticks, and the HTTP endpoints."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from m2g.model import labels as L
from m2g.model.inputs import WorkloadKind
from m2g_controllers.simulator import Simulator, make_server, node_info, pod_load, serve

Obj = dict[str, Any]


def node(name: str, rack: str = "rack-000", pd: str = "pd-00") -> Obj:
    return {"metadata": {"name": name, "labels": {
        L.RACK: rack, "example.com/power-domain": pd, L.BLOCK: "block-00", L.GPU_CLIQUE: "u.0",
        L.GPU_PRODUCT: "NVIDIA-GB300"}},
        "status": {"capacity": {L.GPU_RESOURCE: "4"}}}


def pod(name: str, on: str, gpus: int, kind: str = "training", phase: str = "Running") -> Obj:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {L.WORKLOAD_KIND: kind}},
            "spec": {"nodeName": on, "containers": [
                {"resources": {"limits": {L.GPU_RESOURCE: str(gpus)}}}]},
            "status": {"phase": phase}}


class FakeSource:
    def __init__(self) -> None:
        self.node_objs = [node("n0"), node("n1"), {"metadata": {"name": "cpu", "labels": {}}}]
        self.pod_objs = [pod("p", "n0", 4)]
        self.fail = False

    async def nodes(self) -> list[Obj]:
        if self.fail:
            raise ConnectionError("apiserver down")
        return self.node_objs

    async def pods(self) -> list[Obj]:
        return self.pod_objs


def test_conversions() -> None:
    info = node_info(node("n0"))
    assert info is not None and info.product == "NVIDIA GB300" and info.clique == "u.0"
    assert node_info({"metadata": {"name": "x", "labels": {}}}) is None
    found = pod_load(pod("p", "n0", 2, "inference"))
    assert found is not None
    on, load = found
    assert on == "n0" and load.name == "ns/p" and load.gpus == 2
    assert load.kind is WorkloadKind.INFERENCE
    odd = pod_load(pod("p", "n0", 2, "nonsense"))
    assert odd is not None and odd[1].kind is WorkloadKind.UNSPECIFIED
    assert pod_load(pod("p", "n0", 0)) is None
    assert pod_load(pod("p", "n0", 2, phase="Pending")) is None


async def test_tick_models_pods_and_survives_api_errors() -> None:
    src, now = FakeSource(), [1000.0]
    lines: list[str] = []
    sim = Simulator(src, clock=lambda: now[0], log=lines.append)
    s = await sim.tick()
    assert set(s.nodes) == {"n0", "n1"}
    busy, idle = s.gpus["n0"][0].power_w, s.gpus["n1"][0].power_w
    assert busy > 4 * idle
    src.fail, now[0] = True, 1005.0
    s2 = await sim.tick()
    assert s2.time == 1005.0 and s2.gpus["n0"][0].power_w == busy  # last pods kept
    assert lines and "apiserver down" in lines[0] and "\n" not in lines[0]


@pytest.fixture
def server() -> Iterator[tuple[str, Simulator]]:
    sim = Simulator(FakeSource(), clock=lambda: 50.0, log=lambda _: None)
    asyncio.run(sim.tick())
    srv = make_server(sim, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", sim
    srv.shutdown()
    srv.server_close()


def call(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_metrics_and_faults(server: tuple[str, Simulator]) -> None:
    url, sim = server
    code, text = call(url + "/metrics")
    assert code == 200
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    assert {"DCGM_FI_DEV_POWER_USAGE", "facility_pdu_power_watts",
            "facility_power_domain_power_watts"} <= names
    code, body = call(url + "/faults", "POST", b'{"kind": "tray-failed", "node": "n0"}')
    assert code == 201 and json.loads(body)["node"] == "n0"
    code, body = call(url + "/faults", "POST", b'{"kind": "cooling-degraded"}')
    assert code == 400 and "needs a rack" in json.loads(body)["error"]
    code, body = call(url + "/faults", "POST", b"{not json")
    assert code == 400 and "not JSON" in json.loads(body)["error"]
    asyncio.run(sim.tick())
    _, text = call(url + "/metrics")
    assert 'DCGM_FI_DEV_XID_ERRORS{Hostname="n0"' in text.decode()
    assert 'm2g_sim_fault_active{kind="tray-failed",target="n0"} 1.0' in text.decode()
    assert json.loads(call(url + "/faults")[1]) == [
        {"kind": "tray-failed", "rack": "", "node": "n0", "deltaC": 10.0, "xid": 79,
         "fraction": 1.0}]
    assert json.loads(call(url + "/faults?target=n1", "DELETE")[1]) == {"removed": 0}
    assert json.loads(call(url + "/faults", "DELETE")[1]) == {"removed": 1}
    assert call(url + "/nope")[0] == 404


async def test_serve_runs_until_stopped() -> None:
    stop = asyncio.Event()
    ticks: list[float] = []

    def clock() -> float:
        ticks.append(1.0)
        if len(ticks) >= 3:
            stop.set()
        return float(len(ticks))

    await asyncio.wait_for(serve(FakeSource(), "127.0.0.1", 0, 0.01, clock=clock, stop=stop,
                                 log=lambda _: None), timeout=10)
    assert len(ticks) >= 3
