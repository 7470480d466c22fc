"""The day-ahead forecast: site and power-domain kW per interval for the next hours, with
uncertainty bands and the flexible kW of each flex tier. Pure (no I/O, no clock): it reads the
same ClusterSnapshot the controller decides on.

Model, per interval of ``interval_seconds`` from ``now``:

* **running work** draws its kW (``m2g.io/estimated-kw``, else GPUs × the kind's kW per GPU,
  ``kw_per_gpu``) until its expected end: admission + expected runtime
  (``m2g.io/expected-runtime-seconds``, else ``default_runtime_seconds``); work already past
  its expected end is taken to end within ``overrun_seconds``;
* **the bind pipeline** (``pipeline``): the admitted GPUs the nodes do not hold yet are the
  most recently admitted workloads'; the GPUs the nodes bound of the work admitted within the
  planner's ``settle_max_seconds`` give the bind rate, and the waiting workloads draw — and
  their runtimes start — in admission order at that rate (no rate known: each after as long
  as the oldest has waited). Their mean admission → drawing time is the ``lag`` that work
  admitted from now waits too;
* **the queue** is started in admission order (priority, then longest wait) at the first
  interval start with room: healthy GPUs, less maintenance windows' nodes, less what
  reservations hold (a reservation's named workloads start at its start), less a GPU
  CapacityPlan's cap; it draws after the lag; the tiers m2g's admission holds back
  (``gate_tier``: the headroom gate's ``headroom_min_tier``, and ``headroom_event_min_tier``
  while a grid event is active) are not started into a kW CapacityPlan or grid limit they
  would exceed; during a grid event firm work is held as m2g's gate holds it (``_FirmGate``:
  beyond what pausing the running flexible work frees, and while work m2g paused waits to come
  back, beyond the room under the limit that work leaves — paused work first);
* **idle GPUs** draw ``idle_kw_per_gpu``; a fresh site reading calibrates a constant offset
  (the measured draw less the model's at ``now``: the trays' CPUs, NICs, switches; at ``now``
  admitted work draws only on the GPUs its pods hold: the nodes' allocated GPUs);
* **limits** (a grid event's kW limit, a kW CapacityPlan), per time step (``substeps`` per
  interval: a limit may start or end inside one), as m2g meets them (``_pace``, with the
  planner's settings, ``planner``): it wants off what the site draws above the limit, at most
  what its levers reach — pausing the tiers from ``shed_min_tier`` (tier 1 too in a level-3
  event) saves their kW less the idle kW their GPUs keep drawing, capping the other flexible
  tiers what their flex allowance pays for over the limit's length (``cap_fraction``), new
  work of the gated tiers held at admission (what a pause saves), tier 0 nothing —; it moves
  at its ramp, a shed shows ``shed_show_seconds`` after it is decided; while a limit is in
  force, a restore shows the lag plus half the Retry hold after (held work is asked, admitted
  and bound again); once the limits lift, the work m2g paused comes back gradually, 1 −
  exp(−t / (R + L)) of it t seconds after (``refill_seconds``: R the running work's
  GPU-weighted median remaining runtime, as the room held work needs frees up; L the
  pipeline's lag), and the work its admission held back as a restore does (``_Refill``; with
  paused work first, ``restore_before_firm``, the paused work at the lift is at most the
  admitted work's kW over the limit). The mean kW held down is ``shedKw``;
* **bands**: ``low``/``high`` rerun the model with runtimes × (1 ∓ ``runtime_spread``) and kW ×
  (1 ∓ ``kw_spread``) (unknown runtimes: ``unknown_runtime_spread``);
* **flexible kW**: per flex tier (1-3), the kW of that tier's running work (what could be shed
  or deferred), central run;
* **new work** (``new_work``): work not yet submitted. ``NONE``: none (the forecast is the
  committed work only, ``committed_kw``); ``PERSIST``: the site keeps the GPU level it holds
  now (running work plus what the queue starts at ``now``, at most the interval's room), the
  GPUs that committed work leaves free are taken by new work (a persistence forecast of
  demand) with the kW per GPU and flex-tier mix of the queue's work (what arrives next; the
  work held now when nothing waits). Each of its jobs holds its GPUs for the lag before it
  draws: of the GPUs it holds, R / (R + lag) draw (``_draw_share``; R: the queue's GPU-weighted
  mean expected runtime).

Domains: a workload's kW goes to the power domains of the nodes it is on (placements), else in
proportion to the GPUs allocated per domain at ``now`` (queued work: to healthy GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import MaintenanceWindow
from m2g.model.inputs import WorkloadKind
from m2g.model.labels import GPU_RESOURCE
from m2g.model.schedule import CapUnit, Reservation
from m2g.planner.config import PlannerConfig
from m2g.planner.curves import kind_curve
from m2g.planner.reservations import owns

K = WorkloadKind
#: kW per GPU by workload kind, at full duty uncapped: m2g.sim.power's GB300 model (the same
#: numbers the simulator and the twin draw; tests/unit/test_forecast.py checks they agree).
KIND_KW_PER_GPU: Mapping[WorkloadKind, float] = {
    K.UNSPECIFIED: 1.3375, K.TRAINING: 1.3375, K.FINE_TUNING: 1.2058, K.INFERENCE: 1.2893,
    K.BATCH: 1.3375, K.BENCHMARK: 1.38, K.DATA_PROCESSING: 0.6451, K.AGENTIC: 0.958}


class NewWork(StrEnum):
    """What the forecast assumes of work not yet submitted."""

    NONE = "none"  # nothing: the committed work only
    PERSIST = "persist"  # new work keeps the site at the GPU level it holds now


@dataclass(frozen=True)
class ForecastConfig:
    """Knobs of the forecast (docs/forecast.md)."""

    horizon_hours: float = 24.0
    interval_seconds: int = 3600
    kw_per_gpu: Mapping[WorkloadKind, float] = field(default_factory=lambda: KIND_KW_PER_GPU)
    idle_kw_per_gpu: float = 0.242
    default_runtime_seconds: float = 3600.0
    overrun_seconds: float | None = None  # None: a quarter of default_runtime_seconds
    runtime_spread: float = 0.2
    unknown_runtime_spread: float = 0.5
    kw_spread: float = 0.05
    reservation_lead_seconds: float = 3600.0
    new_work: NewWork = NewWork.NONE
    new_work_spread: float = 0.15  # the bands: the new work's GPU level × (1 ∓ this)
    #: … combined (root sum of squares) with this over the square root of the number of
    #: jobs that hold the level now: a level held by few jobs is a noisy reading of demand
    new_work_count_spread: float = 2.0
    #: The planner's knobs the forecast follows m2g by (its pacing: ``ramp_kw_per_second``,
    #: ``settle_seconds``, ``max_retry_hold_seconds``, ``settle_max_seconds``; its levers:
    #: ``shed_saving_fraction``, ``cap_levels``, ``flex_allowance``, ``headroom_min_tier``,
    #: ``cap_horizon_seconds``): the site configuration's, as the controller decides with.
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    #: The lowest flex tier m2g pauses for a grid limit (the shipped checkpoint-preemption:
    #: tier 1 only in a level-3 emergency, then this less one); tiers below it are only capped.
    shed_min_tier: int = 2
    #: Seconds after m2g decides a shed that it shows in the site's draw (at most the planner's
    #: ``settle_seconds``, which bounds how long m2g waits for it): pods stop within seconds of
    #: their deactivation; caps act at the agents' next pass. Measured in a 16-rack twin event
    #: (2026-12-04): −300 kW 10 s after the first caps, −550 kW by 20 s.
    shed_show_seconds: float = 15.0
    #: Time steps per interval for limits and m2g's pacing (a limit starting or ending inside
    #: an interval, the delay before sheds show, the restore after it).
    substeps: int = 20

    @property
    def overrun(self) -> float:
        if self.overrun_seconds is not None:
            return self.overrun_seconds
        return self.default_runtime_seconds / 4


@dataclass(frozen=True)
class Interval:
    """One interval of the forecast (kW are means over the interval)."""

    start: datetime
    end: datetime
    site_kw: float
    low_kw: float
    high_kw: float
    busy_gpus: float
    limit_kw: float | None = None
    shed_kw: float = 0.0
    domains: Mapping[str, float] = field(default_factory=dict)
    flex_kw: Mapping[int, float] = field(default_factory=dict)
    committed_kw: float | None = None  # the site's kW from submitted work only (new work: 0)
    new_work_gpus: float = 0.0  # GPUs the forecast gives to work not yet submitted


@dataclass(frozen=True)
class Forecast:
    made_at: datetime
    site: str
    interval_seconds: int
    intervals: tuple[Interval, ...]
    calibration_kw: float = 0.0
    notes: tuple[str, ...] = ()


@dataclass
class _Job:
    key: str
    gpus: int
    kw: float
    tier: int
    start: datetime
    end: datetime
    domains: Mapping[str, float]  # domain → share
    queue: str = ""  # its ClusterQueue
    draw_from: datetime | None = None  # admitted, its pods bound (drawing) from then
    cap_kw: float = 0.0  # what m2g's caps can take off it (its flex allowance, cap ladder)

    @property
    def drawing(self) -> datetime:
        return self.start if self.draw_from is None else max(self.start, self.draw_from)


def _runtime(w: WorkloadState, cfg: ForecastConfig, scale: float) -> float:
    known = w.view.expected_runtime_seconds
    base = float(known or cfg.default_runtime_seconds)
    if scale == 1.0:
        return base
    spread = cfg.runtime_spread if known else cfg.unknown_runtime_spread
    return base * (1 + (spread if scale > 1 else -spread))


def job_kw(w: WorkloadState, cfg: ForecastConfig) -> float:
    """A workload's draw when running: its estimate, else GPUs × its kind's kW per GPU."""
    per_gpu = cfg.kw_per_gpu.get(w.view.kind, cfg.kw_per_gpu.get(K.UNSPECIFIED, 1.34))
    return w.view.estimated_kw or w.view.gpus * per_gpu


def cap_fraction(kind: WorkloadKind, tier: int, runtime: float, horizon: float,
                 planner: PlannerConfig) -> float:
    """The share of a job's kW m2g's power caps can take off it for a limit lasting
    ``horizon`` seconds (m2g.planner.curtail): the deepest of ``cap_levels`` whose throughput
    loss its tier's flex allowance pays for, the allowance being an average over the job's
    life (at least the horizon) spent over the horizon; its kind's measured curve."""
    if tier <= 0 or horizon <= 0:
        return 0.0
    allowance = planner.flex_allowance[min(tier, len(planner.flex_allowance) - 1)]
    rate = allowance * max(runtime, horizon) / horizon
    curve = kind_curve(kind)
    saved = [1.0 - curve.power(c) for c in planner.cap_levels
             if 1.0 - curve.throughput(c) <= rate + 1e-9]
    return max(0.0, max(saved, default=0.0))


