"""The short twin: 2 racks, both baselines, a short SRP-shaped event, in a few minutes.

It checks the report's shape and its invariants, never timings: the instrument must produce
every figure of docs/twin-metrics.md in the shape issue 15 fixes, for plain Kueue and
for m2g, from a real control plane. It brings up its own control planes (``$M2G_RUN``-twin-e2e-
kueue / -m2g), so it does not use the session's cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO

pytestmark = pytest.mark.e2e

GRID = {"targetKw", "secondsToTarget", "secondsAboveTarget", "secondsAboveTargetAfterRamp",
        "kwhAboveTarget", "maxRampKwPerSecond"}
WORKLOADS = {"weightedPerformance", "perTier", "queueWaitSeconds", "jctSeconds", "completed",
             "preemptions", "restarts", "lostGpuSeconds", "admissionLatency",
             "performanceLostBy"}
PLACEMENT = {"inOneNvlinkDomainPct", "onAlarmedRacks", "fragmentation", "topologyViolations"}
ACTIONS = {"admits", "defers", "sheds", "restores", "drains", "powerCaps", "capLifts", "resizes",
           "resizeGrows", "quotaChanges"}
CONTROLLER = {"reactionSecondsP50", "reactionSecondsP99", "rssPeakMiB"}
RUN = {"grid", "workloads", "placement", "gpuAllocationPctOutsideEvent", "actions",
       "controller"}


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    if os.environ.get("M2G_E2E_KUBECONFIG"):
        pytest.skip("the twin brings up its own local control planes")
    out = tmp_path_factory.mktemp("twin")
    prefix = Path(os.environ.get("M2G_RUN") or Path.home() / ".cache" / "m2g" / "run")
    res = subprocess.run(
        [sys.executable, str(REPO / "bench" / "twin.py"), "--racks", "2", "--out", str(out),
         "--event-at-hours", "1", "--event-hours", "1", "--after-seconds", "30",
         "--run-dir", f"{prefix}-twin-e2e"],
        capture_output=True, text=True, timeout=1500, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    return json.loads((out / "report.json").read_text()), out


def test_report_has_the_issue_shape(twin: tuple[dict[str, Any], Path]) -> None:
    rep, out = twin
    assert set(rep) == {"scenario", "trace", "timeScale", "runs"}
    assert rep["scenario"] == "dr-srp" and rep["timeScale"] == 60
    assert set(rep["runs"]) == {"kueue", "m2g"}
    for run in rep["runs"].values():
        assert set(run) >= RUN  # extra sections (report.SECTIONS) may follow
        assert set(run["grid"]) == GRID and set(run["workloads"]) == WORKLOADS
        assert set(run["placement"]) == PLACEMENT and set(run["actions"]) == ACTIONS
        assert set(run["controller"]) == CONTROLLER
        assert set(run["workloads"]["perTier"]) == {"0", "1", "2", "3"}
        assert set(run["workloads"]["queueWaitSeconds"]) == {"p50", "p95", "p99"}
        assert set(run["workloads"]["jctSeconds"]) == {"p50", "p95"}
    for name in ("report.md", "site-kw.png", "queue-gpus.png", "tiers.png",
                 "kueue-jobs.json", "m2g-series.json", "m2g/decisions.parquet",
                 "m2g/lifecycle.parquet", "kueue/lifecycle.parquet", "kueue/decisions.csv"):
        assert (out / name).stat().st_size > 0, name


def test_report_invariants(twin: tuple[dict[str, Any], Path]) -> None:
    rep, _ = twin
    jobs = rep["trace"]["jobs"]
    assert jobs > 0
    for name, run in rep["runs"].items():
        g, w, p = run["grid"], run["workloads"], run["placement"]
        assert g["targetKw"] is not None and g["targetKw"] > 0, name
        event_s = 3600 / rep["timeScale"]
        assert 0 <= g["secondsAboveTargetAfterRamp"] <= g["secondsAboveTarget"] <= event_s + 2
        assert g["kwhAboveTarget"] >= 0 and g["maxRampKwPerSecond"] >= 0
        assert 0 < w["completed"] <= jobs, name
        for v in [w["weightedPerformance"], *w["perTier"].values()]:
            assert v is None or 0.0 <= v <= 1.0
        for tier, lost in w["performanceLostBy"].items():  # the parts add up to the loss
            assert w["perTier"][tier] is not None, (name, tier)
            assert abs(sum(lost.values()) - (1.0 - w["perTier"][tier])) <= 2e-3, (name, tier)
        q = w["queueWaitSeconds"]
        assert 0 <= q["p50"] <= q["p95"] <= q["p99"]
        assert 0 <= w["jctSeconds"]["p50"] <= w["jctSeconds"]["p95"]
        assert w["restarts"] <= w["preemptions"] and w["lostGpuSeconds"] >= 0
        assert p["inOneNvlinkDomainPct"] is None or 0 <= p["inOneNvlinkDomainPct"] <= 100
        assert p["onAlarmedRacks"] == 0  # dr-srp alarms no rack
        assert p["fragmentation"] >= 0 and p["topologyViolations"] >= 0
        assert 0 < run["gpuAllocationPctOutsideEvent"] <= 100
    kueue, m2g = rep["runs"]["kueue"], rep["runs"]["m2g"]
    assert set(kueue["actions"].values()) == {0}  # no m2g in plain Kueue's run
    assert all(v is None for v in kueue["controller"].values())
    assert m2g["actions"]["admits"] > 0  # every m2g workload passes m2g's check
    assert rep["trace"]["elasticJobs"] > 0  # the default mapping submits elastic jobs
    assert m2g["controller"]["rssPeakMiB"] > 0
    # where an admission's time goes (wall s): plain Kueue has no check to wait for, m2g has
    assert "quotaReservedToAdmitted" in kueue["workloads"]["admissionLatency"]
    assert "quotaReservedToCheckReady" not in kueue["workloads"]["admissionLatency"]
    for name, run in rep["runs"].items():
        for step in run["workloads"]["admissionLatency"].values():
            assert 0 <= step["p50"] <= step["p95"] and step["n"] > 0, name
    lat = m2g["workloads"]["admissionLatency"]
    assert {"quotaReservedToCheckReady", "checkReadyToAdmitted", "quotaReservedToDecided"} <= set(lat)


def test_each_run_has_a_decision_log_m2g_report_reads(twin: tuple[dict[str, Any], Path]) -> None:
    _, out = twin
    md = (out / "report.md").read_text()
    assert "## Decision logs" in md
    for run in ("kueue", "m2g"):
        res = subprocess.run([str(Path(sys.executable).parent / "m2g"), "report",
                              str(out / run), "-o", "json"],
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr[-2000:]
        s = json.loads(res.stdout)
        assert s["lifecycle"]["records"].get("admitted", 0) > 0, run
        assert s["lifecycle"]["records"].get("placed", 0) > 0, run
        assert s["lifecycle"]["records"].get("quota-reserved", 0) > 0, run
        assert len(s["events"]) == 1, run  # the dr-srp GridEvent (all its intervals)
        assert s["events"][0]["samples"] > 0, run
    m2g_log = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "m2g"), "report", str(out / "m2g"), "-o", "json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)
    assert any(k.startswith("Admission/") for k in m2g_log["actions"])
