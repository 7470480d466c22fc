"""The v1alpha1 policy documents as typed objects: ``Policy`` and ``PolicyTest``.

These are the shapes of docs/policy-format.md. They validate structure only; expressions are
compiled and type-checked by m2g.policy.compiler.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "m2g.io/v1alpha1"
API_GROUP_PREFIX = "m2g.io/"


class Stage(StrEnum):
    """When a policy runs. Admission and Placement are per workload, the others per object."""

    ADMISSION = "Admission"
    CAPACITY = "Capacity"
    PREEMPTION = "Preemption"
    FAIRNESS = "Fairness"
    PLACEMENT = "Placement"


class Decision(StrEnum):
    """An Admission-stage outcome."""

    ADMIT = "Admit"
    DEFER = "Defer"
    REJECT = "Reject"


class FailurePolicy(StrEnum):
    """What a runtime evaluation error means: Fail (count as Defer) or Ignore (skip, report)."""

    FAIL = "Fail"
    IGNORE = "Ignore"


class StopPolicy(StrEnum):
    """Kueue ClusterQueue stopPolicy, ordered by strength."""

    NONE = "None"
    HOLD = "Hold"
    HOLD_AND_DRAIN = "HoldAndDrain"


#: A policy name: no whitespace, control, bidi or zero-width character and no '/' (the API
#: server's DNS-1123 check is stricter; these are the characters that would forge or reorder
#: a problem line: "a\nerror: ...", U+202E).
POLICY_NAME = r"^[^\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff/]+$"
#: The CRD's bound on one expression or message (deploy/crds/m2g.io_policies.yaml).
MAX_EXPRESSION = 10240


class SpecModel(BaseModel):
    """Base for policy documents: frozen, camelCase, unknown fields rejected (typos are errors)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class Metadata(BaseModel):
    """Kubernetes object metadata; only ``name`` matters here, the rest is tolerated. A name
    never carries a newline, a bidi override or a '/' into problem lines (``POLICY_NAME``)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    name: str = Field(min_length=1, max_length=253, pattern=POLICY_NAME)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class NamedExpression(SpecModel):
    """A named CEL expression (matchConditions and variables)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    expression: str = Field(min_length=1, max_length=MAX_EXPRESSION)