@dataclass(frozen=True)
class Pipeline:
    """How fast admitted work starts drawing here, learned from one snapshot (``pipeline``).

    ``lag``: admission → drawing for work admitted from now (the queue, new work, work m2g
    restores); ``draw_at``: when each admitted workload whose pods are not bound yet is
    expected to draw; ``rate``: the GPUs per second the nodes bound lately (None: unknown)."""

    lag: timedelta = timedelta(0)
    draw_at: Mapping[str, datetime] = field(default_factory=dict)
    rate: float | None = None

    @property
    def unbound(self) -> frozenset[str]:
        return frozenset(self.draw_at)


def pipeline(snap: ClusterSnapshot, allocated: float, window_seconds: float) -> Pipeline:
    """The bind pipeline from this snapshot. The admitted GPUs the nodes do not hold yet are
    the most recently admitted workloads' (pods bind in admission order). Of the work admitted
    within ``window_seconds`` (the planner's ``settle_max_seconds``), the GPUs the nodes hold
    were admitted between the oldest such admission and the oldest waiting workload's: GPUs
    over that span are the bind rate (in flow, the pipeline takes work in as fast as it binds
    it; a steady backlog of lag L gives the admission rate, not (span − L) / span of it, and a
    burst's start is not charged the time its waiting work has waited); the waiting workloads
    bind in admission order at that rate (each draws when the GPUs before it and its own are
    bound), and ``lag`` is their mean (GPU-weighted) admission → drawing time. No bound work in
    the window (no rate): every waiting workload waits as long as the oldest has so far (a
    lower bound)."""
    lag, unbound = bind_lag(snap, allocated)
    if not unbound:
        return Pipeline()
    now = snap.now
    waiting = sorted((w for w in snap.workloads if w.key in unbound),
                     key=lambda w: (w.admitted_at or now, w.key))
    since = now - timedelta(seconds=window_seconds)
    recent = [w for w in snap.workloads if w.phase is Phase.ADMITTED
              and (w.admitted_at or now) >= since]
    bound = sum(w.view.gpus for w in recent) - sum(w.view.gpus for w in waiting)
    first = min((w.admitted_at or now for w in recent), default=now)
    # the bound GPUs were admitted before the oldest waiting workload (admission order): the
    # pipeline took them in over that span, as fast as it binds when in flow; counting to now
    # would charge the time the waiting work has already waited to the rate (a burst's start)
    span = ((waiting[0].admitted_at or now) - first).total_seconds()
    if bound <= 0 or span <= 0:
        return Pipeline(lag, {w.key: max(now, (w.admitted_at or now) + lag) for w in waiting})
    rate = bound / span
    draw_at: dict[str, datetime] = {}
    cum = total = weighted = 0.0
    for w in waiting:
        cum += w.view.gpus
        at = now + timedelta(seconds=cum / rate)
        draw_at[w.key] = at
        weighted += w.view.gpus * (at - (w.admitted_at or now)).total_seconds()
        total += w.view.gpus
    mean = timedelta(seconds=weighted / total) if total else lag
    return Pipeline(max(lag, mean), draw_at, rate)


