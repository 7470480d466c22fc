"""Right-sizing end to end on the local control plane (real Kueue 0.19, its
ElasticJobsViaWorkloadSlices gate and, for the factory's TAS flavor,
ElasticJobsViaWorkloadSlicesWithTAS): a grid event shrinks an elastic flex-2 Job's
``spec.parallelism`` before any job is paused, Kueue keeps the same Workload admitted at the
smaller size (no re-admission for a scale-down); after the event m2g grows it back and Kueue
admits the larger size as a new Workload slice (docs/curtailment.md).

The controller runs in this process (as in test_controller_e2e) with the modelled rack power of
m2g.testing.kit (idle + 1.3 kW per GPU of the running pods). Caps are off here (no cap levels):
the kilowatts can only come from replicas or pauses."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from e2e_helpers import Cluster, Obj, condition
from test_controller_e2e import (
    CHECK,
    factory_flavor,
    job,
    make_queue,
    modelled_power,
    running_m2g,
    site_with_budget,
    until,
    workload_of,
)
from test_curtail_e2e import active, event

from m2g.model import labels as L
from m2g.planner.config import PlannerConfig

pytestmark = pytest.mark.e2e
CFG = PlannerConfig(check_name=CHECK, ramp_kw_per_second=1000.0, settle_seconds=10.0,
                    shed_saving_fraction=1.0, min_shed_seconds=5.0, cap_levels=())
SLICE_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"


def elastic_job(name: str, pods: int, minimum: int) -> Obj:
    """A flex-2 Job of ``pods`` 4-GPU pods that Kueue runs as an elastic job and m2g may
    shrink to ``minimum`` pods."""
    obj = job(name, pods * 4, tier=2)
    obj["metadata"].setdefault("annotations", {})[L.ELASTIC_JOB] = "true"
    obj["spec"].pop("completions", None)  # a work-queue Job: its size may change
    obj["spec"]["template"]["metadata"]["annotations"][L.MIN_PARALLELISM] = str(minimum)
    return obj


def slices(cluster: Cluster, namespace: str, job_name: str) -> list[Obj]:
    return [w for w in cluster.workloads(namespace)
            if any(o.get("name") == job_name for o in w["metadata"].get("ownerReferences") or [])]


def admitted_slice(cluster: Cluster, namespace: str, job_name: str) -> Obj | None:
    for w in slices(cluster, namespace, job_name):
        c, done = condition(w, "Admitted"), condition(w, "Finished")
        if c and c["status"] == "True" and not (done and done["status"] == "True"):
            return w
    return None


def count(wl: Obj | None) -> int:
    return int((wl or {}).get("spec", {}).get("podSets", [{}])[0].get("count", 0))


def describe(cluster: Cluster, namespace: str) -> str:
    """The namespace's Workloads in one line each (what a failed check saw)."""
    return "; ".join(
        f"{w['metadata']['name']} owner="
        f"{[o.get('name') for o in w['metadata'].get('ownerReferences') or []]} "
        f"active={w['spec'].get('active', True)} count={count(w)} "
        f"conditions={[(c['type'], c['status'], c.get('reason')) for c in (w.get('status') or {}).get('conditions') or []]}"
        for w in cluster.workloads(namespace))


def parallelism(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.batch.read_namespaced_job(name, namespace).spec.parallelism)


async def test_a_grid_event_shrinks_an_elastic_job_before_pausing_and_grows_it_back(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), CFG) as manager:
        cluster.batch.create_namespaced_job(namespace, job("firm", 16, tier=0))
        cluster.batch.create_namespaced_job(namespace, elastic_job("flex2", 8, minimum=2))
        first = await until("the elastic job admitted at 8 pods", lambda: (
            w if count(w := admitted_slice(cluster, namespace, "flex2")) == 8 else None),
            timeout=90)
        assert first["metadata"]["annotations"].get(L.ELASTIC_JOB) == "true"
        # both jobs running before the event: a firm job admitted only once the event has
        # begun is firm work beyond the room, which m2g makes room for by pausing (CI, loaded,
        # once admitted "firm" after the event began)
        await until("both jobs running (Kueue's PodsReady)", lambda: all(
            (c := condition(workload_of(cluster, namespace, name) or {}, "PodsReady"))
            and c["status"] == "True" for name in ("firm", "flex2")), timeout=90)
        # 2 racks idle 40 kW + 48 GPUs x 1.3 = 102.4 kW; a limit of 94 kW is 8.4 kW short:
        # two replicas of the elastic job (5.4 kW each, estimated) cover it, no pause needed
        ends_in = 40.0
        event(cluster, target_kw=94.0, ends_in=ends_in)
        t0 = time.monotonic()
        await until("the Job shrunk", lambda: parallelism(cluster, namespace, "flex2") < 8,
                    timeout=40)
        shrunk = await until("Kueue's Workload at the smaller size", lambda: (
            w if 2 <= count(w := admitted_slice(cluster, namespace, "flex2")) < 8 else None),
            timeout=40)
        # the same Workload, still admitted: a scale-down is not a new admission
        assert shrunk["metadata"]["uid"] == first["metadata"]["uid"]
        assert shrunk["metadata"]["annotations"]["m2g.io/resized-from"] == "8"
        job_notes = cluster.batch.read_namespaced_job("flex2", namespace).metadata.annotations
        assert job_notes["m2g.io/resized-from"] == "8"
        # nothing is paused during the event
        while time.monotonic() - t0 < ends_in - 5:
            assert active(cluster, namespace, "flex2") and active(cluster, namespace, "firm"), \
                describe(cluster, namespace)
            still = admitted_slice(cluster, namespace, "flex2")
            assert still is not None and still["metadata"]["uid"] == first["metadata"]["uid"]
            await asyncio.sleep(2)
        # after the event: grown back, and Kueue admits the larger size as a new slice
        await until("the Job grown back", lambda: parallelism(cluster, namespace, "flex2") == 8,
                    timeout=60)
        grown = await until("the new slice admitted at 8 pods", lambda: (
            w if count(w := admitted_slice(cluster, namespace, "flex2")) == 8 else None),
            timeout=90)
        assert grown["metadata"]["uid"] != first["metadata"]["uid"]
        assert SLICE_FOR in grown["metadata"].get("annotations", {})
        assert "m2g.io/resized-from" not in grown["metadata"].get("annotations", {})
        job_notes = cluster.batch.read_namespaced_job("flex2", namespace).metadata.annotations
        assert "m2g.io/resized-from" not in (job_notes or {})
        assert manager.state.reconciles > 0
