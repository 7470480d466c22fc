"""m2g.testing.kit: the builders the e2e tests and the benches share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from m2g.k8s import convert as cv
from m2g.model.inputs import PolicyInput
from m2g.testing import kit
from tests.unit.policy_helpers import evaluator

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def test_the_standard_policies_load_and_decide(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", kit.standard_policies("kit"))
    flex = PolicyInput.model_validate({"workload": {"flexTier": 2, "gpus": 4},
                                       "grid": {"event": {"active": True, "id": "ev"}}})
    result = ev.admission(flex)
    assert result.decision.value == "Defer" and "kit-dr" in {r.policy for r in result.reasons}


def test_job_is_what_kueue_and_the_converter_read() -> None:
    body = kit.job("j", 2, pods=2, gpus_per_pod=4, namespace="ns")
    assert body["metadata"] == {"name": "j", "namespace": "ns",
                                "labels": {"kueue.x-k8s.io/queue-name": "default"}}
    template = body["spec"]["template"]
    assert cv.container_gpus(template["spec"]) == 4 and body["spec"]["parallelism"] == 2
    assert template["metadata"]["annotations"]["m2g.io/estimated-kw"] == "10.4"


def test_grid_event_and_queues() -> None:
    ev = kit.grid_event("dr", NOW, 30, 250.0)
    (event,) = cv.grid_events(ev)
    assert (event.start, (event.end - event.start).total_seconds(), event.target_kw) == (
        NOW, 1800.0, 250.0)
    cq = cv.cluster_queue(kit.cluster_queue("cq", "ns", "gb200", 72))
    assert [(q.flavor, q.nominal) for q in cq.quotas] == [("gb200", 72)]
    assert kit.local_queue("ns", "cq")["spec"] == {"clusterQueue": "cq"}


@dataclass
class View:
    objects: dict[str, Any]
    generation: int = 1

    def view(self) -> dict[str, Any]:
        return self.objects


@dataclass
class Caches:
    caches: dict[str, View]


async def test_modelled_power_counts_the_gpus_bound_to_each_rack() -> None:
    nodes = {"n1": {"metadata": {"name": "n1", "labels": {"network.topology.nvidia.com/accelerator": "r0"}}},
             "n2": {"metadata": {"name": "n2", "labels": {"network.topology.nvidia.com/accelerator": "r1"}}}}
    pod = {"spec": {"nodeName": "n1", "containers": [{"resources": {
        "requests": {"nvidia.com/gpu": "4"}}}]}, "status": {"phase": "Running"}}
    cluster = Caches({"nodes": View(nodes), "pods": View({"p": pod})})
    readings = await kit.modelled_power()(cluster)
    assert {r: rr.power_kw.value for r, rr in readings.racks.items()} == {
        "r0": kit.IDLE_KW + 4 * kit.KW_PER_GPU, "r1": kit.IDLE_KW}
    hot = await kit.modelled_power({"n1": "r0"}, inlet={"r0": 35.0})(cluster)
    assert hot.racks["r0"].inlet_c.value == 35.0 and set(hot.racks) == {"r0"}