class _Site:
    """What the simulation needs of the factory, computed once."""

    def __init__(self, snap: ClusterSnapshot, windows: tuple[MaintenanceWindow, ...],
                 cfg: ForecastConfig) -> None:
        f = snap.factory
        self.pd_of_rack = {r.name: r.power_domain or "" for r in f.racks}
        self.pd_of_node = {n.name: self.pd_of_rack.get(n.rack, "") for n in f.nodes}
        self.nodes = [n for n in f.nodes if n.healthy_gpus > 0]
        self.healthy = sum(n.healthy_gpus for n in self.nodes)
        self.windows = windows
        alloc: dict[str, float] = {}
        healthy: dict[str, float] = {}
        for n in f.nodes:
            pd = self.pd_of_node[n.name]
            alloc[pd] = alloc.get(pd, 0.0) + n.gpus_allocated
            healthy[pd] = healthy.get(pd, 0.0) + n.healthy_gpus
        self.alloc_share = _shares(alloc) or _shares(healthy)
        self.allocated = sum(alloc.values())  # GPUs held by bound pods now
        self.healthy_share = _shares(healthy)
        self.healthy_by_pd = healthy
        self.pipe = pipeline(snap, self.allocated, cfg.planner.settle_max_seconds)
        self.draw_share = _draw_share(snap, cfg, self.pipe.lag)
        self.limit_seconds = cfg.planner.cap_horizon_seconds  # set by forecast(): episodes

    def covered_gpus(self, t0: datetime, t1: datetime) -> int:
        down = {n.name: n.healthy_gpus for w in self.windows if w.start < t1 and t0 < w.end
                for n in self.nodes if w.covers(n)}
        return sum(down.values())

    def placed(self, nodes: Iterable[str]) -> dict[str, float]:
        got: dict[str, float] = {}
        for name in nodes:
            pd = self.pd_of_node.get(name)
            if pd is not None:
                got[pd] = got.get(pd, 0.0) + 1.0
        return _shares(got)


def _draw_share(snap: ClusterSnapshot, cfg: ForecastConfig, lag: timedelta) -> float:
    """The share of the GPUs new work holds that draw: each of its jobs holds its GPUs for the
    pipeline's lag before it draws, then for its runtime; with the GPU-weighted mean runtime
    R of the queue's work (what arrives next; else of the admitted work) and the lag L, R / (R
    + L) of them draw at any time (1 without a lag)."""
    wait = lag.total_seconds()
    if wait <= 0:
        return 1.0
    sample = _queue(snap) or [w for w in snap.workloads if w.phase is Phase.ADMITTED]
    gpus = sum(w.view.gpus for w in sample)
    if gpus <= 0:
        return 1.0
    mean = sum(w.view.gpus * float(w.view.expected_runtime_seconds
                                   or cfg.default_runtime_seconds) for w in sample) / gpus
    return mean / (mean + wait) if mean > 0 else 1.0


def _shares(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items() if v > 0} if total > 0 else {}


@dataclass(frozen=True)
class _Limit:
    """The lowest site kW limit in force at one moment, the lowest tier m2g pauses for it, and
    the lowest tier of new work its admission holds back while the site is over it
    (``gate_tier``: m2g.planner.headroom.min_tier)."""

    kw: float
    pause_tier: int
    gate_tier: int = 2
    #: A grid event is active and m2g holds firm work it cannot make room for
    #: (``hold_firm_beyond_reach``, m2g.planner.headroom): new firm work is held back too
    #: once pausing the running flexible work would not make room for it.
    firm: bool = False


def gate_tier(snap: ClusterSnapshot, t: datetime, planner: PlannerConfig) -> int:
    """The lowest flex tier m2g's admission holds back at ``t`` (m2g.planner.headroom.min_tier
    at that moment): ``headroom_min_tier``, one lower from SIMPLE level 2 of a grid event
    active then, and at most ``headroom_event_min_tier`` while one is (new flex-1 work too)."""
    events = [e for e in snap.factory.grid_events if e.start <= t < e.end]
    if not events:
        return planner.headroom_min_tier
    level = max(e.level for e in events)
    tier = max(1, planner.headroom_min_tier - 1) if level >= 2 else planner.headroom_min_tier
    return min(tier, planner.headroom_event_min_tier)


