"""Batch evaluation: many workloads against one snapshot, one CEL evaluation for many policies.

Why (numbers in docs/benchmarks.md): cel-expr-python converts a Python input into CEL values on
first access, per activation, at roughly a microsecond per value, and the factory part of an input
(``domains``, ``topology``) holds hundreds of values. So:

* the snapshot (everything but the workload and its queue) gets one long-lived activation,
  cached by ``PolicyInput.batch_key`` (SnapshotCache): its CEL values are converted once, not once
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
* workloads are evaluated once per **class** (the values of the fields a policy group reads,
  ``_by_class``); a policy whose workloads are mostly classes of their own has its rules split
  by what they read (``_split``): the parts with few classes once per class, the rest per
  workload, the fired rules merged back in the rules' order.

Fallbacks, each to a slower form with the same answers: the combined expression fails to compile
(cel-expr-python's parser stops at 32 levels) or raises for some item → one expression per
policy → one per rule → m2g.policy.fired.walk_policy per input, which reports each error where
it belongs.

The package: ``cel_source`` writes the expressions, ``caches`` keeps programs and snapshot
activations, ``decoding`` turns items into CEL data and results back into Hits; this module
runs a batch (``fired_many``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from m2g.model.inputs import PolicyInput
from m2g.policy.batch.caches import (
    MAX_CHUNK,
    RETAIN_BYTES,
    Combined,
    Fused,
    FusedCache,
    SnapshotCache,
    SnapshotState,
    heap_bytes,
    snapshot_key,
    split_by_gates,
)
from m2g.policy.batch.cel_source import (
    combined_source,
    fused_source,
    workload_fields,
)
from m2g.policy.batch.decoding import (
    PROBE,
    ClassKeys,
    Item,
    Keyed,
    batch_items,
    decode,
    item_classes,
    items_of,
    view_classes,
    workload_data,
)
from m2g.policy.compiler import CompiledPolicy
from m2g.policy.fired import Err, Hit, walk_policy
from m2g.policy.runtime import CelEvalError, Runtime

__all__ = [
    "MAX_CHUNK",
    "ClassKeys",
    "Combined",
    "Fused",
    "FusedCache",
    "Item",
    "SnapshotCache",
    "SnapshotState",
    "batch_items",
    "combined_source",
    "fired_many",
    "fused_source",
    "item_classes",
    "run_fused",
    "snapshot_key",
    "split_by_gates",
    "view_classes",
    "workload_data",
    "workload_fields",
]

_ERRORS = (CelEvalError, TypeError, ValueError, IndexError)


def fired_many(policies: Sequence[CompiledPolicy], runtime: Runtime, cache: FusedCache,
               inputs: Sequence[Item], key: tuple[Any, ...] | None = None,
               base: PolicyInput | None = None) -> list[list[Hit | Err]]:
    """For each input (all sharing one snapshot, whose batch key is ``key`` when given), the
    hits and errors of every policy. The inputs are PolicyInputs, or WorkloadItems over
    ``base`` (then given: the snapshot is its)."""
    if base is None:
        first = inputs[0]
        if not isinstance(first, PolicyInput):
            raise TypeError("a batch of WorkloadItems needs its base input")
        base = first
    snap = cache.snapshots.get(base, key)
    items = _Items(cache, policies, inputs)
    whole = _stage_classes(cache, snap, runtime, policies, items)
    if whole is None:
        return _fired_each(cache, snap, runtime, policies, items)
    firsts, of = whole
    reps = [inputs[i] for i in firsts]
    fired = _fired_each(cache, snap, runtime, policies, _Items(cache, policies, reps))
    return [fired[c] for c in of]


def _stage_classes(cache: FusedCache, snap: SnapshotState, runtime: Runtime,
                   policies: Sequence[CompiledPolicy], items: _Items
                   ) -> tuple[list[int], list[int]] | None:
    """(each class's first input, each input's class) by everything the policies that can
    fire read of the workload and queue together, when the inputs fall into at most half as
    many classes: then the whole stage is evaluated once per class (40,000 waiting workloads
    at 1,400 racks: no class keys, merges of fired lists or combining per workload and
    policy) and each input shares its class's fired list. A policy cannot fire when a
    snapshot match condition is false, or its item match conditions hold for no input
    (admission-pacing's ``requeueCount >= 3``: its ``waitSeconds`` would make every waiting
    workload a class of its own); the same holds for the classes' first inputs. None when
    the policies read all of the workload or the classes are many (the running workloads'
    checkpoint ages): then per policy (group), as before."""
    n = len(items.inputs)
    if n < 4:
        return None
    _, comb = split_by_gates(cache, snap, policies)
    if comb is None:
        return None
    act = snap  # FusedCache.run takes the snapshot's activation chunk by chunk
    live = tuple(p for p in comb.policies if _passing(cache, act, p, items) != [])
    if not live:
        return None
    fields, queue = cache.reads(live)
    if fields is None:
        return None
    names = sorted(fields)
    project = cache.projections(live, names)
    if n > 2 * PROBE and items.keys.members(names, queue, PROBE * 3 // 4, range(PROBE),
                                            project) is None:
        return None  # the first PROBE mostly classes of their own: don't key all of them
    return items.keys.members(names, queue, n // 2, project=project)


def _fired_each(cache: FusedCache, snap: SnapshotState, runtime: Runtime,
                policies: Sequence[CompiledPolicy], items: _Items) -> list[list[Hit | Err]]:
    """fired_many of ``items``' inputs, each policy (group) per class or per item."""
    inputs = items.inputs
    done: dict[str, list[list[Hit | Err]]] = {}
    idle, comb = split_by_gates(cache, snap, policies)
    for policy in idle:  # a match condition is false for the whole snapshot
        done[policy.name] = [[] for _ in inputs]
    snap_act = snap  # FusedCache.run takes the snapshot's activation chunk by chunk
    if comb is not None:
        done.update(_by_class(cache, snap, snap_act, comb.policies, items))
    per_item: list[list[Hit | Err]] = [[] for _ in inputs]
    item_acts: list[Any] = [None] * len(inputs)
    start = heap_bytes()
    for policy in policies:
        result = done.get(policy.name)
        if result is None:
            result = run_fused(cache, policy, snap_act, items.all())
        if result is None:
            result = []
            for i, inp in enumerate(inputs):
                if item_acts[i] is None:
                    item_acts[i] = runtime.activation({
                        **snap.shared, "workload": inp.workload_data(), "queue": inp.queue_data()})
                result.append(walk_policy(policy, item_acts[i]))
                now = heap_bytes()  # each activation keeps what its evaluations allocated
                if now is not None and start is not None and now - start > RETAIN_BYTES:
                    item_acts = [None] * len(inputs)  # rebuilt when another policy needs one
                    start = heap_bytes()
        for i, hits in enumerate(result):  # lists may be shared (classes): never extended
            if hits:
                have = per_item[i]
                per_item[i] = have + hits if have else hits
    return per_item


