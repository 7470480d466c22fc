"""A trace job as the batch/v1 Job a user would submit (docs/twin.md "What a job carries").

m2g lives in wall time, so the durations it reads are wall seconds: the checkpoint interval
and the expected runtime are the trace's divided by the time scale. A foreign job carries no
m2g label or annotation (and no priority class): m2g gives it its defaults. An elastic job
(``TraceJob.min_pods``) is what docs/curtailment.md "Right-sizing" asks a tenant to write:
Kueue's ``kueue.x-k8s.io/elastic-job: "true"`` on the Job, ``m2g.io/min-parallelism`` on its
pod template, no ``completions`` (a work-queue Job: its size may change, it completes when its
pods succeed) and no topology request (Kueue v0.19 refuses one on an elastic Job).
"""

from __future__ import annotations

from typing import Any

from m2g.model import labels as L
from m2g.model.inputs import WorkloadKind
from m2g.sim.power import PowerModel
from twinkit.kube import TWIN_LABEL
from twinkit.trace import TraceJob

Obj = dict[str, Any]
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
LOCAL_QUEUE = "default"  # every job's LocalQueue, in its namespace (kueue-config/base/tenants.yaml)


def estimated_kw(job: TraceJob, model: PowerModel) -> float:
    """What a real site's template would write for the job (``m2g.io/estimated-kw``,
    docs/templates.md "Power": GPUs × the kind's kW per GPU): its GPUs' whole draw at full
    power, idle included and the trays' overhead not. Every m2g reader takes it so: the
    forecast and admission count it whole, a shed saves it less its GPUs' idle."""
    try:
        kind = WorkloadKind(job.kind)
    except ValueError:
        kind = WorkloadKind.UNSPECIFIED
    return round(float(job.gpus * model.gpu_watts(kind)) / 1000.0, 1)


def manifest(job: TraceJob, time_scale: float, model: PowerModel) -> Obj:
    labels: dict[str, str] = {TWIN_LABEL: "true"}
    annotations: dict[str, str] = {}
    if not job.foreign:
        labels |= {"m2g.io/workload-kind": job.kind, "m2g.io/flex-tier": str(job.tier)}
        annotations["m2g.io/estimated-kw"] = str(estimated_kw(job, model))
        annotations["m2g.io/expected-runtime-seconds"] = str(max(1, round(job.runtime /
                                                                          time_scale)))
        if job.checkpoint_s > 0:
            annotations["m2g.io/checkpoint-interval-seconds"] = str(
                max(1, round(job.checkpoint_s / time_scale)))
        if job.elastic:
            annotations[L.MIN_PARALLELISM] = str(job.min_pods)
    topology = "" if job.elastic else job.topology  # Kueue's webhook refuses one on elastic
    if topology == "required-clique":
        annotations[REQUIRED] = L.GPU_CLIQUE  # the templates' default nvlink_level
    elif topology == "preferred-rack":
        annotations[PREFERRED] = L.RACK
    elif topology == "required-block":
        annotations[REQUIRED] = L.BLOCK
    job_labels = {TWIN_LABEL: "true", "kueue.x-k8s.io/queue-name": LOCAL_QUEUE}
    if job.priority_class:
        job_labels["kueue.x-k8s.io/priority-class"] = job.priority_class
    gpus = str(job.gpus_per_pod)
    meta: Obj = {"name": job.name, "namespace": job.namespace, "labels": job_labels}
    size: Obj = {"parallelism": job.pods, "completions": job.pods}
    if job.elastic and not job.foreign:
        meta["annotations"] = {L.ELASTIC_JOB: "true"}
        size = {"parallelism": job.pods}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {**size, "backoffLimit": 0,
                 "template": {
                     "metadata": {"labels": labels, "annotations": annotations},
                     "spec": {"restartPolicy": "Never", "containers": [{
                         "name": "main", "image": "registry.invalid/m2g-twin:1",
                         "resources": {"requests": {"cpu": "8", "memory": "64Gi",
                                                    "nvidia.com/gpu": gpus},
                                       "limits": {"nvidia.com/gpu": gpus}}}]}}},
    }

