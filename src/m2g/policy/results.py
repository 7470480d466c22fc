"""What evaluating a stage yields: decisions, reasons and stage results (JSON-ready)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from m2g.policy.spec import Decision, StopPolicy

DEFAULT_REQUEUE_SECONDS = 300


@dataclass(frozen=True, slots=True)
class Reason:
    """A fired rule: ``{policy, rule, decision, message}``."""

    policy: str
    rule: str
    decision: str
    message: str

    @property
    def ref(self) -> str:
        return f"{self.policy}/{self.rule}"

    def to_json(self) -> dict[str, str]:
        return {"policy": self.policy, "rule": self.rule, "decision": self.decision,
                "message": self.message}


@dataclass(frozen=True, slots=True)
class EvalIssue:
    """A runtime evaluation error that a policy's failurePolicy: Ignore skipped."""

    policy: str
    rule: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"policy": self.policy, "rule": self.rule, "message": self.message}


@dataclass(frozen=True)
class PodSetUpdate:
    """Kueue's PodSetUpdate shape: changes for one pod set."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.node_selector:
            out["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            out["tolerations"] = [dict(t) for t in self.tolerations]
        return out


@dataclass(frozen=True)
class PlacementResult:
    """Placement stage: the topology level to require and the pod set changes."""

    topology_level: str | None
    pod_set_updates: tuple[PodSetUpdate, ...]
    reasons: tuple[Reason, ...]
    errors: tuple[EvalIssue, ...] = ()
    conflict: Reason | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topologyLevel": self.topology_level,
            "podSetUpdates": [u.to_json() for u in self.pod_set_updates],
            "reasons": [r.to_json() for r in self.reasons],
        }
        if self.errors:
            out["errors"] = [e.to_json() for e in self.errors]
        return out


@dataclass(frozen=True)
class AdmissionResult:
    """The Admission decision for one workload (with Placement merged in when it applies)."""

    decision: Decision
    requeue_after_seconds: int | None
    reasons: tuple[Reason, ...]
    pod_set_updates: tuple[PodSetUpdate, ...] = ()
    errors: tuple[EvalIssue, ...] = ()
    placement: PlacementResult | None = None

    def fired(self) -> list[str]:
        refs = [r.ref for r in self.reasons]
        if self.placement is not None:
            refs += [r.ref for r in self.placement.reasons]
        return refs

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON object; ``placement`` and ``errors`` only when present."""
        out: dict[str, Any] = {
            "decision": self.decision.value,
            "requeueAfterSeconds": self.requeue_after_seconds,
            "reasons": [r.to_json() for r in self.reasons],
            "podSetUpdates": [u.to_json() for u in self.pod_set_updates],
        }
        if self.placement is not None:
            out["placement"] = {
                "topologyLevel": self.placement.topology_level,
                "reasons": [r.to_json() for r in self.placement.reasons],
            }
        errors = self.errors + (self.placement.errors if self.placement else ())
        if errors:
            out["errors"] = [e.to_json() for e in errors]
        return out


@dataclass(frozen=True)
class CapacityResult:
    """Capacity stage: the GPU quota (min over fired rules; None = leave as is) and stopPolicy."""

    quota: int | None
    stop_policy: StopPolicy
    reasons: tuple[Reason, ...]
    errors: tuple[EvalIssue, ...] = ()
    failed: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"quota": self.quota, "stopPolicy": self.stop_policy.value,
                               "reasons": [r.to_json() for r in self.reasons]}
        if self.errors:
            out["errors"] = [e.to_json() for e in self.errors]
        if self.failed:
            out["failed"] = True
        return out


@dataclass(frozen=True)
class PreemptionResult:
    """Preemption stage: may this admitted workload be shed, and how early (higher = first)."""

    eligible: bool
    score: float
    reasons: tuple[Reason, ...]
    errors: tuple[EvalIssue, ...] = ()
    #: The lowest per-GPU power cap (fraction of the default limit) m2g may set on it, from
    #: the fired rules' ``minCap`` (the largest); None: no rule said (its flex allowance
    #: alone bounds it). An extension of the contract; in JSON only when set.
    min_cap: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"eligible": self.eligible, "score": self.score,
                               "reasons": [r.to_json() for r in self.reasons]}
        if self.min_cap is not None:
            out["minCap"] = self.min_cap
        if self.errors:
            out["errors"] = [e.to_json() for e in self.errors]
        return out


@dataclass(frozen=True)
class FairnessResult:
    """Fairness stage: the ClusterQueue's fair-sharing weight (None = leave as is)."""

    weight: float | None
    reasons: tuple[Reason, ...]
    errors: tuple[EvalIssue, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weight": self.weight,
                               "reasons": [r.to_json() for r in self.reasons]}
        if self.errors:
            out["errors"] = [e.to_json() for e in self.errors]
        return out


StageResult = AdmissionResult | CapacityResult | PreemptionResult | FairnessResult | PlacementResult
