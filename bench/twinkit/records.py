"""Each run's decision log in the product's format (m2g.records, docs/decision-log.md).

The m2g run's tables are ``m2g run --decision-log``'s own, copied when it has stopped (the
Parquet footers are written at SIGTERM). Plain Kueue has no m2g run, so the twin writes its
tables itself, in the same schemas, from what it measured: ``Grid``/``Sample`` decision rows
(the site draw against the limit in force, ``applied`` false, policy empty) and lifecycle
records (submitted, admitted, placed, evicted, finished) from the job driver. ``m2g report``
then summarises either run the same way.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from m2g.records import DECISIONS, LIFECYCLE

Obj = dict[str, Any]
TABLES = ("decisions", "lifecycle")


def copy_log(src: Path, dest: Path) -> list[str]:
    """Copy ``m2g run``'s tables (Parquet and CSV); the names of those found."""
    dest.mkdir(parents=True, exist_ok=True)
    found = []
    for table in TABLES:
        for ext in ("parquet", "csv"):
            f = src / f"{table}.{ext}"
            if f.exists():
                shutil.copyfile(f, dest / f.name)
                found.append(f.name)
    return found


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def grid_samples(samples: list[tuple[float, float]], t0: float, event: str | None,
                 start_s: float | None, end_s: float | None, limit: Any) -> list[Obj]:
    """``Grid``/``Sample`` rows of the twin's site-draw samples inside the event (``limit(t)``:
    the kW limit in force at replay second t)."""
    if event is None or start_s is None or end_s is None:
        return []
    return [{"time": _ts(t0 + t), "stage": "Grid", "kind": "Site", "target": "site",
             "outcome": "Sample", "policy": "", "rule": "",
             "message": "measured by the twin (plain Kueue: no m2g run)", "value": kw,
             "applied": False, "site_draw_kw": kw, "site_limit_kw": limit(t),
             "grid_event": event, "grid_target_kw": limit(t),
             "grid_event_start": _ts(t0 + start_s), "grid_event_end": _ts(t0 + end_s)}
            for t, kw in samples if start_s <= t <= end_s]


def lifecycle(jobs: list[Obj], t0: float, node_rack: dict[str, str], end_s: float) -> list[Obj]:
    """Lifecycle records of the driver's job records (times are replay seconds)."""
    rows: list[Obj] = []
    for j in jobs:
        wl = f"{j['namespace']}/{j.get('workload') or j['name']}"
        base = {"workload": wl, "cluster_queue": j["namespace"], "flex_tier": j["tier"],
                "gpus": j["gpus"], "estimated_kw": None, "kwh": None}
        if j.get("submitted") is not None:
            rows.append({**base, "time": _ts(t0 + j["submitted"]), "event": "submitted"})
        if j.get("admitted") is not None:
            rows.append({**base, "time": _ts(t0 + j["admitted"]), "event": "admitted"})
        at = j.get("admitted") or j.get("submitted") or 0.0
        for n, nodes in enumerate(j.get("runs") or []):
            racks = sorted({node_rack.get(x, "") for x in nodes} - {""})
            rows.append({**base, "time": _ts(t0 + at), "event": "placed",
                         "nodes": ",".join(nodes), "racks": ",".join(racks),
                         "message": f"run {n + 1}"})
        if j.get("evictions"):
            rows.append({**base, "time": _ts(t0 + (j.get("finished") or end_s)),
                         "event": "evicted", "message": f"{j['evictions']} eviction(s), "
                         f"{float(j.get('lost') or 0):.0f} trace GPU-s lost"})
        if j.get("finished") is not None:
            ran = j["finished"] - (j.get("admitted") or j["finished"])  # wall s, approx.
            rows.append({**base, "time": _ts(t0 + j["finished"]), "event": "finished",
                         "gpu_seconds": ran * j["gpus"]})
    return sorted(rows, key=lambda r: r["time"])


def admission_rows(jobs: list[Obj], t0: float) -> list[Obj]:
    """``quota-reserved`` and ``check-ready`` lifecycle records of each job's first admission,
    from its Workload's conditions as the twin's driver saw them (m2g run's tracker records
    ``admitted`` and what follows; these are the steps before, for the admission round trip).
    """
    rows: list[Obj] = []
    for j in jobs:
        base = {"workload": f"{j['namespace']}/{j.get('workload') or j['name']}",
                "cluster_queue": j["namespace"], "flex_tier": j["tier"], "gpus": j["gpus"],
                "message": "from the Workload's conditions (twin)"}
        for event, key in (("quota-reserved", "quota_reserved"), ("check-ready", "check_ready")):
            if j.get(key) is not None:
                rows.append({**base, "time": _ts(t0 + j[key]), "event": event})
    return rows


def append_lifecycle(dest: Path, rows: list[Obj]) -> None:
    """Add ``rows`` to ``dest``'s lifecycle table (Parquet and CSV), keeping it time-sorted."""
    f = dest / "lifecycle.parquet"
    if not rows or not f.exists():
        return
    old = pq.read_table(f).cast(LIFECYCLE)
    table = pa.concat_tables([old, pa.Table.from_pylist(rows, schema=LIFECYCLE)])
    table = table.sort_by([("time", "ascending")])
    pq.write_table(table, f)
    pacsv.write_csv(table, dest / "lifecycle.csv")


def first_ready(dest: Path, t0: float) -> dict[str, float]:
    """``namespace/workload`` → replay second of m2g's first ``Ready`` admission decision, from
    ``dest``'s decisions table (empty without one)."""
    f = dest / "decisions.parquet"
    if not f.exists():
        return {}
    out: dict[str, float] = {}
    for r in pq.read_table(f, columns=["time", "stage", "target", "outcome"]).to_pylist():
        if r["stage"] == "Admission" and r["outcome"] == "Ready" and r["time"] is not None:
            t = r["time"].timestamp() - t0
            out[r["target"]] = min(t, out.get(r["target"], t))
    return out


def write(dest: Path, decisions: list[Obj], life: list[Obj]) -> None:
    """Both tables as Parquet and CSV, in the product's schemas."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, schema, rows in (("decisions", DECISIONS, decisions),
                               ("lifecycle", LIFECYCLE, life)):
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, dest / f"{name}.parquet")
        pacsv.write_csv(table, dest / f"{name}.csv")
