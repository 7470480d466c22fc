"""The forecast model on held-out conditions, in-process (no control plane): a cheap check
before a twin run (docs/benchmarks.md, "Thirty-first session", issue 13).

    PYTHONPATH=src:cli:bench python bench/forecast_heldout.py [--trace FILE] [--seeds 7,15]
        [--demands 0.6,0.9,1.1] [--racks 16] [--hours 8] [--made-at 0.5] [--warm-hours 12]

For each trace, seed and demand: the twin's replay plan (bench/twinkit/trace.py: the same
mapping, re-timing and warm start as ``bench/twin.py``), run through an idealised factory —
every job starts at its arrival once its GPUs are free (arrival order, smaller jobs may pass a
blocked one), runs its trace runtime at the kind's full kW (m2g.planner.forecast's
KIND_KW_PER_GPU), idle GPUs 0.242 kW, a constant 0.5 kW per tray besides — gives the "actual"
kW per trace hour. The snapshot at ``--made-at`` trace hours (the admitted work with its
admission times and exact runtimes, the queue, the allocated GPUs, the site draw) goes into
``m2g.planner.forecast`` with new work persisted (the controller's setting), and the forecast
is scored as the twin scores it: MAPE, committed-only MAPE, bias, band coverage.

What this leaves out (the twin has it): Kueue's quotas and placement (fragmentation), the bind
pipeline, grid events and m2g's levers. It measures the demand side of the model — how the
committed work drains and how new work fills — across traces, seeds and loads. A benchmark
script: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twinkit import trace as T

from m2g.model.cluster import ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, Node, Rack, Reading
from m2g.model.inputs import WorkloadKind, WorkloadView
from m2g.planner.forecast import KIND_KW_PER_GPU, ForecastConfig, NewWork, forecast

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "data" / "openb" / "openb_pod_list_default.csv"
T0 = datetime(2026, 12, 7, tzinfo=UTC)
IDLE = 0.242
TRAY_KW = 0.5  # per tray besides the GPUs: what the calibration offset stands for


@dataclass(frozen=True)
class Ran:
    job: T.TraceJob
    start: float
    end: float

    @property
    def kw_per_gpu(self) -> float:
        return KIND_KW_PER_GPU.get(_kind(self.job), KIND_KW_PER_GPU[WorkloadKind.UNSPECIFIED])


def _kind(j: T.TraceJob) -> WorkloadKind:
    try:
        return WorkloadKind(j.kind)
    except ValueError:
        return WorkloadKind.UNSPECIFIED


def simulate(jobs: tuple[T.TraceJob, ...], gpus: int) -> list[Ran]:
    """Each job in arrival order starts once its GPUs are free; a job that does not fit
    lets smaller later ones pass (Kueue's BestEffortFIFO without quotas or topology)."""
    ran: list[Ran] = []
    waiting: list[T.TraceJob] = []
    ends: list[tuple[float, int]] = []
    free = gpus
    todo = sorted(jobs, key=lambda j: (j.arrival, j.name))
    i, t = 0, 0.0
    while i < len(todo) or waiting:
        nxt_arr = todo[i].arrival if i < len(todo) else float("inf")
        nxt_end = ends[0][0] if ends else float("inf")
        if nxt_arr == float("inf") and nxt_end == float("inf"):
            break  # what waits never fits
        t = min(nxt_arr, nxt_end)
        while ends and ends[0][0] <= t:
            free += heapq.heappop(ends)[1]
        while i < len(todo) and todo[i].arrival <= t:
            waiting.append(todo[i])
            i += 1
        left = []
        for j in waiting:
            if j.gpus <= free:
                free -= j.gpus
                ran.append(Ran(j, t, t + j.runtime))
                heapq.heappush(ends, (t + j.runtime, j.gpus))
            else:
                left.append(j)
        waiting = left
    return ran


def actual_kw(ran: list[Ran], gpus: int, a: float, b: float) -> tuple[float, float, float]:
    """Mean site kW, busy GPUs and flexible (tier >= 1) kW over [a, b) trace seconds."""
    busy = kw = flex = 0.0
    for r in ran:
        overlap = min(b, r.end) - max(a, r.start)
        if overlap > 0:
            busy += r.job.gpus * overlap / (b - a)
            kw += r.job.gpus * r.kw_per_gpu * overlap / (b - a)
            if r.job.tier > 0:
                flex += r.job.gpus * r.kw_per_gpu * overlap / (b - a)
    return kw + (gpus - busy) * IDLE + gpus / 4 * TRAY_KW, busy, flex


def snapshot(ran: list[Ran], jobs: tuple[T.TraceJob, ...], racks: int, at: float
             ) -> ClusterSnapshot:
    now = T0 + timedelta(seconds=at)
    started = {r.job.name: r for r in ran}
    states: list[WorkloadState] = []
    busy = 0
    for j in jobs:
        if j.arrival > at:
            continue
        r = started.get(j.name)
        if r is not None and r.end <= at:
            continue
        view = WorkloadView(name=j.name, namespace=j.namespace, gpus=j.gpus,
                            kind=_kind(j), flex_tier=j.tier,
                            expected_runtime_seconds=0 if j.foreign else round(j.runtime))
        if r is not None and r.start <= at:
            busy += j.gpus
            states.append(WorkloadState(j.namespace, j.name, view, Phase.ADMITTED,
                                        admitted_at=T0 + timedelta(seconds=r.start)))
        else:
            states.append(WorkloadState(j.namespace, j.name, view, Phase.PENDING,
                                        waiting_since=T0 + timedelta(seconds=j.arrival)))
    total = racks * 72
    draw, *_ = actual_kw(ran, total, at, at + 1e-6)
    nodes, left = [], busy
    for r in range(racks):
        for n in range(18):
            held = min(4, left)
            left -= held
            nodes.append(Node(f"r{r}-n{n}", f"rack-{r}", clique=f"rack-{r}",
                              gpus_allocated=held))
    rack_objs = tuple(Rack(f"rack-{r}", f"b{r // 4}", f"pd-{r // 4}", clique=f"rack-{r}",
                           power_kw=Reading(draw / racks, 1.0)) for r in range(racks))
    return ClusterSnapshot(FactorySnapshot(now=now, racks=rack_objs, nodes=tuple(nodes)),
                           tuple(states))


def score(trace: Path, seed: int, demand: float, start: int | None,
          args: argparse.Namespace) -> dict[str, object]:
    read = T.read_trace(trace.read_text(errors="replace"))
    gpus = args.racks * 72
    plan = T.plan_jobs(read, T.Mapping(seed=seed), factory_gpus=gpus,
                       horizon_s=(args.made_at + args.hours) * 3600, demand=demand,
                       start=start, warm_s=args.warm_hours * 3600)
    ran = simulate(plan.jobs, gpus)
    at = args.made_at * 3600
    snap = snapshot(ran, plan.jobs, args.racks, at)
    cfg = ForecastConfig(horizon_hours=args.hours, new_work=NewWork.PERSIST)
    if args.new_work_spread is not None:
        cfg = replace(cfg, new_work_spread=args.new_work_spread)
    if args.count_spread is not None:
        cfg = replace(cfg, new_work_count_spread=args.count_spread)
    fc = forecast(snap, cfg)
    rows = []
    flex_share: list[tuple[float, float]] = []
    for iv in fc.intervals:
        a = (iv.start - T0).total_seconds()
        kw, busy, flex = actual_kw(ran, gpus, a, a + 3600)
        rows.append((iv.site_kw, iv.committed_kw, kw, iv.low_kw, iv.high_kw, iv.busy_gpus,
                     busy))
        flex_share.append((sum(iv.flex_kw.values()) / iv.site_kw * 100, flex / kw * 100))
    mean = sum(r[2] for r in rows) / len(rows)
    pending = sum(1 for w in snap.workloads if w.phase is Phase.PENDING)
    return {
        "trace": trace.name, "seed": seed, "demand": demand, "windowStart": plan.window_start,
        "mapePct": round(sum(abs(f - a) / a for f, _, a, *_ in rows) / len(rows) * 100, 2),
        "committedMapePct": round(sum(abs(c - a) / a for _, c, a, *_ in rows)
                                  / len(rows) * 100, 2),
        "biasPct": round(sum(f - a for f, _, a, *_ in rows) / len(rows) / mean * 100, 2),
        "bandCoveragePct": round(sum(1 for _, _, a, lo, hi, *_ in rows if lo <= a <= hi)
                                 / len(rows) * 100, 1),
        "errorPct": [round((f - a) / a * 100, 1) for f, _, a, *_ in rows],
        "gpus": [f"{fg:.0f}/{ag:.0f}" for *_, fg, ag in rows],
        "pendingAtForecast": pending,
        "flexibleSharePct": [round(sum(f for f, _ in flex_share) / len(rows), 1),
                             round(sum(a for _, a in flex_share) / len(rows), 1)],
        "notes": list(fc.notes),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="forecast_heldout.py", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, action="append",
                   help="a CSV with openb's pod-list columns (repeatable; default openb)")
    p.add_argument("--seeds", default="7,15")
    p.add_argument("--demands", default="0.6,0.9,1.1")
    p.add_argument("--racks", type=int, default=16)
    p.add_argument("--hours", type=float, default=8.0, help="forecast horizon, trace hours")
    p.add_argument("--window-starts", default="",
                   help="trace seconds the replay starts at, comma-separated (default: the "
                   "twin's, after the trace's last gap longer than a day)")
    p.add_argument("--made-at", type=float, default=0.5, help="trace hours into the replay")
    p.add_argument("--warm-hours", type=float, default=12.0)
    p.add_argument("--new-work-spread", type=float,
                   help="the bands' spread of the new work's GPU level (default: the model's)")
    p.add_argument("--count-spread", type=float,
                   help="the bands' spread per 1/sqrt(jobs holding the level) (default: the "
                   "model's)")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        demands = [float(d) for d in args.demands.split(",") if d.strip()]
        starts: list[int | None] = [int(w) for w in args.window_starts.split(",")
                                    if w.strip()] or [None]
    except ValueError:
        print("error: --seeds and --demands are comma-separated numbers", file=sys.stderr)
        return 2
    if args.racks < 1 or args.hours <= 0 or args.made_at < 0 or not seeds or not demands:
        print("error: --racks, --hours must be positive, --made-at not negative",
              file=sys.stderr)
        return 2
    out = []
    try:
        for trace in args.trace or [DEFAULT_TRACE]:
            for start in starts:
                for seed in seeds:
                    for demand in demands:
                        got = score(trace, seed, demand, start, args)
                        out.append(got)
                        print(json.dumps({k: v for k, v in got.items() if k != "notes"}),
                              flush=True)
    except (OSError, T.TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mapes = [float(str(r["mapePct"])) for r in out]
    bias = [float(str(r["biasPct"])) for r in out]
    cover = [float(str(r["bandCoveragePct"])) for r in out]
    print(json.dumps({"runs": len(out), "meanMapePct": round(sum(mapes) / len(mapes), 2),
                      "worstMapePct": max(mapes),
                      "meanBiasPct": round(sum(bias) / len(bias), 2),
                      "meanBandCoveragePct": round(sum(cover) / len(cover), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
