"""The forecast scenario's figures (twinkit.forecast): m2g's forecast against the sampled draw,
as docs/twin-metrics.md "Forecast" defines them; the twin's site config in wall time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from twinkit import forecast as F
from twinkit import harness as H
from twinkit import scenarios as S

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def iso(s: float) -> str:
    return (T0 + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def fc(values: list[float], made: float = 10.0, step: float = 60.0) -> dict[str, object]:
    ivs = [{"start": iso(made + i * step), "end": iso(made + (i + 1) * step), "siteKw": v,
            "lowKw": v * 0.9, "highKw": v * 1.1, "committedKw": v / 2, "limitKw": None,
            "busyGpus": 10.0, "newWorkGpus": 5.0, "flexTier1Kw": v / 4, "flexTier2Kw": 0.0,
            "flexTier3Kw": 0.0} for i, v in enumerate(values)]
    return {"madeAt": iso(made), "intervalSeconds": step, "intervals": ivs,
            "calibrationKw": 3.0, "report": {"reportName": "x"}}


def test_mape_is_over_whole_intervals_against_the_mean_sampled_draw() -> None:
    # actual: 100 kW in the first interval, 200 in the second; the third is past the samples
    samples = [(float(t), 100.0 if t < 70 else 200.0) for t in range(10, 130, 2)]
    got = F.figures(fc([110.0, 150.0, 999.0]), samples, T0.timestamp(), 60.0)
    assert got is not None
    assert got["intervalsCompared"] == 2
    assert got["horizonHours"] == 2.0  # 2 × 60 wall s at time scale 60
    assert got["madeAtSeconds"] == 10.0
    assert [r["actualKw"] for r in got["intervals"]] == [100.0, 200.0]
    assert got["mapePct"] == pytest.approx((10 + 25) / 2)
    assert got["committedMapePct"] == pytest.approx((45 + 62.5) / 2)
    assert got["biasPct"] == pytest.approx((10 - 50) / 2 / 150 * 100, abs=0.01)
    assert got["nrmsePct"] == pytest.approx(((100 + 2500) / 2) ** 0.5 / 150 * 100, abs=0.01)
    assert got["bandCoveragePct"] == 50.0  # 100 in [99, 121]; 200 not in [135, 165]
    assert got["flexibleSharePct"] == 25.0
    assert got["report"] == {"reportName": "x"}


def test_no_whole_interval_no_figures() -> None:
    assert F.figures(fc([100.0]), [(12.0, 90.0), (20.0, 95.0)], T0.timestamp(), 60.0) is None


def test_the_twin_gives_m2g_its_default_runtime_in_wall_time(tmp_path: Path) -> None:
    tl = S.Timeline(S.Scenario.FORECAST, 180, 207, 17, 0.3)
    cfg = H.RunConfig("m2g", 2, None, tl, 60.0, 537, tmp_path, tmp_path)  # type: ignore[arg-type]
    doc = yaml.safe_load(H.site_config(cfg).read_text())
    assert doc["planner"]["defaultRuntimeSeconds"] == 60.0  # one trace hour at scale 60
    assert doc["planner"]["rampKwPerSecond"] == 50  # the rest is the shipped file's
    assert "restoreDuringEvents" not in doc["planner"]
    after = H.RunConfig("m2g-restore-after", 2, None, tl, 60.0, 537, tmp_path,  # type: ignore[arg-type]
                        tmp_path)
    assert yaml.safe_load(H.site_config(after).read_text())["planner"]["restoreDuringEvents"] \
        is False
    assert S.Scenario.FORECAST in S.GRID_SCENARIOS and H.SCENARIOS[S.Scenario.FORECAST].start


def test_a_saved_forecast_snapshot_is_rescored_against_the_same_draw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``m2g forecast --save-inputs`` writes the snapshot and configuration the forecast is
    made from; bench/forecast_rescore.py makes it again from them (with the model on the path)
    and scores it with the twin's figures against a run's samples: the same forecast, the
    same figures as the twin's report."""
    import json
    import pickle
    from types import SimpleNamespace

    import forecast_rescore
    from typer.testing import CliRunner

    from m2g_cli import forecast_cmd
    from m2g_cli.app import app
    from tests.unit.test_forecast import NOW, QUEUED, RUNNING, snap

    s = snap(RUNNING, QUEUED)
    monkeypatch.setattr(forecast_cmd, "_view", lambda *a, **k: SimpleNamespace(snapshot=s))
    monkeypatch.delenv("M2G_CONFIG", raising=False)
    saved = tmp_path / "inputs.pickle"
    got = CliRunner().invoke(app, ["forecast", "-o", "json", "--interval", "60", "--hours",
                                   "0.05", "--save-inputs", str(saved)])
    assert got.exit_code == 0, got.output
    made = json.loads(got.output)
    inputs = pickle.loads(saved.read_bytes())
    assert inputs["snapshot"] == s and inputs["config"].interval_seconds == 60
    t0 = NOW.timestamp() - 5.0  # the replay started 5 s before the forecast
    samples = [(float(t), 150.0) for t in range(5, 5 + 3 * 60, 2)]
    series = {"t0": t0, "timeScale": 60.0, "siteKw": samples, "driverSamples": []}
    again = forecast_rescore.rescore(inputs, series)
    direct = F.figures(made, samples, t0, 60.0, [])
    assert direct is not None
    assert again["intervalsCompared"] == direct["intervalsCompared"] == 3
    assert again["mapePct"] == direct["mapePct"] and again["biasPct"] == direct["biasPct"]
    assert again["forecastKw"] == [iv["siteKw"] for iv in made["intervals"]]


