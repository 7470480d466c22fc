"""Rendering per workload API: Kueue labels, TAS annotations on pod templates, KAI
annotations, m2g labels, and each API's own shape (counts, groups, commands)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from m2g.model import labels as L
from m2g.templates import Rendered, render
from tests.unit.templates_helpers import Obj, pod_templates, shipped

CASES = [(name, api.value) for name, t in sorted(shipped().items()) for api in t.spec.apis]
CLIQUE, BLOCK = "nvidia.com/gpu.clique", "network.topology.nvidia.com/block"



def placement(meta: dict[str, Any]) -> dict[str, str]:
    """A pod template's scheduling annotations (m2g's own facts checked separately)."""
    facts = {L.ESTIMATED_KW, L.EXPECTED_RUNTIME, L.CHECKPOINT_INTERVAL, L.POWER_CURVE}
    assert L.ESTIMATED_KW in meta["annotations"], "Kueue copies only pod-template metadata"
    return {k: v for k, v in meta["annotations"].items() if k not in facts}

def rendered(name: str, **sets: object) -> Rendered:
    return render(shipped()[name], {k: str(v) for k, v in sets.items()},
                  namespace="team-a", queue="lq-a")


def pods(obj: Obj) -> list[Obj]:
    return [t for _, t in pod_templates(obj)]


@pytest.mark.parametrize(("name", "api"), CASES)
def test_every_api_carries_kueue_and_m2g_labels(name: str, api: str) -> None:
    r = rendered(name, api=api)
    w = r.workload
    assert w["kind"] == api
    assert w["metadata"]["namespace"] == "team-a"
    labels = w["metadata"]["labels"]
    assert labels[L.QUEUE_NAME] == "lq-a"
    assert labels[L.PRIORITY_CLASS] == r.values.priority
    assert labels[L.WORKLOAD_KIND] == shipped()[name].spec.workload_kind.value
    assert labels[L.FLEX_TIER] == str(r.values.flex_tier)
    notes = w["metadata"]["annotations"]
    assert notes[L.ESTIMATED_KW] == f"{r.sizing.kw:g}"
    assert json.loads(notes[L.TEMPLATE_VALUES])["api"] == api


@pytest.mark.parametrize(("name", "api"), CASES)
def test_every_pod_template_carries_the_tas_request(name: str, api: str) -> None:
    r = rendered(name, api=api)
    templates = pods(r.workload)
    assert templates, "no pod template found"
    p = r.sizing.placement
    for t in templates:
        ann = t["metadata"]["annotations"]
        if p.unconstrained:
            assert ann[L.TAS_UNCONSTRAINED] == "true"
        else:
            assert ann.get(L.TAS_REQUIRED, ann.get(L.TAS_PREFERRED)) in (CLIQUE, BLOCK)
        assert t["metadata"]["labels"][L.WORKLOAD_KIND] == r.workload["metadata"]["labels"][
            L.WORKLOAD_KIND]


@pytest.mark.parametrize(("name", "api"), CASES)
def test_kai_annotations_follow_the_scheduler(name: str, api: str) -> None:
    kai = rendered(name, api=api).workload
    plain = rendered(name, api=api, scheduler="default").workload
    placement = kai["metadata"]["annotations"].get(L.KAI_REQUIRED_PLACEMENT)
    if shipped()[name].spec.shape.value != "independent":
        assert placement in (CLIQUE, BLOCK)
        assert kai["metadata"]["annotations"][L.KAI_TOPOLOGY] == "nvl72"
    assert L.KAI_REQUIRED_PLACEMENT not in plain["metadata"]["annotations"]
    assert "kai-scheduler" not in json.dumps(plain)
    if api != "TrainJob":  # TrainJob takes its scheduler from the runtime
        assert all(t["spec"]["schedulerName"] == "kai-scheduler" for t in pods(kai))


def test_gpus_requested_add_up_for_every_case() -> None:
    for name, api in CASES:
        r = rendered(name, api=api)
        assert _gpus(r.workload) == r.sizing.gpus, (name, api)


def _gpus(w: Obj) -> int:
    s = w["spec"]
    if w["kind"] == "Job":
        return int(s["completions"] * _limit(s["template"]))
    if w["kind"] == "JobSet":
        rj = s["replicatedJobs"][0]
        return int(rj["replicas"] * rj["template"]["spec"]["parallelism"]
                   * _limit(rj["template"]["spec"]["template"]))
    if w["kind"] == "PyTorchJob":
        return sum(r["replicas"] * _limit(r["template"])
                   for r in s["pytorchReplicaSpecs"].values())
    if w["kind"] == "TrainJob":
        t = s["trainer"]
        return int(t["numNodes"] * t["resourcesPerNode"]["limits"][L.GPU_RESOURCE])
    lwt = s["leaderWorkerTemplate"]
    return int(s["replicas"] * lwt["size"] * _limit(lwt["workerTemplate"]))


def _limit(pod: Obj) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["limits"][L.GPU_RESOURCE])


def test_indexed_job_has_a_headless_service_and_torchrun_rendezvous() -> None:
    r = rendered("rack-benchmark")
    svc, job = r.objects
    assert (svc["kind"], svc["spec"]["clusterIP"]) == ("Service", "None")
    assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": "rack-benchmark"}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == (
        "Indexed", 18, 18)
    assert spec["suspend"] is True and spec["template"]["spec"]["subdomain"] == "rack-benchmark"
    cmd = spec["template"]["spec"]["containers"][0]["command"]
    assert cmd[:6] == ["torchrun", "--nnodes=18", "--nproc-per-node=4",
                       "--master-addr=rack-benchmark-0.rack-benchmark", "--master-port=29500",
                       "--node-rank=$(JOB_COMPLETION_INDEX)"]
    assert placement(spec["template"]["metadata"]) == {L.TAS_REQUIRED: CLIQUE}


def test_single_pod_job_needs_no_service() -> None:
    r = rendered("llama31-8b-finetune", api="Job", dp=4)
    assert [o["kind"] for o in r.objects] == ["Job"]
    assert "--standalone" in r.workload["spec"]["template"]["spec"]["containers"][0]["command"]


def test_batch_job_retries_per_index_and_is_unconstrained() -> None:
    spec = rendered("batch-synthetic-data").workload["spec"]
    assert spec["backoffLimitPerIndex"] == 2 and "backoffLimit" not in spec
    assert placement(spec["template"]["metadata"]) == {L.TAS_UNCONSTRAINED: "true"}
    args = spec["template"]["spec"]["containers"][0]["command"]
    assert "--input-file=/data/in/shard-$(JOB_COMPLETION_INDEX)-of-16.jsonl" in args


def test_jobset_makes_one_child_job_per_slice() -> None:
    w = rendered("llama31-405b-pretrain").workload
    rj = w["spec"]["replicatedJobs"][0]
    child = rj["template"]["spec"]
    assert (rj["replicas"], child["parallelism"], child["completions"]) == (8, 16, 16)
    ann = placement(child["template"]["metadata"])
    assert ann == {L.TAS_REQUIRED: BLOCK, L.TAS_SLICE_REQUIRED: CLIQUE, L.TAS_SLICE_SIZE: "16"}
    script = child["template"]["spec"]["containers"][0]["command"][2]
    assert script.startswith("export PET_NODE_RANK=$((JOB_INDEX * 16 + JOB_COMPLETION_INDEX))")
    assert "--master-addr=llama31-405b-pretrain-trainer-0-0.llama31-405b-pretrain" in script


def test_indexed_job_of_a_block_carries_slices_too() -> None:
    ann = rendered("llama31-405b-pretrain", api="Job").workload["spec"]["template"]["metadata"][
        "annotations"]
    assert ann[L.TAS_SLICE_SIZE] == "16" and ann[L.TAS_REQUIRED] == BLOCK


def test_pytorchjob_groups_master_and_workers() -> None:
    w = rendered("llama31-8b-finetune").workload
    specs = w["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 1)
    for spec in specs.values():
        meta, pod = spec["template"]["metadata"], spec["template"]["spec"]
        assert placement(meta) == {L.TAS_REQUIRED: CLIQUE,
                                       L.TAS_PODSET_GROUP: "llama31-8b-finetune"}
        assert pod["containers"][0]["name"] == "pytorch"
        assert pod["containers"][0]["command"][:3] == ["tune", "run", "full_finetune_distributed"]
    assert w["spec"]["runPolicy"]["suspend"] is True and w["spec"]["nprocPerNode"] == "4"


def test_pytorchjob_beyond_a_domain_uses_kai_segments_and_says_so() -> None:
    r = rendered("llama31-405b-pretrain", api="PyTorchJob")
    ann = r.workload["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"][
        "annotations"]
    assert L.TAS_SLICE_SIZE not in ann and ann[L.TAS_REQUIRED] == BLOCK
    assert (ann[L.KAI_SEGMENT_SIZE], ann[L.KAI_SEGMENT_REQUIRED]) == ("16", CLIQUE)
    assert any("KAI segments" in n for n in r.notes)


def test_trainjob_puts_the_tas_request_in_its_own_runtime_patch() -> None:
    r = rendered("llama31-70b-sft")
    spec = r.workload["spec"]
    assert spec["runtimeRef"]["name"] == "torch-distributed" and spec["suspend"] is True
    assert (spec["trainer"]["numNodes"], spec["trainer"]["numProcPerNode"]) == (8, 4)
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == "m2g.io/templates"
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    meta = node["template"]["spec"]["template"]["metadata"]
    assert placement(meta) == {L.TAS_REQUIRED: CLIQUE}
    assert meta["labels"][L.WORKLOAD_KIND] == "fine-tuning"
    assert "tensor_parallel_dim=4" in spec["trainer"]["command"]


def test_leaderworkerset_groups_are_gangs_in_one_domain() -> None:
    w = rendered("vllm-llama31-405b", replicas=3).workload
    lwt = w["spec"]["leaderWorkerTemplate"]
    assert (w["spec"]["replicas"], lwt["size"]) == (3, 2)
    for key in ("leaderTemplate", "workerTemplate"):
        assert placement(lwt[key]["metadata"]) == {
            L.TAS_REQUIRED: CLIQUE, L.TAS_PODSET_GROUP: "vllm-llama31-405b"}
        assert lwt[key]["spec"]["restartPolicy"] == "Always"
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    assert leader["command"][2].startswith("ray start --head --port=6379; exec vllm serve ")
    assert "--tensor-parallel-size=8" in leader["command"][2]
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "ray start --address=$LWS_LEADER_ADDRESS:6379 --block" in worker["command"][2]


def test_single_tray_serving_group_has_no_leader_template() -> None:
    w = rendered("vllm-llama31-405b", tp=4).workload
    lwt = w["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 1 and "leaderTemplate" not in lwt
    assert L.TAS_PODSET_GROUP not in lwt["workerTemplate"]["metadata"]["annotations"]
    assert lwt["workerTemplate"]["spec"]["containers"][0]["command"][:2] == ["vllm", "serve"]


def test_checkpoint_and_data_volumes_only_when_asked() -> None:
    bare = rendered("rack-benchmark").workload["spec"]["template"]["spec"]
    assert [v["name"] for v in bare["volumes"]] == ["dshm"]
    spec = rendered("rack-benchmark", checkpoint_pvc="ckpt", data_pvc="ds").workload["spec"]
    pod = spec["template"]["spec"]
    assert {v["name"]: v.get("persistentVolumeClaim") for v in pod["volumes"]} == {
        "dshm": None, "checkpoints": {"claimName": "ckpt"}, "data": {"claimName": "ds"}}
    assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} == {
        "/dev/shm", "/checkpoints", "/data"}


def test_priority_kai_queue_and_checkpoint_annotations() -> None:
    w = rendered("llama31-8b-finetune", priority="", kai_queue="team-a",
                 checkpoint_interval=600).workload
    assert L.PRIORITY_CLASS not in w["metadata"]["labels"]
    assert w["metadata"]["annotations"][L.CHECKPOINT_INTERVAL] == "600"
    assert all(t["metadata"]["labels"][L.KAI_QUEUE] == "team-a" for t in pods(w))
    assert L.CHECKPOINT_INTERVAL not in rendered("agentic-coder").workload["metadata"][
        "annotations"]


def test_the_cap_curve_travels_to_the_workload() -> None:
    """The template's power.capCurve, as m2g.io/power-curve on the pod template (what Kueue
    copies into the Workload), sorted by cap; the planner's curtailment reads it back."""
    from m2g.k8s.convert import cap_curve
    r = rendered("llama31-405b-pretrain")
    meta = next(o for o in r.objects if o["kind"] in ("JobSet", "Job"))
    found = [m for m in _metadatas(meta) if L.POWER_CURVE in (m.get("annotations") or {})]
    assert found
    text = found[0]["annotations"][L.POWER_CURVE]
    assert text == "0.25:0.186,0.5:0.629,0.625:0.784,0.75:0.867,0.875:0.923,1:1"
    assert cap_curve(text)[3] == (0.75, 0.867)


def _metadatas(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        if isinstance(obj.get("metadata"), dict):
            out.append(obj["metadata"])
        for v in obj.values():
            out += _metadatas(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _metadatas(v)
    return out
