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


def test_a_long_or_short_job_variant_keeps_its_rows_and_the_twin_reads_it(
        tmp_path: Path) -> None:
    """bench/trace_variant.py: the GPU pods running at least (long) or under (short) the
    median runtime, rows unchanged; the two halves split the trace's usable pods, and the
    twin plans the result through ``--trace``."""
    import trace_variant as V

    text = SHIPPED.read_text()
    pods = T.read_trace(text).pods
    long_csv, cut, n_long = V.variant(text, "long")
    short_csv, cut2, n_short = V.variant(text, "short")
    assert cut == cut2 == V.median([float(p.runtime) for p in pods])
    assert n_long + n_short == len(pods) and abs(n_long - n_short) <= 1
    got = T.read_trace(long_csv).pods
    assert {p.name for p in got} == {p.name for p in pods if p.runtime >= cut}
    assert min(p.runtime for p in got) >= cut
    assert max(p.runtime for p in T.read_trace(short_csv).pods) < cut
    # the rows are the trace's own, every column
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(text))}
    for r in csv.DictReader(io.StringIO(long_csv)):
        assert r == rows[r["name"]]
    path = tmp_path / "long.csv"
    assert V.main(["--runtimes", "long", "--out", str(path)]) == 0
    assert len(_plan(path, 2).jobs) > 0


def test_a_variant_of_nothing_is_one_error_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import trace_variant as V

    assert V.main(["--runtimes", "long", "--split", "1e12", "--out",
                   str(tmp_path / "x.csv")]) == 2
    assert V.main(["--runtimes", "long", "--trace", str(tmp_path / "missing.csv"), "--out",
                   str(tmp_path / "x.csv")]) == 2
    assert V.main(["--runtimes", "short", "--split", "-1", "--out",
                   str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "x.csv").exists()


def test_the_held_out_bench_runs_jobs_when_their_gpus_are_free() -> None:
    """bench/forecast_heldout.py's idealised factory: a job that does not fit waits for GPUs,
    a smaller later one may pass it; every job runs its runtime."""
    import forecast_heldout as HO

    def job(name: str, arrival: float, runtime: float, gpus: int) -> T.TraceJob:
        return T.TraceJob(name, name, arrival, runtime, gpus, "training", 0, "training", "",
                          0, False, "", False)

    ran = {r.job.name: r for r in HO.simulate(
        (job("a", 0, 100, 64), job("b", 10, 50, 16), job("c", 20, 10, 4)), 72)}
    assert (ran["a"].start, ran["a"].end) == (0, 100)
    assert ran["b"].start == 100  # 64 + 16 > 72: waits for a
    assert ran["c"].start == 20  # fits beside a: passes b
    kw, busy, flex = HO.actual_kw(list(ran.values()), 72, 0, 100)
    assert busy == pytest.approx(64 + 4 * 10 / 100)
    assert flex == 0.0 and kw > busy * 1.3
