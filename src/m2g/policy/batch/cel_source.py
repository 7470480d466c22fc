"""CEL source generation for batch evaluation: one policy, or several, as a single expression
mapped over the batch's items (the workloads that share a snapshot).

Shapes (see m2g.policy.batch for why)::

    m2g__items().map(workload, [BODY_1, BODY_2, ...])

where each BODY is a policy's per-item expression: its item-dependent match conditions as
``!(M) ? [] : ...``, then one cell per rule (``[]``, or ``[true, slot values...]`` when the
rule fires), its variables bound where they are needed (``bind_grouped``). ``gate_source`` and
``hoist_source`` are the per-snapshot parts: the match conditions and variables that read no
item. ``workload_fields`` says which workload fields the expressions read, so an item carries
only those.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from m2g.model.inputs import WorkloadView
from m2g.policy.compiler import CompiledPolicy, CompiledRule
from m2g.policy.fired import slots
from m2g.policy.inline import bind_grouped, mentions, needed, strip_strings
from m2g.policy.runtime import BATCH_ITEMS, Program

_ITEM_VARIABLES = ("workload", "queue")


def _over_items(body: str, queue: bool) -> str:
    """Map ``body`` over the batch. Each item is the workload's data, so the iteration variable
    is ``workload``; its queue is at ``m2g__q``, bound to ``queue`` when ``queue`` is read."""
    if queue:
        body = f"[workload.m2g__q].map(queue, {body})[0]"
    return f"{BATCH_ITEMS}().map(workload, {body})"


def _needs(policy: CompiledPolicy, prog: Program) -> set[str]:
    return needed(prog.bare, policy.variables)


def _rule_source(policy: CompiledPolicy, index: int, rule: CompiledRule, outer: set[str],
                 hoisted: dict[str, str]) -> str:
    """One rule (bare), binding the variables its ``when`` needs around it and those only its
    payload needs inside the fired branch (hoisted ones are read from ``m2g__h``)."""
    when_vars = _needs(policy, rule.when) - outer
    progs = [prog for _, prog in slots(rule)]
    slot_vars = set().union(*(_needs(policy, p) for p in progs)) - outer - when_vars
    fired = bind_grouped("[" + ", ".join(["true", *(f"({p.bare})" for p in progs)]) + "]",
                         slot_vars, policy.variables, f"s{index}_", hoisted)
    return bind_grouped(f"({rule.when.bare}) ? {fired} : []", when_vars, policy.variables,
                        f"w{index}_", hoisted)


def split_match(policy: CompiledPolicy) -> tuple[list[Program], list[Program]]:
    """(the leading match conditions that read no item variable, the rest). Only a leading run
    can be decided once per snapshot: a later one is reached only after the item's own."""
    progs = [p for _, p in policy.match]
    n = 0
    while n < len(progs) and not mentions(progs[n].source, _ITEM_VARIABLES):
        n += 1
    return progs[:n], progs[n:]


def _policy_body(policy: CompiledPolicy, conditions: Sequence[Program],
                 hoisted: Sequence[str] = (), only: frozenset[int] | None = None) -> str:
    """The per-item expression of one policy under ``conditions`` (match conditions): a list
    with one cell per rule, or []. The ``hoisted`` variables are read from ``m2g__h``. With
    ``only`` (rule indices), the other rules' cells are ``[]``: they are evaluated apart."""
    fixed = {n: f"m2g__h[{policy.name!r}][{i}]" for i, n in enumerate(hoisted)}
    live = [(i, r) for i, r in enumerate(policy.rules) if only is None or i in only]
    counts: dict[str, int] = {}
    for _, rule in live:
        for name in _needs(policy, rule.when) - fixed.keys():
            counts[name] = counts.get(name, 0) + 1
    outer = {n for n, c in counts.items() if c > 1}
    outer |= set().union(*(policy.variables.deps[n] for n in outer))
    outer -= fixed.keys()
    body = "[" + ", ".join(_rule_source(policy, i, r, outer, fixed)
                           if only is None or i in only else "[]"
                           for i, r in enumerate(policy.rules)) + "]"
    body = bind_grouped(body, outer, policy.variables, "o", fixed)
    # A match condition binds what it uses itself. "!(M) ? [] : BODY", not "(M) ? BODY : []":
    # CEL's else branch needs no parentheses, and each one is a level for the parser.
    for prog in reversed(conditions):
        body = f"!({prog.source}) ? [] : {body}"
    return body


