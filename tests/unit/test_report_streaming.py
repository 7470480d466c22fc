"""``m2g report`` streams a decision log: its files are read a batch at a time and the summary
keeps no row, so its memory is the log's width, not its length. Before, the log was read
whole into Python rows (~3 KB a decision: 5 million decisions ~15 GB; bench/report_memory.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from m2g.records import DECISIONS
from m2g_cli import report_cmd
from m2g_cli.app import app
from m2g_cli.report_cmd import LogTable
from m2g_cli.report_view import summary

T0 = datetime(2026, 12, 1, tzinfo=UTC)
START, END = T0 + timedelta(seconds=100), T0 + timedelta(seconds=200)


def _row(i: int) -> dict[str, Any]:
    t = T0 + timedelta(seconds=i / 10)
    if i % 50 == 0:  # a sample every 5 s
        return {"time": t, "stage": "Grid", "kind": "Site", "target": "site",
                "outcome": "Sample", "site_draw_kw": 900.0 if i < 1500 else 800.0,
                "grid_event": "dr-1", "grid_target_kw": 850.0, "grid_baseline_kw": 1000.0,
                "grid_event_start": START, "grid_event_end": END}
    return {"time": t, "stage": "Admission", "kind": "Workload", "target": f"ns/job-{i}",
            "outcome": "Admitted" if i % 3 else "Retry", "policy_set": "abc"}


class Alive:
    """Counts the rows alive: one of these rides in each row and is freed with it."""

    now = peak = 0

    def __init__(self) -> None:
        Alive.now += 1
        Alive.peak = max(Alive.peak, Alive.now)

    def __del__(self) -> None:
        Alive.now -= 1


class Lazy:
    """A log of ``n`` decisions made one at a time, each time it is iterated."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            yield {**_row(i), "message": Alive()}


def test_the_summary_keeps_no_row() -> None:
    Alive.now = Alive.peak = 0
    s = summary(Lazy(3000), [], 10.0)
    assert s["rows"]["decisions"] == 3000 and Alive.now == 0
    assert Alive.peak <= 3  # a row or two at a time; the old summary listed all 3,000
    (ev,) = s["events"]
    assert ev["samples"] == 21 and ev["secondsToTarget"] == 50.0  # 800 kW from 150 s
    assert ev["actions"] == {"Admission/Admitted": 654, "Admission/Retry": 326}
    assert s["actions"]["Admission/Admitted"] == 1960
    assert summary(Lazy(3000), [], 10.0) == summary([_row(i) for i in range(3000)], [], 10.0)


def _write(folder: Path, n: int, csv: bool) -> None:
    table = pa.Table.from_pylist([_row(i) for i in range(n)], schema=DECISIONS)
    if csv:
        pacsv.write_csv(table, folder / "decisions.csv")
    else:
        pq.write_table(table, folder / "decisions.parquet", row_group_size=500)


@pytest.mark.parametrize("csv", [False, True])
def test_the_files_are_read_a_batch_at_a_time(tmp_path: Path, csv: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, 3000, csv)
    monkeypatch.setattr(report_cmd, "BATCH_ROWS", 500)
    monkeypatch.setattr(report_cmd, "CSV_BLOCK_BYTES", 16 << 10)  # ~200 rows
    batches = 0
    real = report_cmd._conform

    def counting(batch: Any, schema: Any) -> Any:
        nonlocal batches
        batches += 1
        return real(batch, schema)

    monkeypatch.setattr(report_cmd, "_conform", counting)
    rows = iter(LogTable(tmp_path, "decisions"))
    first = next(rows)
    assert first["time"] == T0 and batches == 1  # the first row before the rest is read
    assert 1 + sum(1 for _ in rows) == 3000
    assert batches == (19 if csv else 6)  # 16 KiB of CSV a batch, 500 rows of Parquet


def test_a_bad_row_is_reported_once_though_the_log_is_read_twice(tmp_path: Path) -> None:
    _write(tmp_path, 3000, csv=True)
    with (tmp_path / "decisions.csv").open("a") as f:
        f.write('"2026-12-01 00:05:00Z","Grid","Samp\n')  # a run killed mid-line
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.output.count("wrong number of columns") == 1
    assert "GRID EVENT dr-1" in res.output and "3000 decisions" in res.output
