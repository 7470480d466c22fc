"""Parameters → GPUs, pods, placement, memory per GPU, power and checkpoint size.

Pure arithmetic on a GB300 NVL72 factory: 4 GPUs per compute tray (= Kubernetes node),
72 GPUs per NVLink domain, 288 GB HBM per GPU. Rules of thumb and their sources are in
docs/templates.md ("Sizing"). Impossible layouts raise TemplateError; layouts that are
possible but probably wrong (memory over budget, uneven pipeline stages) become warnings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from m2g.templates.errors import TemplateError
from m2g.templates.params import Values
from m2g.templates.schema import ModelFacts, Shape, WorkloadTemplate

GPUS_PER_NODE = 4
NVLINK_GPUS = 72
HBM_GB = 288.0
USABLE_FRACTION = 0.9  # what a framework may plan to use (vLLM gpu-memory-utilization)
ACTIVATION_BYTES = 34  # per token per hidden unit per layer (Korthikanti et al. 2022, SP + FA)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
GB = 1e9


@dataclass(frozen=True, slots=True)
class Placement:
    """Topology request: one of required / preferred / unconstrained, optional slices."""

    required: str | None = None
    preferred: str | None = None
    unconstrained: bool = False
    slice_level: str | None = None
    slice_pods: int | None = None


@dataclass(frozen=True, slots=True)
class Memory:
    """Estimated GB per GPU."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    kv_cache: float
    kv_tokens: int  # serving: tokens of KV cache that fit per replica

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache


@dataclass(frozen=True, slots=True)
class Sizing:
    """Everything derived from a template and its values."""

    gpus: int
    pods: int  # in one gang (serving: one group)
    gpus_per_pod: int
    groups: int  # serving replicas; 1 otherwise
    model_parallel: int  # GPUs holding one model replica
    placement: Placement
    memory: Memory | None
    kw: float
    checkpoint_gb: float
    warnings: tuple[str, ...]


def size(template: WorkloadTemplate, v: Values) -> Sizing:
    """Dispatch on the template's shape."""
    if template.spec.shape is Shape.TRAINING:
        return _training(template, v)
    if template.spec.shape is Shape.SERVING:
        return _serving(template, v)
    return _independent(template, v)


def _trays(template: str, gpus: int, what: str) -> tuple[int, int]:
    """(pods, gpus per pod) for a gang of ``gpus``: whole 4-GPU trays above one tray."""
    if gpus > GPUS_PER_NODE and gpus % GPUS_PER_NODE:
        raise TemplateError(f"{template}: {what} = {gpus} GPUs is not a whole number of "
                            f"{GPUS_PER_NODE}-GPU trays")
    return math.ceil(gpus / GPUS_PER_NODE), min(gpus, GPUS_PER_NODE)


def _check_model(template: str, model: ModelFacts | None, v: Values) -> list[str]:
    if model is None:
        return []
    if model.heads % v.tp:
        raise TemplateError(f"{template}: tp={v.tp} does not divide the model's "
                            f"{model.heads} attention heads")
    if model.layers % v.pp and (model.layers + 2) % v.pp:
        return [f"pp={v.pp} splits {model.layers} layers unevenly; balance the first and "
                "last stages"]
    return []


def _training(t: WorkloadTemplate, v: Values) -> Sizing:
    name, model = t.name, t.spec.model
    if v.tp * v.cp > NVLINK_GPUS:
        raise TemplateError(f"{name}: tp*cp = {v.tp * v.cp} GPUs exceeds one NVLink domain "
                            f"({NVLINK_GPUS} GPUs)")
    if v.ep > 1 and v.dp % v.ep:
        raise TemplateError(f"{name}: ep={v.ep} must divide dp={v.dp}")
    warnings = _check_model(name, model, v)
    mp = v.tp * v.cp * v.pp
    gpus = mp * v.dp
    pods, per_pod = _trays(name, gpus, "tp*cp*pp*dp")
    placement = _training_placement(name, v, gpus, mp)
    memory = None if model is None else _training_memory(model, v)
    warnings += _memory_warnings(memory)
    ckpt = 0.0 if model is None else model.parameters_b * 14  # bf16 weights + fp32 Adam
    return Sizing(gpus, pods, per_pod, 1, mp, placement, memory,
                  round(gpus * t.spec.power.kw_per_gpu, 1), ckpt, tuple(warnings))


