"""Decisions kept across reconciles: what a class of workloads fired in a policy part the last
time it was evaluated, reused when the next batch has a workload of that class again.

A part of a policy (``FusedCache.parts``: the rules that read the same workload fields) that
reads nothing of the snapshot but its own hoisted variables (``SnapshotState.hoist``: values
worked out once per snapshot) is a pure function of those values and of the workload fields it
reads. Its result for a class (one value of those fields: ``ClassKeys``) is then the same in
the next reconcile if the hoisted values are equal, however else the snapshot changed. The
checkpoint rules of checkpoint-preemption are such a part: 60,000 running workloads at 1,400
racks are ~12,800 classes of (interval, age, reported), and ten seconds later ~94 % of the
classes are ones seen before (ages advance, but other workloads had those ages a reconcile
ago), so their CEL rows, item data and decoding are not worked out again.

The memo is bounded: each part keeps what it found in its last two evaluations (``Recent``),
and forgets everything when its hoisted values change.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

from m2g.policy.batch.cel_source import subset_source
from m2g.policy.compiler import CompiledPolicy
from m2g.policy.inline import mentions

V = TypeVar("V")

_SCALARS = frozenset({str, int, float, bool, type(None)})


def frozen(value: Any) -> Any:
    """A hashable stand-in for plain data that tells CEL types apart (1, 1.0 and True are
    different values to CEL, equal to Python)."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, value)
    if kind is dict:
        return (dict, tuple(sorted((k, frozen(v)) for k, v in value.items())))
    if kind is list or kind is tuple:
        return (list, tuple(frozen(v) for v in value))
    return (kind, value)


class Recent(Generic[V]):
    """A memo that keeps what was used in the current and the previous generation: ``turn``
    starts a generation (once per evaluation of what it memoises); an entry not used in one
    whole generation is dropped at the next turn, so it holds at most two evaluations' keys."""

    def __init__(self) -> None:
        self._now: dict[Hashable, V] = {}
        self._before: dict[Hashable, V] = {}

    def turn(self) -> None:
        """Start a generation: what the last one used stays findable for this one."""
        self._before, self._now = self._now, {}

    def get(self, key: Hashable) -> V | None:
        """The value kept for ``key`` (kept on into this generation), or None."""
        got = self._now.get(key)
        if got is None:
            got = self._before.get(key)
            if got is not None:
                self._now[key] = got
        return got

    def put(self, key: Hashable, value: V) -> V:
        """Keep ``value`` for ``key`` in this generation; returns it."""
        self._now[key] = value
        return value

    def __len__(self) -> int:
        return len(self._now.keys() | self._before.keys())


#: A part of a policy: (its name, the indices of its rules, its hoisted variables' names).
PartKey = tuple[str, tuple[int, ...], tuple[str, ...]]


class PartMemos:
    """The memo of each pure policy part (see the module's docstring), by part and the values
    of its policy's hoisted variables. Safe to share between threads: a memo found for some
    values only ever holds results for those values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pure: dict[tuple[PartKey, frozenset[str]], bool] = {}
        self._memos: dict[PartKey, tuple[Any, Recent[Any]]] = {}

    def pure(self, policy: CompiledPolicy, part: PartKey, snapshot_names: frozenset[str]
             ) -> bool:
        """Does the part's batch expression read none of the snapshot's variables
        (``snapshot_names``: every name of the activation but the items and the hoisted
        values), so that its result depends only on its items and its hoisted values?"""
        key = (part, snapshot_names)
        got = self._pure.get(key)
        if got is None:
            source = subset_source(policy, frozenset(part[1]), part[2])
            got = self._pure[key] = not mentions(source, tuple(sorted(snapshot_names)))
        return got

    def memo(self, policy: CompiledPolicy, part: PartKey, hoisted: list[Any],
             snapshot: Mapping[str, Any]) -> Recent[Any] | None:
        """The memo of the part for these hoisted values (a new one when they changed), its
        generation turned; None when the part reads the snapshot or the values are not plain
        data."""
        if not self.pure(policy, part, frozenset(snapshot)):
            return None
        try:
            values = frozen(hoisted)
            hash(values)
        except TypeError:
            return None
        with self._lock:
            had = self._memos.get(part)
            if had is None or had[0] != values:
                had = self._memos[part] = (values, Recent())
        had[1].turn()
        return had[1]

    def __len__(self) -> int:
        """The class results kept, over every part."""
        with self._lock:
            memos = [m for _, m in self._memos.values()]
        return sum(map(len, memos))

    def clear(self) -> None:
        """Forget every part's results (the compiled programs and purity checks stay)."""
        with self._lock:
            self._memos.clear()
