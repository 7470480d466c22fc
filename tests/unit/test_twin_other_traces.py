"""The twin runs unchanged on traces it has not seen: another size, rows and columns in another
order, extra columns, a different time span — through the same ``--trace`` path as the CLI."""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

import pytest
import twin
from twinkit import trace as T

import tests.unit.twin_path as tp

SHIPPED = tp.DATA / "openb" / "openb_pod_list_default.csv"


def _rows() -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(SHIPPED.read_text()))
    return list(reader.fieldnames or []), list(reader)


def _write(path: Path, columns: list[str], rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def _plan(path: Path, racks: int) -> T.Plan:
    args = twin.parse(["--trace", str(path), "--racks", str(racks)])
    plan, _, _ = twin.make_plan(args)
    return plan


def test_a_resized_reordered_trace_with_extra_columns_plans(tmp_path: Path) -> None:
    columns, rows = _rows()
    rng = random.Random(7)
    subset = rng.sample(rows, 3000)  # another size, and rows in no particular order
    for r in subset:
        r["site"] = "elsewhere"  # a column openb does not have
    shuffled_cols = ["site", *reversed(columns)]
    odd = _write(tmp_path / "other.csv", shuffled_cols, subset)
    plan = _plan(odd, racks=4)
    assert plan.rows == 3000 and plan.jobs
    assert sum(plan.skipped.values()) + len(T.read_trace(odd.read_text()).pods) == 3000
    assert plan.offered_gpus == pytest.approx(0.9 * 4 * 72, rel=0.05) or plan.notes
    assert all(j.gpus % T.TRAY_GPUS == 0 and 0 < j.gpus <= 2 * T.RACK_GPUS for j in plan.jobs)
    arrivals = [j.arrival for j in plan.jobs]
    assert arrivals == sorted(arrivals)
    # the order of rows and columns is not part of the format: the same rows in openb's order
    # give the same replay
    same = _plan(_write(tmp_path / "same.csv", columns,
                        sorted(subset, key=lambda r: int(r["creation_time"]))), racks=4)
    assert same.jobs == plan.jobs


def test_a_shifted_short_trace_plans_and_a_broken_one_is_one_line(tmp_path: Path) -> None:
    columns, rows = _rows()
    # a later, shorter trace: times shifted by 10 days, the first 400 GPU-bearing rows only
    gpu_rows = [dict(r) for r in rows if r["num_gpu"] not in ("", "0")][:400]
    for r in gpu_rows:
        for key in ("creation_time", "deletion_time", "scheduled_time"):
            if r[key]:
                r[key] = str(int(r[key]) + 864_000)
    plan = _plan(_write(tmp_path / "short.csv", columns, gpu_rows), racks=2)
    assert plan.jobs and plan.rows == 400
    broken = _write(tmp_path / "broken.csv", [c for c in columns if c != "num_gpu"], gpu_rows)
    with pytest.raises(T.TraceError, match="num_gpu"):
        _plan(broken, racks=2)