def _training_placement(name: str, v: Values, gpus: int, mp: int) -> Placement:
    """≤ one NVLink domain: required there. Larger: block, with NVLink-domain slices."""
    if gpus <= NVLINK_GPUS:
        return Placement(required=v.nvlink_level)
    unit = mp if mp <= NVLINK_GPUS else v.tp * v.cp
    slice_gpus = math.lcm(unit, GPUS_PER_NODE)
    if slice_gpus > NVLINK_GPUS:
        raise TemplateError(f"{name}: a model-parallel group of {unit} GPUs does not pack into "
                            f"whole trays within one NVLink domain")
    slice_pods = slice_gpus // GPUS_PER_NODE
    if gpus <= v.block_gpus:
        return Placement(required=v.block_level, slice_level=v.nvlink_level,
                         slice_pods=slice_pods)
    return Placement(preferred=v.block_level, slice_level=v.nvlink_level, slice_pods=slice_pods)


def _params_per_gpu(model: ModelFacts, v: Values) -> float:
    """Parameters held by one GPU: dense part split by tp*pp, experts also by ep."""
    total = model.parameters_b * GB
    dense = total if model.moe is None else model.moe.active_parameters_b * GB
    return (dense + (total - dense) / v.ep) / (v.tp * v.pp)


def _training_memory(model: ModelFacts, v: Values) -> Memory:
    """Mixed precision + Adam with Megatron's distributed optimizer (sharded over dp*cp)."""
    n = _params_per_gpu(model, v)
    weights = n * (WEIGHT_BYTES["bf16"] + (1.0 if v.precision == "fp8" else 0.0))
    act = ACTIVATION_BYTES * v.seq_len * v.micro_batch * model.hidden * model.layers
    return Memory(weights=weights / GB, gradients=n * 4 / GB, optimizer=n * 12 / (v.dp * v.cp) / GB,
                  activations=act / (v.tp * v.cp) / GB, kv_cache=0.0, kv_tokens=0)


def _memory_warnings(memory: Memory | None) -> list[str]:
    budget = HBM_GB * USABLE_FRACTION
    if memory is not None and memory.total > budget:
        return [f"estimated {memory.total:.0f} GB per GPU exceeds the {budget:.0f} GB budget; "
                "raise tp/pp/cp or lower seq_len/micro_batch"]
    return []


def _serving(t: WorkloadTemplate, v: Values) -> Sizing:
    name, model = t.name, t.spec.model
    group = v.tp * v.pp
    if group > NVLINK_GPUS:
        raise TemplateError(f"{name}: tp*pp = {group} GPUs exceeds one NVLink domain "
                            f"({NVLINK_GPUS} GPUs)")
    warnings = _check_model(name, model, v)
    pods, per_pod = _trays(name, group, "tp*pp")
    memory = None if model is None else _serving_memory(model, v)
    if memory is not None and memory.kv_cache <= 0:
        warnings.append(f"weights alone ({memory.weights:.0f} GB per GPU) exceed the budget; "
                        "raise tp/pp or lower precision")
    elif memory is not None and memory.kv_tokens < v.seq_len:
        warnings.append(f"KV cache holds {memory.kv_tokens} tokens, less than one "
                        f"seq_len={v.seq_len} sequence")
    gpus = group * v.replicas
    return Sizing(gpus, pods, per_pod, v.replicas, group, Placement(required=v.nvlink_level),
                  memory, round(gpus * t.spec.power.kw_per_gpu, 1), 0.0, tuple(warnings))


def _serving_memory(model: ModelFacts, v: Values) -> Memory:
    """Weights at ``precision``; the rest of the budget becomes KV cache (as vLLM does)."""
    weights = _params_per_gpu(model, v) * WEIGHT_BYTES[v.precision] / GB
    kv_bytes = 2.0 if v.precision == "bf16" else 1.0
    per_token = (2 * (model.layers / v.pp) * model.kv_heads * model.head_dim * kv_bytes
                 / min(v.tp, model.kv_heads))
    free = max(HBM_GB * USABLE_FRACTION - weights, 0.0)
    return Memory(weights=weights, gradients=0.0, optimizer=0.0, activations=0.0,
                  kv_cache=free, kv_tokens=int(free * GB / per_token))


def _independent(t: WorkloadTemplate, v: Values) -> Sizing:
    gpus = v.workers * v.gpus_per_worker
    return Sizing(gpus, v.workers, v.gpus_per_worker, 1, v.gpus_per_worker,
                  Placement(unconstrained=True), None,
                  round(gpus * t.spec.power.kw_per_gpu, 1), 0.0, ())
