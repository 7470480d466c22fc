"""The parts every workload API shares: labels, annotations, pod template, container.

All manifests are plain dicts. Label and annotation names come from m2g.model.labels.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from m2g.model import labels as L
from m2g.templates.errors import TemplateError
from m2g.templates.params import Values
from m2g.templates.schema import Launcher, WorkloadTemplate
from m2g.templates.sizing import Placement, Sizing

Obj = dict[str, Any]
CHECKPOINT_DIR = "/checkpoints"
DATA_DIR = "/data"
KAI_SCHEDULER = "kai-scheduler"
MASTER_PORT = 29500


@dataclass(frozen=True, slots=True)
class Context:
    """One render: the template, its resolved values, their sizing, and where it goes."""

    template: WorkloadTemplate
    values: Values
    sizing: Sizing
    namespace: str
    queue: str

    @property
    def name(self) -> str:
        return self.values.name


def placeholders(ctx: Context) -> dict[str, object]:
    """What ``{...}`` in a template's args may refer to."""
    v, s = ctx.values, ctx.sizing
    model = ctx.template.spec.model
    return {
        "name": v.name, "model": model.name if model else "", "tp": v.tp, "pp": v.pp,
        "cp": v.cp, "dp": v.dp, "ep": v.ep, "seq_len": v.seq_len, "micro_batch": v.micro_batch,
        "precision": v.precision, "gpus": s.gpus, "pods": s.pods, "gpus_per_pod": s.gpus_per_pod,
        "replicas": v.replicas, "workers": v.workers, "checkpoint_dir": CHECKPOINT_DIR,
        "data_dir": DATA_DIR, "checkpoint_interval": v.checkpoint_interval,
        "port": ctx.template.spec.container.port or 0,
    }


def expand(ctx: Context, text: str) -> str:
    """``text`` with ``{placeholders}`` filled in."""
    try:
        return text.format_map(placeholders(ctx))
    except (KeyError, ValueError, IndexError, AttributeError) as exc:
        raise TemplateError(f"{ctx.template.name}: bad placeholder in {text!r}: {exc}") \
            from None


def expand_args(ctx: Context) -> list[str]:
    """The template's args with placeholders filled in."""
    return [expand(ctx, arg) for arg in ctx.template.spec.container.args]


def workload_labels(ctx: Context) -> dict[str, str]:
    """Labels of the top-level object: Kueue queue and priority, m2g kind and tier."""
    out = {L.QUEUE_NAME: ctx.queue, **pod_labels(ctx)}
    if ctx.values.priority:
        out[L.PRIORITY_CLASS] = ctx.values.priority
    return out


def pod_labels(ctx: Context) -> dict[str, str]:
    """Labels every pod carries (m2g reads them on pods too)."""
    out = {L.WORKLOAD_KIND: ctx.template.spec.workload_kind.value,
           L.FLEX_TIER: str(ctx.values.flex_tier), L.TEMPLATE: ctx.template.name}
    if ctx.values.scheduler == "kai" and ctx.values.kai_queue:
        out[L.KAI_QUEUE] = ctx.values.kai_queue
    return out


def m2g_facts(ctx: Context) -> dict[str, str]:
    """m2g's power/runtime/checkpoint facts. They go on the pod template as well as the
    object: Kueue copies only the pod template's metadata into the Workload m2g reads."""
    v, s = ctx.values, ctx.sizing
    out = {L.ESTIMATED_KW: f"{s.kw:g}", L.EXPECTED_RUNTIME: str(v.expected_runtime)}
    if v.checkpoint_interval:
        out[L.CHECKPOINT_INTERVAL] = str(v.checkpoint_interval)
    curve = ctx.template.spec.power.cap_curve
    if len(curve) >= 2:  # the planner's curtailment reads it (docs/curtailment.md)
        out[L.POWER_CURVE] = ",".join(f"{p.cap:g}:{p.throughput:g}"
                                      for p in sorted(curve, key=lambda p: p.cap))
    return out


def workload_annotations(ctx: Context) -> dict[str, str]:
    """m2g's facts, the template values and KAI's topology request."""
    v, s = ctx.values, ctx.sizing
    out = {**m2g_facts(ctx),
           L.TEMPLATE_VALUES: json.dumps(v.model_dump(), sort_keys=True, separators=(",", ":"))}
    if v.scheduler == "kai":
        out.update(kai_topology(ctx.values, s.placement))
    return out


def kai_topology(v: Values, p: Placement) -> dict[str, str]:
    """KAI's workload-level topology annotations (none for unconstrained work)."""
    if p.required:
        return {L.KAI_TOPOLOGY: v.topology, L.KAI_REQUIRED_PLACEMENT: p.required}
    if p.preferred:
        return {L.KAI_TOPOLOGY: v.topology, L.KAI_PREFERRED_PLACEMENT: p.preferred}
    return {}


def tas_annotations(p: Placement, group: str | None = None, slices: bool = True) -> dict[str, str]:
    """Kueue TAS pod-template annotations for a placement."""
    out: dict[str, str] = {}
    if p.required:
        out[L.TAS_REQUIRED] = p.required
    elif p.preferred:
        out[L.TAS_PREFERRED] = p.preferred
    elif p.unconstrained:
        out[L.TAS_UNCONSTRAINED] = "true"
    if slices and p.slice_level and p.slice_pods:
        out[L.TAS_SLICE_REQUIRED] = p.slice_level
        out[L.TAS_SLICE_SIZE] = str(p.slice_pods)
    if group:
        out[L.TAS_PODSET_GROUP] = group
    return out


