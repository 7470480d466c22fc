"""Which rules of which policies fired for one input, with their payloads evaluated.

Two ways to get there, with the same answer:

* ``walk_policy`` — one input, one expression at a time (both runtimes; the reference path).
* m2g.policy.batch — many inputs that share a snapshot, one fused expression per policy
  (cel-expr-python only), falling back to ``walk_policy`` for a policy whose batch fails.

Combining the fired rules into a decision is m2g.policy.evaluate's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m2g.policy.compiler import CompiledPolicy, CompiledRule
from m2g.policy.runtime import CelEvalError, Program
from m2g.policy.spec import FailurePolicy

SlotKey = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class RenderedUpdate:
    """One podSetUpdates entry with its values evaluated."""

    pod_sets: tuple[str, ...]
    fields: tuple[tuple[str, str, str], ...]  # (labels|annotations|nodeSelector, key, value)
    tolerations: tuple[dict[str, str], ...]


@dataclass(frozen=True, slots=True)
class Payload:
    """What a fired rule carries, evaluated; only the stage's own fields are set."""

    message: str
    requeue: int | None = None
    updates: tuple[RenderedUpdate, ...] = ()
    quota: int | None = None
    eligible: bool | None = None
    score: float | None = None
    min_cap: float | None = None
    weight: float | None = None
    level: str | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    """A fired rule."""

    policy: CompiledPolicy
    rule: CompiledRule
    payload: Payload

    @property
    def ref(self) -> str:
        return f"{self.policy.name}/{self.rule.name}"


@dataclass(frozen=True, slots=True)
class Err:
    """An evaluation error inside a policy (match condition, rule or payload)."""

    policy: CompiledPolicy
    rule: str
    message: str

    @property
    def fails(self) -> bool:
        return self.policy.failure_policy is FailurePolicy.FAIL


def slots(rule: CompiledRule) -> list[tuple[SlotKey, Program]]:
    """The rule's payload expressions in a fixed order (the batch path relies on it)."""
    out: list[tuple[SlotKey, Program]] = []
    for name in ("message_expr", "requeue_after", "quota", "eligible", "score", "weight",
                 "topology_level", "min_cap"):
        prog = getattr(rule, name)
        if prog is not None:
            out.append(((name,), prog))
    for i, upd in enumerate(rule.updates):
        for fname, pairs in (("labels", upd.labels), ("annotations", upd.annotations),
                             ("nodeSelector", upd.node_selector)):
            out += [(("u", i, fname, key), prog) for key, prog in pairs]
        for j, tol in enumerate(upd.tolerations):
            out += [(("t", i, j, name), prog) for name, prog in tol]
    return out


def _typed(value: Any, kind: type, what: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CelEvalError(f"{what} returned {type(value).__name__}, want {kind.__name__}")
    return value


def payload(policy: CompiledPolicy, rule: CompiledRule, values: dict[SlotKey, Any]) -> Payload:
    """Build a Payload from slot values; a value of the wrong type raises CelEvalError."""
    default = rule.message or f"{policy.name}/{rule.name} fired"
    msg = values.get(("message_expr",), default)
    if isinstance(msg, CelEvalError):
        msg = f"{default} (messageExpression failed: {msg})"
    get = values.get
    updates = []
    for i, upd in enumerate(rule.updates):
        fields = tuple(
            (fname, key, _typed(get(("u", i, fname, key)), str, f"{fname}[{key}]"))
            for fname, pairs in (("labels", upd.labels), ("annotations", upd.annotations),
                                 ("nodeSelector", upd.node_selector))
            for key, _ in pairs
        )
        tols = tuple({name: _typed(get(("t", i, j, name)), str, f"tolerations.{name}")
                      for name, _ in tol} for j, tol in enumerate(upd.tolerations))
        updates.append(RenderedUpdate(upd.pod_sets, fields, tols))

    def opt(key: str, kind: type, what: str) -> Any:
        return None if (key,) not in values else _typed(values[(key,)], kind, what)

    return Payload(
        message=_typed(msg, str, "messageExpression"),
        requeue=opt("requeue_after", int, "requeueAfter"),
        updates=tuple(updates),
        quota=opt("quota", int, "quota"),
        eligible=opt("eligible", bool, "eligible"),
        score=opt("score", float, "score"),
        min_cap=opt("min_cap", float, "minCap"),
        weight=opt("weight", float, "weight"),
        level=opt("topology_level", str, "topologyLevel"),
    )


def _rule_values(rule: CompiledRule, act: Any) -> dict[SlotKey, Any]:
    values: dict[SlotKey, Any] = {}
    for key, prog in slots(rule):
        try:
            values[key] = prog.run(act)
        except CelEvalError as exc:
            if key != ("message_expr",):
                raise CelEvalError(f"{key[0] if len(key) == 1 else key[2]}: {exc}") from None
            values[key] = exc
    return values


def walk_policy(policy: CompiledPolicy, act: Any) -> list[Hit | Err]:
    """The fired rules (and errors) of one policy for one activation."""
    for name, prog in policy.match:
        try:
            if prog.run(act) is not True:
                return []
        except CelEvalError as exc:
            return [Err(policy, "", f"matchConditions.{name}: {exc}")]
    out: list[Hit | Err] = []
    for rule in policy.rules:
        try:
            if rule.when.run(act) is not True:
                continue
        except CelEvalError as exc:
            out.append(Err(policy, rule.name, f"when: {exc}"))
            continue
        try:
            out.append(Hit(policy, rule, payload(policy, rule, _rule_values(rule, act))))
        except CelEvalError as exc:
            out.append(Err(policy, rule.name, str(exc)))
    return out
