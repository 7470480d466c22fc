"""The ``WorkloadTemplate`` document (``m2g.io/v1alpha1``) as frozen pydantic models.

A template is a recipe: facts about the model and the workload (what AI engineers know) plus the
parameters a user may change with ``--set``, each with a default and bounds. docs/templates.md
describes every field and the reasoning behind the shipped numbers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

API_VERSION = "m2g.io/v1alpha1"
KIND = "WorkloadTemplate"
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class Frozen(BaseModel):
    """Base: immutable, no unknown fields, camelCase in YAML."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class WorkloadApi(StrEnum):
    """The Kubernetes workload API a template renders to."""

    JOB = "Job"
    JOBSET = "JobSet"
    PYTORCHJOB = "PyTorchJob"
    TRAINJOB = "TrainJob"
    LEADERWORKERSET = "LeaderWorkerSet"


class Shape(StrEnum):
    """How GPUs are counted: one gang, replicated serving groups, or independent workers."""

    TRAINING = "training"  # world = tp * cp * pp * dp, one gang
    SERVING = "serving"  # replicas groups of tp * pp GPUs, each its own gang
    INDEPENDENT = "independent"  # workers pods of gpus_per_worker GPUs, no gang


class Launcher(StrEnum):
    """What the container runs in front of the template's ``args``."""

    TORCHRUN = "torchrun"  # torch.distributed elastic launcher, rendezvous per API
    RAY = "ray"  # vLLM multi-node: Ray head on the leader, workers join it
    PLAIN = "plain"  # args as they are


class Precision(StrEnum):
    """Number format of the weights (training: of the compute; master weights stay fp32)."""

    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"


class PowerShape(StrEnum):
    """How the load draws power over time (what a grid operator sees)."""

    STEADY = "steady"  # synchronous training: flat and high, dips at checkpoints
    DIURNAL = "diurnal"  # a service following its users
    BURSTY = "bursty"  # agentic / interactive: short spikes, idle gaps
    FLAT = "flat"  # batch: flat while running, any time of day


class WorkloadKindName(StrEnum):
    """Values of the ``m2g.io/workload-kind`` label (same as m2g.model.inputs.WorkloadKind)."""

    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    BATCH = "batch"
    BENCHMARK = "benchmark"
    DATA_PROCESSING = "data-processing"
    AGENTIC = "agentic"


class Moe(Frozen):
    """Mixture-of-experts facts."""

    experts: int = Field(ge=2)
    experts_per_token: int = Field(alias="expertsPerToken", ge=1)
    active_parameters_b: float = Field(alias="activeParametersB", gt=0)


class ModelFacts(Frozen):
    """The model's architecture, as in its published config."""

    name: str
    parameters_b: float = Field(alias="parametersB", gt=0)
    layers: int = Field(ge=1)
    hidden: int = Field(ge=64)
    heads: int = Field(ge=1)
    kv_heads: int = Field(alias="kvHeads", ge=1)
    head_dim_: int | None = Field(alias="headDim", default=None, ge=16)  # if not hidden/heads
    moe: Moe | None = None
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.hidden // self.heads


class CapPoint(Frozen):
    """Normalised throughput at a per-GPU power cap (fraction of the uncapped limit)."""

    cap: float = Field(gt=0, le=1)
    throughput: float = Field(ge=0, le=1)


class PowerProfile(Frozen):
    """Expected draw and how throughput responds to a power cap."""

    kw_per_gpu: float = Field(alias="kwPerGpu", gt=0, le=2.5)
    shape: PowerShape
    cap_curve: tuple[CapPoint, ...] = Field(alias="capCurve", default=())
    source: str = ""


class Benchmark(Frozen):
    """What good looks like: the number a healthy run should reach."""

    metric: str
    target: float = Field(gt=0)
    unit: str
    source: str = ""


class Container(Frozen):
    """The main container: launcher, args (with ``{placeholders}``), port, extra env."""

    launcher: Launcher = Launcher.PLAIN
    launcher_command: tuple[str, ...] = Field(alias="launcherCommand", default=("torchrun",),
                                              min_length=1)  # e.g. [tune, run]
    args: tuple[str, ...] = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    env: dict[str, str] = Field(default_factory=dict)


class ParamBounds(Frozen):
    """A template's declaration of one settable parameter (type comes from the catalogue)."""

    default: int | float | str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    help: str = ""


class Metadata(Frozen):
    """Template name (also the default workload name) and one-line description."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    description: str = Field(min_length=1, max_length=120)


class TemplateSpec(Frozen):
    """The recipe."""

    workload_kind: WorkloadKindName = Field(alias="workloadKind")
    shape: Shape
    apis: tuple[WorkloadApi, ...] = Field(min_length=1)
    model: ModelFacts | None = None
    power: PowerProfile
    benchmark: Benchmark | None = None
    container: Container
    parameters: dict[str, ParamBounds]

    @model_validator(mode="after")
    def _serving_api(self) -> TemplateSpec:
        serving = self.shape is Shape.SERVING
        lws = WorkloadApi.LEADERWORKERSET in self.apis
        if serving != lws or (serving and len(self.apis) != 1):
            raise ValueError("serving templates render to LeaderWorkerSet only, and only they do")
        return self


class WorkloadTemplate(Frozen):
    """The whole document."""

    api_version: Literal["m2g.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["WorkloadTemplate"]
    metadata: Metadata
    spec: TemplateSpec

    @property
    def name(self) -> str:
        return self.metadata.name