def _limit_at(snap: ClusterSnapshot, t: datetime, pause_tier: int,
              planner: PlannerConfig) -> _Limit | None:
    events = [e for e in snap.factory.grid_events if e.start <= t < e.end and e.target() > 0]
    limits = [e.target() for e in events]
    limits += [v for p in snap.capacity_plans if p.unit is CapUnit.KW and p.domain in (
        "", snap.factory.site) and (v := p.at(t)) is not None]
    if not limits:
        return None
    severe = any(e.level >= 3 for e in snap.factory.grid_events if e.start <= t < e.end)
    firm = bool(events) and planner.hold_firm_beyond_reach
    return _Limit(min(limits), max(1, pause_tier - 1) if severe else pause_tier,
                  gate_tier(snap, t, planner), firm)


def _limit(snap: ClusterSnapshot, t0: datetime, t1: datetime,
           planner: PlannerConfig) -> _Limit | None:
    """The lowest site kW limit in force at the interval's middle (grid events, kW plans)."""
    return _limit_at(snap, t0 + (t1 - t0) / 2, 1, planner)


def forecast(snap: ClusterSnapshot, cfg: ForecastConfig | None = None, *,
             extra_windows: tuple[MaintenanceWindow, ...] = ()) -> Forecast:
    """The forecast from ``snap`` (``extra_windows``: proposed maintenance windows)."""
    cfg = cfg or ForecastConfig()
    windows = snap.factory.maintenance + extra_windows
    site = _Site(snap, windows, cfg)
    n = max(1, math.ceil(cfg.horizon_hours * 3600 / cfg.interval_seconds))
    bounds = [snap.now + timedelta(seconds=cfg.interval_seconds * i) for i in range(n + 1)]
    steps = max(1, cfg.substeps)
    dt = cfg.interval_seconds / steps
    limits = [[_limit_at(snap, bounds[i] + timedelta(seconds=dt * (k + 0.5)), cfg.shed_min_tier,
                         cfg.planner) for k in range(steps)] for i in range(n)]
    site.limit_seconds = _longest_episode(limits, dt) or cfg.planner.cap_horizon_seconds
    central = _run(snap, cfg, site, bounds, 1.0, 1.0)
    low = _run(snap, cfg, site, bounds, 0.99, 1 - cfg.kw_spread)
    high = _run(snap, cfg, site, bounds, 1.01, 1 + cfg.kw_spread)
    draw = snap.factory.site_draw_kw()
    offset, notes = 0.0, []
    if not draw.stale and draw.value is not None:
        offset = draw.value - central.kw_at_now
        notes.append(f"calibrated on the site draw {draw.value:.1f} kW: {offset:+.1f} kW "
                     "outside the GPU model")
    else:
        notes.append("site draw stale or missing: no calibration (GPU model only)")
    if site.pipe.unbound:
        notes.append(f"{len(site.pipe.unbound)} admitted workload(s) not running yet: "
                     f"admission → drawing {site.pipe.lag.total_seconds():.0f} s; new work "
                     f"draws on {site.draw_share:.0%} of the GPUs it holds")
    refill = refill_seconds(central, site)
    if any(lim is not None for row in limits for lim in row):
        lag = site.pipe.lag.total_seconds()
        notes.append(f"after a limit, paused work refills with a time constant of {refill:.0f} "
                     f"s (the running work's median remaining runtime {refill - lag:.0f} s + "
                     f"admission → drawing {lag:.0f} s); work held back at admission comes "
                     f"back {lag + cfg.planner.max_retry_hold_seconds / 2:.0f} s after")
    sheds = _pace(cfg, central, limits, site.pipe.lag, offset, refill)
    out: list[Interval] = []
    for i in range(n):
        shed = sheds[i]
        c = central.site[i] + offset - shed
        lo = min(low.site[i] + offset - shed, c)
        hi = max(high.site[i] + offset - shed, c)
        in_force = [lim.kw for lim in limits[i] if lim is not None]
        limit = min(in_force) if in_force else None
        doms = {d: round(max(0.0, v + offset * site.healthy_share.get(d, 0.0)
                             - shed * site.healthy_share.get(d, 0.0)), 3)
                for d, v in sorted(central.domains[i].items()) if d}
        committed = min(central.committed[i] + offset, c)
        out.append(Interval(bounds[i], bounds[i + 1], round(max(0.0, c), 3),
                            round(max(0.0, lo), 3), round(max(0.0, hi), 3),
                            round(central.busy[i], 2), limit, round(shed, 3), doms,
                            {t: round(central.flex[i].get(t, 0.0), 3) for t in (1, 2, 3)},
                            round(max(0.0, committed), 3), round(central.new_gpus[i], 2)))
    return Forecast(snap.now, snap.factory.site, cfg.interval_seconds, tuple(out),
                    round(offset, 3), tuple(notes))


def _longest_episode(limits: list[list[_Limit | None]], dt: float) -> float:
    """The longest stretch with a limit in force, seconds (0: none)."""
    best = run = 0
    for row in limits:
        for lim in row:
            run = run + 1 if lim is not None else 0
            best = max(best, run)
    return best * dt


def refill_seconds(run: _Run, site: _Site) -> float:
    """The time constant of the refill after a limit lifts: R + L, R the GPU-weighted median
    remaining runtime of the admitted work at ``now`` (``run.remaining_seconds``, worked out
    with its jobs; the room the work m2g held needs back frees up as it ends: Kueue re-admits
    held work into whole cliques, not into the scattered GPUs a pause left), L the pipeline's
    lag (admission → drawing). The median, not the mean: remaining runtimes are heavy-tailed,
    and a few long jobs holding many GPUs would set a mean far longer than the refill takes
    (it follows the many short jobs that end first)."""
    return run.remaining_seconds + site.pipe.lag.total_seconds()


def weighted_median(values: Iterable[tuple[float, float]]) -> float:
    """The weighted median of (value, weight) pairs: the smallest value at or below which at
    least half the total weight lies (0 when there is no weight)."""
    pairs = sorted((v, w) for v, w in values if w > 0)
    half = sum(w for _, w in pairs) / 2
    seen = 0.0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    return 0.0


