"""Batch evaluation: many workloads against one snapshot, one CEL evaluation per policy.

Why: cel-expr-python converts a Python input into CEL values on first access, per activation.
The factory part of the input (``domains`` above all) is the same for every workload of a
reconcile, yet converting it costs more than all the rules together (docs/benchmarks.md). So the
workloads that share a snapshot and a ClusterQueue go into one list, and each policy becomes one
fused expression mapped over it::

    m2g__items.map(it, BIND(workload, queue of it,
                            M1 ? (M2 ? BIND_VARS([W1 ? [true, slots...] : [], ...]) : []) : []))

``workload`` and ``queue`` are bound to each item's own, so every rule reads the item as it would
read a single input. Ternaries keep CEL's short-circuit order, so a fused result equals the
per-input one.
A policy whose fused evaluation fails (any runtime error, for any item) is evaluated again per
input by m2g.policy.fired.walk_policy, which reports each error where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from m2g.model.inputs import PolicyInput
from m2g.policy.compiler import CompiledPolicy, CompiledRule
from m2g.policy.fired import Err, Hit, payload, slots, walk_policy
from m2g.policy.runtime import BATCH_ITEMS, CelCompileError, CelEvalError, Program, Runtime


def _over_items(body: str) -> str:
    """Map ``body`` over the batch, binding ``workload`` and ``queue`` to each item's own."""
    return (f"{BATCH_ITEMS}.map(m2g__it, [m2g__it.w].map(workload, "
            f"[m2g__it.q].map(queue, {body})[0])[0])")


def _rule_source(rule: CompiledRule) -> str:
    parts = ", ".join(["true", *(f"({prog.bare})" for _, prog in slots(rule))])
    return f"(({rule.when.bare}) ? [{parts}] : [])"


def fused_source(policy: CompiledPolicy) -> str:
    """The one expression that evaluates every rule of ``policy`` for every batch item, with
    each policy variable bound once per item (m2g.policy.inline), inside the match conditions."""
    body = "[" + ", ".join(_rule_source(r) for r in policy.rules) + "]"
    body = policy.variables.bind_all(body)
    for _, prog in reversed(policy.match):  # a match condition binds what it uses itself
        body = f"(({prog.source}) ? {body} : [])"
    return _over_items(body)


def fused_rule_source(policy: CompiledPolicy, rule: CompiledRule) -> str:
    """One rule over every batch item, binding its own variables (for a policy whose single
    fused expression is too deep for the parser: cel-expr-python stops at 32 levels)."""
    parts = ", ".join(["true", *(f"({prog.source})" for _, prog in slots(rule))])
    body = f"(({rule.when.source}) ? [{parts}] : [])"
    for _, prog in reversed(policy.match):
        body = f"(({prog.source}) ? {body} : [])"
    return _over_items(body)


@dataclass(frozen=True)
class Fused:
    """A policy's batch programs: one for the whole policy, or one per rule."""

    whole: Program | None
    per_rule: tuple[Program, ...] = ()


class FusedCache:
    """Fused programs per policy, compiled on first use (None: this runtime does not batch)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._programs: dict[str, Fused | None] = {}

    def get(self, policy: CompiledPolicy) -> Fused | None:
        if policy.name not in self._programs:
            self._programs[policy.name] = self._compile(policy)
        return self._programs[policy.name]

    def _compile(self, policy: CompiledPolicy) -> Fused | None:
        try:
            whole = self._runtime.compile_batch(fused_source(policy))
            return None if whole is None else Fused(whole)
        except CelCompileError:
            pass
        try:
            progs = [self._runtime.compile_batch(fused_rule_source(policy, r))
                     for r in policy.rules]
        except CelCompileError:
            return None
        return Fused(None, tuple(p for p in progs if p is not None))


def _decode(policy: CompiledPolicy, row: Any) -> list[Hit | Err]:
    """One item's fused result → its hits; raises CelEvalError on a malformed payload."""
    if not row:
        return []
    out: list[Hit | Err] = []
    for rule, cell in zip(policy.rules, row, strict=True):
        if not cell:
            continue
        keys = [key for key, _ in slots(rule)]
        out.append(Hit(policy, rule, payload(policy, rule, dict(zip(keys, cell[1:],
                                                                     strict=True)))))
    return out


def fired_many(policies: Sequence[CompiledPolicy], runtime: Runtime, cache: FusedCache,
               shared: dict[str, Any], inputs: Sequence[PolicyInput]) -> list[list[Hit | Err]]:
    """For each input (all sharing ``shared`` data), the hits and errors of every policy."""
    per_item: list[list[Hit | Err]] = [[] for _ in inputs]
    workloads = [inp.workload_data() for inp in inputs]
    queues = [inp.queue_data() for inp in inputs]
    batch_act = runtime.activation(
        {**shared, BATCH_ITEMS: [{"w": w, "q": q} for w, q in zip(workloads, queues, strict=True)]})
    item_acts: list[Any] = [None] * len(inputs)
    for policy in policies:
        decoded = _run_fused(cache.get(policy), policy, batch_act)
        if decoded is None:
            for i, w in enumerate(workloads):
                if item_acts[i] is None:
                    item_acts[i] = runtime.activation({**shared, "workload": w, "queue": queues[i]})
                per_item[i] += walk_policy(policy, item_acts[i])
        else:
            for i, hits in enumerate(decoded):
                per_item[i] += hits
    return per_item


def _run_fused(fused: Fused | None, policy: CompiledPolicy,
               act: Any) -> list[list[Hit | Err]] | None:
    """Every item's hits from fused evaluation; None when it must be redone per item."""
    if fused is None:
        return None
    try:
        if fused.whole is not None:
            return [_decode(policy, row) for row in fused.whole.run(act)]
        columns = [prog.run(act) for prog in fused.per_rule]
        rows = [[col[i] for col in columns] for i in range(len(columns[0]))]
        return [_decode(policy, [] if all(not c for c in row) else row) for row in rows]
    except (CelEvalError, TypeError, ValueError, IndexError):
        return None
