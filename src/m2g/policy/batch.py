"""Batch evaluation: many workloads against one snapshot, one CEL evaluation for many policies.

Why (numbers in docs/benchmarks.md): cel-expr-python converts a Python input into CEL values on
first access, per activation, at roughly a microsecond per value, and the factory part of an input
(``domains``, ``topology``) holds hundreds of values. So:

* the snapshot (everything but the workload and its queue) gets one long-lived activation,
  cached by ``PolicyInput.batch_key`` (Snapshots): its CEL values are converted once, not once
  per decision or per batch;
* the workloads that share it are passed as one list, returned by the function ``m2g__items()``
  (a function, not a variable, so the activation outlives the batch);
* the policies of the stages asked for become one expression mapped over that list::

      [[G1, G2]].map(m2g__g, m2g__items().map(m2g__it, BIND(workload, queue of it,
          [m2g__g[0] && M1 ? BIND_SHARED([W1 ? BIND_SLOTS([true, slots...]) : [], ...]) : [],
           m2g__g[1] && ...])))[0]

  ``G`` is the conjunction of a policy's match conditions that read neither ``workload`` nor
  ``queue``: evaluated once per batch, not once per item. A policy variable is bound where it is
  needed: around the policy when two or more rules test it, else around the one rule whose
  ``when`` tests it, else inside the fired branch (a variable used only by a message costs
  nothing until the rule fires). Ternaries keep CEL's short-circuit order, so a fused result
  equals the per-input one.

Fallbacks, each to a slower form with the same answers: the combined expression fails to compile
(cel-expr-python's parser stops at 32 levels) or raises for some item → one expression per
policy → one per rule → m2g.policy.fired.walk_policy per input, which reports each error where
it belongs.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import BaseModel

from m2g.model.inputs import PolicyInput, WorkloadView
from m2g.policy.compiler import CompiledPolicy, CompiledRule
from m2g.policy.fired import Err, Hit, payload, slots, walk_policy
from m2g.policy.inline import bind_grouped, mentions, needed, strip_strings
from m2g.policy.runtime import (
    BATCH_ITEMS,
    HOISTED,
    CelCompileError,
    CelEvalError,
    Program,
    Runtime,
)

_ITEM_VARIABLES = ("workload", "queue")
_ERRORS = (CelEvalError, TypeError, ValueError, IndexError)
_BUDGET = "Iteration budget exceeded"
#: Items per evaluation, at most. cel-expr-python 0.1.3 builds a comprehension's result list by
#: copying it at every step, into the activation's arena, which keeps it until the activation
#: is dropped: a batch of n items costs O(n²) time and memory. 2,000 items in one evaluation
#: took ~0.65 s and left ~70 MiB on the snapshot's activation; in chunks of 32, ~0.05 s and
#: ~3 MiB (docs/benchmarks.md, "Controller latency").
MAX_CHUNK = 32


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
                 hoisted: Sequence[str] = ()) -> str:
    """The per-item expression of one policy under ``conditions`` (match conditions): a list
    with one cell per rule, or []. The ``hoisted`` variables are read from ``m2g__h``."""
    fixed = {n: f"m2g__h[{policy.name!r}][{i}]" for i, n in enumerate(hoisted)}
    counts: dict[str, int] = {}
    for rule in policy.rules:
        for name in _needs(policy, rule.when) - fixed.keys():
            counts[name] = counts.get(name, 0) + 1
    outer = {n for n, c in counts.items() if c > 1}
    outer |= set().union(*(policy.variables.deps[n] for n in outer))
    outer -= fixed.keys()
    body = "[" + ", ".join(_rule_source(policy, i, r, outer, fixed)
                           for i, r in enumerate(policy.rules)) + "]"
    body = bind_grouped(body, outer, policy.variables, "o", fixed)
    # A match condition binds what it uses itself. "!(M) ? [] : BODY", not "(M) ? BODY : []":
    # CEL's else branch needs no parentheses, and each one is a level for the parser.
    for prog in reversed(conditions):
        body = f"!({prog.source}) ? [] : {body}"
    return body


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
    return _over_items("[" + ", ".join(bodies) + "]", _reads_queue(policies))


def _reads_queue(policies: Sequence[CompiledPolicy]) -> bool:
    return any(mentions(prog.source, ("queue",)) for p in policies for prog in _programs(p))


_WORKLOAD_FIELD = re.compile(r"(?<![\w.])workload\s*\.\s*([A-Za-z_]\w*)")
_WORKLOAD_WHOLE = re.compile(r"(?<![\w.])workload\b(?!\s*\.\s*[A-Za-z_])")
_ALIASES = {info.alias or name: name for name, info in WorkloadView.model_fields.items()}
_FIELD_ALIAS = {name: alias for alias, name in _ALIASES.items()}


def workload_fields(policies: Sequence[CompiledPolicy]) -> set[str] | None:
    """The WorkloadView fields (Python names) that ``policies`` read, or None when some
    expression uses ``workload`` other than as ``workload.FIELD`` (then all of them).
    Converting a value into CEL costs about a microsecond, and a workload has thirty."""
    code = " ".join(strip_strings(prog.source) for p in policies for prog in _programs(p))
    if _WORKLOAD_WHOLE.search(code):
        return None
    return {_ALIASES[f] for f in _WORKLOAD_FIELD.findall(code) if f in _ALIASES}


def _programs(policy: CompiledPolicy) -> list[Program]:
    return [*(p for _, p in policy.match),
            *(p for r in policy.rules for p in (r.when, *(q for _, q in slots(r))))]


def fused_source(policy: CompiledPolicy) -> str:
    """The one expression that evaluates every rule of ``policy`` for every batch item, every
    match condition included: per item, a list with the policy's row."""
    body = _policy_body(policy, [p for _, p in policy.match])
    return _over_items(f"[{body}]", _reads_queue([policy]))


