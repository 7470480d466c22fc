"""The Kueue Workload ``m2g submit --dry-run`` evaluates: one per template and workload API,
read back through the same conversion m2g uses for real Workloads (m2g.k8s.convert)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from m2g.k8s.convert import workload
from m2g.model.cluster import Phase
from m2g.model.inputs import WorkloadKind
from m2g.templates import WorkloadApi, render
from m2g.templates.workload import kueue_workload
from tests.unit.templates_helpers import shipped

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CASES = [(name, api) for name in sorted(shipped()) for api in WorkloadApi
         if api.value in {a.value for a in shipped()[name].spec.apis}]


@pytest.mark.parametrize(("name", "api"), CASES, ids=lambda x: str(getattr(x, "value", x)))
def test_the_workload_has_the_gpus_and_facts_m2g_reads(name: str, api: WorkloadApi) -> None:
    r = render(shipped()[name], {"api": api.value}, namespace="ns1", queue="q1")
    w = workload(kueue_workload(r), NOW, local_queues={"ns1/q1": "cq1"})
    assert (w.namespace, w.view.queue, w.cluster_queue) == ("ns1", "q1", "cq1")
    assert w.phase is Phase.PENDING
    # a LeaderWorkerSet gets one Workload per serving group; every other API one for the gang
    assert w.view.gpus * r.sizing.groups == r.sizing.gpus, (w.view.pod_sets, r.sizing)
    assert w.view.flex_tier == r.values.flex_tier
    assert w.view.kind is WorkloadKind(shipped()[name].spec.workload_kind.value)
    assert w.view.estimated_kw > 0
    assert w.view.priority_class == (r.values.priority or "")


def test_pod_sets_follow_the_roles() -> None:
    r = render(shipped()["llama31-70b-sft"], {"api": "PyTorchJob"})
    names = [(ps["name"], ps["count"]) for ps in kueue_workload(r)["spec"]["podSets"]]
    assert names == [("master", 1), ("worker", r.sizing.pods - 1)]
