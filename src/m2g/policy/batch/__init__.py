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

Fallbacks, each to a slower form with the same answers: the combined expression fails to compile
(cel-expr-python's parser stops at 32 levels) or raises for some item → one expression per
policy → one per rule → m2g.policy.fired.walk_policy per input, which reports each error where
it belongs.

The package: ``cel_source`` writes the expressions, ``caches`` keeps programs and snapshot
activations, ``decoding`` turns items into CEL data and results back into Hits; this module
runs a batch (``fired_many``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from m2g.model.inputs import PolicyInput
from m2g.policy.batch.caches import (
    MAX_CHUNK,
    Combined,
    Fused,
    FusedCache,
    SnapshotCache,
    SnapshotState,
    snapshot_key,
    split_by_gates,
)
from m2g.policy.batch.cel_source import (
    combined_source,
    fused_source,
    workload_fields,
)
from m2g.policy.batch.decoding import (
    batch_items,
    decode,
    item_classes,
    view_classes,
    workload_data,
)
from m2g.policy.compiler import CompiledPolicy
from m2g.policy.fired import Err, Hit, walk_policy
from m2g.policy.runtime import CelEvalError, Runtime

__all__ = [
    "MAX_CHUNK",
    "Combined",
    "Fused",
    "FusedCache",
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
               inputs: Sequence[PolicyInput], key: tuple[Any, ...] | None = None,
               ) -> list[list[Hit | Err]]:
    """For each input (all sharing one snapshot, whose batch key is ``key`` when given), the
    hits and errors of every policy."""
    snap = cache.snapshots.get(inputs[0], key)
    items = _Items(cache, policies, inputs)
    done: dict[str, list[list[Hit | Err]]] = {}
    idle, comb = split_by_gates(cache, snap, policies)
    for policy in idle:  # a match condition is false for the whole snapshot
        done[policy.name] = [[] for _ in inputs]
    snap_act = snap.activation(runtime)
    if comb is not None:
        done.update(_by_class(cache, snap, snap_act, comb.policies, items))
    per_item: list[list[Hit | Err]] = [[] for _ in inputs]
    item_acts: list[Any] = [None] * len(inputs)
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
        for i, hits in enumerate(result):
            per_item[i] += hits
    return per_item


class _Items:
    """A batch's items: every input's data only when some policy is evaluated over every
    item (``all``); a policy group evaluated per class builds one item per class from the
    inputs' workloads (``classes``)."""

    def __init__(self, cache: FusedCache, policies: Sequence[CompiledPolicy],
                 inputs: Sequence[PolicyInput]) -> None:
        self.cache, self.policies, self.inputs = cache, policies, inputs
        self._all: list[dict[str, Any]] | None = None

    def all(self) -> list[dict[str, Any]]:
        if self._all is None:
            self._all = batch_items(self.cache, self.policies, self.inputs)
        return self._all

    def classes(self, policy: CompiledPolicy) -> tuple[tuple[str, ...], bool] | None:
        """The reads of ``policy`` as a group key: (its workload fields, whether it reads the
        queue); None when it reads all of the workload."""
        fields, queue = self.cache.reads((policy,))
        return None if fields is None else (tuple(sorted(fields)), queue)


def _by_class(cache: FusedCache, snap: SnapshotState, act: Any,
              policies: Sequence[CompiledPolicy], items: _Items
              ) -> dict[str, list[list[Hit | Err]]]:
    """Hits of the live ``policies`` for every item, evaluated once per workload class.

    Policies that read the same workload fields (and the queue or not) form a group; a group
    whose items fall into at most half as many classes is evaluated over one item per class
    (thermal-admission reads four workload fields: 40,000 pending workloads are a few hundred
    classes), the others together over every item. A group whose evaluation raises is left
    out (the caller evaluates those policies on their own)."""
    groups: dict[tuple[tuple[str, ...], bool] | None, list[CompiledPolicy]] = {}
    for p in policies:
        groups.setdefault(items.classes(p), []).append(p)
    dense: list[CompiledPolicy] = []
    runs: list[tuple[list[CompiledPolicy], list[dict[str, Any]], list[int] | None]] = []
    n = len(items.inputs)
    for reads, members in groups.items():
        found = None if reads is None else view_classes(items.inputs, reads[0], reads[1],
                                                         n // 2)
        if found is None:
            dense += members
        else:
            runs.append((members, *found))
    if dense:
        runs.append((dense, items.all(), None))
    done: dict[str, list[list[Hit | Err]]] = {}
    for members, rows_in, of in runs:
        comb = cache.combined(members, {p.name: snap.hoist(cache, p) for p in members})
        if comb is None:
            continue
        try:
            rows = cache.run(comb.program, act, rows_in)
            for k, p in enumerate(comb.policies):
                hits = [decode(p, row[k]) for row in rows]
                done[p.name] = hits if of is None else [hits[i] for i in of]
        except _ERRORS:
            continue
    return done


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