def fused_rule_source(policy: CompiledPolicy, rule: CompiledRule) -> str:
    """One rule over every batch item, binding its own variables (for a policy whose single
    fused expression is too deep for the parser: cel-expr-python stops at 32 levels)."""
    body = _rule_source(policy, 0, rule, set(), {})
    for _, prog in reversed(policy.match):
        body = f"!({prog.source}) ? [] : {body}"
    return _over_items(body, _reads_queue([policy]))


@dataclass(frozen=True)
class Fused:
    """A policy's batch programs: one for the whole policy, or one per rule."""

    whole: Program | None
    per_rule: tuple[Program, ...] = ()


@dataclass(frozen=True)
class Combined:
    """One program for several policies (those whose own fused expression compiles whole)."""

    program: Program
    policies: tuple[CompiledPolicy, ...]


class FusedCache:
    """Fused programs per policy and per policy list, compiled on first use (None: this runtime
    does not batch, or the expression does not compile)."""

    def __init__(self, runtime: Runtime, max_chunk: int = MAX_CHUNK) -> None:
        self._runtime = runtime
        self._max_chunk = max(1, max_chunk)
        self._programs: dict[str, Fused | None] = {}
        self._combined: dict[tuple[tuple[str, ...], ...], Combined | None] = {}
        self._gates: dict[str, Program | None] = {}
        self._hoists: dict[str, list[tuple[str, Program]]] = {}
        self._reads: dict[tuple[str, ...], tuple[set[str] | None, bool]] = {}
        self._reads_by_id: dict[int, tuple[Any, tuple[set[str] | None, bool]]] = {}
        self._chunk: dict[int, int] = {}
        self.snapshots = Snapshots(runtime)
        self.batches = runtime.compile_batch("[]") is not None

    def run(self, program: Program, act: Any, items: list[Any]) -> list[Any]:
        """Run a batch program over ``items`` in chunks of at most ``max_chunk`` (MAX_CHUNK:
        larger batches cost quadratic time and memory) and small enough for cel-expr-python's
        iteration budget (10,000 comprehension steps per evaluation; every bound variable is
        one): a chunk that exceeds it is halved, and the size that worked is remembered."""
        size = self._chunk.get(id(program), self._max_chunk)
        out: list[Any] = []
        i = 0
        while i < len(items):
            part = items[i:i + size]
            try:
                out += self._runtime.run_batch(program, act, part)
            except CelEvalError as exc:
                if _BUDGET not in str(exc) or size == 1:
                    raise
                size = max(1, size // 2)
                self._chunk[id(program)] = size
                continue
            i += len(part)
        return out

    def get(self, policy: CompiledPolicy) -> Fused | None:
        if policy.name not in self._programs:
            self._programs[policy.name] = self._compile(policy)
        return self._programs[policy.name]

    def reads(self, policies: Sequence[CompiledPolicy]) -> tuple[set[str] | None, bool]:
        """(the workload fields ``policies`` read, or None for all; whether they read queue)."""
        hit = self._reads_by_id.get(id(policies))
        if hit is not None and hit[0] is policies:
            return hit[1]
        key = tuple(p.name for p in policies)
        if key not in self._reads:
            self._reads[key] = (workload_fields(policies), _reads_queue(policies))
        self._reads_by_id[id(policies)] = (policies, self._reads[key])
        return self._reads[key]

    def gate(self, policy: CompiledPolicy) -> Program | None:
        """The policy's snapshot-only match conditions as one program (None: it has none)."""
        if policy.name not in self._gates:
            source = gate_source(policy)
            self._gates[policy.name] = (None if source is None
                                        else self._runtime.compile(source))
        return self._gates[policy.name]

    def hoists(self, policy: CompiledPolicy) -> list[tuple[str, Program]]:
        """Programs for the policy's snapshot-wide variables (see hoistable)."""
        if policy.name not in self._hoists:
            out = []
            for name in hoistable(policy):
                try:
                    prog = self._runtime.compile_batch(hoist_source(policy, name))
                except CelCompileError:
                    break
                if prog is None:
                    break
                out.append((name, prog))
            self._hoists[policy.name] = out
        return self._hoists[policy.name]

    def combined(self, policies: Sequence[CompiledPolicy],
                 hoisted: dict[str, tuple[str, ...]] | None = None) -> Combined | None:
        """One program for those of ``policies`` whose own fused expression compiles whole
        (the caller has checked their gates), reading ``hoisted`` variables from ``m2g__h``."""
        hoisted = hoisted or {}
        key = tuple((p.name, *hoisted.get(p.name, ())) for p in policies)
        if key not in self._combined:
            # All of them if that compiles, else those whose own fused expression does.
            self._combined[key] = None
            tries = [tuple(policies), tuple(p for p in policies if (f := self.get(p)) is not None
                                            and f.whole is not None)]
            for members in tries:
                if not members:
                    continue
                try:
                    prog = self._runtime.compile_batch(combined_source(members, hoisted))
                except CelCompileError:
                    continue
                if prog is not None:
                    self._combined[key] = Combined(prog, members)
                break
        return self._combined[key]

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


def snapshot_key(inp: PolicyInput, domain_ids: dict[int, tuple[int, ...]] | None = None
                 ) -> tuple[Any, ...]:
    """``inp.batch_key()``, computed faster: inputs with equal keys share everything but the
    workload and its queue (compared by identity). ``domain_ids``, when given, memoises the ids
    of each ``domains`` dict's values by the dict's own id: inputs copied from one base share
    that dict, and a 100-rack factory has ~200 domains (the caller keeps the inputs alive, so
    an id is not reused meanwhile)."""
    ids = None if domain_ids is None else domain_ids.get(id(inp.domains))
    if ids is None:
        ids = tuple(map(id, inp.domains.values()))
        if domain_ids is not None:
            domain_ids[id(inp.domains)] = ids
    return (id(inp.site), id(inp.grid), id(inp.flavor), id(inp.domain), inp.now, ids)


class Snapshots:
    """One activation per snapshot (``PolicyInput.batch_key``), kept for the last few snapshots.

    The entry holds the snapshot's objects, so the ids in the key stay theirs while it lives.
    """

    def __init__(self, runtime: Runtime, size: int = 8) -> None:
        self._runtime = runtime
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], Snapshot] = OrderedDict()

    def get(self, inp: PolicyInput, key: tuple[Any, ...] | None = None) -> Snapshot:
        """The snapshot of ``inp`` (whose snapshot_key is ``key`` when given)."""
        key = snapshot_key(inp) if key is None else key
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        shared = inp.shared_data()
        refs = (inp.site, inp.grid, inp.flavor, inp.domain, tuple(inp.domains.values()))
        entry = Snapshot(refs, shared, self._runtime.activation(shared))
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return entry