def metadata(ctx: Context) -> Obj:
    """Top-level object metadata."""
    return {"name": ctx.name, "namespace": ctx.namespace, "labels": workload_labels(ctx),
            "annotations": workload_annotations(ctx)}


def container(ctx: Context, name: str, command: list[str] | None, gpus: int) -> Obj:
    """The main container: image, command, env, GPUs, shared memory and checkpoints."""
    v = ctx.values
    env = {"M2G_WORKLOAD": v.name, "M2G_CHECKPOINT_DIR": CHECKPOINT_DIR,
           "M2G_CHECKPOINT_INTERVAL_SECONDS": str(v.checkpoint_interval),
           **{k: expand(ctx, val) for k, val in ctx.template.spec.container.env.items()}}
    out: Obj = {"name": name, "image": v.image}
    if command is not None:
        out["command"] = command
    out |= {"env": [{"name": k, "value": val} for k, val in env.items()] + checkpoint_env(),
                "resources": {"limits": {L.GPU_RESOURCE: gpus},
                              "requests": {L.GPU_RESOURCE: gpus}},
                "volumeMounts": mounts(v)}
    port = ctx.template.spec.container.port
    if port:
        out["ports"] = [{"name": "http", "containerPort": port}]
    return out


def checkpoint_env() -> list[Obj]:
    """How the job reports a checkpoint (docs/policies.md, "Reporting checkpoints"): after
    each save it annotates its own pod, ``$M2G_POD_NAMESPACE/$M2G_POD_NAME``, with
    ``$M2G_CHECKPOINT_ANNOTATION`` = the save's RFC 3339 time (downward API)."""
    return [{"name": "M2G_CHECKPOINT_ANNOTATION", "value": L.LAST_CHECKPOINT},
            *({"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}
              for env, path in (("M2G_POD_NAME", "metadata.name"),
                                ("M2G_POD_NAMESPACE", "metadata.namespace")))]


def mounts(v: Values) -> list[Obj]:
    out: list[Obj] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if v.checkpoint_pvc:
        out.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
    if v.data_pvc:
        out.append({"name": "data", "mountPath": DATA_DIR})
    return out


def volumes(v: Values) -> list[Obj]:
    out: list[Obj] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if v.checkpoint_pvc:
        out.append({"name": "checkpoints",
                    "persistentVolumeClaim": {"claimName": v.checkpoint_pvc}})
    if v.data_pvc:
        out.append({"name": "data", "persistentVolumeClaim": {"claimName": v.data_pvc}})
    return out


def pod_template(ctx: Context, containers: list[Obj], annotations: dict[str, str],
                 restart: str = "Never", extra: Obj | None = None) -> Obj:
    """A PodTemplateSpec with m2g labels, the given annotations and the scheduler."""
    spec: Obj = {"restartPolicy": restart, "containers": containers,
                 "volumes": volumes(ctx.values), **(extra or {})}
    if ctx.values.scheduler == "kai":
        spec["schedulerName"] = KAI_SCHEDULER
    return {"metadata": {"labels": pod_labels(ctx),
                         "annotations": {**m2g_facts(ctx), **annotations}}, "spec": spec}


def torchrun(ctx: Context, rank: str | None, master: str | None) -> list[str]:
    """A torchrun command line. master None: the operator sets PET_* env (PyTorchJob,
    TrainJob); rank None: the caller exports PET_NODE_RANK (JobSet)."""
    s = ctx.sizing
    head = list(ctx.template.spec.container.launcher_command)
    if master is not None:
        head += [f"--nnodes={s.pods}", f"--nproc-per-node={s.gpus_per_pod}",
                 f"--master-addr={master}", f"--master-port={MASTER_PORT}"]
        if rank is not None:
            head.append(f"--node-rank={rank}")
    return head + expand_args(ctx)


def launch(ctx: Context, rank: str | None, master: str) -> list[str]:
    """The command of a gang member, per the template's launcher."""
    launcher = ctx.template.spec.container.launcher
    if launcher is Launcher.TORCHRUN and ctx.sizing.pods > 1:
        return torchrun(ctx, rank, master)
    if launcher is Launcher.TORCHRUN:
        return [*ctx.template.spec.container.launcher_command, "--standalone",
                f"--nproc-per-node={ctx.sizing.gpus_per_pod}", *expand_args(ctx)]
    return expand_args(ctx)


def operator_command(ctx: Context) -> list[str]:
    """The command when an operator (PyTorchJob, TrainJob) sets torchrun's PET_* env."""
    if ctx.template.spec.container.launcher is Launcher.TORCHRUN:
        return torchrun(ctx, None, None)
    return expand_args(ctx)


def shell(prelude: str, cmd: list[str]) -> list[str]:
    """``sh -c '<prelude>; exec <cmd>'`` with the command quoted."""
    return ["sh", "-c", f"{prelude}; exec {shlex.join(cmd)}"]