def _pace(cfg: ForecastConfig, run: _Run, limits: list[list[_Limit | None]],
          lag: timedelta, offset: float, refill: float = 0.0) -> list[float]:
    """The mean kW m2g holds down in each interval for the limits, as m2g does it.

    In each time step (``substeps`` per interval) the kW m2g wants off the site are what it
    draws above the limit in force then, at most what its levers reach (``_Run.reach``:
    pausing the tiers it pauses saves their kW less the idle kW their GPUs keep drawing — the
    planner's ``shed_saving_fraction`` —, capping the others what their flex allowance pays
    for, tier 0 nothing). m2g moves towards that at its ramp (``ramp_kw_per_second``, both
    ways); a shed shows in the site's draw ``shed_show_seconds`` (at most ``settle_seconds``)
    after it is decided (the pods stop, the caps act); while a limit is in force, a restore
    only after the pipeline's ``lag`` plus, on average, half of ``max_retry_hold_seconds``
    (held work is asked again, admitted again and bound again): kW decided off stay off in
    the draw until then. Once no limit is in force, what m2g held when the last one lifted
    comes back (``_Refill``): the work it paused gradually, 1 − exp(−t / ``refill``) of it t
    seconds after (means over each time step; ``refill``: ``refill_seconds``, 0 = at once);
    the work its admission held back as a restore does, the lag plus half the Retry hold
    after. Under a grid event where paused work comes back first (``restore_before_firm``,
    ``restore_during_events``, ``hold_firm_beyond_reach``) the paused work at the lift is at
    most the admitted work's kW over the limit (``committed``), the rest was held back at
    admission; otherwise all of it is taken as paused."""
    p = cfg.planner
    steps = max(1, cfg.substeps)
    dt = cfg.interval_seconds / steps
    shed_delay = max(0, round(min(cfg.shed_show_seconds, p.settle_seconds) / dt))
    back_delay = max(0, round((lag.total_seconds() + p.max_retry_hold_seconds / 2) / dt)
                     - shed_delay)
    step_kw = p.ramp_kw_per_second * dt
    decided: list[float] = []
    shown: list[float] = []
    out: list[float] = []
    first = p.restore_before_firm and p.restore_during_events
    lift = _Refill(refill, lag.total_seconds() + p.max_retry_hold_seconds / 2, dt)
    for i, row in enumerate(limits):
        c = run.site[i] + offset
        total = 0.0
        firm = any(lim is not None and lim.firm for lim in row)
        for lim in row:
            want = 0.0
            if lim is not None:
                want = min(max(0.0, c - lim.kw),
                           run.reach(i, lim.pause_tier, lim.gate_tier, lim.firm))
            prev = decided[-1] if decided else 0.0
            decided.append(prev + max(-step_kw, min(step_kw, want - prev)))
            j = len(decided) - 1 - shed_delay
            shown.append(decided[j] if j >= 0 else 0.0)
            if lim is not None:
                held = max(shown[max(0, len(shown) - 1 - back_delay):])
                paused = held if not (first and lim.firm) else min(
                    held, max(0.0, run.committed[i] + offset - lim.kw))
                lift.hold(held, paused)
            else:  # the limit lifted: held work comes back (``_Refill``)
                held = lift.next()
            total += min(held, run.reach(i, 1, None, firm))  # what the levers hold
        out.append(total / steps)
    return out


@dataclass
class _Refill:
    """What m2g holds after the last limit lifted, time step by time step (``_pace``): of
    ``paused`` kW (work m2g paused), 1 − exp(−t / ``refill``) are back t s after the lift
    (the mean over each step; ``refill`` 0: at once); the rest (work m2g's admission held
    back) comes back ``asked`` s after (asked again, admitted and bound: as a restore)."""

    refill: float
    asked: float
    dt: float
    held: float = 0.0  # kW held when the last limit lifted
    paused: float = 0.0  # of which work m2g paused
    since: int = 0  # time steps since the lift

    def hold(self, held: float, paused: float) -> None:
        """A step with a limit in force: ``held`` kW held, ``paused`` kW of it paused."""
        self.held, self.paused, self.since = held, min(held, paused), 0

    def next(self) -> float:
        """The mean kW still held in the next step after the lift."""
        k, dt, r = self.since, self.dt, self.refill
        self.since += 1
        slow = 0.0 if r <= 0 else r / dt * (math.exp(-k * dt / r) - math.exp(-(k + 1) * dt / r))
        fast = min(1.0, max(0.0, (self.asked - k * dt) / dt))  # share of the step still held
        return self.paused * slow + (self.held - self.paused) * fast


@dataclass
class _Run:
    site: list[float]
    busy: list[float]
    domains: list[dict[str, float]]
    flex: list[dict[int, float]]
    kw_at_now: float
    committed: list[float] = field(default_factory=list)
    new_gpus: list[float] = field(default_factory=list)
    capped: list[dict[int, float]] = field(default_factory=list)  # kW caps reach, per tier
    paused: list[dict[int, float]] = field(default_factory=list)  # kW pauses reach, per tier
    #: the same of new work alone (in ``capped`` and ``paused`` too): what holding it back at
    #: admission would save, and what caps would
    new_capped: list[dict[int, float]] = field(default_factory=list)
    new_paused: list[dict[int, float]] = field(default_factory=list)
    #: the admitted work's GPU-weighted median remaining runtime at ``now`` (``refill_seconds``)
    remaining_seconds: float = 0.0

    def reach(self, i: int, pause_tier: int, gate_tier: int | None = None,
              firm: bool = False) -> float:
        """kW m2g's levers take off interval ``i``: the tiers from ``pause_tier`` paused
        (their kW less the idle kW their GPUs keep drawing), the flexible ones below it
        capped — except new work of the tiers from ``gate_tier``, which m2g's admission holds
        back (it saves what pausing would); running tier-0 work is never touched, and new
        tier-0 work is held back only under ``firm`` (an active grid event m2g cannot meet
        otherwise: ``hold_firm_beyond_reach``)."""
        gate = pause_tier if gate_tier is None else max(1, gate_tier)
        out = self.new_paused[i].get(0, 0.0) if firm and self.new_paused else 0.0
        for t in self.flex[i]:
            if t <= 0:
                continue
            if t >= pause_tier:
                out += self.paused[i].get(t, 0.0)
                continue
            out += self.capped[i].get(t, 0.0)
            if t >= gate and self.new_paused:
                out += self.new_paused[i].get(t, 0.0) - self.new_capped[i].get(t, 0.0)
        return out