class _Items:
    """A batch's items: every input's data only when some policy is evaluated over every
    item (``all``); a policy group evaluated per class builds one item per class from the
    inputs' workloads (``classes``)."""

    def __init__(self, cache: FusedCache, policies: Sequence[CompiledPolicy],
                 inputs: Sequence[Item]) -> None:
        self.cache, self.policies, self.inputs = cache, policies, inputs
        self._all: list[dict[str, Any]] | None = None
        self.keys = ClassKeys(inputs)

    def all(self) -> list[dict[str, Any]]:
        if self._all is None:
            self._all = batch_items(self.cache, self.policies, self.inputs)
        return self._all

    def classes(self, policy: CompiledPolicy) -> tuple[tuple[str, ...], bool] | None:
        """The reads of ``policy`` as a group key: (its workload fields, whether it reads the
        queue); None when it reads all of the workload."""
        fields, queue = self.cache.reads((policy,))
        return None if fields is None else (tuple(sorted(fields)), queue)


#: One evaluation of _by_class: the policies, the items (one per class, or every input's),
#: each input's class index (None: one item per input) and which inputs (None: all of them).
_Run = tuple[list[CompiledPolicy], list[dict[str, Any]], list[int] | None, list[int] | None]


def _by_class(cache: FusedCache, snap: SnapshotState, act: Any,
              policies: Sequence[CompiledPolicy], items: _Items
              ) -> dict[str, list[list[Hit | Err]]]:
    """Hits of the live ``policies`` for every item, evaluated once per workload class.

    A policy whose item-dependent match conditions read fewer fields than it does has them
    decided first, once per class of those fields (admission-pacing's ``requeueCount >= 3``:
    40,000 waiting workloads are a few classes, most fail it), and only the workloads that
    pass are evaluated (for the others it fires nothing). Policies that read the same
    workload fields (and the queue or not) form a group; a group whose items fall into at
    most half as many classes is evaluated over one item per class (thermal-admission reads
    four workload fields: 40,000 pending workloads are a few hundred classes), the others
    together over every item. A group whose evaluation raises is left out (the caller
    evaluates those policies on their own)."""
    groups: dict[tuple[tuple[str, ...], bool] | None, list[CompiledPolicy]] = {}
    runs: list[_Run] = []
    n = len(items.inputs)
    done: dict[str, list[list[Hit | Err]]] = {}
    for p in policies:
        passing = _passing(cache, act, p, items)
        if passing is None:
            groups.setdefault(items.classes(p), []).append(p)
        elif not passing:
            done[p.name] = [[] for _ in range(n)]
        else:
            runs.append(_subset_run(cache, p, items, passing))
    dense: list[CompiledPolicy] = []
    for reads, members in groups.items():
        found = None if reads is None else items.keys.classes(
            reads[0], reads[1], n // 2, project=cache.projections(members, reads[0]))
        if found is not None:
            runs.append((members, *found, None))
            continue
        for p in members:
            split = _split(cache, snap, act, p, items)
            if split is None:
                dense.append(p)
            else:
                done[p.name] = split
    if dense:
        runs.append((dense, items.all(), None, None))
    for members, rows_in, of, where in runs:
        comb = cache.combined(members, {p.name: snap.hoist(cache, p) for p in members})
        if comb is None:
            continue
        try:
            rows = cache.run(comb.program, act, rows_in)
            for k, p in enumerate(comb.policies):
                hits = [decode(p, row[k]) for row in rows]
                each = hits if of is None else [hits[i] for i in of]
                if where is not None:  # the others' match conditions do not hold
                    full: list[list[Hit | Err]] = [[] for _ in range(n)]
                    for i, h in zip(where, each, strict=True):
                        full[i] = h
                    each = full
                done[p.name] = each
        except _ERRORS:
            continue
    return done


def _split(cache: FusedCache, snap: SnapshotState, act: Any, policy: CompiledPolicy,
           items: _Items) -> list[list[Hit | Err]] | None:
    """Hits of ``policy`` for every item, its rules evaluated apart by what they read
    (FusedCache.parts): a part whose fields put the items into at most nine tenths as many
    classes once per class, the others together over every item (a class costs its key and a
    share of one CEL row; an item evaluated on its own, its item data, a CEL row and its
    decoding: at 400 racks the checkpoint rules' 12,000 running workloads are ~7,500 classes,
    and the stage was a fifth cheaper per class). checkpoint-preemption: many running
    workloads have their own checkpoint age, but its tier rules read ``flexTier`` (four classes)
    and its priority rule ``priority``: only the two checkpoint rules run per workload. None
    when the policy has one part, no part has few classes, or a part does not compile or
    raises (then it is evaluated as a whole, which reports the error where it belongs)."""
    parts = cache.parts(policy)
    if len(parts) < 2:
        return None
    n = len(items.inputs)
    runs: list[tuple[tuple[int, ...], Keyed | list[dict[str, Any]], Sequence[int] | None]] = []
    rest: list[int] = []
    fields: set[str] | None = set()
    queue = False
    for reads, reads_q, idx in parts:
        found = None if reads is None else items.keys.keyed(reads, reads_q, n * 9 // 10)
        if found is not None:
            runs.append((idx, found, found.of))
            continue
        rest += idx
        fields = None if reads is None or fields is None else fields | set(reads)
        queue = queue or reads_q
    if not runs:
        return None
    if rest:
        runs.append((tuple(rest), items_of(items.inputs, fields, queue), None))
    runs.sort(key=lambda r: min(r[0]))
    ordered = all(max(a[0]) < min(b[0]) for a, b in itertools.pairwise(runs))
    hoisted = snap.hoist(cache, policy)
    per_run: list[list[list[Hit | Err]]] = []  # each run's hits, per class (or per item)
    columns: list[Sequence[int]] = []  # each run's class of every item
    try:
        for idx, rows_in, of in runs:
            prog = cache.subset(policy, frozenset(idx), hoisted)
            if prog is None:
                return None
            if isinstance(rows_in, Keyed):
                hits = _class_hits(cache, snap, act, policy, (idx, hoisted, prog), rows_in,
                                   items)
            else:
                hits = [decode(policy, row[0]) for row in cache.run(prog, act, rows_in)]
            per_run.append(hits)
            columns.append(_same_hits(hits, range(n) if of is None else of))
    except _ERRORS:
        return None
    pos = None if ordered else {id(r): k for k, r in enumerate(policy.rules)}
    # an item's hits are those of its class in each run: merged once per combination of
    # classes (60,000 running workloads at 1,400 racks are far fewer), one shared list each
    merged: dict[tuple[int, ...], list[Hit | Err]] = {}
    out: list[list[Hit | Err]] = []
    for combo in zip(*columns, strict=True):
        got = merged.get(combo)
        if got is None:
            got = [h for hits, c in zip(per_run, combo, strict=True) for h in hits[c]]
            if pos is not None and len(got) > 1:  # the rules' order, as one evaluation gives
                got.sort(key=lambda x: pos[id(x.rule)])
            merged[combo] = got
        out.append(got)
    return out


def _class_hits(cache: FusedCache, snap: SnapshotState, act: Any, policy: CompiledPolicy,
                part: tuple[tuple[int, ...], tuple[str, ...], Any], keyed: Keyed,
                items: _Items) -> list[list[Hit | Err]]:
    """The hits of a part of ``policy`` (``part``: its rule indices, hoisted variables and
    program) for each class of ``keyed``. A part that reads nothing of the snapshot but its
    hoisted values takes what an earlier batch found for a class of the same key with the
    same hoisted values (m2g.policy.batch.memo): only the classes not seen in its last two
    evaluations are evaluated."""
    idx, hoisted, prog = part
    memo = cache.memos.memo(policy, (policy.name, idx, hoisted),
                            snap.hoisted.get(policy.name, ((), []))[1], snap.shared)
    if memo is None:
        return _run_classes(cache, act, policy, prog, keyed, items, range(len(keyed.firsts)))
    got = [memo.get(k) for k in keyed.keys]
    missing = [c for c, hits in enumerate(got) if hits is None]
    if missing:
        found = _run_classes(cache, act, policy, prog, keyed, items, missing)
        for c, hits in zip(missing, found, strict=True):
            got[c] = memo.put(keyed.keys[c], hits)
    return [hits for hits in got if hits is not None]


def _run_classes(cache: FusedCache, act: Any, policy: CompiledPolicy, prog: Any, keyed: Keyed,
                 items: _Items, classes: Sequence[int]) -> list[list[Hit | Err]]:
    """The hits of ``prog`` (a part of ``policy``) for ``keyed``'s ``classes``, each
    evaluated on its first input."""
    rows = items.keys.reps(keyed.fields, keyed.queue, [keyed.firsts[c] for c in classes])
    return [decode(policy, row[0]) for row in cache.run(prog, act, rows)]


def _same_hits(hits: list[list[Hit | Err]], of: Sequence[int]) -> Sequence[int]:
    """Each item's class in ``of`` renamed to the first class whose hits are the same objects
    (Hits of equal cells are shared: m2g.policy.batch.decoding): the checkpoint classes whose
    rules fire nothing are one, so the merge of a split policy's runs is worked out once per
    combination of distinct hit lists, and equal merged lists are one shared list (combined
    once by the Evaluator, found by its id)."""
    first: dict[tuple[int, ...], int] = {}
    rename = [first.setdefault(tuple(map(id, h)), c) for c, h in enumerate(hits)]
    if len(first) == len(hits):
        return of
    return list(map(rename.__getitem__, of))


def _passing(cache: FusedCache, act: Any, policy: CompiledPolicy, items: _Items
             ) -> list[int] | None:
    """The inputs whose item-dependent match conditions hold for ``policy``, decided once per
    class of the fields they read; None when that does not apply (see FusedCache.matcher),
    there are many classes, more than half the inputs pass (then its group's classes serve
    better), or the conditions raise (then the policy is evaluated as usual, which reports
    the error where it belongs)."""
    matcher = cache.matcher(policy)
    if matcher is None:
        return None
    prog, fields, queue = matcher
    found = items.keys.classes(fields, queue, len(items.inputs) // 2)
    if found is None:
        return None
    reps, of = found
    try:
        held = [v is True for v in cache.run(prog, act, reps)]
    except _ERRORS:
        return None
    passing = [i for i, c in enumerate(of) if held[c]]
    return passing if len(passing) <= len(of) // 2 else None  # else: as usual, in its group


def _subset_run(cache: FusedCache, policy: CompiledPolicy, items: _Items,
                passing: list[int]) -> _Run:
    """The evaluation of ``policy`` over the ``passing`` inputs only: per class of what it
    reads when they fall into few, else one item each."""
    reads = items.classes(policy)
    found = None if reads is None else items.keys.classes(reads[0], reads[1],
                                                           len(passing) // 2, passing)
    if found is None:
        inputs = [items.inputs[i] for i in passing]
        return [policy], batch_items(cache, [policy], inputs), None, passing
    return [policy], found[0], found[1], passing


def run_fused(cache: FusedCache, policy: CompiledPolicy, act: Any,
               items: list[Any]) -> list[list[Hit | Err]] | None:
    """Every item's hits from fused evaluation; None when it must be redone per item."""
    fused = cache.get(policy)
    if fused is None:
        return None
    try:
        if fused.whole is not None:
            return [decode(policy, row[0]) for row in cache.run(fused.whole, act, items)]
        columns = [cache.run(prog, act, items) for prog in fused.per_rule]
        rows = [[col[i] for col in columns] for i in range(len(columns[0]))]
        return [decode(policy, [] if all(not c for c in row) else row) for row in rows]
    except _ERRORS:
        return None
