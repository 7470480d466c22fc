"""The twin's I/O helpers: the driver's bounded concurrent writer and the decision logs it
writes for plain Kueue in the product's schemas (read back by ``m2g report``'s reader)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from twinkit import records as Rec
from twinkit.driver import Writer, Writes

from m2g.k8s.client import NotFound, PermanentError
from m2g.testing.kube import FakeKube
from m2g_cli.report_cmd import read_table
from m2g_cli.report_view import summary


class Kube(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str, Any]] = []
        self.inflight = self.peak = 0

    async def patch(self, *args: Any, **kwargs: Any) -> Any:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        await asyncio.sleep(0.01)
        self.inflight -= 1
        self.requests.append(("PATCH", args[1], args[2]))
        if args[1] == "gone":
            raise NotFound("gone")
        if args[1] == "bad":
            raise PermanentError("PATCH bad: 422")
        return {}

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append((method, path, kwargs.get("body")))
        return {}


def test_writer_is_concurrent_bounded_and_forgiving() -> None:
    kube = Kube()
    w = Writes(complete_pods=[("ns", f"p{i}") for i in range(20)] + [("ns", "gone"),
                                                                      ("ns", "bad")],
               checkpoints=[("ns", "wl", "2026-01-01T00:00:00Z")],
               delete_jobs=[("ns", "j1")])

    async def go() -> Writer:
        writer = Writer(kube)
        await writer.apply(w, 100.0)
        await writer.apply(Writes(delete_jobs=[("ns", "j1")]), 105.0)  # asked 5 s ago
        await writer.apply(Writes(delete_jobs=[("ns", "j1")]), 111.0)  # again after 10 s
        return writer

    writer = asyncio.run(go())
    assert 1 < kube.peak <= 8
    assert writer.failures == 1  # the 422; a vanished pod is no failure
    deletes = [r for r in kube.requests if r[0] == "DELETE"]
    assert len(deletes) == 2
    assert deletes[0][1] == "/apis/batch/v1/namespaces/ns/jobs/j1"
    assert deletes[0][2] == {"propagationPolicy": "Background"}
    assert ("PATCH", "wl", {"metadata": {"annotations": {
        "m2g.io/last-checkpoint-time": "2026-01-01T00:00:00Z"}}}) in kube.requests


def test_plain_kueue_log_reads_back_as_a_delivery(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    samples = [(float(t), 100.0 if t < 20 else 70.0) for t in range(0, 60, 2)]
    rows = Rec.grid_samples(samples, t0, "ev", 10.0, 50.0, lambda t: 80.0)
    jobs = [{"name": "j", "namespace": "research", "tier": 2, "gpus": 8, "submitted": 1.0,
             "admitted": 3.0, "finished": 43.0, "runs": [["n1", "n2"]], "evictions": 1,
             "lost": 5.0}]
    life = Rec.lifecycle(jobs, t0, {"n1": "rack-000", "n2": "rack-000"}, 60.0)
    Rec.write(tmp_path, rows, life)
    dec, lc = read_table(tmp_path, "decisions"), read_table(tmp_path, "lifecycle")
    assert len(dec) == 21 and all(r["outcome"] == "Sample" for r in dec)
    s = summary(dec, lc, 10.0)
    ev = s["events"][0]
    assert ev["event"] == "ev" and ev["targetKw"] == 80.0
    assert ev["secondsToTarget"] == 10.0  # the first sample under 80 kW is at t = 20
    assert ev["secondsAboveTarget"] == 10.0
    assert s["lifecycle"]["records"] == {"admitted": 1, "evicted": 1, "finished": 1,
                                         "placed": 1, "submitted": 1}
    placed = next(r for r in lc if r["event"] == "placed")
    assert placed["racks"] == "rack-000" and placed["nodes"] == "n1,n2"
    assert s["lifecycle"]["gpuHours"] == round(40 * 8 / 3600, 3)
    assert (tmp_path / "decisions.csv").stat().st_size > 0


def test_a_grid_event_of_several_intervals_is_reported_as_one() -> None:
    t0 = 1_800_000_000.0
    ramp = [(float(t), 100.0) for t in range(0, 10, 2)]
    hold = [(float(t), 75.0) for t in range(10, 40, 2)]
    rows = (Rec.grid_samples(ramp, t0, "ev/0", 0.0, 10.0, lambda t: 90.0)
            + Rec.grid_samples(hold, t0, "ev/1", 10.0, 40.0, lambda t: 80.0)
            + Rec.grid_samples(hold, t0, "other", 10.0, 40.0, lambda t: 70.0))
    s = summary(rows, [], 10.0)
    assert [e["event"] for e in s["events"]] == ["ev", "other"]
    ev = s["events"][0]
    assert ev["start"].startswith("2027-01-15T08:00:00") and ev["samples"] == 20
    assert ev["secondsToTarget"] == 10.0 and ev["secondsAboveTarget"] == 10.0
    assert [i["targetKw"] for i in ev["intervals"]] == [90.0, 80.0, 80.0, 80.0]
    assert summary(rows, [], 10.0, only_event="ev/1")["events"][0]["event"] == "ev"


def test_admission_steps_join_a_lifecycle_table_and_the_first_ready_is_read(
        tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    jobs = [{"name": "j", "workload": "job-j-1", "namespace": "research", "tier": 2, "gpus": 8,
             "submitted": 1.0, "quota_reserved": 1.0, "check_ready": 2.0, "admitted": 3.0,
             "runs": []}]
    Rec.write(tmp_path, [], Rec.lifecycle(jobs, t0, {}, 60.0))
    Rec.append_lifecycle(tmp_path, Rec.admission_rows(jobs, t0))
    lc = read_table(tmp_path, "lifecycle")
    assert [r["event"] for r in lc] == ["submitted", "quota-reserved", "check-ready", "admitted"]
    assert {r["workload"] for r in lc} == {"research/job-j-1"}
    assert "check-ready" in (tmp_path / "lifecycle.csv").read_text()
    ts = [datetime.fromtimestamp(t0 + s, UTC) for s in (4.5, 2.5, 9.0)]
    rows = [{"time": ts[0], "stage": "Admission", "target": "research/job-j-1",
             "outcome": "Ready"},
            {"time": ts[1], "stage": "Admission", "target": "research/job-j-1",
             "outcome": "Ready"},
            {"time": ts[2], "stage": "Admission", "target": "research/job-k-1",
             "outcome": "Retry"}]
    Rec.write(tmp_path, rows, [])
    assert Rec.first_ready(tmp_path, t0) == {"research/job-j-1": 2.5}