@dataclass(frozen=True)
class _NewWork:
    """Work not yet submitted (NewWork.PERSIST): the GPU level the site holds at ``now``, and
    the kW per GPU, the kW share per flex tier and the share of each tier's kW caps reach of
    the work it holds then; ``draw_share``: of the GPUs it holds, the share that draws."""

    level: float = 0.0
    kw_per_gpu: float = 0.0
    tier_share: Mapping[int, float] = field(default_factory=dict)
    cap_share: Mapping[int, float] = field(default_factory=dict)
    draw_share: float = 1.0

    @staticmethod
    def of(jobs: list[_Job], t: datetime, scale: float = 1.0, draw_share: float = 1.0,
           sample: list[_Job] | None = None) -> _NewWork:
        """The level of ``jobs`` alive at ``t``; the mix of ``sample`` (the queue's work: what
        arrives next — the work held now over-represents long jobs), else of those jobs."""
        alive = [j for j in jobs if j.start <= t < j.end]
        gpus = sum(j.gpus for j in alive)
        mix = [j for j in sample or () if j.gpus > 0] or alive
        mix_gpus = sum(j.gpus for j in mix)
        kw = sum(j.kw for j in mix)
        if gpus <= 0 or kw <= 0 or mix_gpus <= 0:
            return _NewWork()
        tiers: dict[int, float] = {}
        caps: dict[int, float] = {}
        for j in mix:
            tiers[j.tier] = tiers.get(j.tier, 0.0) + j.kw / kw
            caps[j.tier] = caps.get(j.tier, 0.0) + j.cap_kw
        cap_share = {t: caps[t] / (tiers[t] * kw) for t in tiers if tiers[t] > 0}
        return _NewWork(float(gpus) * scale, kw / mix_gpus, tiers, cap_share, draw_share)


def _gpu_cap(snap: ClusterSnapshot, t: datetime) -> float | None:
    caps = [v for p in snap.capacity_plans if p.unit is CapUnit.GPUS and p.domain in (
        "", snap.factory.site) and (v := p.at(t)) is not None]
    return min(caps) if caps else None


def _job(w: WorkloadState, cfg: ForecastConfig, site: _Site, kw_scale: float,
         span: tuple[datetime, datetime], domains: Mapping[str, float],
         draw_from: datetime | None) -> _Job:
    kw = job_kw(w, cfg) * kw_scale
    runtime = float(w.view.expected_runtime_seconds or cfg.default_runtime_seconds)
    cap = kw * cap_fraction(w.view.kind, w.view.flex_tier, runtime, site.limit_seconds,
                            cfg.planner)
    return _Job(w.key, w.view.gpus, kw, w.view.flex_tier, span[0], span[1], domains,
                w.cluster_queue, draw_from, cap)


def _running(snap: ClusterSnapshot, cfg: ForecastConfig, site: _Site, scale: float,
             kw_scale: float) -> tuple[list[_Job], list[WorkloadState]]:
    now = snap.now
    jobs: list[_Job] = []
    requeued: list[WorkloadState] = []
    for w in snap.workloads:
        if w.phase is not Phase.ADMITTED:
            continue
        began = w.admitted_at or now
        draw_from = site.pipe.draw_at.get(w.key)
        if draw_from is not None:  # its runtime starts when its pods run
            began = draw_from
        end = began + timedelta(seconds=_runtime(w, cfg, scale))
        if end <= now:
            end = now + timedelta(seconds=cfg.overrun * scale)
        placed = snap.placements.get(w.key, ())
        stop = min((win.start for win in site.windows if win.start < end and now < win.end
                    and any(win.covers(nd) for nd in site.nodes if nd.name in placed)),
                   default=None)
        if stop is not None:  # drained for the window: back to the queue, from the start
            end = max(now, stop)
            requeued.append(w)
        jobs.append(_job(w, cfg, site, kw_scale, (now, end),
                         site.placed(placed) or site.alloc_share, draw_from))
    return jobs, requeued


def bind_lag(snap: ClusterSnapshot, allocated: float) -> tuple[timedelta, frozenset[str]]:
    """How long admitted work waits for its pods to run, from this snapshot alone: the
    admitted GPUs the nodes do not hold yet are taken to be the most recently admitted
    workloads' (pods bind in admission order); the oldest of those has waited the lag (a
    lower bound). Returns the lag and the workloads not running yet."""
    admitted = sorted((w for w in snap.workloads if w.phase is Phase.ADMITTED),
                      key=lambda w: (w.admitted_at or snap.now, w.key), reverse=True)
    missing = sum(w.view.gpus for w in admitted) - allocated
    unbound: list[WorkloadState] = []
    for w in admitted:
        if missing <= 0:
            break
        unbound.append(w)
        missing -= w.view.gpus
    if not unbound:
        return timedelta(0), frozenset()
    oldest = unbound[-1].admitted_at or snap.now
    return max(timedelta(0), snap.now - oldest), frozenset(w.key for w in unbound)


def _queue(snap: ClusterSnapshot) -> list[WorkloadState]:
    waiting = [w for w in snap.workloads if w.phase in (Phase.PENDING, Phase.RESERVED)
               or (w.phase is Phase.INACTIVE and (w.shed_by_m2g or w.drained_for))]
    now = snap.now
    return sorted(waiting, key=lambda w: (-w.view.priority, -w.wait_seconds(now), w.key))


def _held(reservations: Iterable[Reservation], w: WorkloadState | None, t: datetime,
          end: datetime, lead: float, gpu_size: int) -> int:
    """GPUs reservations keep from ``w`` (None: from everything) over [t, end)."""
    held = 0
    for r in reservations:
        if r.status.get("phase") in ("Invalid", "Released") or t >= r.end:
            continue
        if w is not None and owns(r, w):
            continue
        if t < r.hold_from(lead) and end <= r.hold_from(lead):
            continue
        if r.start > t and end <= r.start:
            continue  # ends before the start: allowed
        held += r.cliques * gpu_size if r.cliques else r.gpus
    return held


