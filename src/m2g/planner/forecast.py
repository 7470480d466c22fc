"""The day-ahead forecast: site and power-domain kW per interval for the next hours, with
uncertainty bands and the flexible kW of each flex tier. Pure (no I/O, no clock): it reads the
same ClusterSnapshot the controller decides on.

Model, per interval of ``interval_seconds`` from ``now``:

* **running work** draws its kW (``m2g.io/estimated-kw``, else GPUs × the kind's kW per GPU,
  ``kw_per_gpu``) until its expected end: admission + expected runtime
  (``m2g.io/expected-runtime-seconds``, else ``default_runtime_seconds``); work already past
  its expected end is taken to end within ``overrun_seconds``;
* **the queue** is started in admission order (priority, then longest wait) at the first
  interval start with room: healthy GPUs, less maintenance windows' nodes, less what
  reservations hold (a reservation's named workloads start at its start), less a GPU
  CapacityPlan's cap; work is not started into a kW CapacityPlan or grid limit it would exceed;
* **idle GPUs** draw ``idle_kw_per_gpu``; a fresh site reading calibrates a constant offset
  (the measured draw less the model's at ``now``: the trays' CPUs, NICs, switches; at ``now``
  admitted work draws only on the GPUs its pods hold: the nodes' allocated GPUs);
* **limits**: a grid event's kW limit or a kW CapacityPlan caps the site's kW (m2g sheds the
  flexible work above it); the capped part is reported as ``shedKw``;
* **bands**: ``low``/``high`` rerun the model with runtimes × (1 ∓ ``runtime_spread``) and kW ×
  (1 ∓ ``kw_spread``) (unknown runtimes: ``unknown_runtime_spread``);
* **flexible kW**: per flex tier (1-3), the kW of that tier's running work (what could be shed
  or deferred), central run;
* **new work** (``new_work``): work not yet submitted. ``NONE``: none (the forecast is the
  committed work only, ``committed_kw``); ``PERSIST``: the site keeps the GPU level it holds
  now (running work plus what the queue starts at ``now``, at most the interval's room), the
  GPUs that committed work leaves free are taken by new work with the kW per GPU and the flex
  tier mix of the work the site holds now (a persistence forecast of demand).

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


class _Site:
    """What the simulation needs of the factory, computed once."""

    def __init__(self, snap: ClusterSnapshot, windows: tuple[MaintenanceWindow, ...]) -> None:
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


def _shares(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items() if v > 0} if total > 0 else {}


def forecast(snap: ClusterSnapshot, cfg: ForecastConfig | None = None, *,
             extra_windows: tuple[MaintenanceWindow, ...] = ()) -> Forecast:
    """The forecast from ``snap`` (``extra_windows``: proposed maintenance windows)."""
    cfg = cfg or ForecastConfig()
    windows = snap.factory.maintenance + extra_windows
    site = _Site(snap, windows)
    n = max(1, math.ceil(cfg.horizon_hours * 3600 / cfg.interval_seconds))
    bounds = [snap.now + timedelta(seconds=cfg.interval_seconds * i) for i in range(n + 1)]
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
    out: list[Interval] = []
    for i in range(n):
        c, lo, hi = central.site[i] + offset, low.site[i] + offset, high.site[i] + offset
        limit = _limit(snap, bounds[i], bounds[i + 1])
        floor = c - sum(central.flex[i].values())  # m2g sheds flexible work only
        shed = max(0.0, c - max(limit, floor)) if limit is not None else 0.0
        if limit is not None:
            c, lo, hi = (min(c, max(limit, floor)), min(lo, max(limit, floor)),
                         min(hi, max(limit, floor)))
        lo, hi = min(lo, c), max(hi, c)
        doms = {d: round(max(0.0, v + offset * site.healthy_share.get(d, 0.0)), 3)
                for d, v in sorted(central.domains[i].items()) if d}
        committed = central.committed[i] + offset
        if limit is not None:
            committed = min(committed, max(limit, floor))
        out.append(Interval(bounds[i], bounds[i + 1], round(max(0.0, c), 3),
                            round(max(0.0, lo), 3), round(max(0.0, hi), 3),
                            round(central.busy[i], 2), limit, round(shed, 3), doms,
                            {t: round(central.flex[i].get(t, 0.0), 3) for t in (1, 2, 3)},
                            round(max(0.0, committed), 3), round(central.new_gpus[i], 2)))
    return Forecast(snap.now, snap.factory.site, cfg.interval_seconds, tuple(out),
                    round(offset, 3), tuple(notes))


def _limit(snap: ClusterSnapshot, t0: datetime, t1: datetime) -> float | None:
    """The lowest site kW limit in force at the interval's middle (grid events, kW plans)."""
    mid = t0 + (t1 - t0) / 2
    limits = [e.target() for e in snap.factory.grid_events if e.start <= mid < e.end
              and e.target() > 0]
    limits += [v for p in snap.capacity_plans if p.unit is CapUnit.KW and p.domain in (
        "", snap.factory.site) and (v := p.at(mid)) is not None]
    return min(limits) if limits else None


@dataclass
class _Run:
    site: list[float]
    busy: list[float]
    domains: list[dict[str, float]]
    flex: list[dict[int, float]]
    kw_at_now: float
    committed: list[float] = field(default_factory=list)
    new_gpus: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _NewWork:
    """Work not yet submitted (NewWork.PERSIST): the GPU level the site holds at ``now``, and
    the kW per GPU and the kW share per flex tier of the work it holds then."""

    level: float = 0.0
    kw_per_gpu: float = 0.0
    tier_share: Mapping[int, float] = field(default_factory=dict)

    @staticmethod
    def of(jobs: list[_Job], t: datetime, scale: float = 1.0) -> _NewWork:
        alive = [j for j in jobs if j.start <= t < j.end]
        gpus = sum(j.gpus for j in alive)
        kw = sum(j.kw for j in alive)
        if gpus <= 0 or kw <= 0:
            return _NewWork()
        tiers: dict[int, float] = {}
        for j in alive:
            tiers[j.tier] = tiers.get(j.tier, 0.0) + j.kw / kw
        return _NewWork(float(gpus) * scale, kw / gpus, tiers)


