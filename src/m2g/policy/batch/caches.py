"""The caches of batch evaluation: compiled programs per policy and policy list (FusedCache),
one CEL activation per snapshot with its gates and hoisted variables (SnapshotCache,
SnapshotState), and which policies of a list a snapshot leaves idle (split_by_gates).

A snapshot is identified by ``snapshot_key`` (the identities of everything but the workload and
its queue), so the CEL values of its factory part are converted once, not once per decision.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from m2g.model.inputs import PolicyInput
from m2g.policy.batch.cel_source import (
    PROJECTABLE,
    combined_source,
    fused_rule_source,
    fused_source,
    gate_source,
    hoist_source,
    hoistable,
    map_keys,
    match_reads,
    match_source,
    reads_queue,
    rule_parts,
    subset_source,
    workload_fields,
)
from m2g.policy.batch.memo import PartMemos
from m2g.policy.compiler import CompiledPolicy
from m2g.policy.runtime import HOISTED, CelCompileError, CelEvalError, Program, Runtime

_BUDGET = "Iteration budget exceeded"
#: Items per evaluation, at most. cel-expr-python 0.1.3 builds a comprehension's result list by
#: copying it at every step, into the activation's arena, which keeps it until the activation
#: is dropped: a batch of n items costs O(n²) time and memory. 2,000 items in one evaluation
#: took ~0.65 s and left ~70 MiB on the snapshot's activation; in chunks of 32, ~0.05 s and
#: ~3 MiB (docs/benchmarks.md, "Controller latency").
MAX_CHUNK = 32
#: What the snapshot's batch activation may gain (the process's resident memory, measured after
#: each chunk) before it is dropped and rebuilt: cel-expr-python keeps everything an evaluation
#: allocates in the activation's arena until the activation is dropped, so a policy allocating
#: 30 MB an evaluation took 6 GB over 200 workloads (issue 11, "batch memory bounded"). A rebuild
#: costs converting the snapshot's values once more; honest policies never reach it.
RETAIN_BYTES = 256 << 20
#: What one chunk may grow the heap by: a program's first chunk is one item, and its chunks
#: after that hold as many items as fit in this at the growth per item last measured (at most
#: ``max_chunk``, and at most what the iteration budget allowed).
CHUNK_BYTES = 64 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2() -> Any:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> int | None:
    """Bytes in use on the C heap (glibc's mallinfo2, ~0.4 µs: what cel-expr-python's arenas
    hold, freed memory not counted), else the process's resident memory (Linux), else None."""
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        return int(info.uordblks + info.hblkhd)
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


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
        self._matchers: dict[str, tuple[Program, tuple[str, ...], bool] | None] = {}
        self._hoists: dict[str, list[tuple[str, Program]]] = {}
        self._reads: dict[tuple[str, ...], tuple[set[str] | None, bool]] = {}
        self._reads_by_id: dict[int, tuple[Any, tuple[set[str] | None, bool]]] = {}
        self._chunk: dict[int, int] = {}
        self._budget_cap: dict[int, int] = {}
        self._parts: dict[str, list[tuple[tuple[str, ...] | None, bool, tuple[int, ...]]]] = {}
        self._subsets: dict[tuple[Any, ...], Program | None] = {}
        self._projections: dict[tuple[tuple[str, ...], tuple[str, ...]],
                                dict[str, tuple[str, ...]]] = {}
        self.snapshots = SnapshotCache(runtime)
        #: what pure policy parts fired per class, kept across batches (m2g.policy.batch.memo)
        self.memos = PartMemos()
        self.batches = runtime.compile_batch("[]") is not None

    def run(self, program: Program, act: Any, items: list[Any]) -> list[Any]:
        """Run a batch program over ``items`` in chunks of at most ``max_chunk`` (MAX_CHUNK:
        larger batches cost quadratic time and memory) and small enough for cel-expr-python's
        iteration budget (10,000 comprehension steps per evaluation; every bound variable is
        one): a chunk that exceeds it is halved, and the size that worked is remembered.
        ``act`` is an activation, or a SnapshotState whose batch activation is used and
        dropped once it has grown the heap by RETAIN_BYTES; then chunks are sized by the
        growth per item (CHUNK_BYTES)."""
        snap = act if isinstance(act, SnapshotState) else None
        # a program not run before starts with one item when its growth can be measured
        size = self._chunk.get(id(program), 1 if snap is not None and self._max_chunk > 1
                               and heap_bytes() is not None else self._max_chunk)
        cap = self._budget_cap.get(id(program), self._max_chunk)
        out: list[Any] = []
        i = 0
        while i < len(items):
            part = items[i:i + size]
            activation = snap.activation(self._runtime) if snap is not None else act
            before = heap_bytes() if snap is not None else None
            try:
                out += self._runtime.run_batch(program, activation, part)
            except CelEvalError as exc:
                if _BUDGET not in str(exc) or size == 1:
                    raise
                size = cap = max(1, size // 2)
                self._chunk[id(program)] = size
                self._budget_cap[id(program)] = cap
                continue
            i += len(part)
            if snap is not None:
                after = heap_bytes()
                if before is not None and after is not None:
                    per_item = max(1, (after - before) // len(part))
                    size = max(1, min(cap, CHUNK_BYTES // per_item))
                    self._chunk[id(program)] = size
                del activation
                snap.drop_if_grown(after)
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
            self._reads[key] = (workload_fields(policies), reads_queue(policies))
        self._reads_by_id[id(policies)] = (policies, self._reads[key])
        return self._reads[key]

    def matcher(self, policy: CompiledPolicy
                ) -> tuple[Program, tuple[str, ...], bool] | None:
        """The policy's item-dependent match conditions as a batch program, with the workload
        fields and whether the queue they read; None when they read what the whole policy
        reads (nothing to gain from deciding them apart) or do not compile."""
        if policy.name not in self._matchers:
            self._matchers[policy.name] = None
            source = match_source(policy)
            fields, queue = match_reads(policy)
            whole, whole_queue = self.reads((policy,))
            if source is not None and fields is not None and whole is not None and (
                    fields < whole or (whole_queue and not queue)):
                try:
                    prog = self._runtime.compile_batch(source)
                except CelCompileError:
                    prog = None
                if prog is not None:
                    self._matchers[policy.name] = (prog, tuple(sorted(fields)), queue)
        return self._matchers[policy.name]

    def projections(self, policies: Sequence[CompiledPolicy], fields: Sequence[str]
                    ) -> dict[str, tuple[str, ...]]:
        """For the map fields among ``fields`` that ``policies`` read only at literal keys,
        those keys (map_keys): their class key is the values there, not the whole map."""
        key = (tuple(p.name for p in policies), tuple(fields))
        got = self._projections.get(key)
        if got is None:
            got = self._projections[key] = {
                f: keys for f in fields if f in PROJECTABLE
                and (keys := map_keys(policies, f)) is not None}
        return got

    def parts(self, policy: CompiledPolicy
              ) -> list[tuple[tuple[str, ...] | None, bool, tuple[int, ...]]]:
        """The policy's rules grouped by the workload fields they read (rule_parts)."""
        if policy.name not in self._parts:
            self._parts[policy.name] = rule_parts(policy)
        return self._parts[policy.name]

    def subset(self, policy: CompiledPolicy, only: frozenset[int],
               hoisted: tuple[str, ...]) -> Program | None:
        """A batch program for the policy's rules at ``only`` (subset_source); None when it
        does not compile."""
        key = (policy.name, tuple(sorted(only)), hoisted)
        if key not in self._subsets:
            try:
                self._subsets[key] = self._runtime.compile_batch(
                    subset_source(policy, only, hoisted))
            except CelCompileError:
                self._subsets[key] = None
        return self._subsets[key]

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
        ids = _Ids(map(id, inp.domains.values()))
        if domain_ids is not None:
            domain_ids[id(inp.domains)] = ids
    return (id(inp.site), id(inp.grid), id(inp.flavor), id(inp.domain), inp.now, ids)


class _Ids(tuple[int, ...]):
    """A tuple of ids that hashes once: a 1,400-rack factory has ~3,100 domains, and hashing
    their ids again for each of 100,000 inputs (grouping them by snapshot) took ~3 s."""

    _hash: int

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = super().__hash__()
            return self._hash


class SnapshotCache:
    """One activation per snapshot (``PolicyInput.batch_key``), kept for the last few snapshots.

    The entry holds the snapshot's objects, so the ids in the key stay theirs while it lives.
    """

    def __init__(self, runtime: Runtime, size: int = 8) -> None:
        self._runtime = runtime
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], SnapshotState] = OrderedDict()

    def get(self, inp: PolicyInput, key: tuple[Any, ...] | None = None) -> SnapshotState:
        """The snapshot of ``inp`` (whose snapshot_key is ``key`` when given)."""
        key = snapshot_key(inp) if key is None else key
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        shared = inp.shared_data()
        refs = (inp.site, inp.grid, inp.flavor, inp.domain, tuple(inp.domains.values()))
        entry = SnapshotState(refs, shared, self._runtime.activation(shared))
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return entry


@dataclass
class SnapshotState:
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
    _built_at: int | None = None  # heap bytes after the activation's first chunk
    rebuilt: int = 0  # activations dropped for growing beyond RETAIN_BYTES

    def drop_if_grown(self, now: int | None) -> None:
        """Drop the batch activation (its arena) when the heap grew by more than
        RETAIN_BYTES since its first chunk; the next chunk builds a new one."""
        if self._built_at is None:  # after its first chunk: the snapshot's values it converted
            self._built_at = now     # on first access are not growth
            return
        if now is not None and now - self._built_at > RETAIN_BYTES:
            self._activation = None
            self.rebuilt += 1

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
            self._built_at = None
        return self._activation





def split_by_gates(cache: FusedCache, snap: SnapshotState, policies: Sequence[CompiledPolicy]
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