def _run(snap: ClusterSnapshot, cfg: ForecastConfig, site: _Site, bounds: list[datetime],
         scale: float, kw_scale: float) -> _Run:
    jobs, requeued = _running(snap, cfg, site, scale, kw_scale)
    spread = new_work_spread(cfg, sum(1 for j in jobs if j.gpus > 0
                                      and j.start <= bounds[0] < j.end))
    new_scale = 1.0 if scale == 1.0 else max(0.0, 1 + (spread if scale > 1 else -spread))
    queue = requeued + _queue(snap)
    size = max((sum(nd.gpus for nd in snap.factory.nodes_of(r.name))
                for r in snap.factory.racks), default=72)
    n = len(bounds) - 1
    out = _Run([0.0] * n, [0.0] * n, [{} for _ in range(n)], [{} for _ in range(n)], 0.0,
               [0.0] * n, [0.0] * n, [{} for _ in range(n)], [{} for _ in range(n)],
               [{} for _ in range(n)], [{} for _ in range(n)])
    out.kw_at_now = _kw_now(jobs, site, cfg)
    out.remaining_seconds = weighted_median(
        (max(0.0, (j.end - snap.now).total_seconds()), j.gpus) for j in jobs if j.gpus > 0)
    sample = [_job(w, cfg, site, kw_scale, (bounds[0], bounds[0]), {}, None)
              for w in _queue(snap)]
    new = _NewWork.of(jobs, bounds[0], new_scale, site.draw_share, sample) \
        if cfg.new_work is NewWork.PERSIST else _NewWork()
    for i in range(n):
        t0, t1 = bounds[i], bounds[i + 1]
        cap = site.healthy - site.covered_gpus(t0, t1)
        plan_cap = _gpu_cap(snap, t0)
        if plan_cap is not None:
            cap = min(cap, int(plan_cap))
        limit = _limit(snap, t0, t1, cfg.planner)
        queue = _start_queue(snap, cfg, queue, jobs, (t0, cap, limit), (scale, kw_scale),
                             size, site)
        room = cap - _held(snap.reservations, None, t0, t1, cfg.reservation_lead_seconds, size)
        _account(out, i, jobs, t0, t1, site, cfg, new, max(0, room))
    return out


def new_work_spread(cfg: ForecastConfig, jobs: int) -> float:
    """The bands' relative spread of the new work's GPU level, held now by ``jobs`` jobs."""
    if jobs <= 0 or cfg.new_work_count_spread <= 0:
        return cfg.new_work_spread
    return math.hypot(cfg.new_work_spread, cfg.new_work_count_spread / math.sqrt(jobs))


def _kw_now(jobs: list[_Job], site: _Site, cfg: ForecastConfig) -> float:
    """What the model says the site draws at ``now``, for the calibration: admitted work
    draws only on the GPUs its pods hold (the nodes' allocated GPUs; admitted work whose pods
    are not bound yet draws nothing yet), the other healthy GPUs idle."""
    admitted = sum(j.gpus for j in jobs)
    running = min(admitted, site.allocated) if site.allocated >= 0 else admitted
    kw = sum(j.kw for j in jobs) * (running / admitted if admitted else 0.0)
    return kw + max(0, site.healthy - running) * cfg.idle_kw_per_gpu


def _queue_gpus(snap: ClusterSnapshot) -> dict[str, int]:
    """GPUs each ClusterQueue admits: its nominal GPU quota, or what it uses now if it
    borrows more (the forecast does not borrow beyond what a queue holds now)."""
    out: dict[str, int] = {}
    for q in snap.queues:
        nominal = sum(fq.nominal for fq in q.quotas if fq.resource == GPU_RESOURCE)
        if any(fq.resource == GPU_RESOURCE for fq in q.quotas):
            out[q.name] = max(nominal, q.used_gpus)
    return out


def _start_queue(snap: ClusterSnapshot, cfg: ForecastConfig, queue: list[WorkloadState],
                 jobs: list[_Job], at: tuple[datetime, int, _Limit | None],
                 scales: tuple[float, float], size: int, site: _Site) -> list[WorkloadState]:
    """Start the queued work that fits at ``t0`` (appended to ``jobs``); the rest waits.
    Under a kW limit the tiers m2g's admission holds back (``gate_tier``: flex >= 2, and
    flex 1 too during a grid event) are not started into it; the others (firm work) are,
    except during a grid event under ``hold_firm_beyond_reach`` (``_FirmGate``): then only
    while the limit plus what pausing the running flexible work would save covers them, and
    while work m2g paused waits to come back (``restore_before_firm``) only in the room under
    the limit beyond that work's kW — the paused work comes back first."""
    t0, cap, lim = at
    scale, kw_scale = scales
    lag = site.pipe.lag
    limit = None if lim is None else lim.kw
    gate = cfg.planner.headroom_min_tier if lim is None else lim.gate_tier
    busy = sum(j.gpus for j in jobs if j.start <= t0 < j.end)
    busy_kw = sum(j.kw for j in jobs if j.start <= t0 < j.end)
    firm = _FirmGate.of(jobs, t0, lim, cfg, busy_kw)
    if firm is not None and firm.first:  # m2g's gate admits restored work before firm work
        queue = sorted(queue, key=lambda w: not _paused(w))
        firm.waiting = sum(job_kw(w, cfg) * kw_scale for w in queue if _paused(w))
    quotas = _queue_gpus(snap)
    used: dict[str, int] = {}
    for j in jobs:
        if j.start <= t0 < j.end:
            used[j.queue] = used.get(j.queue, 0) + j.gpus
    left: list[WorkloadState] = []
    for w in queue:
        rt = timedelta(seconds=_runtime(w, cfg, scale))
        named = [r for r in snap.reservations if not w.names().isdisjoint(r.workloads)]
        if named and min(r.start for r in named) > t0:
            left.append(w)
            continue
        room = cap - busy - _held(snap.reservations, w, t0, t0 + rt,
                                  cfg.reservation_lead_seconds, size)
        kw = job_kw(w, cfg) * kw_scale
        over = limit is not None and busy_kw + kw > limit and w.view.flex_tier >= gate
        over = over or (firm is not None and w.view.flex_tier < gate
                        and firm.holds(busy_kw, kw))
        quota = quotas.get(w.cluster_queue)
        if quota is not None and used.get(w.cluster_queue, 0) + w.view.gpus > quota:
            left.append(w)  # its ClusterQueue is full: Kueue would not admit it
            continue
        if w.view.gpus <= room and not over:
            jobs.append(_job(w, cfg, site, kw_scale, (t0, t0 + lag + rt), site.healthy_share,
                             t0 + lag))
            used[w.cluster_queue] = used.get(w.cluster_queue, 0) + w.view.gpus
            busy += w.view.gpus
            busy_kw += kw
            if firm is not None and _paused(w):
                firm.waiting = max(0.0, firm.waiting - kw)
        else:
            left.append(w)
    return left