@dataclass
class Snapshot:
    """A snapshot's plain data and activations, its policies' gate results (True, False, or
    None when the gate raised: that policy is then evaluated on its own) and hoisted variables.

    ``base`` serves gates and hoisted variables; ``activation`` (the batch one) also carries
    their values as ``m2g__h``, and is rebuilt when a policy not seen before adds some."""

    refs: Any
    shared: dict[str, Any]
    base: Any
    gates: dict[str, bool | None] = field(default_factory=dict)
    hoisted: dict[str, tuple[tuple[str, ...], list[Any]]] = field(default_factory=dict)
    plans: dict[int, tuple[Any, list[CompiledPolicy], Combined | None]] = field(
        default_factory=dict)
    _activation: Any = None

    def gate(self, cache: FusedCache, policy: CompiledPolicy) -> bool | None:
        if policy.name not in self.gates:
            prog = cache.gate(policy)
            try:
                held = True if prog is None else prog.run(self.base) is True
                self.gates[policy.name] = held
            except CelEvalError:
                self.gates[policy.name] = None
        return self.gates[policy.name]

    def hoist(self, cache: FusedCache, policy: CompiledPolicy) -> tuple[str, ...]:
        """The names of the policy's variables computed for this snapshot (those that raise
        are left to each item)."""
        if policy.name not in self.hoisted:
            names: list[str] = []
            values: list[Any] = []
            for name, prog in cache.hoists(policy):
                if not policy.variables.deps[name] <= set(names):
                    continue
                try:
                    values.append(prog.run(self.base))
                except CelEvalError:
                    continue
                names.append(name)
            self.hoisted[policy.name] = (tuple(names), values)
            if names:
                self._activation = None
        return self.hoisted[policy.name][0]

    def activation(self, runtime: Runtime) -> Any:
        if self._activation is None:
            values = {name: vals for name, (_, vals) in self.hoisted.items()}
            self._activation = runtime.activation({**self.shared, HOISTED: values})
        return self._activation


