"""The day-ahead forecast (m2g.planner.forecast) and its renderers (m2g_cli.forecast_view)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g.model.cluster import ClusterSnapshot, FlavorQuota, Phase, QueueState, WorkloadState
from m2g.model.factory import FactorySnapshot, GridEvent, MaintenanceWindow, Node, Rack, Reading
from m2g.model.inputs import WorkloadKind, WorkloadView
from m2g.model.schedule import CapacityPlan, CapUnit, Reservation
from m2g.planner.config import PlannerConfig
from m2g.planner.curves import kind_curve
from m2g.planner.forecast import (
    KIND_KW_PER_GPU,
    ForecastConfig,
    NewWork,
    bind_lag,
    cap_fraction,
    forecast,
    pipeline,
    weighted_median,
)
from m2g.sim.power import PowerModel
from m2g_cli.app import app
from m2g_cli.forecast_view import ForecastOutput, plot, render
from tests.unit.goldens import golden

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
KW = KIND_KW_PER_GPU[WorkloadKind.TRAINING]
IDLE = 0.242
CFG = ForecastConfig(horizon_hours=6)


def factory(draw: float | None = None, events: tuple[GridEvent, ...] = ()) -> FactorySnapshot:
    nodes = tuple(Node(f"r{r}-n{i}", f"rack-{r}", clique=f"rack-{r}",
                       gpus_allocated=4 if r == 0 else 0) for r in range(2) for i in range(18))
    racks = tuple(Rack(f"rack-{r}", "b0", f"pd-{r}", clique=f"rack-{r}",
                       power_kw=Reading(None if draw is None else draw / 2, 1.0))
                  for r in range(2))
    return FactorySnapshot(now=NOW, racks=racks, nodes=nodes, grid_events=events)


def wl(name: str, phase: Phase, gpus: int, runtime: int, tier: int = 0, ago: float = 0,
       ns: str = "team") -> WorkloadState:
    view = WorkloadView(name=name, namespace=ns, gpus=gpus, expected_runtime_seconds=runtime,
                        flex_tier=tier, kind=WorkloadKind.TRAINING)
    return WorkloadState(ns, name, view, phase,
                         admitted_at=NOW - timedelta(seconds=ago) if phase is Phase.ADMITTED
                         else None)


RUNNING = wl("running", Phase.ADMITTED, 72, 3600, ago=1800)  # ends in 30 min
QUEUED = wl("queued", Phase.PENDING, 36, 7200, tier=2)


def snap(*ws: WorkloadState, f: FactorySnapshot | None = None,
         reservations: tuple[Reservation, ...] = (),
         plans: tuple[CapacityPlan, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(f or factory(), ws, placements={"team/running": tuple(
        f"r0-n{i}" for i in range(18))}, reservations=reservations, capacity_plans=plans)


def test_running_work_ends_and_the_queue_starts_in_admission_order() -> None:
    fc = forecast(snap(RUNNING, QUEUED), CFG)
    first, second, third = fc.intervals[:3]
    # hour 0: the running job half the hour, the queued one all of it, the rest idle
    assert first.site_kw == pytest.approx(72 * KW * 0.5 + 36 * KW + (144 - 36 - 36) * IDLE,
                                          abs=1e-3)
    assert first.busy_gpus == pytest.approx(72)
    assert second.site_kw == pytest.approx(36 * KW + 108 * IDLE, abs=1e-3)
    assert third.site_kw == pytest.approx(144 * IDLE, abs=1e-3)  # all done after 2 h
    assert first.flex_kw == {1: 0.0, 2: pytest.approx(36 * KW, abs=1e-3), 3: 0.0}
    # domains: the running job on rack-0 (pd-0); the queued one and idle spread over both
    assert first.domains["pd-0"] > first.domains["pd-1"]
    assert sum(first.domains.values()) == pytest.approx(first.site_kw, abs=1e-2)
    for i in fc.intervals:
        assert i.low_kw <= i.site_kw <= i.high_kw
    assert fc.intervals[1].low_kw < fc.intervals[1].high_kw  # runtimes uncertain: a band


def test_a_fresh_site_reading_calibrates_an_offset() -> None:
    modelled = 72 * KW + 72 * IDLE
    fc = forecast(snap(RUNNING, f=factory(draw=modelled + 10.0)), CFG)
    assert fc.calibration_kw == pytest.approx(10.0, abs=1e-3)
    plain = forecast(snap(RUNNING), CFG)
    assert fc.intervals[3].site_kw == pytest.approx(plain.intervals[3].site_kw + 10, abs=1e-3)


def test_queued_work_waits_for_room() -> None:
    big = wl("big", Phase.PENDING, 144, 3600)
    fc = forecast(snap(RUNNING, big), CFG)
    # 144 GPUs fit only once the running job has ended: from hour 1 to 2
    assert [round(i.busy_gpus) for i in fc.intervals[:3]] == [36, 144, 0]


def test_a_proposed_window_shows_its_effect() -> None:
    win = MaintenanceWindow("mw", NOW, NOW + timedelta(hours=3), racks=("rack-1",))
    base = forecast(snap(RUNNING, wl("w", Phase.PENDING, 72, 3600)), CFG)
    moved = forecast(snap(RUNNING, wl("w", Phase.PENDING, 72, 3600)), CFG,
                     extra_windows=(win,))
    # without the window the 72-GPU job runs at once on rack-1; with it, only after the
    # running job frees rack-0 (hour 1)
    assert [round(i.busy_gpus) for i in base.intervals[:3]] == [108, 0, 0]
    assert [round(i.busy_gpus) for i in moved.intervals[:3]] == [36, 72, 0]


def test_limits_cap_the_site_and_report_what_is_shed() -> None:
    ev = GridEvent("dr", NOW + timedelta(hours=1), NOW + timedelta(hours=2), target_kw=40.0)
    long = wl("long", Phase.ADMITTED, 72, 4 * 3600, tier=2, ago=0)
    fc = forecast(snap(long, f=factory(events=(ev,))), CFG)
    assert fc.intervals[0].limit_kw is None and fc.intervals[1].limit_kw == 40.0
    assert fc.intervals[1].site_kw == 40.0
    assert fc.intervals[1].shed_kw == pytest.approx(72 * KW + 72 * IDLE - 40, abs=1e-3)
    # m2g sheds flexible work only: tier-0 work keeps the site above the limit
    firm = forecast(snap(wl("firm", Phase.ADMITTED, 72, 4 * 3600, ago=0),
                         f=factory(events=(ev,))), CFG)
    assert firm.intervals[1].site_kw == pytest.approx(72 * KW + 72 * IDLE, abs=1e-3)
    assert firm.intervals[1].shed_kw == 0.0
    plan = CapacityPlan("p", NOW, 3600, (-1, 36), CapUnit.GPUS)
    capped = forecast(snap(wl("a", Phase.PENDING, 36, 7200), wl("b", Phase.PENDING, 72, 3600),
                           plans=(plan,)), CFG)
    assert [round(i.busy_gpus) for i in capped.intervals[:3]] == [108, 36, 0]


def test_named_workloads_start_at_their_reservation() -> None:
    r = Reservation("big", NOW + timedelta(hours=2), NOW + timedelta(hours=4), cliques=1,
                    workloads=("ml/job",))
    fc = forecast(snap(wl("job", Phase.PENDING, 72, 3600, ns="ml"), reservations=(r,)), CFG)
    assert [round(i.busy_gpus) for i in fc.intervals[:4]] == [0, 0, 72, 0]
    # other long work is kept off the held clique: only 72 GPUs for it while the hold lasts
    other = forecast(snap(wl("long", Phase.PENDING, 144, 6 * 3600), reservations=(r,)), CFG)
    assert round(other.intervals[0].busy_gpus) == 0


def test_kind_profiles_are_the_simulators() -> None:
    model = PowerModel()
    for kind, kw in KIND_KW_PER_GPU.items():
        assert kw == pytest.approx(model.gpu_watts(kind) / 1000, abs=1e-3), kind
    assert pytest.approx(model.idle_w / 1000) == IDLE


def _fixed() -> tuple[object, object]:
    win = MaintenanceWindow("mw", NOW + timedelta(hours=1), NOW + timedelta(hours=3),
                            racks=("rack-1",))
    s = snap(RUNNING, QUEUED, wl("later", Phase.PENDING, 72, 5400, tier=1),
             f=factory(draw=120.0, events=(GridEvent("dr", NOW + timedelta(hours=3),
                                                     NOW + timedelta(hours=4),
                                                     target_kw=60.0),)))
    return forecast(s, CFG), forecast(s, CFG, extra_windows=(win,))


@pytest.mark.parametrize("fmt", list(ForecastOutput))
def test_golden_output(fmt: ForecastOutput) -> None:
    fc, other = _fixed()
    golden(f"forecast_{fmt.value}.txt", render(fc, fmt, other))  # type: ignore[arg-type]
    if fmt is ForecastOutput.JSON:
        data = json.loads(render(fc, fmt))  # type: ignore[arg-type]
        assert [r["resourceName"] for r in data["report"]["resources"]] == ["site", "pd-0",
                                                                            "pd-1"]


def test_png(tmp_path: Path) -> None:
    fc, other = _fixed()
    plot(fc, tmp_path / "f.png", other)  # type: ignore[arg-type]
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_a_bad_window_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("kind: MaintenanceWindow\nmetadata: {name: x}\nspec: {start: soon}\n")
    got = CliRunner().invoke(app, ["forecast", "--with-window", str(bad)])
    assert got.exit_code == 2 and "--with-window" in got.output and "Traceback" not in got.output


@pytest.mark.parametrize("spec", [
    "{start: '2026-11-30T14:00:00Z', end: '2026-11-30T18:00:00Z', scope: all}",
    "{start: '2026-11-30T14:00:00Z', end: '2026-11-30T18:00:00Z', scope: [r1]}",
    "{start: '2026-11-30T14:00:00Z', end: '2026-11-30T18:00:00Z', scope: {racks: 5}}",
    "[1]", "x"])
def test_a_window_field_of_the_wrong_type_is_one_line(tmp_path: Path, spec: str) -> None:
    """Nineteenth session probe: ``scope: all``, ``spec: [1]``, ``racks: 5`` raised
    AttributeError / TypeError out of ``m2g forecast --with-window``."""
    bad = tmp_path / "w.yaml"
    bad.write_text(f"kind: MaintenanceWindow\nmetadata: {{name: x}}\nspec: {spec}\n")
    got = CliRunner().invoke(app, ["forecast", "--with-window", str(bad)])
    assert got.exit_code == 2 and "--with-window" in got.output, got.output
    assert isinstance(got.exception, SystemExit)


def test_a_png_path_that_cannot_be_written_is_refused_before_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--png DIR`` (or a missing folder) raised out of savefig after the whole forecast."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    for png in (tmp_path, tmp_path / "missing" / "f.png"):
        got = CliRunner().invoke(app, ["forecast", "--png", str(png)])
        assert got.exit_code == 2 and "--png" in got.output and "existing folder" in got.output
        assert isinstance(got.exception, SystemExit)


def test_a_horizon_of_too_many_intervals_is_refused_before_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hours 168 --interval 10`` (60,480 intervals) took 284 s and 1.4 GB at 40 racks."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    got = CliRunner().invoke(app, ["forecast", "--hours", "168", "--interval", "10"])
    assert got.exit_code == 2 and "60,480 intervals; at most 2,016" in got.output
    ok = CliRunner().invoke(app, ["forecast", "--hours", "168", "--interval", "300"])
    assert ok.exit_code == 1  # a week at 5 min is allowed: it ends at the missing kubeconfig


def test_new_work_persists_the_gpu_level_held_now() -> None:
    """PERSIST: the GPUs the committed work leaves free are taken by new work at the kW per GPU
    and tier mix of the work running now; NONE (the default) forecasts committed work."""
    flex = wl("flex", Phase.ADMITTED, 36, 7200, tier=2, ago=0)  # ends in 2 h
    s = snap(RUNNING, flex)
    committed = forecast(s, CFG)
    persist = forecast(s, ForecastConfig(horizon_hours=6, new_work=NewWork.PERSIST))
    level = 72 + 36  # the GPUs running now
    for c, p in zip(committed.intervals, persist.intervals, strict=True):
        assert c.new_work_gpus == 0.0 and c.committed_kw == pytest.approx(c.site_kw, abs=1e-3)
        assert p.committed_kw == pytest.approx(c.site_kw, abs=1e-3)
        assert p.busy_gpus == pytest.approx(level, abs=1e-2)
        assert p.site_kw == pytest.approx(level * KW + (144 - level) * IDLE, abs=1e-2)
        assert p.new_work_gpus == pytest.approx(level - c.busy_gpus, abs=1e-2)
    # hour 3: all committed work is done; new work's flexible kW follows the mix (tier 2: 1/3)
    assert committed.intervals[3].busy_gpus == 0
    assert persist.intervals[3].flex_kw[2] == pytest.approx(level * KW / 3, abs=1e-2)
    # the bands: the new work's level ∓ 15 %
    assert persist.intervals[3].low_kw < persist.intervals[3].site_kw \
        < persist.intervals[3].high_kw


def test_the_new_work_band_widens_when_few_jobs_hold_the_level() -> None:
    """The bands' new-work level spreads by ``new_work_spread`` and, root sum of squares, by
    ``new_work_count_spread`` / sqrt(jobs holding the level now): one job's level is a noisier
    reading of demand than eighteen jobs' (bench/forecast_heldout.py: the band covered 45-58 %
    of held-out hours with the flat 15 %)."""
    cfg = ForecastConfig(horizon_hours=3, new_work=NewWork.PERSIST)
    one = snap(wl("one", Phase.ADMITTED, 72, 3600, ago=1800))
    many = snap(*(wl(f"m{i}", Phase.ADMITTED, 4, 3600, ago=1800) for i in range(18)))
    late_one, late_many = forecast(one, cfg).intervals[2], forecast(many, cfg).intervals[2]
    # hour 2: only new work runs, 72 GPUs in both; the band is the level's spread (the high
    # run: its GPUs at kW × 1.05, the central run's 72 GPUs 5 % more)
    assert late_one.site_kw == pytest.approx(late_many.site_kw, abs=1e-3)
    more_gpu = KW * 1.05 - IDLE
    more_kw = 0.05 * 72 * KW
    spread_many = math.hypot(0.15, 2.0 / math.sqrt(18))  # 0.49
    assert late_many.high_kw - late_many.site_kw == pytest.approx(
        72 * spread_many * more_gpu + more_kw, abs=0.05)
    # one job: 72 × (1 + 2.0) GPUs, held to the 144 healthy ones; low: no new work at all
    assert late_one.high_kw - late_one.site_kw == pytest.approx(72 * more_gpu + more_kw,
                                                                abs=0.05)
    assert late_one.low_kw == pytest.approx(144 * IDLE, abs=1e-2)
    assert late_many.low_kw > 144 * IDLE + 20
    # without the count term: the flat 15 %, whoever holds the level
    flat = forecast(many, replace(cfg, new_work_count_spread=0.0)).intervals[2]
    assert flat.high_kw - flat.site_kw == pytest.approx(72 * 0.15 * more_gpu + more_kw,
                                                        abs=0.05)


def test_new_work_keeps_off_a_maintenance_window() -> None:
    win = MaintenanceWindow("w", NOW + timedelta(hours=3), NOW + timedelta(hours=4),
                            racks=("rack-1",))
    cfg = ForecastConfig(horizon_hours=6, new_work=NewWork.PERSIST)
    flex = wl("flex", Phase.ADMITTED, 36, 7200, tier=2, ago=0)
    fc = forecast(snap(RUNNING, flex), cfg, extra_windows=(win,))
    assert fc.intervals[3].busy_gpus == pytest.approx(72, abs=1e-2)  # one rack left
    assert fc.intervals[4].busy_gpus == pytest.approx(108, abs=1e-2)


def test_queued_work_waits_for_its_cluster_queues_quota() -> None:
    q = QueueState("research", (FlavorQuota("gb200", "nvidia.com/gpu", 40, 40),), used_gpus=0)
    a = replace(wl("a", Phase.PENDING, 36, 7200), cluster_queue="research")
    b = replace(wl("b", Phase.PENDING, 36, 3600), cluster_queue="research")
    fc = forecast(replace(snap(a, b), queues=(q,)), CFG)
    assert [round(i.busy_gpus) for i in fc.intervals[:3]] == [36, 36, 36]  # one at a time
    free = forecast(snap(a, b), CFG)
    assert [round(i.busy_gpus) for i in free.intervals[:3]] == [72, 36, 0]


def test_an_overrun_is_a_quarter_of_the_default_runtime() -> None:
    late = wl("late", Phase.ADMITTED, 72, 600, ago=3000)  # expected end 40 min ago
    cfg = ForecastConfig(horizon_hours=2, interval_seconds=600, default_runtime_seconds=2400)
    fc = forecast(snap(late), cfg)
    assert fc.intervals[0].busy_gpus == pytest.approx(72)  # ends within 600 s
    assert fc.intervals[1].busy_gpus == pytest.approx(0)


def test_admitted_work_whose_pods_do_not_run_yet_draws_after_the_bind_lag() -> None:
    """The nodes hold 72 GPUs (rack-0) of 144 admitted: the two most recently admitted jobs
    wait for their pods; the older of them has waited 600 s, so each draws 600 s after its
    admission, and its runtime starts then."""
    late = wl("late", Phase.ADMITTED, 36, 3600, ago=600)
    later = wl("later", Phase.ADMITTED, 36, 3600, ago=60)
    s = snap(RUNNING, late, later)
    lag, unbound = bind_lag(s, 72)
    assert lag == timedelta(seconds=600) and unbound == {"team/late", "team/later"}
    fc = forecast(s, ForecastConfig(horizon_hours=1, interval_seconds=600))
    assert fc.intervals[0].busy_gpus == pytest.approx(72 + 36 + 36 * 60 / 600, abs=1e-2)
    assert fc.intervals[1].busy_gpus == pytest.approx(72 + 36 + 36, abs=1e-2)
    # the calibration counts only the GPUs that draw now (72 of RUNNING's, idle elsewhere)
    cal = forecast(snap(RUNNING, late, later, f=factory(draw=72 * KW + 72 * IDLE + 5.0)),
                   ForecastConfig(horizon_hours=1, interval_seconds=600))
    assert cal.calibration_kw == pytest.approx(5.0, abs=1e-2)
    assert bind_lag(snap(RUNNING), 72) == (timedelta(0), frozenset())


# ---- following m2g: limits per time step, the levers' reach, the planner's pacing, the bind
# pipeline and new work (issue 13, docs/forecast.md "Model")

FLEX2 = wl("flex2", Phase.ADMITTED, 72, 4 * 3600, tier=2)  # on rack-0's 72 allocated GPUs
FULL = 72 * KW + 72 * IDLE  # the site with it running, no calibration


def _event(start: float, end: float, kw: float, level: int = 0) -> GridEvent:
    return GridEvent("dr", NOW + timedelta(seconds=start), NOW + timedelta(seconds=end),
                     target_kw=kw, level=level)


def _fast(**knobs: float) -> PlannerConfig:
    """Sheds that show at once (no settle, an unbounded ramp, no Retry hold), unless set."""
    base: dict[str, float] = {"settle_seconds": 0.0, "ramp_kw_per_second": 1e6,
                              "max_retry_hold_seconds": 0}
    base.update(knobs)
    return PlannerConfig(**base)  # type: ignore[arg-type]


def test_a_limit_starting_inside_an_interval_holds_only_that_part() -> None:
    """An event from 1 h 30 min: hour 1 is limited half of the time (before: all of it,
    from the limit at the interval's middle)."""
    ev = _event(5400, 3 * 3600, 80.0)
    fc = forecast(snap(FLEX2, f=factory(events=(ev,))),
                  ForecastConfig(horizon_hours=4, planner=_fast()))
    assert fc.intervals[0].site_kw == pytest.approx(FULL, abs=1e-3)
    assert fc.intervals[1].site_kw == pytest.approx((FULL + 80.0) / 2, abs=1e-3)
    assert fc.intervals[1].shed_kw == pytest.approx((FULL - 80.0) / 2, abs=1e-3)
    assert fc.intervals[1].limit_kw == 80.0
    assert fc.intervals[2].site_kw == pytest.approx(80.0, abs=1e-3)
    # after it, the held job comes back gradually: its own 4 h left (R) are the time constant
    assert fc.intervals[3].site_kw == pytest.approx(
        FULL - (FULL - 80.0) * 4 * (1 - math.exp(-0.25)), abs=1e-3)


def test_pausing_saves_the_kw_above_idle_and_tier_1_is_only_capped() -> None:
    """A limit below what the levers reach: a paused job's GPUs keep drawing idle; tier 1 is
    not paused outside a level-3 event, only capped within its flex allowance; tier 0 is
    never touched."""
    ev = (_event(0, 3600, 10.0),)
    cfg = ForecastConfig(horizon_hours=1, planner=_fast())
    paused = forecast(snap(FLEX2, f=factory(events=ev)), cfg)
    assert paused.intervals[0].site_kw == pytest.approx(144 * IDLE, abs=1e-3)
    tier1 = wl("flex2", Phase.ADMITTED, 72, 4 * 3600, tier=1)
    capped = forecast(snap(tier1, f=factory(events=ev)), cfg)
    curve = kind_curve(WorkloadKind.TRAINING)
    rate = 0.10 * 4 * 3600 / 3600  # its 10 % over a 4 h life, spent over the 1 h event
    deepest = min(c for c in PlannerConfig().cap_levels if 1 - curve.throughput(c) <= rate)
    assert 0.0 < 1 - curve.power(deepest) < KW - IDLE
    assert capped.intervals[0].site_kw == pytest.approx(
        FULL - 72 * KW * (1 - curve.power(deepest)), abs=1e-3)
    emergency = forecast(snap(tier1, f=factory(events=(_event(0, 3600, 10.0, level=3),))),
                         cfg)
    assert emergency.intervals[0].site_kw == pytest.approx(144 * IDLE, abs=1e-3)
    firm = forecast(snap(replace(FLEX2, view=FLEX2.view.model_copy(update={"flex_tier": 0})),
                         f=factory(events=ev)), cfg)
    assert firm.intervals[0].site_kw == pytest.approx(FULL, abs=1e-3)


def test_a_cap_reaches_what_the_flex_allowance_pays_for_over_the_limit() -> None:
    kind = WorkloadKind.TRAINING
    planner = PlannerConfig()
    assert cap_fraction(kind, 0, 36000, 3600, planner) == 0.0
    short = cap_fraction(kind, 1, 3600, 3600, planner)  # 10 % over the limit itself
    long = cap_fraction(kind, 1, 36000, 3600, planner)  # its life spent over a short limit
    assert 0.0 < short < long
    assert long == pytest.approx(1 - kind_curve(kind).power(min(planner.cap_levels)))


def test_sheds_show_after_the_settle_time_and_follow_the_ramp() -> None:
    """One-minute intervals (a compressed replay): a shed decided at the event's start shows
    in the draw shed_show_seconds later (at most settle_seconds); at a slow ramp it takes
    longer still."""
    ev = (_event(60, 600, 80.0),)
    cfg = ForecastConfig(horizon_hours=4 / 60, interval_seconds=60)
    s = snap(FLEX2, f=factory(events=ev))
    now = forecast(s, replace(cfg, planner=_fast()))
    assert [round(i.site_kw, 3) for i in now.intervals] == [round(FULL, 3), 80.0, 80.0, 80.0]
    late = forecast(s, replace(cfg, planner=_fast(settle_seconds=60), shed_show_seconds=60))
    assert late.intervals[1].site_kw == pytest.approx(FULL, abs=1e-3)
    assert late.intervals[2].site_kw == pytest.approx(80.0, abs=1e-3)
    # the default: it shows 15 s after (a quarter of that minute), not the 60 s settle time
    soon = forecast(s, replace(cfg, planner=_fast(settle_seconds=60)))
    assert soon.intervals[1].site_kw == pytest.approx(FULL - (FULL - 80.0) * 0.75, abs=1e-3)
    # capped at the settle time: m2g decides again after it whatever the meter shows
    capped = forecast(s, replace(cfg, planner=_fast(settle_seconds=0), shed_show_seconds=60))
    assert capped.intervals[1].site_kw == pytest.approx(80.0, abs=1e-3)
    slow = forecast(s, replace(cfg, planner=_fast(ramp_kw_per_second=0.1)))  # 6 kW a minute
    assert FULL - 6.0 < slow.intervals[1].site_kw < FULL
    assert slow.intervals[3].site_kw > 80.0


def test_held_work_draws_again_after_the_lag_and_half_the_retry_hold() -> None:
    """While a limit is in force, what m2g no longer needs to hold comes back only once it is
    asked again (half the Retry hold on average) and bound again (the pipeline's lag: none
    here): a second, higher limit follows the first at 120 s."""
    ev = (_event(60, 120, 80.0), _event(120, 240, 100.0))
    cfg = ForecastConfig(horizon_hours=4 / 60, interval_seconds=60)
    s = snap(FLEX2, f=factory(events=ev))
    at_once = forecast(s, replace(cfg, planner=_fast()))
    assert [round(i.site_kw, 3) for i in at_once.intervals] == [round(FULL, 3), 80.0, 100.0,
                                                                  100.0]
    held = forecast(s, replace(cfg, planner=_fast(max_retry_hold_seconds=60)))
    assert held.intervals[1].site_kw == pytest.approx(80.0, abs=1e-3)
    assert held.intervals[2].site_kw == pytest.approx((80.0 + 100.0) / 2, abs=1e-3)
    assert held.intervals[3].site_kw == pytest.approx(100.0, abs=1e-3)


def test_queued_work_refills_gradually_after_a_grid_event() -> None:
    """After the event, the work m2g held comes back gradually, not at once: 1 − exp(−t /
    (R + L)) of it t seconds after the event's end, R the running work's GPU-weighted median
    remaining runtime (600 s here), L the admission → drawing lag (0 here: every admitted
    GPU is bound). The model before stepped back to the full draw in the next minute."""
    ending = wl("flex2", Phase.ADMITTED, 72, 3600, tier=2, ago=3000)  # 600 s left
    cfg = ForecastConfig(horizon_hours=5 / 60, interval_seconds=60, planner=_fast())
    fc = forecast(snap(ending, f=factory(events=(_event(0, 60, 80.0),))), cfg)
    site = [i.site_kw for i in fc.intervals]
    assert site[0] == pytest.approx(80.0, abs=1e-3)
    for k in range(1, 5):  # the minute [k - 1, k) after the end: the mean of exp(−t / 600)
        still = 600 / 60 * (math.exp(-(k - 1) * 60 / 600) - math.exp(-k * 60 / 600))
        assert site[k] == pytest.approx(FULL - (FULL - 80.0) * still, abs=1e-3)
        assert fc.intervals[k].shed_kw == pytest.approx((FULL - 80.0) * still, abs=1e-3)
    assert site[1] < site[2] < site[3] < site[4] < FULL - 20.0  # 27 % back 4 min after
    assert any("time constant of 600 s" in n for n in fc.notes)
    # L: admitted work whose pods are not bound yet (36 GPUs admitted 30 s ago, none bound
    # since) makes it slower by the lag it reads
    late = wl("late", Phase.ADMITTED, 36, 600, ago=30)
    lagged = forecast(snap(ending, late, f=factory(events=(_event(0, 60, 80.0),))), cfg)
    assert any("time constant of 630 s" in n and "drawing 30 s" in n for n in lagged.notes)


def test_the_refill_follows_the_median_remaining_runtime_not_a_few_long_jobs() -> None:
    """R is the GPU-weighted median remaining runtime, not the mean: remaining runtimes are
    heavy-tailed, and the refill follows the many short jobs that end first. Two 36-GPU jobs
    with 600 s left and one 16-GPU job with 7 h left: the median is 600 s (the mean, 5,073 s,
    the model before, refilled 8.5 times slower). Weighted by GPUs, not by job: two 8-GPU
    jobs with 600 s left do not outvote a 72-GPU job with 7 h left."""
    cfg = ForecastConfig(horizon_hours=5 / 60, interval_seconds=60, planner=_fast())
    # every admitted GPU bound (88 of them): no lag
    ev = replace(_allocated(88), grid_events=(_event(0, 60, 80.0),))

    def refill(*ws: WorkloadState) -> list[float]:
        fc = forecast(replace(snap(*ws), factory=ev), cfg)
        return [float(n.split("time constant of ")[1].split(" s")[0])
                for n in fc.notes if "time constant of" in n]

    short = [wl(f"short{i}", Phase.ADMITTED, 36, 3600, tier=2, ago=3000) for i in range(2)]
    long = wl("long", Phase.ADMITTED, 16, 8 * 3600, tier=2, ago=3600)  # 25,200 s left
    assert refill(*short, long) == [600.0]
    small = [wl(f"small{i}", Phase.ADMITTED, 8, 3600, tier=2, ago=3000) for i in range(2)]
    big = wl("big", Phase.ADMITTED, 72, 8 * 3600, tier=2, ago=3600)
    assert refill(*small, big) == [25200.0]


def test_weighted_median() -> None:
    assert weighted_median([]) == 0.0
    assert weighted_median([(5.0, 0.0)]) == 0.0
    assert weighted_median([(10.0, 1.0), (1.0, 1.0), (100.0, 1.0)]) == 10.0
    assert weighted_median([(1.0, 1.0), (100.0, 3.0)]) == 100.0
    assert weighted_median([(1.0, 2.0), (100.0, 2.0)]) == 1.0  # the lower at an exact half


def _allocated(gpus: int) -> FactorySnapshot:
    nodes = tuple(Node(f"r{r}-n{i}", f"rack-{r}", clique=f"rack-{r}",
                       gpus_allocated=4 if r * 18 + i < gpus // 4 else 0)
                  for r in range(2) for i in range(18))
    racks = tuple(Rack(f"rack-{r}", "b0", f"pd-{r}", clique=f"rack-{r}") for r in range(2))
    return FactorySnapshot(now=NOW, racks=racks, nodes=nodes)


def test_the_bind_rate_paces_the_work_not_running_yet() -> None:
    """Of the work admitted in the last settle_max_seconds (300 s), the nodes hold a's 36 GPUs,
    admitted in the 100 s before the oldest waiting job (b, 100 s ago): 0.36 GPU/s. The two
    jobs still waiting draw in admission order at that rate, 100 s and 200 s from now, not as
    soon as they have waited as long as the oldest (100 s)."""
    a = wl("a", Phase.ADMITTED, 36, 3600, ago=200)
    b = wl("b", Phase.ADMITTED, 36, 3600, ago=100)
    c = wl("c", Phase.ADMITTED, 36, 3600, ago=50)
    s = replace(snap(RUNNING, a, b, c), factory=_allocated(108))
    pipe = pipeline(s, 108, 300)
    assert pipe.rate == pytest.approx(36 / 100)
    assert pipe.draw_at == {"team/b": NOW + timedelta(seconds=100),
                            "team/c": NOW + timedelta(seconds=200)}
    assert pipe.lag == timedelta(seconds=(200 + 250) / 2)
    fc = forecast(s, ForecastConfig(horizon_hours=1 / 6, interval_seconds=200))
    assert [round(i.busy_gpus) for i in fc.intervals[:3]] == [126, 180, 180]
    # nothing bound in the window: the lower bound of bind_lag, as before
    assert pipeline(s, 72, 300).rate is None


def test_the_bind_rate_is_not_charged_the_wait_of_a_burst_just_admitted() -> None:
    """A burst: 20 jobs of 36 GPUs admitted one a second, 40 s to 21 s ago; the nodes hold
    the first two (72 GPUs: bound in the last few seconds, after the pipeline's dead time).
    They were taken in over the 2 s before the oldest waiting job's admission: 36 GPU/s, so
    the other 648 GPUs draw within 18 s — not over the 40 s since the burst began (1.8 GPU/s,
    360 s): the time the waiting work has already waited is not the pipeline's throughput."""
    burst = [wl(f"j{i:02}", Phase.ADMITTED, 36, 3600, ago=40 - i) for i in range(20)]
    s = ClusterSnapshot(factory(), tuple(burst))
    pipe = pipeline(s, 72, 300)
    assert pipe.rate == pytest.approx(72 / 2)
    assert max(pipe.draw_at.values()) == NOW + timedelta(seconds=648 / 36)
    assert len(pipe.draw_at) == 18


def test_new_work_draws_on_the_share_its_runtime_leaves_after_the_lag() -> None:
    """No pod bound yet: the admitted job has waited 120 s (the lag). New work holds its GPUs
    that long before each of its jobs draws: with the queue's runtime of 360 s, 360 / 480 of
    the GPUs it holds draw."""
    a = wl("a", Phase.ADMITTED, 72, 600, ago=120)
    q = wl("q", Phase.PENDING, 36, 360)
    cfg = ForecastConfig(horizon_hours=2, new_work=NewWork.PERSIST)
    fc = forecast(replace(snap(a, q), factory=_allocated(0)), cfg)
    late = fc.intervals[1]  # both have ended: new work only
    assert late.new_work_gpus == pytest.approx(72, abs=1e-2)
    assert late.busy_gpus == pytest.approx(72 * 360 / 480, abs=1e-2)
    assert late.site_kw == pytest.approx(54 * KW + (144 - 54) * IDLE, abs=1e-2)


def test_new_work_takes_the_queues_mix() -> None:
    """The work running now is tier 0; what waits (what arrives next) is tier-2 data
    processing: new work has its kW per GPU and tier."""
    q = replace(wl("q", Phase.PENDING, 36, 7200, tier=2),
                view=wl("q", Phase.PENDING, 36, 7200, tier=2).view.model_copy(
                    update={"kind": WorkloadKind.DATA_PROCESSING}))
    cfg = ForecastConfig(horizon_hours=3, new_work=NewWork.PERSIST)
    fc = forecast(snap(RUNNING, q), cfg)
    per_gpu = KIND_KW_PER_GPU[WorkloadKind.DATA_PROCESSING]
    late = fc.intervals[1]  # RUNNING has ended; q runs; new work takes RUNNING's 72 GPUs
    assert late.new_work_gpus == pytest.approx(72 - 36, abs=1e-2)
    assert late.flex_kw[2] == pytest.approx(72 * per_gpu, abs=1e-2)


def test_tier_1_queued_work_is_held_during_a_grid_event_not_under_a_plan() -> None:
    """m2g's admission holds back flex >= 2 under a limit (headroom_min_tier), and flex 1 too
    while a grid event is active (headroom_event_min_tier): a kW CapacityPlan alone lets
    tier 1 start."""
    cfg = ForecastConfig(horizon_hours=1, planner=_fast())
    ev = factory(events=(_event(0, 7200, 10.0),))
    one = wl("one", Phase.PENDING, 36, 3600, tier=1)
    assert forecast(snap(one, f=ev), cfg).intervals[0].busy_gpus == 0
    plan = (CapacityPlan("p", NOW, 7200, (10.0,), CapUnit.KW),)
    assert forecast(snap(one, plans=plan), cfg).intervals[0].busy_gpus == pytest.approx(36)
    two = wl("two", Phase.PENDING, 36, 3600, tier=2)
    assert forecast(snap(two, plans=plan), cfg).intervals[0].busy_gpus == 0
    # headroomEventMinTier 2 (the site's choice): tier 1 is firm work during the event, held
    # only beyond what m2g can free (nothing runs here: held), else it starts
    loose = ForecastConfig(horizon_hours=1, planner=_fast(headroom_event_min_tier=2))
    assert forecast(snap(one, f=ev), loose).intervals[0].busy_gpus == 0
    looser = ForecastConfig(horizon_hours=1, planner=_fast(headroom_event_min_tier=2,
                                                           hold_firm_beyond_reach=False))
    assert forecast(snap(one, f=ev), looser).intervals[0].busy_gpus == pytest.approx(36)


def test_firm_work_waits_in_an_event_for_room_m2g_can_make() -> None:
    """As m2g's firm gate (hold_firm_beyond_reach): during a grid event queued firm work
    starts while the limit plus what pausing the running flexible work saves covers it; a kW
    CapacityPlan alone does not hold firm work; new firm work counts in what m2g can hold
    back during an event (the reach), not outside one."""
    cfg = ForecastConfig(horizon_hours=1, planner=_fast())
    firm = wl("firm", Phase.PENDING, 36, 3600, tier=0)
    kw = 36 * KIND_KW_PER_GPU[WorkloadKind.UNSPECIFIED]
    assert forecast(snap(firm, f=factory(events=(_event(0, 7200, 10.0),))),
                    cfg).intervals[0].busy_gpus == 0
    assert forecast(snap(firm, f=factory(events=(_event(0, 7200, kw + 1),))),
                    cfg).intervals[0].busy_gpus == pytest.approx(36)
    # under the limit with a flexible job running whose pause frees enough: the firm job
    # starts; the same job firm (nothing to pause): it waits
    flex = wl("flex", Phase.ADMITTED, 72, 7200, tier=2, ago=60)
    ev = factory(events=(_event(0, 7200, 100.0),))
    assert forecast(snap(firm, flex, f=ev), cfg).intervals[0].busy_gpus == pytest.approx(108)
    fixed = replace(flex, view=flex.view.model_copy(update={"flex_tier": 0}))
    assert forecast(snap(firm, fixed, f=ev), cfg).intervals[0].busy_gpus == pytest.approx(72)
    plan = (CapacityPlan("p", NOW, 7200, (10.0,), CapUnit.KW),)
    assert forecast(snap(firm, plans=plan), cfg).intervals[0].busy_gpus == pytest.approx(36)
    off = ForecastConfig(horizon_hours=1, planner=_fast(hold_firm_beyond_reach=False))
    assert forecast(snap(firm, f=factory(events=(_event(0, 7200, 10.0),))),
                    off).intervals[0].busy_gpus == pytest.approx(36)


def test_new_firm_work_is_in_the_reach_only_under_the_firm_gate() -> None:
    t0 = wl("t0", Phase.ADMITTED, 72, 3600, tier=0, ago=1800)
    ev = factory(events=(_event(0, 7200, 10.0),))
    held = forecast(snap(t0, f=ev), ForecastConfig(horizon_hours=2, new_work=NewWork.PERSIST,
                                                   planner=_fast())).intervals[1]
    free = forecast(snap(t0, f=ev), ForecastConfig(
        horizon_hours=2, new_work=NewWork.PERSIST,
        planner=_fast(hold_firm_beyond_reach=False))).intervals[1]
    assert free.shed_kw == 0.0
    assert held.shed_kw > 0.0 and held.site_kw < free.site_kw


def test_new_flex_1_work_is_held_back_during_a_grid_event() -> None:
    """New work takes the GPUs a tier-1 job leaves after 30 min. During a grid event m2g's
    admission holds new tier-1 work back (it saves its kW above idle); under a kW plan alone
    tier 1 is only capped, within its flex allowance."""
    t1 = wl("t1", Phase.ADMITTED, 72, 3600, tier=1, ago=1800)
    cfg = ForecastConfig(horizon_hours=2, new_work=NewWork.PERSIST, planner=_fast())
    held = forecast(snap(t1, f=factory(events=(_event(0, 7200, 10.0),))), cfg).intervals[1]
    assert held.new_work_gpus == pytest.approx(72, abs=1e-2)
    assert held.site_kw == pytest.approx(144 * IDLE, abs=1e-2)
    plan = (CapacityPlan("p", NOW, 7200, (10.0,), CapUnit.KW),)
    capped = forecast(snap(t1, plans=plan), cfg).intervals[1]
    assert 144 * IDLE + 1.0 < capped.site_kw < FULL




def test_paused_work_comes_back_before_new_firm_work_in_an_event() -> None:
    """As m2g's gate (restore_before_firm, on by default): while work m2g paused for a grid
    event waits to come back, new firm work starts only in the room under the limit beyond
    that work's kW. The model before started it whenever pausing the running flexible work
    made room for it (firm work first), as m2g does with restoreBeforeFirm: false."""
    firm = wl("firm", Phase.PENDING, 36, 3600, tier=0)
    flex = wl("flex", Phase.ADMITTED, 72, 7200, tier=2, ago=60)
    ev = factory(events=(_event(0, 7200, 70.0),))  # the flexible job (96 kW) is paused
    cfg = ForecastConfig(horizon_hours=1, planner=_fast())
    assert forecast(snap(firm, flex, f=ev), cfg).intervals[0].busy_gpus == pytest.approx(72)
    for knob in ("restore_before_firm", "restore_during_events"):
        before = replace(cfg, planner=replace(cfg.planner, **{knob: False}))
        assert forecast(snap(firm, flex, f=ev), before).intervals[0].busy_gpus == \
            pytest.approx(108)
    # a forecast made during the event: a flex-2 job m2g paused waits in the queue beside a
    # firm job, room under the limit for one of them: the paused one comes back (before: the
    # firm job started, and the paused one waited)
    paused = replace(wl("paused", Phase.INACTIVE, 36, 3600, tier=2), shed_by_m2g=True)
    ev = factory(events=(_event(0, 7200, 50.0),))
    now = forecast(snap(firm, paused, f=ev), cfg).intervals[0]
    assert now.flex_kw[2] == pytest.approx(36 * KW, abs=1e-3)
    assert now.busy_gpus == pytest.approx(36)
    before = forecast(snap(firm, paused, f=ev), replace(cfg, planner=_fast(
        restore_before_firm=False))).intervals[0]
    assert before.flex_kw[2] == 0.0 and before.busy_gpus == pytest.approx(36)
    # work drained for maintenance is not paused work: the firm job is not held for it
    drained = replace(paused, drained_for="maintenance/w")
    assert forecast(snap(firm, drained, f=ev), cfg).intervals[0].flex_kw[2] == 0.0


def test_work_held_at_admission_comes_back_as_a_restore_after_a_grid_event() -> None:
    """What m2g holds when the event ends is not all paused work: with paused work coming
    back first (restore_before_firm), the work paused at the end is at most the admitted
    work's kW over the limit, and the rest was held back at admission — new work, which
    Kueue asks m2g for again within the Retry hold and binds after the lag, not at the pace
    of the running work's remaining runtime (R + L). Here a flex-2 job ends a minute into a
    two-minute event and new flex-2 work (persistence) takes its GPUs, held back at
    admission: after the event it comes back at once (no lag, no Retry hold), half a minute
    after with a 60 s hold. The model before refilled it in 1 − exp(−t / 60 s) (R: the job's
    60 s left), as it still does when paused work does not come first."""
    ending = wl("ending", Phase.ADMITTED, 72, 3600, tier=2, ago=3540)  # 60 s left
    ev = factory(events=(_event(0, 120, 80.0),))
    cfg = ForecastConfig(horizon_hours=4 / 60, interval_seconds=60, new_work=NewWork.PERSIST,
                         planner=_fast())
    held = FULL - 80.0  # new work at full, less the limit: held back at admission
    site = [i.site_kw for i in forecast(snap(ending, f=ev), cfg).intervals]
    assert site[1] == pytest.approx(80.0, abs=1e-3)
    assert site[2] == pytest.approx(FULL, abs=1e-3)
    hold = replace(cfg, planner=_fast(max_retry_hold_seconds=60))
    assert forecast(snap(ending, f=ev), hold).intervals[2].site_kw == pytest.approx(
        FULL - held / 2, abs=1e-3)
    gradual = FULL - held * (1 - math.exp(-1))  # the mean of exp(−t / 60) over a minute
    for knob in ("restore_before_firm", "restore_during_events", "hold_firm_beyond_reach"):
        before = replace(cfg, planner=_fast(**{knob: False}))
        assert forecast(snap(ending, f=ev), before).intervals[2].site_kw == pytest.approx(
            gradual, abs=1e-3)
