"""Decoding for batch evaluation: a fused result row back into Hits, and a workload into the
plain data of one batch item (only the fields the policies read)."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel

from m2g.model.inputs import CelModel, QueueView, WorkloadItem, WorkloadView
from m2g.policy.batch.caches import FusedCache
from m2g.policy.batch.cel_source import FIELD_ALIAS
from m2g.policy.batch.memo import frozen as _frozen
from m2g.policy.compiler import CompiledPolicy, CompiledRule
from m2g.policy.fired import Err, Hit, payload, slots


class Item(Protocol):
    """What a batch reads of each of its inputs: a PolicyInput, or a WorkloadItem over the
    batch's base input."""

    @property
    def workload(self) -> WorkloadView: ...

    @property
    def queue(self) -> QueueView: ...

    def workload_data(self) -> dict[str, Any]: ...

    def queue_data(self) -> dict[str, Any]: ...


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


def decode(policy: CompiledPolicy, row: Any) -> list[Hit | Err]:
    """One item's fused result → its hits; raises CelEvalError on a malformed payload."""
    if not row:
        return []
    return [_hit(policy, rule, cell) for rule, cell in zip(policy.rules, row, strict=True)
            if cell]


def _plain(value: Any) -> Any:
    """``value`` as ``model_dump(mode="json")`` renders it."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, CelModel):
        return _plain_model(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    raise TypeError(type(value).__name__)


_FIELDS: dict[type, tuple[tuple[str, str, type | None], ...]] = {}
_EXACT: tuple[type, ...] = (bool, int, float, str)


def _plain_model(model: CelModel) -> dict[str, Any]:
    """A CelModel's ``model_dump(mode="json", by_alias=True)`` field by field (a nested model
    such as every running workload's ``checkpoint``: pydantic's serializer costs several
    times as much). Raises TypeError for a value _plain does not know, a scalar field holding
    another type (pydantic would convert it: an int in a float field is written 1.0, which
    CEL tells from 1) or a float that is not finite: the caller then asks pydantic."""
    fields = _FIELDS.get(type(model))
    if fields is None:
        fields = _FIELDS[type(model)] = tuple(
            (name, info.alias or name,
             _EXACT[_EXACT.index(info.annotation)] if info.annotation in _EXACT else None)
            for name, info in type(model).model_fields.items())
    out: dict[str, Any] = {}
    for name, alias, kind in fields:
        v = getattr(model, name)
        if kind is None:
            out[alias] = _plain(v)
            continue
        if type(v) is not kind or (type(v) is float and not math.isfinite(v)):
            raise TypeError(kind.__name__)
        out[alias] = v
    return out


def workload_data(workload: WorkloadView, fields: set[str] | None) -> dict[str, Any]:
    """The workload's plain data, only ``fields`` (Python names; None: all), as
    ``model_dump(mode="json", by_alias=True, include=fields)`` gives it, several times faster."""
    if fields is None:
        return workload.model_dump(mode="json", by_alias=True)
    try:
        return {FIELD_ALIAS[f]: _plain(getattr(workload, f)) for f in fields}
    except TypeError:
        return workload.model_dump(mode="json", by_alias=True, include=fields)


def item_data(inp: Item, fields: set[str] | None) -> dict[str, Any]:
    """``workload_data`` of ``inp``'s workload, read off a WorkloadItem's stored view and
    what differs from it (``WorkloadItem.field``) without making the view, when it can."""
    if fields is not None and type(inp) is WorkloadItem and inp.updates is not None:
        try:
            return {FIELD_ALIAS[f]: _plain(inp.field(f)) for f in fields}
        except TypeError:
            pass
    return workload_data(inp.workload, fields)


def batch_items(cache: FusedCache, policies: Sequence[CompiledPolicy],
                inputs: Sequence[Item]) -> list[dict[str, Any]]:
    """What ``m2g__items()`` returns: each workload's data (only the fields the policies read),
    with its queue's at ``m2g__q`` when they read ``queue``."""
    fields, queue = cache.reads(policies)
    return items_of(inputs, fields, queue)