_KEYS: dict[int, tuple[CompiledRule, list[Any]]] = {}


def _slot_keys(rule: CompiledRule) -> list[Any]:
    """The rule's payload slot keys (cached: the decoding of every fired rule needs them)."""
    hit = _KEYS.get(id(rule))
    if hit is None or hit[0] is not rule:
        hit = (rule, [key for key, _ in slots(rule)])
        _KEYS[id(rule)] = hit
    return hit[1]


_HITS: dict[tuple[Any, ...], tuple[CompiledRule, Hit]] = {}


def _hit(policy: CompiledPolicy, rule: CompiledRule, cell: list[Any]) -> Hit:
    """The Hit for a fired rule's cell; Hits are immutable, so equal cells (same values of the
    same types: 1, 1.0 and True are told apart) share one, as many workloads fire the same
    rule with the same payload."""
    try:
        key: tuple[Any, ...] | None = (id(rule), tuple(cell), tuple(map(type, cell)))
        cached = _HITS.get(key)  # type: ignore[arg-type]
    except TypeError:  # a list or map among the values
        key, cached = None, None
    if cached is not None and cached[0] is rule:
        return cached[1]
    hit = Hit(policy, rule, payload(policy, rule, dict(zip(_slot_keys(rule), cell[1:],
                                                             strict=True))))
    if key is not None:
        if len(_HITS) > 20_000:
            _HITS.clear()
        _HITS[key] = (rule, hit)
    return hit


def _decode(policy: CompiledPolicy, row: Any) -> list[Hit | Err]:
    """One item's fused result → its hits; raises CelEvalError on a malformed payload."""
    if not row:
        return []
    return [_hit(policy, rule, cell) for rule, cell in zip(policy.rules, row, strict=True)
            if cell]