def match_source(policy: CompiledPolicy) -> str | None:
    """The policy's item-dependent match conditions (those after its gate) as one expression
    over the batch's items: per item, whether they all hold (in order, short-circuit); None
    when it has none."""
    _, per_item = split_match(policy)
    if not per_item:
        return None
    body = "".join(f"!({p.source}) ? false : " for p in per_item) + "true"
    return _over_items(body, any(mentions(p.source, ("queue",)) for p in per_item))


def match_reads(policy: CompiledPolicy) -> tuple[set[str] | None, bool]:
    """(the workload fields its item-dependent match conditions read, None for all; whether
    they read the queue)."""
    _, per_item = split_match(policy)
    code = " ".join(strip_strings(p.source) for p in per_item)
    if _WORKLOAD_WHOLE.search(code):
        return None, True
    return ({_ALIASES[f] for f in _WORKLOAD_FIELD.findall(code) if f in _ALIASES},
            any(mentions(p.source, ("queue",)) for p in per_item))


def gate_source(policy: CompiledPolicy) -> str | None:
    """A policy's match conditions that read neither workload nor queue, as one expression
    (in order, short-circuit), or None when it has none: they hold for a whole snapshot."""
    indep, _ = split_match(policy)
    if not indep:
        return None
    return "".join(f"!({p.source}) ? false : " for p in indep) + "true"


def hoistable(policy: CompiledPolicy) -> list[str]:
    """The policy's variables that read neither workload nor queue, in declaration order: their
    value is the same for a whole snapshot."""
    out: list[str] = []
    for name in policy.variables.order:
        if (not mentions(policy.variables.bare[name], _ITEM_VARIABLES)
                and all(d in out for d in policy.variables.deps[name])):
            out.append(name)
    return out


def hoist_source(policy: CompiledPolicy, name: str) -> str:
    """An expression for the value of one variable (binding what it needs)."""
    return bind_grouped(f"m2g__v_{name}", {name} | policy.variables.deps[name],
                        policy.variables, "h")


def combined_source(policies: Sequence[CompiledPolicy],
                    hoisted: dict[str, tuple[str, ...]] | None = None) -> str:
    """One expression for all ``policies``, whose snapshot-only match conditions (gate_source)
    are known to hold: per item, a list with one row per policy. ``hoisted[policy]`` names the
    variables already computed for the snapshot, read from ``m2g__h[policy]``."""
    hoisted = hoisted or {}
    bodies = [_policy_body(p, split_match(p)[1], hoisted.get(p.name, ())) for p in policies]
    return _over_items("[" + ", ".join(bodies) + "]", reads_queue(policies))


def subset_source(policy: CompiledPolicy, only: frozenset[int],
                  hoisted: Sequence[str] = ()) -> str:
    """One policy's rules at the indices ``only`` (the others' cells ``[]``) under its
    item-dependent match conditions (its gate is known to hold), per item a list with the
    policy's row: the rules that read few workload fields evaluated once per class of them,
    apart from those that read a field every workload has its own value of (rule_parts)."""
    body = _policy_body(policy, split_match(policy)[1], hoisted, only)
    sub = replace(policy, rules=tuple(r for i, r in enumerate(policy.rules) if i in only))
    return _over_items(f"[{body}]", reads_queue([sub]))


def rule_parts(policy: CompiledPolicy
               ) -> list[tuple[tuple[str, ...] | None, bool, tuple[int, ...]]]:
    """The policy's rules grouped by what they read (with its item-dependent match
    conditions): (workload fields, sorted, or None for all; the queue or not; rule indices),
    in the order of each group's first rule."""
    parts: dict[tuple[tuple[str, ...] | None, bool], list[int]] = {}
    for i, rule in enumerate(policy.rules):
        one = replace(policy, rules=(rule,))
        fields = workload_fields([one])
        key = (None if fields is None else tuple(sorted(fields)), reads_queue([one]))
        parts.setdefault(key, []).append(i)
    return [(fields, queue, tuple(idx)) for (fields, queue), idx in parts.items()]


def reads_queue(policies: Sequence[CompiledPolicy]) -> bool:
    return any(mentions(prog.source, ("queue",)) for p in policies for prog in programs(p))


#: The map fields of WorkloadView that ``map_keys`` may project.
PROJECTABLE = ("annotations", "labels")
_LIT = r"(?:'(_*)'|\"(_*)\")"  # a masked literal (_masked)
#: ``'KEY' in workload.F`` as a whole operand: after the start, ``(``, ``,``, ``?``, ``:``,
#: ``[``, ``{``, ``!``, ``&&`` or ``||`` (nothing binding tighter than ``in`` on its left:
#: ``a + 'k' in m`` is ``(a + 'k') in m``), and not followed by a member, index, call or
#: arithmetic (``'k' in m.x`` is ``'k' in (m.x)``).
_IN_KEY = (r"(?:(?<=[(,?:\[{!])|(?<=&&)|(?<=\|\|)|^)\s*" + _LIT
           + r"\s+in\s+workload\s*\.\s*{f}\b(?!\s*[.\[(+\-*/%])")