def items_of(inputs: Sequence[Item], fields: set[str] | None, queue: bool
             ) -> list[dict[str, Any]]:
    """Each input's workload ``fields`` (None: all), with its queue at ``m2g__q`` when
    ``queue``."""
    items = [item_data(inp, fields) for inp in inputs]
    if queue:
        for item, inp in zip(items, inputs, strict=True):
            item["m2g__q"] = inp.queue_data()
    return items


#: item_classes gives up after this many items when more than three quarters of them were
#: classes of their own: the shedding stage's 60,000 running workloads each have their own
#: checkpoint age, and keying all of them before giving up took ~1.5 s at 1,400 racks.
PROBE = 1024
_SCALARS = frozenset({str, int, float, bool, type(None)})


def item_classes(items: Sequence[dict[str, Any]], keys: Sequence[str] | None,
                 most: int | None = None) -> tuple[list[dict[str, Any]], list[int]] | None:
    """(one item per class, each item's class index): items are of one class when they agree
    on ``keys`` (all their keys when None), which is all the policies that read them can see,
    so a class is evaluated once for all its workloads. The class items carry only ``keys``.
    None when there are more than ``most`` classes, or (``most`` given, many items) when the
    first PROBE items were mostly classes of their own: the caller then evaluates every item."""
    index: dict[Any, int] = {}
    reps: list[dict[str, Any]] = []
    of: list[int] = []
    probe = PROBE if most is not None and len(items) > 2 * PROBE else -1
    for n_seen, item in enumerate(items):
        if n_seen == probe and len(reps) > probe * 3 // 4:
            return None  # nearly every item its own class (e.g. checkpoint ages): don't look on
        names = keys if keys is not None else sorted(item)
        k = tuple([_frozen(item.get(n)) for n in names])
        i = index.get(k)
        if i is None:
            if most is not None and len(reps) >= most:
                return None
            i = index[k] = len(reps)
            reps.append({n: item[n] for n in names if n in item})
        of.append(i)
    return reps, of


def view_classes(inputs: Sequence[Item], fields: Sequence[str], queue: bool,
                 most: int | None = None) -> tuple[list[dict[str, Any]], list[int]] | None:
    """``item_classes`` of the inputs' items restricted to the workload ``fields`` (Python
    names) and the queue when ``queue``, read from the workload views (ClassKeys)."""
    return ClassKeys(inputs).classes(fields, queue, most)


_FLAT: dict[type, Any] = {}


def _flat(model: Any) -> Any:
    """For a CelModel whose fields are all scalars (``checkpoint``), a getter of its field
    values in order; None for any other value."""
    kind = type(model)
    got = _FLAT.get(kind)
    if got is None and kind not in _FLAT:
        got = None
        if isinstance(model, CelModel):
            fields = type(model).model_fields
            if all(info.annotation in _EXACT for info in fields.values()):
                got = operator.attrgetter(*fields) if len(fields) > 1 else None
        _FLAT[kind] = got
    return got


def _key(v: Any) -> Any:
    """A workload value's class key: a scalar's is its type and value, a flat CelModel's its
    type, field values and their types (as finely as its plain data tells them apart, or
    more), anything else's that of its plain data (raises TypeError for a value _plain does
    not know)."""
    if type(v) in _SCALARS:
        return (type(v), v)
    if isinstance(v, Enum):  # as its plain data: its value
        return (type(v.value), v.value)
    get = _flat(v)
    if get is not None:
        values = get(v)
        return (type(v), values, tuple(map(type, values)))
    return _frozen(_plain(v))


def cheap_key(v: Any) -> bool:
    """Is ``v``'s class key cheap to work out (a scalar or a flat CelModel)?"""
    return type(v) in _SCALARS or isinstance(v, Enum) or _flat(v) is not None


