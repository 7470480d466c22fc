"""One builder per workload API: indexed Job (+ headless Service), JobSet, PyTorchJob,
TrainJob and LeaderWorkerSet. Each returns the objects to create and notes for the user."""

from __future__ import annotations

from m2g.model import labels as L
from m2g.templates.podspec import (
    Context,
    Obj,
    container,
    launch,
    metadata,
    operator_command,
    pod_template,
    shell,
    tas_annotations,
)
from m2g.templates.schema import Launcher, Shape

Built = tuple[list[Obj], list[str]]
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
TRAINJOB_PATCH_MANAGER = "m2g.io/templates"
KAI_SEGMENT_APIS_NOTE = ("PyTorchJob: Kueue slices cannot be expressed (the 1-pod Master is its "
                         "own PodSet); NVLink-domain slices rely on KAI segments")


def _distributed(ctx: Context) -> bool:
    return ctx.template.spec.container.launcher is Launcher.TORCHRUN and ctx.sizing.pods > 1


def job(ctx: Context) -> Built:
    """Indexed batch/v1 Job; a headless Service gives torchrun a stable master address."""
    s, name = ctx.sizing, ctx.name
    independent = ctx.template.spec.shape is Shape.INDEPENDENT
    cmd = launch(ctx, "$(JOB_COMPLETION_INDEX)", f"{name}-0.{name}")
    extra: Obj = {"subdomain": name} if _distributed(ctx) else {}
    pod = pod_template(ctx, [container(ctx, "main", cmd, s.gpus_per_pod)],
                       tas_annotations(s.placement), extra=extra)
    spec: Obj = {"suspend": True, "completionMode": "Indexed", "completions": s.pods,
                 "parallelism": s.pods, "template": pod}
    if independent:
        spec["backoffLimitPerIndex"] = 2
    else:
        spec["backoffLimit"] = 0
    objs: list[Obj] = [{"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(ctx),
                        "spec": spec}]
    if extra:
        objs.insert(0, _headless_service(ctx))
    return objs, []


def _headless_service(ctx: Context) -> Obj:
    meta = {"name": ctx.name, "namespace": ctx.namespace, "labels": {L.TEMPLATE: ctx.template.name}}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {JOB_NAME_LABEL: ctx.name}}}


def jobset(ctx: Context) -> Built:
    """JobSet: one child Job per NVLink-domain slice (Kueue's slice = a Job's parallelism)."""
    s, name = ctx.sizing, ctx.name
    per_job = s.placement.slice_pods or s.pods
    jobs = s.pods // per_job
    master = f"{name}-trainer-0-0.{name}"
    prelude = f"export PET_NODE_RANK=$((JOB_INDEX * {per_job} + JOB_COMPLETION_INDEX))"
    cmd = launch(ctx, None, master)
    if _distributed(ctx):
        cmd = shell(prelude, cmd)
    main = container(ctx, "main", cmd, s.gpus_per_pod)
    main["env"].append({"name": "JOB_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{JOBSET_INDEX_LABEL}']"}}})
    pod = pod_template(ctx, [main], tas_annotations(s.placement))
    child = {"spec": {"completionMode": "Indexed", "completions": per_job,
                      "parallelism": per_job, "backoffLimit": 0, "template": pod}}
    spec = {"suspend": True, "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [{"name": "trainer", "replicas": jobs, "template": child}]}
    return [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": metadata(ctx), "spec": spec}], []


def pytorchjob(ctx: Context) -> Built:
    """Kubeflow PyTorchJob: Master + Workers in one Kueue PodSet group."""
    s, notes = ctx.sizing, []
    sliced = bool(s.placement.slice_pods)
    group = ctx.name if s.pods > 1 else None
    annotations = tas_annotations(s.placement, group=group, slices=False)
    if sliced and ctx.values.scheduler == "kai":
        annotations |= {L.KAI_SEGMENT_SIZE: str(s.placement.slice_pods),
                        L.KAI_SEGMENT_REQUIRED: str(s.placement.slice_level)}
    if sliced:
        notes.append(KAI_SEGMENT_APIS_NOTE)
    cmd = operator_command(ctx)

    def replica(count: int) -> Obj:
        pod = pod_template(ctx, [container(ctx, "pytorch", cmd, s.gpus_per_pod)], annotations)
        return {"replicas": count, "restartPolicy": "Never", "template": pod}

    specs = {"Master": replica(1)}
    if s.pods > 1:
        specs["Worker"] = replica(s.pods - 1)
    spec = {"runPolicy": {"suspend": True, "backoffLimit": 0},
            "nprocPerNode": str(s.gpus_per_pod), "pytorchReplicaSpecs": specs}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata(ctx),
             "spec": spec}], notes


def trainjob(ctx: Context) -> Built:
    """Kubeflow Trainer TrainJob (v2.2+) on the ``torch-distributed`` ClusterTrainingRuntime;
    pod labels and the TAS request go in through a ``runtimePatches`` entry of our own."""
    s, v = ctx.sizing, ctx.values
    notes = ["TrainJob: the scheduler, volumes and /dev/shm come from the runtime "
             "(torch-distributed), not from the template"]
    main = container(ctx, "node", operator_command(ctx), s.gpus_per_pod)
    trainer = {"image": v.image, "command": main["command"], "env": main["env"],
               "numNodes": s.pods, "numProcPerNode": s.gpus_per_pod,
               "resourcesPerNode": main["resources"]}
    pod_meta = pod_template(ctx, [], tas_annotations(s.placement))["metadata"]
    node = {"name": "node", "template": {"spec": {"template": {"metadata": pod_meta}}}}
    patch = {"manager": TRAINJOB_PATCH_MANAGER,
             "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}}}
    spec = {"runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime"},
            "suspend": True, "trainer": trainer, "runtimePatches": [patch]}
    return [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
             "metadata": metadata(ctx), "spec": spec}], notes


def leaderworkerset(ctx: Context) -> Built:
    """LeaderWorkerSet: ``replicas`` serving groups, each one gang in one NVLink domain."""
    s = ctx.sizing
    multi = s.pods > 1
    group = ctx.name if multi else None
    annotations = tas_annotations(s.placement, group=group)
    ray = ctx.template.spec.container.launcher is Launcher.RAY and multi
    leader_cmd = launch(ctx, None, "")
    if ray:
        leader_cmd = shell("ray start --head --port=6379", leader_cmd)
    leader = container(ctx, "main", leader_cmd, s.gpus_per_pod)
    port = ctx.template.spec.container.port
    if port:
        leader["readinessProbe"] = {"httpGet": {"path": "/health", "port": port},
                                    "periodSeconds": 10, "failureThreshold": 3}
    lwt: Obj = {"size": s.pods, "restartPolicy": "RecreateGroupOnPodRestart"}
    leader_pod = pod_template(ctx, [leader], annotations, restart="Always")
    if multi:
        worker_cmd = ["sh", "-c", "exec ray start --address=$LWS_LEADER_ADDRESS:6379 --block"]
        worker = container(ctx, "main", worker_cmd if ray else leader_cmd, s.gpus_per_pod)
        lwt["leaderTemplate"] = leader_pod
        lwt["workerTemplate"] = pod_template(ctx, [worker], annotations, restart="Always")
    else:
        lwt["workerTemplate"] = leader_pod
    spec = {"replicas": s.groups, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": lwt}
    return [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": metadata(ctx), "spec": spec}], []
