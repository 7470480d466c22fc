"""The decision log (m2g_controllers.decisionlog) and ``m2g report`` on it, without a cluster:
a scripted event on fabricated snapshots, written, read back (Parquet, and the CSV while the
Parquet is still open) and summarised."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, Node, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.model.plan import CheckUpdate, Plan, ShedAction
from m2g.records import DECISIONS, LIFECYCLE
from m2g_cli.app import app
from m2g_cli.report_cmd import read_table
from m2g_cli.report_view import summary
from m2g_controllers.decisionlog import DecisionLog

T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
START, END = T0 + timedelta(seconds=60), T0 + timedelta(seconds=180)


def factory(now: datetime, draw: float) -> FactorySnapshot:
    return FactorySnapshot(
        now=now, racks=(Rack("rack-0", "b", "pd", power_kw=Reading(draw, 1.0), cap_kw=500.0),),
        nodes=(Node("n0", "rack-0"), Node("n1", "rack-0")),
        grid_events=(GridEvent("dr-1", START, END, target_kw=100.0, source="dr-1"),))


def wl(phase: Phase, **kw: object) -> WorkloadState:
    view = WorkloadView(name="a", namespace="t", flex_tier=3, gpus=8, estimated_kw=10.0,
                        cluster_queue="cq")
    return WorkloadState("t", "a", view, phase, cluster_queue="cq", check="m2g", **kw)  # type: ignore[arg-type]


def scripted(folder: Path, close: bool = True) -> DecisionLog:
    """A workload admitted at T0+10 s, shed during the event, restored and admitted again,
    finished; the draw 120 kW until 90 s into the event, then 95 kW; a sample every 10 s."""
    dl = DecisionLog(folder, flush_seconds=1e9, sample_seconds=5.0, row_group_rows=7)
    for s in range(0, 241, 10):
        now = T0 + timedelta(seconds=s)
        draw = 120.0 if s < 90 + 60 else 95.0
        plan = Plan()
        if s == 0:
            state = wl(Phase.RESERVED, check_state=CheckState.PENDING)
            plan = Plan(checks=(CheckUpdate("t", "a", "m2g", CheckState.READY, "ok",
                                            policy="p", rule="r"),))
        elif s < 100:
            state = wl(Phase.ADMITTED, admitted_at=T0 + timedelta(seconds=10))
            if s == 90:
                plan = Plan(sheds=(ShedAction("t", "a", False, 8.2, "shed 8 kW"),))
        elif s < 200:
            state = wl(Phase.INACTIVE, shed_by_m2g=True, shed_at=T0 + timedelta(seconds=90))
        elif s < 230:
            state = wl(Phase.ADMITTED, admitted_at=T0 + timedelta(seconds=200))
        else:
            state = wl(Phase.FINISHED)
        snap = ClusterSnapshot(factory(now, draw), (state,))
        dl.record(snap, plan, policy_set="abc123", applied=True,
                  placements=lambda keys: {k: ("n1",) for k in keys})
    if close:
        dl.close()
    return dl


def test_decisions_and_lifecycle_are_written_as_parquet_with_the_schema(tmp_path: Path) -> None:
    scripted(tmp_path)
    decisions = pq.read_table(tmp_path / "decisions.parquet")
    assert decisions.schema.equals(DECISIONS)
    assert pq.ParquetFile(tmp_path / "decisions.parquet").num_row_groups > 1  # flushed in groups
    rows = decisions.to_pylist()
    ready = next(r for r in rows if r["stage"] == "Admission")
    assert (ready["outcome"], ready["policy"], ready["rule"], ready["policy_set"]) == (
        "Ready", "p", "r", "abc123")
    assert ready["site_draw_kw"] == 120.0 and ready["grid_event"] == "dr-1"
    shed = next(r for r in rows if r["outcome"] == "Shed")
    assert (shed["target"], shed["value"], shed["flex_tier"], shed["gpus"]) == ("t/a", 8.2, 3, 8)
    life = pq.read_table(tmp_path / "lifecycle.parquet")
    assert life.schema.equals(LIFECYCLE)
    events = [(r["event"], r["time"]) for r in life.to_pylist()]
    assert [e for e, _ in events] == ["submitted", "admitted", "placed", "shed", "restored",
                                      "admitted", "placed", "finished"]
    by = {e: r for r in life.to_pylist() for e in [r["event"]]}
    assert by["placed"]["nodes"] == "n1" and by["placed"]["racks"] == "rack-0"
    # ran 10..100 s (shed seen at 100) and 200..230 s: 120 s x 8 GPUs; 10 kW x 120 s
    assert by["finished"]["gpu_seconds"] == 960.0
    assert abs(by["finished"]["kwh"] - 10.0 * 120 / 3600) < 1e-9


def test_the_report_gives_the_event_delivery_per_interval(tmp_path: Path) -> None:
    scripted(tmp_path)
    s = summary(read_table(tmp_path, "decisions"), read_table(tmp_path, "lifecycle"), 60.0)
    (ev,) = s["events"]
    assert (ev["event"], ev["targetKw"]) == ("dr-1", 100.0)
    # samples at 60..180 s: 120 kW until 140 s, 95 kW from 150 s
    assert ev["secondsToTarget"] == 90.0
    assert ev["secondsAboveTarget"] == 90.0  # 60 -> 150 s
    assert abs(ev["kwhAboveTarget"] - 20.0 * 90 / 3600) < 1e-4
    assert [(i["meanKw"], i["compliant"]) for i in ev["intervals"]] == [
        (120.0, False), ((120.0 * 3 + 95.0 * 3) / 6, False)]
    assert ev["actions"] == {"Preemption/Shed": 1}
    assert s["lifecycle"]["records"]["shed"] == 1 and s["policySets"] == ["abc123"]


def test_a_log_still_being_written_is_read_from_its_csv(tmp_path: Path) -> None:
    dl = scripted(tmp_path, close=False)
    dl.flush()  # row groups on disk, no Parquet footer yet
    rows = read_table(tmp_path, "decisions")
    assert any(r["outcome"] == "Shed" for r in rows)
    assert isinstance(rows[0]["time"], datetime)
    dl.close()
    assert len(read_table(tmp_path, "decisions")) == len(rows)


def test_a_new_run_keeps_the_previous_log(tmp_path: Path) -> None:
    scripted(tmp_path)
    first = len(read_table(tmp_path, "decisions"))
    scripted(tmp_path)
    assert len(read_table(tmp_path, "decisions")) == first
    assert len(read_table(tmp_path, "decisions", every_run=True)) == 2 * first


def test_m2g_report_command(tmp_path: Path) -> None:
    scripted(tmp_path)
    runner = CliRunner()
    table = runner.invoke(app, ["report", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "GRID EVENT dr-1" in table.output and "0/2 intervals compliant" in table.output
    out = runner.invoke(app, ["report", str(tmp_path), "-o", "json", "--interval", "30"])
    data = json.loads(out.output)
    assert len(data["events"][0]["intervals"]) == 4
    missing = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no such folder" in missing.output


def test_samples_only_while_an_event_exists(tmp_path: Path) -> None:
    dl = DecisionLog(tmp_path, sample_seconds=0.0)
    quiet = replace(factory(T0, 50.0), grid_events=())
    dl.record(ClusterSnapshot(quiet), Plan(), policy_set="", applied=True)
    dl.record(ClusterSnapshot(factory(T0, 50.0)), Plan(), policy_set="", applied=True)
    dl.close()
    assert [r["outcome"] for r in read_table(tmp_path, "decisions")] == ["Sample"]


# Nineteenth session probe (docs/reliability.md): decision logs that are cut short, mistyped,
# or name an event of centuries. Before, each raised out of ``m2g report`` (pyarrow's
# ArrowInvalid, KeyError 'time', MemoryError, OverflowError).


def test_a_log_cut_short_or_with_a_bad_row_keeps_its_good_rows(tmp_path: Path) -> None:
    dl = scripted(tmp_path, close=False)
    dl.flush()
    good = len(read_table(tmp_path, "decisions"))
    with (tmp_path / "decisions.csv").open("a") as f:
        bad = next(iter((tmp_path / "decisions.csv").read_text().splitlines()[1:]))
        cells = bad.split(",")
        cells[15] = '"high"'  # grid_level, an int32
        f.write(",".join(cells) + "\n")
        f.write('"2026-11-30T14:09:00Z","Grid","Samp')  # a run killed mid-line
    skipped: list[str] = []
    assert len(read_table(tmp_path, "decisions", skipped=skipped)) == good
    assert any("grid_level" in s for s in skipped) and any("number of columns" in s
                                                           for s in skipped)
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 0 and "GRID EVENT dr-1" in res.output
    assert "warning:" in res.output and "Traceback" not in res.output
    dl.close()


def test_an_event_of_centuries_has_a_bounded_number_of_intervals(tmp_path: Path) -> None:
    rows = read_table_of_scripted(tmp_path)
    # two days at 1 s: 172,800 intervals before (year 1 to 9999 took every byte of memory)
    long = [dict(r, grid_event_end=START + timedelta(days=2))
            if r["grid_event"] else r for r in rows]
    (ev,) = summary(long, [], 1.0)["events"]
    assert len(ev["intervals"]) == 10_000 and ev["intervalSeconds"] == 17.28
    assert sum(i["samples"] for i in ev["intervals"]) == ev["samples"] > 0
    far = [dict(r, grid_event_start=datetime(1, 1, 1, tzinfo=UTC),
                grid_event_end=datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
           if r["grid_event"] else r for r in rows]
    (ev,) = summary(far, [], 1.0)["events"]
    assert len(ev["intervals"]) == 10_000 and ev["samples"] > 0


def read_table_of_scripted(folder: Path) -> list[dict[str, object]]:
    scripted(folder)
    return read_table(folder, "decisions")


def test_report_files_and_options_that_cannot_be_used_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    scripted(tmp_path)
    for bad in ("inf", "1e308", "nan"):
        res = runner.invoke(app, ["report", str(tmp_path), "--interval", bad])
        assert res.exit_code == 2 and "Traceback" not in res.output, bad
    (tmp_path / "decisions-x.csv").write_text("garbage\n\x00\n")  # no time column
    res = runner.invoke(app, ["report", str(tmp_path), "--all"])
    assert res.exit_code == 0 and "without a time left out" in res.output
    odd = tmp_path / "odd"
    (odd / "decisions.csv").mkdir(parents=True)
    res = runner.invoke(app, ["report", str(odd)])
    assert res.exit_code == 1 and "decisions.csv: not a regular file" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_value_outside_its_column_never_stops_the_log_or_a_reconcile(tmp_path: Path) -> None:
    """A pending Workload of 2^34 GPUs (a Job of an int32 parallelism × 8 GPUs) does not fit
    the int32 ``gpus`` column: ``flush`` raised ArrowInvalid out of ``record`` — out of every
    reconcile of ``m2g run --decision-log`` — and kept the rows for ever."""
    view = WorkloadView(name="a", namespace="t", flex_tier=3, gpus=2**34, estimated_kw=10.0,
                        cluster_queue="cq")
    state = WorkloadState("t", "a", view, Phase.PENDING, cluster_queue="cq", check="m2g")
    dl = DecisionLog(tmp_path, flush_seconds=0.0)
    plan = Plan(checks=(CheckUpdate("t", "a", "m2g", CheckState.RETRY, "wait", policy="p",
                                    rule="r"),))
    for _ in range(2):
        dl.record(ClusterSnapshot(factory(T0, 120.0), (state,)), plan, policy_set="x",
                  applied=True)
    dl.close()
    rows = [r for r in read_table(tmp_path, "decisions") if r["stage"] == "Admission"]
    assert len(rows) == 2 and rows[0]["gpus"] is None and rows[0]["outcome"] == "Retry"


def test_the_controller_loads_pyarrow_only_for_a_decision_log() -> None:
    """pyarrow (and numpy) took ~40 MiB of the controller's RSS with no decision log asked
    for: the controller's modules import it only when ``m2g run --decision-log`` is given."""
    import os
    import subprocess
    import sys

    code = ("import sys, m2g_controllers.run, m2g_controllers.manager, m2g_controllers.wiring; "
            "print(sorted({'pyarrow', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"


def test_a_full_disk_loses_rows_and_keeps_none(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Thirtieth session probe: with the disk full every flush failed and the rows were kept
    to be written again, so they grew by every reconcile's rows for as long as it lasted
    (5,000 after 50 failed flushes of 100): the controller's memory without bound. Now the
    rows of a failed write are lost (said in the warning), both tables each on its own."""
    import os

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    log = DecisionLog(tmp_path / "log", flush_seconds=0.0)
    for name in ("decisions.csv", "decisions.parquet", "lifecycle.csv", "lifecycle.parquet"):
        os.symlink("/dev/full", tmp_path / "log" / name)  # the disk is full from now on
    row = {"time": T0, "stage": "Admission", "kind": "Workload", "target": "w",
           "outcome": "Defer", "message": "x" * 200}
    for _ in range(50):
        for _ in range(100):
            log.decisions.add(dict(row))
            log.lifecycle.add({"time": T0, "workload": "w", "event": "Submitted"})
        log.flush()
        assert (len(log.decisions), len(log.lifecycle)) == (0, 0)
    assert "100 decisions row(s) lost" in caplog.text
    assert "100 lifecycle row(s) lost" in caplog.text