def _numbered(keys: Sequence[Any], most: int | None = None
              ) -> tuple[list[int], list[int]] | None:
    """(the position of each distinct key's first occurrence, in first-seen order; each key's
    number in that order); None when there are more than ``most``. Two hashes of each key,
    both in C (``dict.fromkeys`` keeps the first-seen order, ``map`` numbers them): a loop
    in Python over 60,000 running workloads' keys cost more than the hashes (2026-12-03)."""
    index: dict[Any, int] = dict.fromkeys(keys, 0)
    if most is not None and len(index) > most:
        return None
    for number, k in enumerate(index):  # once per class
        index[k] = number
    of = list(map(index.__getitem__, keys))
    n = len(of)
    first = dict(zip(reversed(of), range(n - 1, -1, -1), strict=True))  # earliest wins
    return [first[c] for c in range(len(index))], of


_OWN = frozenset({int, str})


def _keys_of(values: list[Any]) -> list[Any]:
    """The class keys of one column's values: an int's or str's key is itself (no other
    type's key equals it), another scalar's its type and value, anything else's ``_key``.
    A column of ints and strs only, or of other scalars only, is keyed in C."""
    types = set(map(type, values))
    if types <= _OWN:
        return values
    if types <= _SCALARS and not types & _OWN:
        return list(zip(map(type, values), values, strict=True))
    flat = _flat_keys(values, types)
    if flat is not None:
        return flat
    return [v if (t := type(v)) is int or t is str else (t, v) if t in _SCALARS else _key(v)
            for v in values]


def _flat_keys(values: list[Any], types: set[type]) -> list[Any] | None:
    """``_key`` of each value of a column of one flat CelModel type whose fields each hold
    one type throughout (``checkpoint`` of 60,000 running workloads), worked out in C: the
    same (type, field values, their types) tuples; None for any other column."""
    get = _flat(values[0]) if len(types) == 1 else None
    if get is None:
        return None
    rows = list(map(get, values))
    kinds = []
    for j in range(len(rows[0])):
        seen = set(map(type, map(operator.itemgetter(j), rows)))
        if len(seen) != 1:
            return None
        kinds.append(seen.pop())
    kind, of_fields = type(values[0]), tuple(kinds)
    return list(zip(itertools.repeat(kind), rows, itertools.repeat(of_fields), strict=False))


@dataclass(frozen=True)
class Keyed:
    """A batch's inputs by class of some workload ``fields`` (and the queue when ``queue``):
    each class's first input (``firsts``), each input's class (``of``) and each class's key
    (``keys``: equal for equal values in any batch; ClassKeys)."""

    fields: tuple[str, ...]
    queue: bool
    firsts: list[int]
    of: list[int]
    keys: list[Any]


