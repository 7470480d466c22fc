"""The decision log (``m2g run --decision-log DIR``): every decision and workload lifecycle
record, as Parquet (pyarrow) and CSV. Schema and meaning: docs/decision-log.md.

Written by the leader only, after each reconcile's apply: the plan's decisions (admission
answers, sheds/restores/drains, quotas, stops, weights, taints, KAI limits, GridEvent status)
with the signal values the reconcile read, a ``Grid``/``Sample`` row of the site draw against
the limit in force (at most every ``sample_seconds`` while a grid event exists or the site is
over its limit: the series ``m2g report`` turns into an event's delivery), and lifecycle
records from the snapshot's workload phases (submitted, admitted, placed, shed, drained,
restored, evicted, finished, deleted) with the GPU-seconds and estimated kWh run so far.

Memory stays bounded: rows are buffered and written as one Parquet row group (and appended to
the CSV) every ``row_group_rows`` rows or ``flush_seconds``; the lifecycle tracker holds one
small entry per live workload. The Parquet footer is written on ``close`` (the controller's
shutdown); the CSV is readable at any time. A previous run's files are kept under a
timestamped name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import Plan
from m2g.records import DECISIONS, LIFECYCLE

log = logging.getLogger("m2g.decisionlog")

Row = dict[str, Any]
Placements = Callable[[Iterable[str]], Mapping[str, tuple[str, ...]]]


class TableWriter:
    """One table: ``NAME.parquet`` (a row group per flush) and ``NAME.csv`` (appended)."""

    def __init__(self, folder: Path, name: str, schema: pa.Schema) -> None:
        self.schema = schema
        self.parquet_path, self.csv_path = folder / f"{name}.parquet", folder / f"{name}.csv"
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        for path in (self.parquet_path, self.csv_path):  # keep a previous run's log
            if path.exists():
                path.rename(path.with_name(f"{name}-{stamp}{path.suffix}"))
        self._parquet: pq.ParquetWriter | None = None
        self._rows: list[Row] = []
        self.written = 0

    def add(self, row: Row) -> None:
        self._rows.append(row)

    def __len__(self) -> int:
        return len(self._rows)

    def flush(self) -> None:
        """Write the rows added since the last flush. They are let go whether or not the write
        succeeds: on a full disk (OSError, raised) they are lost, never kept to be written
        again — kept, they grew by every reconcile's rows for as long as the disk was full
        (5,000 rows after 50 failed flushes of 100), the controller's memory with them."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        try:
            table = pa.Table.from_pylist(rows, schema=self.schema)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            # a value outside its column's type (a Workload of 2^34 GPUs in the int32 `gpus`)
            # raised here at every flush — out of every reconcile, the rows kept for ever:
            # that cell is written empty instead
            table = pa.Table.from_pylist([self._fit(r) for r in rows], schema=self.schema)
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.parquet_path, self.schema)
        self._parquet.write_table(table)
        header = not self.csv_path.exists()
        with self.csv_path.open("ab") as f:
            pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=header))
        self.written += len(rows)

    def _fit(self, row: Row) -> Row:
        """``row`` with each value that does not fit its column's type left empty."""
        out = dict(row)
        for f in self.schema:
            if out.get(f.name) is None:
                continue
            try:
                pa.scalar(out[f.name], type=f.type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                out[f.name] = None
        return out

    def close(self) -> None:
        self.flush()
        if self._parquet is None:  # an empty log is still a readable file with its schema
            self._parquet = pq.ParquetWriter(self.parquet_path, self.schema)
        self._parquet.close()


def signals(snap: ClusterSnapshot) -> Row:
    """The snapshot-wide signal values every decision row carries."""
    f = snap.factory
    draw = f.site_draw_kw()
    ev = f.grid_event()
    ages = [r.power_kw.age_seconds for r in f.racks]
    row: Row = {"site_draw_kw": None if draw.stale else draw.value,
                "site_limit_kw": f.effective_budget_kw() or None,
                "power_age_s": min(max(ages), 1e9) if ages else None,
                "grid_event": None, "grid_level": None, "grid_target_kw": None,
                "grid_baseline_kw": None, "grid_event_start": None, "grid_event_end": None}
    if ev is not None:
        row |= {"grid_event": ev.id, "grid_level": ev.level, "grid_target_kw": ev.target() or None,
                "grid_baseline_kw": ev.baseline_kw or None, "grid_event_start": ev.start,
                "grid_event_end": ev.end}
    return row


def _workload_cols(w: WorkloadState | None, now: datetime | None = None) -> Row:
    if w is None or now is None:
        return {"flex_tier": None, "gpus": None, "estimated_kw": None, "checkpoint_age_s": None}
    v = w.view
    return {"flex_tier": v.flex_tier, "gpus": v.gpus, "estimated_kw": v.estimated_kw or None,
            "checkpoint_age_s": w.checkpoint_at(now).last_age_seconds}


def decision_rows(snap: ClusterSnapshot, plan: Plan) -> list[Row]:
    """One row per change the plan makes (without the signal and version columns)."""
    by_key = {w.key: w for w in snap.workloads}
    out: list[Row] = []

    def add(stage: str, kind: str, target: str, outcome: str, message: str,
            value: float | None = None, policy: str = "", rule: str = "") -> None:
        out.append({"stage": stage, "kind": kind, "target": target, "outcome": outcome,
                    "policy": policy, "rule": rule, "message": message, "value": value,
                    **_workload_cols(by_key.get(target), snap.now)})

    for c in plan.checks:
        add("Admission", "Workload", f"{c.namespace}/{c.name}", c.state.value, c.message,
            c.requeue_after_seconds, c.policy, c.rule)
    for s in plan.sheds:
        kind = ("Return" if s.active else "Drain") if s.drain else (
            "Restore" if s.active else "Shed")
        add("Maintenance" if s.drain else "Preemption", "Workload",
            f"{s.namespace}/{s.name}", kind, s.reason, s.kw)
    for cap in plan.caps:
        add("Preemption", "Workload", f"{cap.namespace}/{cap.name}",
            "LiftCap" if cap.fraction >= 1.0 else "Cap", cap.reason, cap.fraction)
    for rs in plan.resizes:
        add("Preemption", "Job", f"{rs.namespace}/{rs.job}",
            "Grow" if rs.parallelism >= rs.full else "Shrink", rs.reason, rs.parallelism)
    for q in plan.quotas:
        add("Capacity", "ClusterQueue", q.cluster_queue, "Quota",
            f"{q.flavor} {q.resource} {q.nominal} of {q.base}: {q.reason}", q.nominal)
    for st in plan.stops:
        add("Capacity", "ClusterQueue", st.cluster_queue, f"Stop{st.stop_policy}", st.reason)
    for pu in plan.preemptions:
        add("Capacity", "ClusterQueue", pu.cluster_queue, f"Preemption{pu.within}", pu.reason)
    for wu in plan.weights:
        add("Fairness", "ClusterQueue", wu.cluster_queue, "Weight", wu.reason, wu.weight)
    for t in plan.taints:
        add("Node", "Node", t.node, "Taint" if t.add else "Untaint", f"{t.key}: {t.reason}")
    for kq in plan.kai_queues:
        add("KAI", "Queue", kq.queue, "GpuLimit", kq.reason, kq.limit)
    for e in plan.event_statuses:
        target = e.status.get("targetKw")
        add("Grid", "GridEvent", e.name, str(e.status.get("phase", "")),
            str(e.status.get("message", "")), float(target) if target is not None else None)
    for r in plan.reservation_statuses:
        add("Reservation", "Reservation", r.name, str(r.status.get("phase", "")),
            str(r.status.get("message", "")), float(r.status.get("heldGpus") or 0))
    return out


@dataclass
class Tracked:
    """What the lifecycle tracker keeps of one workload."""

    phase: Phase
    shed: bool
    drained: bool
    run_start: datetime | None
    gpu_seconds: float = 0.0
    kwh: float = 0.0
    placed: bool = False


class Lifecycle:
    """Lifecycle records from successive snapshots (phase changes of each workload)."""

    def __init__(self, kw_per_gpu: float = 1.34) -> None:
        self.kw_per_gpu = kw_per_gpu
        self.known: dict[str, Tracked] = {}

    def _kw(self, w: WorkloadState) -> float:
        return w.view.estimated_kw or w.view.gpus * self.kw_per_gpu

    def rows(self, snap: ClusterSnapshot, placements: Placements | None = None) -> list[Row]:
        now, out = snap.now, list[Row]()
        seen: set[str] = set()
        unplaced: list[WorkloadState] = []
        for w in snap.workloads:
            seen.add(w.key)
            t = self.known.get(w.key)
            if t is None:
                t = self._first(w, now, out)
            else:
                self._step(w, t, now, out)
            if w.phase is Phase.ADMITTED and not t.placed:
                unplaced.append(w)
        for key in [k for k in self.known if k not in seen]:
            t = self.known.pop(key)
            if t.phase is not Phase.FINISHED:
                out.append(self._row(now, key, None, "deleted", t, ""))
        if unplaced and placements is not None:
            where = placements(w.key for w in unplaced)
            for w in unplaced:
                nodes = where.get(w.key, ())
                if nodes:
                    t = self.known[w.key]
                    t.placed = True
                    out.append(self._row(now, w.key, w, "placed", t, "", nodes, snap))
        return out

    def _first(self, w: WorkloadState, now: datetime, out: list[Row]) -> Tracked:
        running = w.phase is Phase.ADMITTED
        t = Tracked(w.phase, w.shed_by_m2g, bool(w.drained_for),
                    (w.admitted_at or now) if running else None)
        self.known[w.key] = t
        if w.phase in (Phase.PENDING, Phase.RESERVED):
            since = now.timestamp() - w.wait_seconds(now)
            out.append(self._row(datetime.fromtimestamp(since, UTC), w.key, w, "submitted", t,
                                 ""))
        else:
            out.append(self._row(now, w.key, w, "observed", t, f"first seen {w.phase.value}"))
        return t

    def _stop_running(self, w: WorkloadState, t: Tracked, now: datetime) -> None:
        if t.run_start is not None:
            secs = max(0.0, (now - t.run_start).total_seconds())
            t.gpu_seconds += secs * w.view.gpus
            t.kwh += secs * self._kw(w) / 3600
            t.run_start = None

    def _step(self, w: WorkloadState, t: Tracked, now: datetime, out: list[Row]) -> None:
        was, shed_before = t.phase, t.shed
        if w.phase is was and w.shed_by_m2g == shed_before:
            return
        event = ""
        if w.phase is Phase.ADMITTED and was is not Phase.ADMITTED:
            t.run_start, t.placed, event = w.admitted_at or now, False, "admitted"
        elif was is Phase.ADMITTED:
            self._stop_running(w, t, now)
            if w.phase is Phase.FINISHED:
                event = "finished"
            elif w.phase is Phase.INACTIVE and w.shed_by_m2g:
                event = "drained" if w.drained_for else "shed"
            else:
                event = "evicted" if w.phase is not Phase.INACTIVE else "deactivated"
        elif w.phase is Phase.FINISHED:
            event = "finished"
        if shed_before and not w.shed_by_m2g and w.phase is not Phase.INACTIVE:
            out.append(self._row(now, w.key, w, "restored", t, ""))
        t.phase, t.shed, t.drained = w.phase, w.shed_by_m2g, bool(w.drained_for)
        if event:
            out.append(self._row(now, w.key, w, event, t, ""))

    def _row(self, when: datetime, key: str, w: WorkloadState | None, event: str, t: Tracked,
             message: str, nodes: tuple[str, ...] = (),
             snap: ClusterSnapshot | None = None) -> Row:
        racks = sorted({n.rack for n in snap.factory.nodes if n.name in nodes}) if snap else []
        running = 0.0
        if t.run_start is not None and w is not None:
            running = max(0.0, (when - t.run_start).total_seconds())
        v = w.view if w is not None else None
        return {"time": when, "workload": key, "event": event,
                "cluster_queue": w.cluster_queue if w else None,
                "flex_tier": v.flex_tier if v else None, "gpus": v.gpus if v else None,
                "estimated_kw": (v.estimated_kw or None) if v else None,
                "nodes": ",".join(nodes) or None, "racks": ",".join(racks) or None,
                "gpu_seconds": t.gpu_seconds + running * (v.gpus if v else 0),
                "kwh": t.kwh + (running * self._kw(w) / 3600 if w else 0.0),
                "message": message or None}


class DecisionLog:
    """The opt-in decision and lifecycle log of ``m2g run`` (see the module docstring)."""

    def __init__(self, folder: Path, *, row_group_rows: int = 4096, flush_seconds: float = 10.0,
                 sample_seconds: float = 2.0, kw_per_gpu: float = 1.34,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.decisions = TableWriter(folder, "decisions", DECISIONS)
        self.lifecycle = TableWriter(folder, "lifecycle", LIFECYCLE)
        self.tracker = Lifecycle(kw_per_gpu)
        self.row_group_rows, self.flush_seconds = row_group_rows, flush_seconds
        self.sample_seconds = sample_seconds
        self._monotonic = monotonic
        self._last_flush = monotonic()
        self._last_sample: datetime | None = None

    def record(self, snap: ClusterSnapshot, plan: Plan, *, policy_set: str, applied: bool,
               placements: Placements | None = None) -> None:
        sig = signals(snap)
        common = {"time": snap.now, "applied": applied, "policy_set": policy_set, **sig}
        for row in decision_rows(snap, plan):
            self.decisions.add(common | row)
        if self._sample_due(snap, sig):
            self.decisions.add(common | {
                "stage": "Grid", "kind": "Site", "target": snap.factory.site, "outcome": "Sample",
                "policy": "", "rule": "", "message": plan.notes[0] if plan.notes else "",
                "value": sig["site_draw_kw"], **_workload_cols(None)})
        for row in self.tracker.rows(snap, placements):
            self.lifecycle.add(row)
        self._maybe_flush()

    def _sample_due(self, snap: ClusterSnapshot, sig: Row) -> bool:
        draw, limit = sig["site_draw_kw"], sig["site_limit_kw"]
        over = draw is not None and limit is not None and draw > limit
        if not (snap.factory.grid_events or over):
            return False
        last = self._last_sample
        if last is not None and (snap.now - last).total_seconds() < self.sample_seconds:
            return False
        self._last_sample = snap.now
        return True

    def _maybe_flush(self) -> None:
        due = self._monotonic() - self._last_flush >= self.flush_seconds
        if due or len(self.decisions) >= self.row_group_rows or \
                len(self.lifecycle) >= self.row_group_rows:
            self.flush()

    def flush(self) -> None:
        for table in (self.decisions, self.lifecycle):  # each on its own: one failing does
            lost = len(table)                            # not keep the other's rows
            try:
                table.flush()
            except OSError as exc:  # a full disk loses log rows, never a reconcile
                log.warning("decision log not written (%d %s row(s) lost): %s", lost,
                            table.parquet_path.stem, exc)
        self._last_flush = self._monotonic()

    def close(self) -> None:
        try:
            self.decisions.close()
            self.lifecycle.close()
        except OSError as exc:
            log.warning("decision log not closed cleanly: %s", exc)
