"""``m2g report``'s peak memory on a large synthetic decision log.

Writes a log of N decision rows (``decisions.parquet`` in row groups of 50,000, or
``decisions.csv``, as ``m2g run --decision-log`` writes them: admission answers, a shed or
restore now and then, and during one two-hour grid event a ``Grid``/``Sample`` row every 5 s)
and a lifecycle table of N/50 records, then runs ``m2g report DIR -o json`` in a child process
and prints its wall and CPU time and peak RSS (``wait4``'s ``ru_maxrss``), with the sizes.

Run: ``.venv/bin/python bench/report_memory.py [N ...] [--csv] [--dir D]`` (default N 1000000;
the code measured is the one ``PYTHONPATH`` names). A benchmark script: it prints what it
measured and asserts nothing about time or memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from m2g.records import DECISIONS, LIFECYCLE

T0 = datetime(2026, 12, 1, tzinfo=UTC)
STEP = timedelta(milliseconds=10)  # a decision every 10 ms: 5 M rows are ~14 hours
CHUNK = 50_000
EVENT = (T0 + timedelta(hours=2), T0 + timedelta(hours=4))


def _decisions(first: int, n: int) -> pa.Table:
    rows = []
    for i in range(first, first + n):
        t = T0 + i * STEP
        during = EVENT[0] <= t < EVENT[1]
        if during and i % 500 == 0:  # every 5 s of the event: the site draw against its target
            rows.append({"time": t, "stage": "Grid", "kind": "Site", "target": "site",
                         "outcome": "Sample", "site_draw_kw": 900.0 - (i % 7) * 20,
                         "site_limit_kw": 850.0, "power_age_s": 4.0, "grid_event": "dr-1",
                         "grid_level": 1, "grid_target_kw": 850.0, "grid_baseline_kw": 1000.0,
                         "grid_event_start": EVENT[0], "grid_event_end": EVENT[1],
                         "applied": True, "policy_set": "abc123"})
            continue
        shed = i % 997 == 0
        rows.append({
            "time": t, "stage": "Preemption" if shed else "Admission", "kind": "Workload",
            "target": f"research/job-{i % 20_000}-1",
            "outcome": ("Shed" if during else "Restored") if shed else
            ("Admitted" if i % 3 else "Retry"),
            "policy": "grid-admission", "rule": "headroom",
            "message": f"fits in the site's headroom: {i % 400} kW of {850 + i % 50} kW",
            "value": float(i % 400), "applied": True, "policy_set": "abc123",
            "site_draw_kw": 800.0, "site_limit_kw": 1000.0, "power_age_s": 3.0,
            "flex_tier": i % 4, "gpus": 8 * (1 + i % 8), "estimated_kw": 10.0,
            "checkpoint_age_s": i % 3600})
    return pa.Table.from_pylist(rows, schema=DECISIONS)


def _lifecycle(n: int) -> pa.Table:
    events = ("submitted", "admitted", "placed", "finished", "deleted")
    return pa.Table.from_pylist([{
        "time": T0 + i * STEP * 50, "workload": f"research/job-{i // 5}-1",
        "event": events[i % 5], "cluster_queue": "research", "flex_tier": 2, "gpus": 8,
        "estimated_kw": 10.0, "nodes": "n1,n2", "racks": "rack-000",
        "gpu_seconds": float(i), "kwh": i / 100, "message": ""} for i in range(n)],
        schema=LIFECYCLE)


def write_log(folder: Path, n: int, csv: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, schema, tables in (
            ("decisions", DECISIONS, (_decisions(f, min(CHUNK, n - f))
                                      for f in range(0, n, CHUNK))),
            ("lifecycle", LIFECYCLE, iter([_lifecycle(max(1, n // 50))]))):
        if csv:
            with (folder / f"{name}.csv").open("wb") as f:
                for k, table in enumerate(tables):
                    pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=k == 0))
        else:
            with pq.ParquetWriter(folder / f"{name}.parquet", schema) as w:
                for table in tables:
                    w.write_table(table)


def measure(folder: Path) -> tuple[float, float, float, dict[str, int]]:
    """wall s, CPU s, peak RSS MiB of ``m2g report folder -o json``, and its row counts."""
    code = ("import sys; from m2g_cli.app import main; "
            f"sys.argv = ['m2g', 'report', {str(folder)!r}, '-o', 'json']; main()")
    wall = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    out = child.stdout.read() if child.stdout else b""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - wall
    if status:
        raise SystemExit(f"m2g report failed (status {status})")
    rows = json.loads(out)["rows"]
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int, nargs="*", default=[1_000_000])
    p.add_argument("--csv", action="store_true", help="write the log as CSV, not Parquet")
    p.add_argument("--dir", type=Path, help="keep the logs here (reused when present)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = args.dir or Path(tmp)
        for n in args.n:
            folder = base / f"log-{n}-{'csv' if args.csv else 'parquet'}"
            if not folder.exists():
                write_log(folder, n, args.csv)
            size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
            wall, cpu, rss, rows = measure(folder)
            print(f"{n:>10,} decisions ({rows['decisions']:,} read, {rows['lifecycle']:,} "
                  f"lifecycle; {size:,.0f} MiB {'CSV' if args.csv else 'Parquet'}): "
                  f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:,.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