class TolerationSpec(SpecModel):
    """A toleration whose every field is a CEL string expression."""

    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class PodSetUpdateSpec(SpecModel):
    """Changes to pod sets; each value is a CEL string expression. ``podSets`` empty = all."""

    pod_sets: tuple[str, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[TolerationSpec, ...] = ()


class RuleSpec(SpecModel):
    """A rule: fires when ``when`` is true; what it carries depends on the stage."""

    name: str = Field(min_length=1, max_length=253)
    when: str = Field("true", max_length=MAX_EXPRESSION)
    message: str | None = Field(None, max_length=MAX_EXPRESSION)
    message_expression: str | None = Field(None, max_length=MAX_EXPRESSION)
    # Admission
    decision: Decision | None = None
    requeue_after: str | None = None
    pod_set_updates: tuple[PodSetUpdateSpec, ...] = ()
    # Capacity
    quota: str | None = None
    stop_policy: StopPolicy | None = None
    # Preemption
    eligible: str | None = None
    score: str | None = None
    min_cap: str | None = None  # the lowest per-GPU power cap m2g may set (extension)
    # Fairness
    weight: str | None = None
    # Placement
    topology_level: str | None = None

    @field_validator("pod_set_updates", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("when", "requeue_after", "quota", "eligible", "score", "min_cap", "weight",
                     "topology_level", "message_expression", mode="before")
    @classmethod
    def _expression_text(cls, value: Any) -> Any:
        """YAML reads `quota: 48` or `eligible: true` as numbers/bools; CEL wants their text."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return repr(value)
        return value


STAGE_FIELDS: dict[Stage, frozenset[str]] = {
    Stage.ADMISSION: frozenset({"decision", "requeue_after", "pod_set_updates"}),
    Stage.CAPACITY: frozenset({"quota", "stop_policy"}),
    Stage.PREEMPTION: frozenset({"eligible", "score", "min_cap"}),
    Stage.FAIRNESS: frozenset({"weight"}),
    Stage.PLACEMENT: frozenset({"topology_level", "pod_set_updates"}),
}
ALL_STAGE_FIELDS = frozenset().union(*STAGE_FIELDS.values())


class PolicySpecBody(SpecModel):
    """``spec`` of a Policy."""

    stage: Stage
    priority: int = 100
    failure_policy: FailurePolicy = FailurePolicy.FAIL
    match_conditions: tuple[NamedExpression, ...] = ()
    variables: tuple[NamedExpression, ...] = ()
    rules: tuple[RuleSpec, ...] = Field(min_length=1)
    description: str | None = None

    @model_validator(mode="after")
    def _stage_fields(self) -> PolicySpecBody:
        allowed = STAGE_FIELDS[self.stage]
        names: set[str] = set()
        for i, rule in enumerate(self.rules):
            if rule.name in names:
                raise ValueError(f"rules[{i}]: duplicate rule name {rule.name!r}")
            names.add(rule.name)
            used = {f for f in ALL_STAGE_FIELDS if getattr(rule, f) not in (None, ())}
            wrong = sorted(used - allowed)
            if wrong:
                fields = ", ".join(to_camel(f) for f in wrong)
                raise ValueError(
                    f"rules[{i}] ({rule.name}): {fields} not allowed in stage {self.stage.value}"
                )
            _require_stage_payload(self.stage, i, rule)
        _unique("variables", self.variables)
        _unique("matchConditions", self.match_conditions)
        return self


def _require_stage_payload(stage: Stage, i: int, rule: RuleSpec) -> None:
    missing = {
        Stage.ADMISSION: rule.decision is None and "decision (Admit | Defer | Reject)",
        Stage.CAPACITY: rule.quota is None and rule.stop_policy is None and "quota or stopPolicy",
        Stage.FAIRNESS: rule.weight is None and "weight",
        Stage.PLACEMENT: rule.topology_level is None
        and not rule.pod_set_updates
        and "topologyLevel or podSetUpdates",
        Stage.PREEMPTION: False,
    }[stage]
    if missing:
        raise ValueError(f"rules[{i}] ({rule.name}): a {stage.value} rule needs {missing}")
    if rule.requeue_after is not None and rule.decision is not Decision.DEFER:
        raise ValueError(f"rules[{i}] ({rule.name}): requeueAfter is only for Defer rules")
    if rule.pod_set_updates and stage is Stage.ADMISSION and rule.decision is not Decision.ADMIT:
        raise ValueError(f"rules[{i}] ({rule.name}): podSetUpdates are only for Admit rules")


def _unique(what: str, items: tuple[NamedExpression, ...]) -> None:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise ValueError(f"{what}: duplicate name {item.name!r}")
        seen.add(item.name)


class PolicyDoc(SpecModel):
    """A ``Policy`` object."""

    api_version: str
    kind: str
    metadata: Metadata
    spec: PolicySpecBody

    @field_validator("api_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {value!r}")
        return value


class TestExpect(SpecModel):
    """What a test case expects; every field is optional and only given fields are checked."""

    decision: Decision | None = None
    requeue_after_seconds: int | None = None
    reasons: tuple[str, ...] | None = None
    not_reasons: tuple[str, ...] = ()
    pod_set_updates: tuple[dict[str, Any], ...] | None = None
    topology_level: str | None = None
    quota: int | None = None
    stop_policy: StopPolicy | None = None
    eligible: bool | None = None
    score: float | None = None
    min_cap: float | None = None
    weight: float | None = None
    errors: int | None = None
    message_contains: str | None = None  # some fired rule's message contains this text


class TestCase(SpecModel):
    """One case: an input (the CEL inputs; omitted facts are zero) and what to expect."""

    name: str = Field(min_length=1)
    stage: Stage | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    expect: TestExpect


class PolicyTestDoc(SpecModel):
    """A ``PolicyTest`` object. ``stage`` and ``policies`` extend v1alpha1 (defaults: Admission,
    every policy under the tested folder)."""

    api_version: str
    kind: str
    metadata: Metadata
    stage: Stage = Stage.ADMISSION
    policies: tuple[str, ...] = ()
    cases: tuple[TestCase, ...] = Field(min_length=1)
