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
from m2g.policy.batch.cel_source import combined_source, fused_source, workload_fields
from m2g.policy.batch.decoding import batch_items, decode, workload_data
from m2g.policy.compiler import CompiledPolicy
from m2g.policy.fired import Err, Hit, walk_policy
from m2g.policy.runtime import CelEvalError, Runtime

__all__ = ["MAX_CHUNK", "Combined", "Fused", "FusedCache", "SnapshotCache", "SnapshotState",
           "batch_items", "combined_source", "fired_many", "fused_source", "run_fused",
           "snapshot_key", "split_by_gates", "workload_data", "workload_fields"]

_ERRORS = (CelEvalError, TypeError, ValueError, IndexError)


def fired_many(policies: Sequence[CompiledPolicy], runtime: Runtime, cache: FusedCache,
               inputs: Sequence[PolicyInput], key: tuple[Any, ...] | None = None,
               ) -> list[list[Hit | Err]]:
    """For each input (all sharing one snapshot, whose batch key is ``key`` when given), the
    hits and errors of every policy."""
    snap = cache.snapshots.get(inputs[0], key)
    items = batch_items(cache, policies, inputs)
    done: dict[str, list[list[Hit | Err]]] = {}
    idle, comb = split_by_gates(cache, snap, policies)
    for policy in idle:  # a match condition is false for the whole snapshot
        done[policy.name] = [[] for _ in inputs]
    snap_act = snap.activation(runtime)
    if comb is not None:
        try:
            rows = cache.run(comb.program, snap_act, items)
            decoded = [[decode(p, row[k]) for row in rows] for k, p in enumerate(comb.policies)]
            done.update({p.name: d for p, d in zip(comb.policies, decoded, strict=True)})
        except _ERRORS:
            pass
    per_item: list[list[Hit | Err]] = [[] for _ in inputs]
    item_acts: list[Any] = [None] * len(inputs)
    for policy in policies:
        result = done.get(policy.name)
        if result is None:
            result = run_fused(cache, policy, snap_act, items)
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