class ClassKeys:
    """The class keys of a batch's inputs, one column per workload field, each worked out once
    and shared by every policy group that reads the field (one pass per field, not one per
    group), and only as far as needed: a group gives up after PROBE mostly distinct items
    (every running workload's checkpoint age is its own), so a column is extended lazily."""

    def __init__(self, inputs: Sequence[Item]) -> None:
        self.inputs = inputs
        self._cols: dict[str, list[Any]] = {}
        self._bad: set[str] = set()
        self._queues: dict[int, Any] = {}
        self._proj: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._all_views: list[Any] = []
        self._all_moved: list[dict[str, Any] | None] = []  # WorkloadItem.updates, per input
        self._moved: set[str] = set()  # the fields some input's ``updates`` set

    def _name(self, field: str, project: Mapping[str, tuple[str, ...]] | None) -> str:
        """The column of ``field``: the field itself, or for a map field in ``project``
        its values at the projected keys (a column of its own)."""
        keys = None if project is None else project.get(field)
        if keys is None:
            return field
        name = field + "[" + "\0".join(keys) + "]"
        self._proj[name] = (field, keys)
        return name

    def _column(self, name: str, upto: int, read: list[Any] | None = None
                ) -> list[Any] | None:
        """The keys of column ``name`` up to ``upto``; ``read``: its field's values on the
        stored views from where the column ends to ``upto``, read already (``_read``)."""
        col = self._cols.setdefault(name, [])
        if name in self._bad:
            return None
        if len(col) < upto:
            try:
                if name == "m2g__q":
                    col += [self._queue(inp) for inp in self.inputs[len(col):upto]]
                elif name in self._proj:  # str values or None (absent): their own keys
                    field, keys = self._proj[name]
                    col += [tuple(map(v.get, keys)) for v in self._values(field, len(col), upto)]
                else:
                    col += _keys_of(self._values(name, len(col), upto, read))
            except TypeError:  # a value _plain does not know: every item on its own
                self._bad.add(name)
                return None
        return col

    def _read(self, names: list[str], upto: int) -> dict[str, list[Any]]:
        """The stored views' values of the plain fields among ``names`` whose columns end
        at the same place short of ``upto``, read in one pass over the views for all of them
        (``_column``'s ``read``): a view's fields are read while it is in the cache, not once
        per column — 40,000 waiting workloads' views at 1,400 racks, read apart for each of
        seven admission fields, were each fetched from memory seven times."""
        by_start: dict[int, list[str]] = {}
        for name in names:
            if name != "m2g__q" and name not in self._proj and name not in self._bad:
                have = len(self._cols.get(name, ()))
                if have < upto and name not in by_start.get(have, ()):
                    by_start.setdefault(have, []).append(name)
        out: dict[str, list[Any]] = {}
        for start, fields in by_start.items():
            if len(fields) > 1:  # (one field: ``_values`` reads it as before)
                rows = list(map(operator.attrgetter(*fields), self._views(start, upto)))
                out.update(zip(fields, map(list, zip(*rows, strict=True)), strict=True))
        return out

    def _values(self, field: str, start: int, stop: int, read: list[Any] | None = None
                ) -> list[Any]:
        """The inputs' workloads' ``field`` from ``start`` to ``stop``: read off their stored
        views (in C; ``read``: read already), those a WorkloadItem's ``updates`` set taken
        from there."""
        values = list(map(operator.attrgetter(field), self._views(start, stop))) \
            if read is None else read
        if field in self._moved:
            moved = self._all_moved[start:stop]
            values = [v if m is None or field not in m else m[field]
                      for v, m in zip(values, moved, strict=True)]
        return values

    def _views(self, start: int, stop: int) -> list[Any]:
        """The inputs' workload views from ``start`` to ``stop``, gathered once per batch: a
        WorkloadItem's stored view (``_values`` applies its ``updates``), not a copy."""
        if len(self._all_views) < stop:
            rest = self.inputs[len(self._all_views):]
            if all(type(inp) is WorkloadItem for inp in rest):
                items: Sequence[WorkloadItem] = rest  # type: ignore[assignment]
                moved = [inp.updates for inp in items]
                self._all_views += [inp.stored for inp in items]
                self._moved.update(*filter(None, moved))
            else:
                moved = [None] * len(rest)
                self._all_views += [inp.workload for inp in rest]
            self._all_moved += moved
        return self._all_views[start:stop]

    def _cheap(self, name: str) -> bool:
        """Are the keys of this column cheap to work out for every input (then no probe:
        integer seconds such as a checkpoint age fall into far fewer classes than workloads
        on a large site, which a probe of the first PROBE cannot tell)?"""
        return name == "m2g__q" or name in self._proj or not self.inputs or cheap_key(
            getattr(self.inputs[0].workload, name, None))

    def _queue(self, inp: Item) -> Any:
        qk = self._queues.get(id(inp.queue))
        if qk is None:
            qk = self._queues[id(inp.queue)] = _frozen(inp.queue_data())
        return qk

    def classes(self, fields: Sequence[str], queue: bool, most: int | None = None,
                where: Sequence[int] | None = None,
                project: Mapping[str, tuple[str, ...]] | None = None
                ) -> tuple[list[dict[str, Any]], list[int]] | None:
        """(one item per class, each input's class index) for the inputs (those at ``where``
        when given) by their ``fields`` and queue (when ``queue``); None when there are more
        than ``most`` classes, or (``most`` given, many inputs) when the first PROBE were
        mostly classes of their own. ``project``: map fields of which only these keys are
        read (cel_source.map_keys): their class key is those keys' values; a class's item
        holds its first input's whole map."""
        found = self.members(fields, queue, most, where, project)
        if found is None:
            return None
        firsts, of = found
        return self.reps(fields, queue, firsts if where is None else [where[p] for p in firsts]
                         ), of

    def reps(self, fields: Sequence[str], queue: bool, positions: Sequence[int]
             ) -> list[dict[str, Any]]:
        """The batch items of the inputs at ``positions``: their workload ``fields``, and
        their queue at ``m2g__q`` when ``queue``."""
        wanted = set(fields)
        out = []
        for pos in positions:
            inp = self.inputs[pos]
            item = item_data(inp, wanted)
            if queue:
                item["m2g__q"] = inp.queue_data()
            out.append(item)
        return out

    def keyed(self, fields: Sequence[str], queue: bool, most: int | None = None
              ) -> Keyed | None:
        """``members`` of every input (no projection) with each class's key: the same key
        for the same values of ``fields`` (and queue) in any batch, which tells a class of
        this batch from one of an earlier reconcile's (m2g.policy.batch.memo)."""
        found = self._members(fields, queue, most, None, None)
        if found is None:
            return None
        firsts, of, keys = found
        return Keyed(tuple(fields), queue, firsts, of, [keys[p] for p in firsts])

    def members(self, fields: Sequence[str], queue: bool, most: int | None = None,
                where: Sequence[int] | None = None,
                project: Mapping[str, tuple[str, ...]] | None = None
                ) -> tuple[list[int], list[int]] | None:
        """``classes`` as (the position of each class's first input among the inputs, or
        among ``where`` when given; each input's class index)."""
        found = self._members(fields, queue, most, where, project)
        return None if found is None else (found[0], found[1])

    def _members(self, fields: Sequence[str], queue: bool, most: int | None,
                 where: Sequence[int] | None, project: Mapping[str, tuple[str, ...]] | None
                 ) -> tuple[list[int], list[int], list[Any]] | None:
        """``members`` and the key of every input (among ``where``)."""
        names = [self._name(f, project) for f in fields]
        if queue:
            names.append("m2g__q")
        n = len(self.inputs) if where is None else len(where)
        if most is not None and n > 2 * PROBE and not all(map(self._cheap, names)):
            keys = self._keys(names, PROBE, None if where is None else where[:PROBE])
            if keys is None or len(set(keys)) > PROBE * 3 // 4:
                return None
        keys = self._keys(names, len(self.inputs), where)
        if keys is None:
            return None
        found = _numbered(keys, most)
        return None if found is None else (found[0], found[1], keys)

    def _keys(self, names: list[str], upto: int, where: Sequence[int] | None
              ) -> list[Any] | None:
        """The keys of the first ``upto`` inputs, or of those at ``where``."""
        if where is not None:
            upto = where[-1] + 1 if where else 0
        read = self._read(names, upto)
        got = [self._column(name, upto, read.get(name)) for name in names]
        if any(c is None for c in got):
            return None
        cols = [c[:upto] if where is None else [c[i] for i in where]
                for c in got if c is not None]
        n = upto if where is None else len(where)
        if len(cols) == 1:  # one column's keys stand for themselves: no 1-tuple each
            return cols[0]
        return list(zip(*cols, strict=True)) if cols else [()] * n
