"""Compile policy documents into an immutable, type-checked ``PolicySet``.

Compilation is all-or-nothing: every document is validated, every expression type-checked (when
cel-expr-python is present) and compiled for the chosen runtime, and *every* problem is collected.
Any problem means no PolicySet, so a caller keeps the set it had (atomic reload).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from m2g.policy.cost import MAX_ALLOC, Cost, CostError, crude, estimate, human, total
from m2g.policy.errors import Problem
from m2g.policy.inline import Variables
from m2g.policy.runtime import CelCompileError, Program, Runtime
from m2g.policy.schema import ExpectedType, TypeChecker
from m2g.policy.spec import (
    Decision,
    FailurePolicy,
    PodSetUpdateSpec,
    PolicyDoc,
    RuleSpec,
    Stage,
    StopPolicy,
)
from m2g.policy.yamlsrc import PathKey, SourceDoc

#: podSetUpdates keys that name a level of the site's topology label mapping (an extension:
#: ``"${site.labels.rack}": "variables.coolest.name"`` selects the rack by the site's own
#: label; m2g.policy.evaluate writes the label, or drops the entry when the site has none).
SITE_LABEL_KEYS: dict[str, str] = {f"${{site.labels.{f}}}": f
                                   for f in ("clique", "rack", "block", "powerDomain")}
_POS = re.compile(r"^<input>:(\d+):(\d+): ")


@dataclass(frozen=True, slots=True)
class CompiledUpdate:
    """podSetUpdates with every value compiled: (key, program) pairs."""

    pod_sets: tuple[str, ...]
    labels: tuple[tuple[str, Program], ...]
    annotations: tuple[tuple[str, Program], ...]
    node_selector: tuple[tuple[str, Program], ...]
    tolerations: tuple[tuple[tuple[str, Program], ...], ...]


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready to evaluate; payload programs are None where the rule does not set them."""

    name: str
    line: int
    when: Program
    message: str | None = None
    message_expr: Program | None = None
    decision: Decision | None = None
    requeue_after: Program | None = None
    updates: tuple[CompiledUpdate, ...] = ()
    quota: Program | None = None
    stop_policy: StopPolicy | None = None
    eligible: Program | None = None
    score: Program | None = None
    min_cap: Program | None = None
    weight: Program | None = None
    topology_level: Program | None = None


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A policy ready to evaluate."""

    name: str
    file: str
    line: int
    stage: Stage
    priority: int
    failure_policy: FailurePolicy
    match: tuple[tuple[str, Program], ...]
    rules: tuple[CompiledRule, ...]
    variables: Variables


@dataclass(frozen=True)
class PolicySet:
    """An immutable, ordered set of compiled policies (priority, then name, inside a stage)."""

    runtime: Runtime
    policies: tuple[CompiledPolicy, ...]
    by_stage: dict[Stage, tuple[CompiledPolicy, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, runtime: Runtime, policies: Iterable[CompiledPolicy]) -> PolicySet:
        ordered = tuple(sorted(policies, key=lambda p: (p.priority, p.name)))
        stages = {s: tuple(p for p in ordered if p.stage is s) for s in Stage}
        return cls(runtime, ordered, stages)

    def names(self) -> list[str]:
        return [p.name for p in self.policies]

    def select(self, names: Iterable[str]) -> PolicySet:
        """Only the named policies (for tests that target some policies of a folder)."""
        wanted = set(names)
        return PolicySet.of(self.runtime, (p for p in self.policies if p.name in wanted))


@dataclass
class _Ctx:
    """Where we are while compiling one policy, to locate problems."""

    doc: SourceDoc
    policy: str
    problems: list[Problem]
    runtime: Runtime
    checker: TypeChecker | None
    env: Any = None
    variables: Variables = field(default_factory=Variables)
    costs: dict[str, Cost] = field(default_factory=dict)

    def cost_problem(self, source: str) -> tuple[Cost, str | None]:
        """(the expression's own Cost, a problem when it and the variables it needs may
        allocate more than MAX_ALLOC in one evaluation; m2g.policy.cost)."""
        used: set[str] = set()

        def variable(name: str) -> Cost | None:
            used.add(name)
            return self.costs.get(name)

        try:
            own = estimate(source, variable)
        except CostError:
            own = crude(source, variable)
            used = {n for n in self.variables.order if f"variables.{n}" in source}
        needed = set(used)
        for u in used:
            needed |= self.variables.deps.get(u, set())
        alloc = total(own, {n: self.costs[n] for n in needed if n in self.costs})
        if alloc > MAX_ALLOC:
            return own, (f"may allocate {human(alloc)} in one evaluation (bound "
                         f"{human(MAX_ALLOC)}): a string or list built up by `+`, variables "
                         "or a comprehension")
        return own, None

    def problem(self, path: PathKey, rule: str, message: str) -> None:
        self.problems.append(
            Problem(self.doc.file, self.doc.line_of(path), self.policy, rule, message)
        )

    def expr(self, source: str, path: PathKey, rule: str, expected: ExpectedType) -> Program | None:
        """Type-check (if we can) and compile one expression; record a problem on failure."""
        if len(path) > 3 and path[1] == "rules":
            what = ".".join(str(p) for p in path[3:])
        else:
            what = f"{path[1]}[{path[2]}]" if len(path) > 2 else str(path[-1])
        try:
            if self.checker is not None:
                self.checker.check(self.env, source, expected)
            text, bare = self.variables.prepare(source)
            program = self.runtime.compile(text, bare)
        except CelCompileError as exc:
            self.problem(path, rule, f"{what}: {_tidy(str(exc))}")
            return None
        _, too_big = self.cost_problem(source)
        if too_big:
            self.problem(path, rule, f"{what}: {too_big}")
            return None
        return program


def _tidy(message: str) -> str:
    m = _POS.match(message)
    return f"column {m.group(2)}: {message[m.end():]}" if m else message


def _validation_problems(doc: SourceDoc, exc: ValidationError) -> list[Problem]:
    data = doc.data if isinstance(doc.data, dict) else {}
    name = str((data.get("metadata") or {}).get("name", "")) if isinstance(
        data.get("metadata"), dict) else ""
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        rule = _rule_name(data, loc)
        where = ".".join(str(p) for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        out.append(Problem(doc.file, doc.line_of(loc), name, rule, f"{where}: {msg}"
                           if where else msg))
    return out


def _rule_name(data: dict[str, Any], loc: tuple[Any, ...]) -> str:
    if len(loc) >= 3 and loc[0] == "spec" and loc[1] == "rules" and isinstance(loc[2], int):
        try:
            return str(data["spec"]["rules"][loc[2]].get("name", ""))
        except (KeyError, IndexError, TypeError, AttributeError):
            return ""
    return ""


def parse_policy(doc: SourceDoc) -> tuple[PolicyDoc | None, list[Problem]]:
    """Validate the structure of one Policy document."""
    try:
        return PolicyDoc.model_validate(doc.data), []
    except ValidationError as exc:
        return None, _validation_problems(doc, exc)


def compile_policy(
    doc: SourceDoc, pol: PolicyDoc, runtime: Runtime, checker: TypeChecker | None
) -> tuple[CompiledPolicy | None, list[Problem]]:
    """Type-check and compile one validated policy."""
    ctx = _Ctx(doc, pol.metadata.name, [], runtime, checker)
    spec = pol.spec
    _compile_variables(ctx, spec.variables)
    match = []
    for i, mc in enumerate(spec.match_conditions):
        prog = ctx.expr(mc.expression, ("spec", "matchConditions", i, "expression"), "",
                        ExpectedType.BOOL)
        if prog is not None:
            match.append((mc.name, prog))
    rules = [_compile_rule(ctx, i, r) for i, r in enumerate(spec.rules)]
    if ctx.problems:
        return None, ctx.problems
    compiled = CompiledPolicy(
        name=pol.metadata.name, file=doc.file, line=doc.start_line, stage=spec.stage,
        priority=spec.priority, failure_policy=spec.failure_policy, match=tuple(match),
        rules=tuple(r for r in rules if r is not None), variables=ctx.variables,
    )
    return compiled, []


def _compile_variables(ctx: _Ctx, variables: Iterable[Any]) -> None:
    types: dict[str, Any] = {}
    ctx.env = ctx.checker.base_env if ctx.checker else None
    for i, var in enumerate(variables):
        path = ("spec", "variables", i, "expression")
        rtype = None
        if ctx.checker is not None:
            try:
                rtype = ctx.checker.check(ctx.env, var.expression, ExpectedType.ANY)
            except CelCompileError as exc:
                ctx.problem(path, "", f"variables.{var.name}: {_tidy(str(exc))}")
        try:
            ctx.runtime.compile(ctx.variables.prepare(var.expression)[0])
        except CelCompileError as exc:
            if ctx.checker is None:
                ctx.problem(path, "", f"variables.{var.name}: {_tidy(str(exc))}")
        own, too_big = ctx.cost_problem(var.expression)
        if too_big:
            ctx.problem(path, "", f"variables.{var.name}: {too_big}")
        ctx.variables.add(var.name, var.expression)
        ctx.costs[var.name] = own
        if ctx.checker is not None:
            from cel_expr_python import cel

            types[var.name] = rtype if rtype is not None else cel.Type.DYN
            ctx.env = ctx.checker.env_with_variables(types)


def _compile_rule(ctx: _Ctx, i: int, rule: RuleSpec) -> CompiledRule | None:
    base: PathKey = ("spec", "rules", i)
    before = len(ctx.problems)

    def opt(attr: str, alias: str, expected: ExpectedType) -> Program | None:
        source = getattr(rule, attr)
        return None if source is None else ctx.expr(source, (*base, alias), rule.name, expected)

    when = ctx.expr(rule.when, (*base, "when"), rule.name, ExpectedType.BOOL)
    compiled = CompiledRule(
        name=rule.name,
        line=ctx.doc.line_of(base),
        when=when,  # type: ignore[arg-type]  # None only when a problem was recorded
        message=rule.message,
        message_expr=opt("message_expression", "messageExpression", ExpectedType.STRING),
        decision=rule.decision,
        requeue_after=opt("requeue_after", "requeueAfter", ExpectedType.INT),
        updates=tuple(
            _compile_update(ctx, (*base, "podSetUpdates", j), rule.name, u)
            for j, u in enumerate(rule.pod_set_updates)
        ),
        quota=opt("quota", "quota", ExpectedType.INT),
        stop_policy=rule.stop_policy,
        eligible=opt("eligible", "eligible", ExpectedType.BOOL),
        score=opt("score", "score", ExpectedType.DOUBLE),
        min_cap=opt("min_cap", "minCap", ExpectedType.DOUBLE),
        weight=opt("weight", "weight", ExpectedType.DOUBLE),
        topology_level=opt("topology_level", "topologyLevel", ExpectedType.STRING),
    )
    return compiled if len(ctx.problems) == before else None


def _compile_update(
    ctx: _Ctx, path: PathKey, rule: str, upd: PodSetUpdateSpec
) -> CompiledUpdate:
    def kv(field_name: str, alias: str, items: dict[str, str]) -> tuple[tuple[str, Program], ...]:
        out = []
        for key, source in items.items():
            if key.startswith("$") and key not in SITE_LABEL_KEYS:
                ctx.problem((*path, alias, key), rule,
                            f"{alias} key {key!r}: a key starting with $ must be one of "
                            f"{', '.join(sorted(SITE_LABEL_KEYS))}")
                continue
            prog = ctx.expr(source, (*path, alias, key), rule, ExpectedType.STRING)
            if prog is not None:
                out.append((key, prog))
        return tuple(out)

    tolerations = []
    for t_i, tol in enumerate(upd.tolerations):
        fields = []
        for name in ("key", "operator", "value", "effect"):
            source = getattr(tol, name)
            if source is not None:
                prog = ctx.expr(source, (*path, "tolerations", t_i, name), rule,
                                ExpectedType.STRING)
                if prog is not None:
                    fields.append((name, prog))
        tolerations.append(tuple(fields))
    return CompiledUpdate(
        pod_sets=upd.pod_sets,
        labels=kv("labels", "labels", upd.labels),
        annotations=kv("annotations", "annotations", upd.annotations),
        node_selector=kv("node_selector", "nodeSelector", upd.node_selector),
        tolerations=tuple(tolerations),
    )


def compile_documents(
    docs: Iterable[tuple[SourceDoc, PolicyDoc]], runtime: Runtime, checker: TypeChecker | None
) -> tuple[PolicySet | None, list[Problem]]:
    """Compile validated policies into a PolicySet, or return every problem and no set."""
    problems: list[Problem] = []
    compiled: list[CompiledPolicy] = []
    seen: dict[str, str] = {}
    for doc, pol in docs:
        name = pol.metadata.name
        if name in seen:
            problems.append(Problem(doc.file, doc.line_of(("metadata", "name")), name, "",
                                    f"duplicate policy name; also defined in {seen[name]}"))
            continue
        seen[name] = f"{doc.file}:{doc.start_line}"
        cp, probs = compile_policy(doc, pol, runtime, checker)
        problems.extend(probs)
        if cp is not None:
            compiled.append(cp)
    if problems:
        return None, problems
    return PolicySet.of(runtime, compiled), []