def test_the_committed_work_draw_is_the_draw_less_what_later_work_drew() -> None:
    """``committedWorkKw``: the sampled draw less what the jobs submitted after the forecast
    drew above idle over the interval (first bound pod → finish); the committed forecast is
    scored against it (``committedWorkMapePct``), and it against the draw (the floor)."""
    from m2g.model.inputs import WorkloadKind
    from m2g.planner.forecast import KIND_KW_PER_GPU, ForecastConfig

    samples = [(float(t), 100.0 if t < 70 else 200.0) for t in range(10, 130, 2)]
    above = KIND_KW_PER_GPU[WorkloadKind.TRAINING] - ForecastConfig().idle_kw_per_gpu
    jobs = [  # known at the forecast (submitted at 5 s): not subtracted
        {"submitted": 5.0, "bound": 6.0, "finished": None, "gpus": 8, "kind": "training"},
        # submitted after it: drawing from 100 s to the end of the second interval (half)
        {"submitted": 90.0, "bound": 100.0, "finished": None, "gpus": 10, "kind": "training"},
        # never bound: drew nothing
        {"submitted": 20.0, "bound": None, "finished": None, "gpus": 50, "kind": "training"}]
    got = F.figures(fc([110.0, 150.0, 999.0]), samples, T0.timestamp(), 60.0, None, jobs)
    assert got is not None
    work = [r["committedWorkKw"] for r in got["intervals"]]
    assert work == [100.0, pytest.approx(200.0 - 10 * above / 2, abs=0.05)]
    committed = [55.0, 75.0]  # the fixture's committedKw: half the forecast
    assert got["committedWorkMapePct"] == pytest.approx(
        sum(abs(c - w) / w * 100 for c, w in zip(committed, work, strict=True)) / 2, abs=0.01)
    assert got["committedFloorPct"] == pytest.approx((0 + (200 - work[1]) / 200 * 100) / 2,
                                                     abs=0.01)
    assert F.figures(fc([110.0, 150.0]), samples, T0.timestamp(), 60.0)["committedFloorPct"] \
        is None  # type: ignore[index]