def plan(cache: FusedCache, snap: Snapshot, policies: Sequence[CompiledPolicy]
         ) -> tuple[list[CompiledPolicy], Combined | None]:
    """(the policies whose gate is false for this snapshot, the combined program for those
    whose gate holds). The rest (gate raised, or left out of the combined program) are
    evaluated on their own."""
    if not cache.batches:
        return [], None
    hit = snap.plans.get(id(policies))
    if hit is not None and hit[0] is policies:
        return hit[1], hit[2]
    idle, live = [], []
    for policy in policies:
        gate = snap.gate(cache, policy)
        if gate is False:
            idle.append(policy)
        elif gate is True:
            live.append(policy)
    hoisted = {p.name: snap.hoist(cache, p) for p in live}
    comb = cache.combined(live, hoisted) if live else None
    if all(snap.gates.get(p.name) is not None for p in policies):
        snap.plans[id(policies)] = (policies, idle, comb)  # the caller keeps ``policies``
    return idle, comb


def _plain(value: Any) -> Any:
    """``value`` as ``model_dump(mode="json")`` renders it."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    raise TypeError(type(value).__name__)


def workload_data(workload: WorkloadView, fields: set[str] | None) -> dict[str, Any]:
    """The workload's plain data, only ``fields`` (Python names; None: all), as
    ``model_dump(mode="json", by_alias=True, include=fields)`` gives it, several times faster."""
    if fields is None:
        return workload.model_dump(mode="json", by_alias=True)
    try:
        return {_FIELD_ALIAS[f]: _plain(getattr(workload, f)) for f in fields}
    except TypeError:
        return workload.model_dump(mode="json", by_alias=True, include=fields)


def batch_items(cache: FusedCache, policies: Sequence[CompiledPolicy],
                inputs: Sequence[PolicyInput]) -> list[dict[str, Any]]:
    """What ``m2g__items()`` returns: each workload's data (only the fields the policies read),
    with its queue's at ``m2g__q`` when they read ``queue``."""
    fields, queue = cache.reads(policies)
    items = [workload_data(inp.workload, fields) for inp in inputs]
    if queue:
        for item, inp in zip(items, inputs, strict=True):
            item["m2g__q"] = inp.queue_data()
    return items


def fired_many(policies: Sequence[CompiledPolicy], runtime: Runtime, cache: FusedCache,
               inputs: Sequence[PolicyInput], key: tuple[Any, ...] | None = None,
               ) -> list[list[Hit | Err]]:
    """For each input (all sharing one snapshot, whose batch key is ``key`` when given), the
    hits and errors of every policy."""
    snap = cache.snapshots.get(inputs[0], key)
    items = batch_items(cache, policies, inputs)
    done: dict[str, list[list[Hit | Err]]] = {}
    idle, comb = plan(cache, snap, policies)
    for policy in idle:  # a match condition is false for the whole snapshot
        done[policy.name] = [[] for _ in inputs]
    snap_act = snap.activation(runtime)
    if comb is not None:
        try:
            rows = cache.run(comb.program, snap_act, items)
            decoded = [[_decode(p, row[k]) for row in rows] for k, p in enumerate(comb.policies)]
            done.update({p.name: d for p, d in zip(comb.policies, decoded, strict=True)})
        except _ERRORS:
            pass
    per_item: list[list[Hit | Err]] = [[] for _ in inputs]
    item_acts: list[Any] = [None] * len(inputs)
    for policy in policies:
        result = done.get(policy.name)
        if result is None:
            result = _run_fused(cache, policy, snap_act, items)
        if result is None:
            result = []
            for i, inp in enumerate(inputs):
                if item_acts[i] is None:
                    item_acts[i] = runtime.activation({
                        **snap.shared, "workload": inp.workload_data(), "queue": inp.queue_data()})
                result.append(walk_policy(policy, item_acts[i]))
        for i, hits in enumerate(result):
            per_item[i] += hits
    return per_item


def _run_fused(cache: FusedCache, policy: CompiledPolicy, act: Any,
               items: list[Any]) -> list[list[Hit | Err]] | None:
    """Every item's hits from fused evaluation; None when it must be redone per item."""
    fused = cache.get(policy)
    if fused is None:
        return None
    try:
        if fused.whole is not None:
            return [_decode(policy, row[0]) for row in cache.run(fused.whole, act, items)]
        columns = [cache.run(prog, act, items) for prog in fused.per_rule]
        rows = [[col[i] for col in columns] for i in range(len(columns[0]))]
        return [_decode(policy, [] if all(not c for c in row) else row) for row in rows]
    except _ERRORS:
        return None