def _paused(w: WorkloadState) -> bool:
    """Work m2g paused for power that waits to come back (not drained for maintenance)."""
    return w.shed_by_m2g and not w.drained_for and w.phase is Phase.INACTIVE


@dataclass
class _FirmGate:
    """m2g's gate for firm work during a grid event at one interval start
    (m2g.planner.headroom: ``hold_firm_beyond_reach``, ``restore_before_firm``).

    ``reach``: the limit plus what pausing the running flexible work would save — firm work
    is started while that covers it. ``first`` (``restore_before_firm``, with
    ``restore_during_events``): work m2g paused comes back before new firm work; while any
    waits — the running work's kW over the limit beyond what caps take (``over``: m2g has
    paused that much), or m2g-paused workloads in the queue not started yet (``waiting``, kW)
    — firm work starts only in the room under the limit beyond it."""

    limit: float
    reach: float
    first: bool
    over: float = 0.0
    waiting: float = 0.0

    @classmethod
    def of(cls, jobs: list[_Job], t0: datetime, lim: _Limit | None, cfg: ForecastConfig,
           busy_kw: float) -> _FirmGate | None:
        if lim is None or not lim.firm:
            return None
        p = cfg.planner
        caps = sum(j.cap_kw for j in jobs if j.start <= t0 < j.end and 0 < j.tier < lim.pause_tier)
        return cls(lim.kw, lim.kw + _firm_reach(jobs, t0, lim.pause_tier, cfg),
                   p.restore_before_firm and p.restore_during_events,
                   max(0.0, busy_kw - lim.kw - caps))

    def holds(self, busy_kw: float, kw: float) -> bool:
        """Whether a firm job of ``kw`` waits, the started work drawing ``busy_kw``."""
        if self.first and (self.over > 0 or self.waiting > 0):
            return busy_kw + self.waiting + kw > self.limit
        return busy_kw + kw > self.reach


def _firm_reach(jobs: list[_Job], t0: datetime, pause_tier: int,
                cfg: ForecastConfig) -> float:
    """What pausing the running flexible work (tiers from ``pause_tier``) at ``t0`` would save:
    the room m2g can make for firm work during a grid event (m2g.planner.shedding.reach_kw)."""
    return sum(max(0.0, j.kw - j.gpus * cfg.idle_kw_per_gpu) for j in jobs
               if j.start <= t0 < j.end and j.tier >= pause_tier > 0)


def _account(out: _Run, i: int, jobs: list[_Job], t0: datetime, t1: datetime, site: _Site,
             cfg: ForecastConfig, new: _NewWork, room: int) -> None:
    span = (t1 - t0).total_seconds()
    gpu_s = held = 0.0  # GPUs drawing; GPUs admitted work holds (drawing or about to)
    kw = 0.0
    doms: dict[str, float] = {}
    flex: dict[int, float] = {}
    capped: dict[int, float] = {}
    paused: dict[int, float] = {}
    for j in jobs:
        held += max(0.0, (min(t1, j.end) - max(t0, j.start)).total_seconds()) / span * j.gpus
        overlap = (min(t1, j.end) - max(t0, j.drawing)).total_seconds()
        if overlap <= 0:
            continue
        frac = overlap / span
        gpu_s += j.gpus * frac
        kw += j.kw * frac
        for d, share in j.domains.items():
            doms[d] = doms.get(d, 0.0) + j.kw * frac * share
        if j.tier > 0:
            flex[j.tier] = flex.get(j.tier, 0.0) + j.kw * frac
            capped[j.tier] = capped.get(j.tier, 0.0) + j.cap_kw * frac
            paused[j.tier] = paused.get(j.tier, 0.0) + max(
                0.0, j.kw - j.gpus * cfg.idle_kw_per_gpu) * frac
    committed = kw + max(0.0, site.healthy - gpu_s) * cfg.idle_kw_per_gpu
    fill = max(0.0, min(new.level, room) - held)
    drawing = fill * new.draw_share  # the rest of its GPUs wait for their pods
    fill_kw = drawing * new.kw_per_gpu
    new_capped: dict[int, float] = {}
    new_paused: dict[int, float] = {}
    for t, share in new.tier_share.items():
        if t <= 0:  # firm new work: held back only by the firm gate (_Run.reach)
            new_paused[t] = max(0.0, (fill_kw - drawing * cfg.idle_kw_per_gpu) * share)
        else:
            flex[t] = flex.get(t, 0.0) + fill_kw * share
            new_capped[t] = fill_kw * share * new.cap_share.get(t, 0.0)
            new_paused[t] = max(0.0, (fill_kw - drawing * cfg.idle_kw_per_gpu) * share)
            capped[t] = capped.get(t, 0.0) + new_capped[t]
            paused[t] = paused.get(t, 0.0) + new_paused[t]
    idle = max(0.0, site.healthy - gpu_s - drawing) * cfg.idle_kw_per_gpu
    for d, share in site.healthy_share.items():
        doms[d] = doms.get(d, 0.0) + (idle + fill_kw) * share
    out.site[i], out.busy[i], out.domains[i], out.flex[i] = (kw + fill_kw + idle,
                                                             gpu_s + drawing, doms, flex)
    out.committed[i], out.new_gpus[i] = committed, fill
    out.capped[i], out.paused[i] = capped, paused
    out.new_capped[i], out.new_paused[i] = new_capped, new_paused
