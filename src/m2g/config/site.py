"""The site configuration of ``m2g run --config FILE`` (docs/configuration.md).

One YAML document, camelCase keys like a Kubernetes object, every part optional:

* ``prometheus`` — where the site's Prometheus-compatible API is and how to authenticate
  (``m2g.signals.config.PrometheusSettings``);
* ``signals`` — which PromQL gives each signal (``SignalSpec``; a partial entry overrides only the
  fields it names, absent signals keep the DCGM / facility defaults);
* ``planner`` — the planner's knobs (ramp, hysteresis, dwell, caps; ``PlannerConfig``);
* ``leaderElection`` — the Lease (its namespace defaults to ``$POD_NAMESPACE``);
* ``topology`` — which node labels mean clique, rack, block and power domain
  (``TopologySettings``; defaults: what a GB300 NVL72 cluster carries, GFD and Topograph), and
  the names of the Kueue/KAI Topology and ResourceFlavor ``m2g topology generate`` writes;
* ``admissionChecks`` — the check m2g keeps Active and the configurations other checks of
  m2g's name in their ``spec.parameters`` (``m2g.config.checks``).

Pure apart from reading the file: no clock, no network. ``load_site_config`` turns every problem
into a ``SiteConfigError`` whose lines point at ``FILE:LINE`` — an unknown key is named with the
line it is on (and the closest known key), never ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator

from m2g.config.checks import AdmissionCheckSettings
from m2g.model.labels import TopologyLabels
from m2g.planner.config import PlannerConfig
from m2g.policy.yamlsrc import parse_documents, read_bounded
from m2g.signals.config import CAMEL, MAX_SECONDS, PrometheusSettings, SignalConfig, SignalSpec

API_VERSION: Final = "m2g.io/v1alpha1"
KIND: Final = "SiteConfig"
DEFAULT_LEASE_NAMESPACE = "m2g-system"


#: Kubernetes names (a namespace is a DNS-1123 label, a Lease name a subdomain).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: kW per GPU, at most, in the planner's settings.
MAX_KW_PER_GPU = 10.0
#: Site power, kW (10 GW: beyond any AI factory); a pace or step above it is a typo.
MAX_SITE_KW = 10_000_000.0
#: GPUs at a site (a 1,400-rack NVL72 site has 100,800); a hysteresis above it is a typo.
MAX_SITE_GPUS = 1_000_000
#: A thermal taint's clear margin, °C: more is a taint that never clears.
MAX_CLEAR_MARGIN_C = 50.0


class SiteConfigError(Exception):
    """A site configuration that cannot be used; ``problems`` are ``FILE:LINE: message`` lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}" if problems else "invalid site configuration")