def _gpu_cap(snap: ClusterSnapshot, t: datetime) -> float | None:
    caps = [v for p in snap.capacity_plans if p.unit is CapUnit.GPUS and p.domain in (
        "", snap.factory.site) and (v := p.at(t)) is not None]
    return min(caps) if caps else None


def _running(snap: ClusterSnapshot, cfg: ForecastConfig, site: _Site, scale: float,
             kw_scale: float) -> tuple[list[_Job], list[WorkloadState]]:
    now = snap.now
    jobs: list[_Job] = []
    requeued: list[WorkloadState] = []
    lag, unbound = bind_lag(snap, site.allocated)
    for w in snap.workloads:
        if w.phase is not Phase.ADMITTED:
            continue
        began = w.admitted_at or now
        draw_from = None
        if w.key in unbound:  # its runtime starts when its pods run
            draw_from = max(now, began + lag)
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
        jobs.append(_Job(w.key, w.view.gpus, job_kw(w, cfg) * kw_scale, w.view.flex_tier,
                         now, end, site.placed(placed) or site.alloc_share, w.cluster_queue,
                         draw_from))
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
    return sorted(waiting, key=lambda w: (-w.view.priority, -w.view.wait_seconds, w.key))


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
    new_scale = 1.0 if scale == 1.0 else 1 + (cfg.new_work_spread if scale > 1
                                              else -cfg.new_work_spread)
    queue = requeued + _queue(snap)
    size = max((sum(nd.gpus for nd in snap.factory.nodes_of(r.name))
                for r in snap.factory.racks), default=72)
    n = len(bounds) - 1
    out = _Run([0.0] * n, [0.0] * n, [{} for _ in range(n)], [{} for _ in range(n)], 0.0,
               [0.0] * n, [0.0] * n)
    out.kw_at_now = _kw_now(jobs, site, cfg)
    new = _NewWork.of(jobs, bounds[0], new_scale) if cfg.new_work is NewWork.PERSIST \
        else _NewWork()
    for i in range(n):
        t0, t1 = bounds[i], bounds[i + 1]
        cap = site.healthy - site.covered_gpus(t0, t1)
        plan_cap = _gpu_cap(snap, t0)
        if plan_cap is not None:
            cap = min(cap, int(plan_cap))
        limit = _limit(snap, t0, t1)
        queue = _start_queue(snap, cfg, queue, jobs, (t0, cap, limit), scale, kw_scale, size,
                             site)
        room = cap - _held(snap.reservations, None, t0, t1, cfg.reservation_lead_seconds, size)
        _account(out, i, jobs, t0, t1, site, cfg, new, max(0, room))
    return out


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
                 jobs: list[_Job], at: tuple[datetime, int, float | None], scale: float,
                 kw_scale: float, size: int, site: _Site) -> list[WorkloadState]:
    """Start the queued work that fits at ``t0`` (appended to ``jobs``); the rest waits."""
    t0, cap, limit = at
    lag = bind_lag(snap, site.allocated)[0]
    busy = sum(j.gpus for j in jobs if j.start <= t0 < j.end)
    busy_kw = sum(j.kw for j in jobs if j.start <= t0 < j.end)
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
        over = limit is not None and busy_kw + kw > limit and w.view.flex_tier > 0
        quota = quotas.get(w.cluster_queue)
        if quota is not None and used.get(w.cluster_queue, 0) + w.view.gpus > quota:
            left.append(w)  # its ClusterQueue is full: Kueue would not admit it
            continue
        if w.view.gpus <= room and not over:
            jobs.append(_Job(w.key, w.view.gpus, kw, w.view.flex_tier, t0, t0 + lag + rt,
                             site.healthy_share, w.cluster_queue, t0 + lag))
            used[w.cluster_queue] = used.get(w.cluster_queue, 0) + w.view.gpus
            busy += w.view.gpus
            busy_kw += kw
        else:
            left.append(w)
    return left


def _account(out: _Run, i: int, jobs: list[_Job], t0: datetime, t1: datetime, site: _Site,
             cfg: ForecastConfig, new: _NewWork, room: int) -> None:
    span = (t1 - t0).total_seconds()
    gpu_s = held = 0.0  # GPUs drawing; GPUs admitted work holds (drawing or about to)
    kw = 0.0
    doms: dict[str, float] = {}
    flex: dict[int, float] = {}
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
    committed = kw + max(0.0, site.healthy - gpu_s) * cfg.idle_kw_per_gpu
    fill = max(0.0, min(new.level, room) - held)
    fill_kw = fill * new.kw_per_gpu
    for t, share in new.tier_share.items():
        if t > 0:
            flex[t] = flex.get(t, 0.0) + fill_kw * share
    idle = max(0.0, site.healthy - gpu_s - fill) * cfg.idle_kw_per_gpu
    for d, share in site.healthy_share.items():
        doms[d] = doms.get(d, 0.0) + (idle + fill_kw) * share
    out.site[i], out.busy[i], out.domains[i], out.flex[i] = (kw + fill_kw + idle, gpu_s + fill,
                                                             doms, flex)
    out.committed[i], out.new_gpus[i] = committed, fill