#: ``workload.F['KEY']`` (not a member of something else).
_AT_KEY = r"(?<![\w.])workload\s*\.\s*{f}\s*\[\s*" + _LIT + r"\s*\]"


def _masked(source: str) -> str | None:
    """``source`` with every string literal's contents replaced by as many ``_`` (its quotes
    kept, so positions are the source's and a pattern can only match real code); None when
    a literal is raw, bytes, triple-quoted or holds an escape (map_keys does not read
    those)."""
    out = list(source)
    i = 0
    while i < len(source):
        quote = source[i]
        if quote not in "'\"":
            i += 1
            continue
        if source.startswith(quote * 3, i) or (i > 0 and source[i - 1] in "rRbB"):
            return None
        j = i + 1
        while j < len(source) and source[j] != quote:
            if source[j] in "\\\n":
                return None
            out[j] = "_"
            j += 1
        i = j + 1
    return "".join(out)


def map_keys(policies: Sequence[CompiledPolicy], name: str) -> tuple[str, ...] | None:
    """The keys of the map field ``name`` (a Python name in PROJECTABLE) that ``policies``
    read, when every expression reads it only as ``'KEY' in workload.F`` or
    ``workload.F['KEY']`` with literal keys (nvlink-placement: three ``kai.scheduler/...``
    annotations); None when one uses it otherwise (then all of it counts). Workloads that
    agree on those keys (their values, or being absent) get the same answers from these
    policies, whatever else their map holds (every running workload's own
    ``m2g.io/last-checkpoint-time``)."""
    alias = FIELD_ALIAS[name]
    rxs = [re.compile(p.replace("{f}", re.escape(alias))) for p in (_IN_KEY, _AT_KEY)]
    keys: set[str] = set()
    for p in policies:
        for prog in programs(p):
            source = prog.source
            rest = _masked(source)
            if rest is None:
                return None
            for rx in rxs:
                for m in rx.finditer(rest):
                    group = 1 if m.group(1) is not None else 2
                    keys.add(source[m.start(group):m.end(group)])
                rest = rx.sub(lambda m: " " * (m.end() - m.start()), rest)
            if any(_ALIASES.get(f) == name for f in _WORKLOAD_FIELD.findall(rest)):
                return None
    return tuple(sorted(keys))


_WORKLOAD_FIELD = re.compile(r"(?<![\w.])workload\s*\.\s*([A-Za-z_]\w*)")
_WORKLOAD_WHOLE = re.compile(r"(?<![\w.])workload\b(?!\s*\.\s*[A-Za-z_])")
_ALIASES = {info.alias or name: name for name, info in WorkloadView.model_fields.items()}
FIELD_ALIAS = {name: alias for alias, name in _ALIASES.items()}


def workload_fields(policies: Sequence[CompiledPolicy]) -> set[str] | None:
    """The WorkloadView fields (Python names) that ``policies`` read, or None when some
    expression uses ``workload`` other than as ``workload.FIELD`` (then all of them).
    Converting a value into CEL costs about a microsecond, and a workload has thirty."""
    code = " ".join(strip_strings(prog.source) for p in policies for prog in programs(p))
    if _WORKLOAD_WHOLE.search(code):
        return None
    return {_ALIASES[f] for f in _WORKLOAD_FIELD.findall(code) if f in _ALIASES}


def programs(policy: CompiledPolicy) -> list[Program]:
    return [*(p for _, p in policy.match),
            *(p for r in policy.rules for p in (r.when, *(q for _, q in slots(r))))]


def fused_source(policy: CompiledPolicy) -> str:
    """The one expression that evaluates every rule of ``policy`` for every batch item, every
    match condition included: per item, a list with the policy's row."""
    body = _policy_body(policy, [p for _, p in policy.match])
    return _over_items(f"[{body}]", reads_queue([policy]))


def fused_rule_source(policy: CompiledPolicy, rule: CompiledRule) -> str:
    """One rule over every batch item, binding its own variables (for a policy whose single
    fused expression is too deep for the parser: cel-expr-python stops at 32 levels)."""
    body = _rule_source(policy, 0, rule, set(), {})
    for _, prog in reversed(policy.match):
        body = f"!({prog.source}) ? [] : {body}"
    return _over_items(body, reads_queue([policy]))