class PlannerSettings(BaseModel):
    """The planner's knobs; a field left out keeps ``PlannerConfig``'s default (and its reason,
    documented there and in docs/configuration.md)."""

    model_config = CAMEL

    #: Shedding and restoring are paced at this many kW per second (a grid transient otherwise).
    ramp_kw_per_second: float | None = Field(default=None, gt=0, le=MAX_SITE_KW)
    #: The most kW one reconcile may shed or restore.
    max_step_kw: float | None = Field(default=None, gt=0, le=MAX_SITE_KW)
    #: Quota changes smaller than this many GPUs are not written (hysteresis).
    quota_hysteresis_gpus: int | None = Field(default=None, ge=0, le=MAX_SITE_GPUS)
    #: A raised quota waits this long after the last change (lowering is immediate).
    quota_raise_dwell_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    settle_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    #: Curtail against the lowest limit starting within this long (0: the one in force).
    shed_lead_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    #: Work expected to end within this long frees its kW as a pause would: no pause for it.
    ending_lead_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    settle_max_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    #: A shed workload stays shed at least this long (dwell before a restore).
    min_shed_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    #: ... unless its pause has settled in the meter and there is room for it twice over.
    early_restore: bool | None = None
    restore_margin: float | None = Field(default=None, ge=0, lt=1)
    #: The site meter's noise, a fraction of the limit: the least a restore keeps under it.
    meter_noise_fraction: float | None = Field(default=None, ge=0, lt=1)
    #: Cap on the requeueAfterSeconds of a Retry answer.
    max_retry_hold_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    #: ... and a wait that ends within that cap is asked this much longer (m2g's Ready at
    #: its end reaches Kueue before the requeue evicts the workload).
    retry_grace_seconds: int | None = Field(default=None, ge=0, le=60)
    shed_saving_fraction: float | None = Field(default=None, gt=0, le=1)
    #: A GPU with its share of the rack draws a few kW (GB300: 1.4 kW); more is a typo.
    default_kw_per_gpu: float | None = Field(default=None, gt=0, le=MAX_KW_PER_GPU)
    kai_topology_name: str | None = Field(default=None, min_length=1, max_length=253,
                                          pattern=DNS_SUBDOMAIN)
    kai_kw_per_gpu: float | None = Field(default=None, gt=0, le=MAX_KW_PER_GPU)
    maintenance_taint_lead_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    maintenance_drain_lead_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    drain_deadline_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    thermal_clear_margin_c: float | None = Field(default=None, ge=0, le=MAX_CLEAR_MARGIN_C)
    #: Reservations: hold lead, expected runtime without an annotation, Retry interval.
    reservation_lead_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    default_runtime_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    reservation_retry_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    #: A percentage grid event's baseline: mean site draw over this many seconds before start.
    baseline_window_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    #: Site-draw samples the controller keeps for baselines, seconds.
    draw_history_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)

    #: Graded curtailment (docs/curtailment.md): false = pauses only.
    power_caps: bool | None = None
    #: The cap ladder, fractions of the default GPU power limit, mildest first.
    cap_levels: tuple[float, ...] | None = Field(default=None, min_length=1, max_length=16)
    #: Throughput a job may lose over its life, by flex tier 0–3.
    flex_allowance: tuple[float, float, float, float] | None = None
    cap_horizon_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    #: The lease on a node's GPUPowerLimit (the agent restores after lease + its grace).
    cap_lease_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    #: Spend the site's headroom once across one reconcile's admissions (docs/curtailment.md).
    share_headroom: bool | None = None
    #: Restore paused work and lift caps during an active grid event when there is room.
    restore_during_events: bool | None = None
    headroom_retry_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    headroom_min_tier: int | None = Field(default=None, ge=1, le=3)
    #: While a grid event is active, the gate holds back every tier from this one (1; 0: all).
    headroom_event_min_tier: int | None = Field(default=None, ge=0, le=4)
    #: ... and firm work during an event only while m2g can still make room for it.
    hold_firm_beyond_reach: bool | None = None
    #: ... and, while paused work waits to come back during an event, only beyond its kW.
    restore_before_firm: bool | None = None
    #: A held-back preemptor keeps its quota while its victims wait, up to this long (0: off).
    preemptor_hold_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    #: During a grid event, no preemption within a ClusterQueue whose new work m2g holds.
    hold_preemption_during_events: bool | None = None
    #: A gang split over NVLink domains though it fits in one gets Retry while it has waited
    #: less than this (0: off), asking again after ``splitRetryRequeueSeconds``.
    split_retry_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    split_retry_requeue_seconds: int | None = Field(default=None, ge=1, le=300)
    #: An elastic Job's workload that fits one NVLink domain is answered Ready with that
    #: domain's nodeSelector before Kueue reserves it (false: after, wherever Kueue put it).
    nvlink_preplace: bool | None = None
    #: A cap the agents report in force shows in the site meter within this long.
    meter_lag_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)

    @field_validator("cap_levels")
    @classmethod
    def _levels(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (any(not 0.1 <= c < 1 for c in v)
                              or any(a <= b for a, b in pairwise(v))):
            raise ValueError("capLevels: fractions in [0.1, 1), mildest (largest) first, "
                             "each once")
        return v

    @field_validator("flex_allowance")
    @classmethod
    def _allowance(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and any(not 0 <= a <= 1 for a in v):
            raise ValueError("flexAllowance: four fractions in [0, 1]")
        return v

    def apply_to(self, base: PlannerConfig) -> PlannerConfig:
        """``base`` with every field this section sets."""
        return dataclasses.replace(base, **self.model_dump(exclude_none=True))


class LeaderElectionSettings(BaseModel):
    """The Lease the replicas campaign for."""

    model_config = CAMEL

    #: Default: the pod's own namespace ($POD_NAMESPACE, from the downward API), else m2g-system.
    lease_namespace: str | None = Field(default=None, min_length=1, max_length=63,
                                        pattern=DNS_LABEL)
    lease_name: str = Field(default="m2g-controller", min_length=1, max_length=253,
                            pattern=DNS_SUBDOMAIN)


class FlavorSettings(BaseModel):
    """The Kueue ResourceFlavor of the GPU nodes (``m2g topology generate``)."""

    model_config = CAMEL

    name: str = Field(default="gb200", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    #: The flavor's nodeLabels: GFD's product label by default.
    node_labels: dict[str, str] = Field(
        default_factory=lambda: {"nvidia.com/gpu.product": "NVIDIA-GB200"}, min_length=1,
        max_length=8)


class TopologySettings(BaseModel):
    """The topology label mapping and the Topology objects generated from it."""

    model_config = CAMEL

    labels: TopologyLabels = Field(default_factory=TopologyLabels)
    #: The Kueue Topology and the KAI Topology (one name for both: templates name it).
    name: str = Field(default="nvl72", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    flavor: FlavorSettings = Field(default_factory=FlavorSettings)


class SiteConfig(BaseModel):
    """Everything a site tells ``m2g run`` (see the module docstring)."""

    model_config = CAMEL

    api_version: Literal["m2g.io/v1alpha1"] = API_VERSION
    kind: Literal["SiteConfig"] = KIND
    #: None: no Prometheus (unless ``m2g run --prometheus`` names one): every signal missing.
    prometheus: PrometheusSettings | None = None
    signals: dict[str, Any] = Field(default_factory=dict)
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    admission_checks: AdmissionCheckSettings = Field(default_factory=AdmissionCheckSettings)
    topology: TopologySettings = Field(default_factory=TopologySettings)

    def signal_config(self) -> SignalConfig:
        """The signals with this site's overrides, and its Prometheus URL, timeout and
        answer bounds."""
        prom = self.prometheus or PrometheusSettings()
        return SignalConfig.model_validate({
            "url": prom.url, "timeout_seconds": prom.timeout_seconds,
            "max_response_bytes": prom.max_response_bytes, "max_series": prom.max_series,
            "max_values_per_series": prom.max_values_per_series, "max_values": prom.max_values,
            "signals": self.signals})

    def planner_config(self, base: PlannerConfig | None = None) -> PlannerConfig:
        """The planner's knobs; the KAI Topology m2g keeps follows the topology mapping."""
        cfg = self.planner.apply_to(base or PlannerConfig())
        return dataclasses.replace(cfg, kai_topology_name=self.topology.name,
                                   kai_topology_levels=self.topology.labels.levels())

    def lease_namespace(self, environ: dict[str, str]) -> str:
        return (self.leader_election.lease_namespace or environ.get("POD_NAMESPACE")
                or DEFAULT_LEASE_NAMESPACE)


def _field_type(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed where ``loc``'s last part is (for a "did you mean")."""
    current: Any = SiteConfig
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            current = _field_type(current, str(part))
            if part == "signals" and current is not None:
                current = dict[str, SignalSpec]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return []
        args = [a for a in get_args(current) if a is not type(None)]
        if get_origin(current) is not dict and len(args) == 1:
            current = args[0]
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]
    return []


def _message(error: Any) -> str:
    loc = tuple(p for p in error["loc"] if p != "[key]")
    where = ".".join(str(p) for p in loc) or "<root>"
    if error["type"] == "extra_forbidden":
        key, known = str(loc[-1]), _known_keys(loc)
        near = [k for k in known if k.lower().startswith(key.lower())] \
            or difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return f"{where}: unknown key{hint}"
    return f"{where}: {error['msg']}"


def parse_site_config(text: str, file: str) -> SiteConfig:
    """Validate the YAML text of a site configuration (``file`` names it in errors)."""
    docs, problems = parse_documents(text, file)
    if problems:
        raise SiteConfigError([f"{p.file}:{p.line}: {p.message}" for p in problems])
    if len(docs) > 1:
        raise SiteConfigError([f"{file}:{docs[1].start_line}: one document expected, found "
                               f"{len(docs)}"])
    doc = docs[0] if docs else None
    data = doc.data if doc is not None and doc.data is not None else {}
    if not isinstance(data, dict):
        raise SiteConfigError([f"{file}:1: a mapping expected, found {type(data).__name__}"])
    errors: list[Any] = []
    config = None
    try:
        config = SiteConfig.model_validate(data)
    except ValidationError as exc:
        errors += [e for e in exc.errors() if e["loc"][:1] != ("signals",)]
    try:  # the signals validate in their own model; their locations start with "signals" too
        SignalConfig.model_validate({"signals": data.get("signals") or {}})
    except ValidationError as exc:
        errors += exc.errors()
    bad_keys = {tuple(e["loc"][:-1]) for e in errors if e["loc"][-1:] == ("[key]",)}
    errors = [e for e in errors if e["loc"][-1:] == ("[key]",)
              or not any(tuple(e["loc"][:len(b)]) == b for b in bad_keys)]
    if errors or config is None:
        located = sorted(((doc.line_of(tuple(p for p in e["loc"] if p != "[key]"))
                           if doc else 1), _message(e)) for e in errors)
        raise SiteConfigError([f"{file}:{line}: {msg}" for line, msg in located])
    return config


def load_site_config(path: Path) -> SiteConfig:
    """Read and validate ``path``; every problem is a ``FILE:LINE`` line of the error."""
    try:  # a regular file of at most 1 MiB, UTF-8 (a FIFO hung here, /dev/zero filled memory)
        text = read_bounded(path)
    except ValueError as exc:
        raise SiteConfigError([f"{path}: cannot read the site configuration: {exc}"]) \
            from None
    return parse_site_config(text, str(path))
