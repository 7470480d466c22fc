"""The report's figures, as docs/twin-metrics.md defines them (pure).

Inputs are plain samples and the driver's job records; nothing here reads a clock or a file.
Times: grid figures in wall seconds, workload figures in trace seconds (wall × time scale).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

TOLERANCE = 1.01  # a sample is above target when draw > target × 1.01
RAMP_DEFAULT_S = 30.0
AFTER_EVENT_S = 120.0  # allocation "outside the event" excludes [start, end + 120 s]
RACK_GPUS = 72


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    data = sorted(values)
    if not data:
        return None
    return data[max(0, math.ceil(q * len(data)) - 1)]


# ---- grid ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GridEvent:
    """The event as the report judges it (wall seconds from the replay's start)."""

    start: float
    end: float
    ramp: float  # the event's own ramp, else RAMP_DEFAULT_S
    target_kw: float  # the plateau limit
    limit: Callable[[float], float]  # the limit in force at a time (= target without steps)


def grid_figures(samples: Sequence[tuple[float, float]], ev: GridEvent | None) -> dict[str, Any]:
    """samples: (t, site kW) in time order."""
    ramp_rate = max((abs(b[1] - a[1]) / (b[0] - a[0]) for a, b in pairwise(samples)
                     if b[0] > a[0]), default=None)
    if ev is None:
        return {"targetKw": None, "secondsToTarget": None, "secondsAboveTarget": None,
                "secondsAboveTargetAfterRamp": None, "kwhAboveTarget": None,
                "maxRampKwPerSecond": _r(ramp_rate, 3)}
    to_target = next((t - ev.start for t, kw in samples
                      if t >= ev.start and kw <= ev.target_kw * TOLERANCE), None)
    above = after = kwh = 0.0
    for (t, kw), (t2, _) in pairwise(samples):
        lo, hi = max(t, ev.start), min(t2, ev.end)
        if hi <= lo:
            continue
        limit = ev.limit(t)
        if kw > limit * TOLERANCE:
            above += hi - lo
            after += max(0.0, hi - max(lo, ev.start + ev.ramp))
        kwh += max(0.0, kw - limit) * (hi - lo) / 3600.0
    return {"targetKw": _r(ev.target_kw, 1), "secondsToTarget": _r(to_target, 1),
            "secondsAboveTarget": _r(above, 1), "secondsAboveTargetAfterRamp": _r(after, 1),
            "kwhAboveTarget": _r(kwh, 3), "maxRampKwPerSecond": _r(ramp_rate, 3)}


def baseline_kw(samples: Sequence[tuple[float, float]], start: float,
                window: float = 60.0) -> float | None:
    """Mean site draw over the ``window`` wall seconds before ``start``."""
    vals = [kw for t, kw in samples if start - window <= t < start]
    return sum(vals) / len(vals) if vals else None


# ---- workloads -------------------------------------------------------------------------------

def performance(jobs: Sequence[Mapping[str, Any]], event_s_trace: float) -> dict[str, Any]:
    """Emerald's definition over the jobs running at the event's start: perf = work done in
    the window / min(remaining, full-speed work in the window)."""
    tiers: dict[str, list[tuple[int, float]]] = {str(t): [] for t in range(4)}
    every: list[tuple[int, float]] = []
    losses: dict[str, dict[str, float]] = {str(t): {} for t in range(4)}
    for j in jobs:
        if not j.get("running_at_event_start") or j.get("done_at_event_end") is None:
            continue
        full = min(float(j["remaining_at_event_start"]), j["gpus"] * event_s_trace)
        if full <= 0:
            continue
        done = float(j["done_at_event_end"]) - float(j["done_at_event_start"])
        perf = min(1.0, max(0.0, done) / full)
        every.append((j["gpus"], perf))
        tiers.setdefault(str(j["tier"]), []).append((j["gpus"], perf))
        if perf < 1.0:
            by = losses.setdefault(str(j["tier"]), {})
            why = loss_class(j)
            by[why] = by.get(why, 0.0) + j["gpus"] * (1.0 - perf)
    return {"weightedPerformance": _weighted(every),
            "perTier": {t: _weighted(v) for t, v in sorted(tiers.items())},
            "performanceLostBy": {
                t: {why: round(v / g, 4) for why, v in sorted(losses[t].items())}
                for t, g in ((t, sum(gp for gp, _ in tiers[t])) for t in sorted(tiers)) if g}}


def loss_class(job: Mapping[str, Any]) -> str:
    """What cost a job running at the event's start its performance in the window, first
    match: ``stopped:<cause>`` (its first stop inside the event: the Evicted condition's
    reason, twinkit.driver.stop_cause), ``shrunk`` (an elastic job ran on fewer replicas
    than its size: m2g right-sized it), ``capped`` (it ran under a power cap), ``stalled`` (a
    failed tray), else ``slow`` (it ran, but not all of the window: started late, waited on
    its pods)."""
    stops = job.get("event_stops") or []
    if stops:
        return f"stopped:{stops[0]}"
    if float(job.get("event_shrunk_s") or 0.0) > 0:
        return "shrunk"
    if float(job.get("event_capped_s") or 0.0) > 0:
        return "capped"
    if float(job.get("event_stalled_s") or 0.0) > 0:
        return "stalled"
    return "slow"


def elastic_figures(jobs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What the job driver saw of the elastic jobs (``min_pods`` > 0; docs/twin.md "Elastic
    jobs"): how many the replay had, how many ran at the event's start, how many of those ran
    on fewer replicas than their size inside the event (m2g shrank them: the pods went, not
    only the counter moved) and for how long in all (trace seconds). None without any."""
    elastic = [j for j in jobs if int(j.get("min_pods") or 0) > 0]
    if not elastic:
        return None
    shrunk = [j for j in elastic if float(j.get("event_shrunk_s") or 0.0) > 0]
    return {"jobs": len(elastic),
            "runningAtEventStart": sum(1 for j in elastic if j.get("running_at_event_start")),
            "shrunkInEvent": len(shrunk),
            "shrunkSeconds": round(sum(float(j["event_shrunk_s"]) for j in shrunk), 1)}


def _weighted(pairs: Sequence[tuple[int, float]]) -> float | None:
    gpus = sum(g for g, _ in pairs)
    return round(sum(g * p for g, p in pairs) / gpus, 4) if gpus else None


def workload_figures(jobs: Sequence[Mapping[str, Any]], time_scale: float,
                     run_end: float, event_s_trace: float | None) -> dict[str, Any]:
    """Waits include jobs never admitted, counted until the run's end (a lower bound); jobs
    of the warm start (``prefill``: submitted at once, already running in the trace) count in
    performance and losses but not in waits and JCT."""
    timed = [j for j in jobs if not j.get("prefill") and j.get("submitted") is not None]
    waits = [((j["admitted"] if j.get("admitted") is not None else run_end) - j["submitted"])
             * time_scale for j in timed]
    jct = [(j["finished"] - j["submitted"]) * time_scale for j in timed
           if j.get("finished") is not None]
    perf = performance(jobs, event_s_trace) if event_s_trace else \
        {"weightedPerformance": None, "perTier": {str(t): None for t in range(4)}}
    return {
        **perf,
        "queueWaitSeconds": {f"p{q}": _r(nearest_rank(waits, q / 100), 1) for q in (50, 95, 99)},
        "jctSeconds": {f"p{q}": _r(nearest_rank(jct, q / 100), 1) for q in (50, 95)},
        "completed": sum(1 for j in jobs if j.get("finished") is not None),
        "preemptions": sum(int(j.get("evictions", 0)) for j in jobs),
        "restarts": sum(int(j.get("restarts", 0)) for j in jobs),
        "lostGpuSeconds": _r(sum(float(j.get("lost", 0.0)) for j in jobs), 1),
    }


#: The steps of an admission (``admission_latency``): name → (from, to) record fields.
ADMISSION_STEPS = {
    "submittedToQuotaReserved": ("submitted", "quota_reserved"),
    "quotaReservedToDecided": ("quota_reserved", "decided"),
    "decidedToCheckReady": ("decided", "check_ready"),
    "quotaReservedToCheckReady": ("quota_reserved", "check_ready"),
    "checkReadyToAdmitted": ("check_ready", "admitted"),
    "quotaReservedToAdmitted": ("quota_reserved", "admitted"),
    "admittedToBound": ("admitted", "bound"),
}


def admission_latency(jobs: Sequence[Mapping[str, Any]],
                      decided: Mapping[str, float] | None = None,
                      start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Where an admission's time goes outside events, per step, in **wall** seconds (the
    control plane's own latency, not trace time): p50 / p95 / n over the replayed (not
    prefilled) jobs' first admissions, counting a step when it has both ends and begins outside
    [start, end + 120] (the window ``allocation_outside`` leaves out: a step begun in an event
    measures the event's deferrals, not the round trip). The ends are the Workload's own
    conditions (whole seconds, so a step is ±1 s), ``decided`` the first ``Ready`` decision in
    m2g's decision log (``namespace/workload`` → replay second, its snapshot's time). A step
    no job has (plain Kueue: no check) is left out."""
    def outside(t: float) -> bool:
        return start is None or end is None or not start <= t <= end + AFTER_EVENT_S

    out: dict[str, Any] = {}
    for step, (a, b) in ADMISSION_STEPS.items():
        vals = []
        for j in jobs:
            if j.get("prefill"):
                continue
            ends = {k: (decided or {}).get(f"{j.get('namespace')}/{j.get('workload')}")
                    if k == "decided" else j.get(k) for k in (a, b)}
            if ends[a] is not None and ends[b] is not None and outside(float(ends[a])):
                vals.append(max(0.0, float(ends[b]) - float(ends[a])))
        if vals:
            out[step] = {"p50": _r(nearest_rank(vals, 0.5), 1),
                         "p95": _r(nearest_rank(vals, 0.95), 1), "n": len(vals)}
    return out


# ---- placement -------------------------------------------------------------------------------

def fragmentation(free_by_rack: Mapping[str, int], sizes: Mapping[int, float]) -> float:
    """FGD's expected fragmentation (Weng et al., ATC '23) with the NVL72 rack as the unit a
    job of ≤ 72 GPUs must fit in: for each rack and task size m (weighted by its share of the
    trace), the rack's free GPUs count as fragment when m does not fit in them. Pods are whole
    trays, so no partial-GPU leftovers exist. Summed over racks, in GPUs."""
    small = {g: s for g, s in sizes.items() if g <= RACK_GPUS}
    total = sum(small.values())
    if not total:
        return 0.0
    return sum(s / total * free for free in free_by_rack.values()
               for g, s in small.items() if g > free)


def placement_figures(jobs: Sequence[Mapping[str, Any]], node_rack: Mapping[str, str],
                      node_block: Mapping[str, str], alarmed_bindings: int,
                      frag_samples: Sequence[float]) -> dict[str, Any]:
    small = [j for j in jobs if j["gpus"] <= RACK_GPUS and j.get("runs")]
    inside = sum(1 for j in small
                 if all(len({node_rack.get(n, n) for n in run}) == 1 for run in j["runs"]))
    levels = {"required-clique": node_rack, "required-block": node_block}  # rack = clique
    violations = 0
    for j in jobs:
        level = levels.get(str(j.get("topology")))
        if level is not None:
            violations += sum(1 for run in j.get("runs") or []
                              if len({level.get(n, n) for n in run}) > 1)
    return {"inOneNvlinkDomainPct": _r(100.0 * inside / len(small), 2) if small else None,
            "onAlarmedRacks": alarmed_bindings,
            "fragmentation": _r(sum(frag_samples) / len(frag_samples), 2)
            if frag_samples else None,
            "topologyViolations": violations}


def alarmed(bindings: Sequence[Sequence[Any]], is_alarmed: Callable[[str, float], bool]) -> int:
    """Pod bindings (job, node, t) made to a node that was alarmed at that time."""
    return sum(1 for _, node, t in bindings if is_alarmed(str(node), float(t)))


def allocation_outside(samples: Sequence[Sequence[float]], total_gpus: int,
                       start: float | None, end: float | None) -> float | None:
    """Mean allocated / total GPUs (%) over samples (t, GPUs, …) outside [start, end + 120]."""
    vals = [s[1] for s in samples
            if start is None or end is None or not start <= s[0] <= end + AFTER_EVENT_S]
    return _r(100.0 * sum(vals) / len(vals) / total_gpus, 2) if vals and total_gpus else None


# ---- the controller --------------------------------------------------------------------------

def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition → name → [(labels, value)] (enough for our own metrics)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = {}
        for part in rest.rstrip("}").split('",') if rest else []:
            k, _, v = part.partition("=")
            if k:
                labels[k.strip()] = v.strip().strip('"')
        try:
            out.setdefault(name.strip(), []).append((labels, float(value)))
        except ValueError:
            continue
    return out


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Prometheus's histogram_quantile over cumulative (le, count) buckets."""
    data = sorted(buckets)
    if not data or data[-1][1] <= 0:
        return None
    rank = q * data[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in data:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 1.0)
        prev_le, prev_count = le, count
    return prev_le


def actions_from_metrics(metrics: Mapping[str, list[tuple[dict[str, str], float]]],
                         quota_changes: int) -> dict[str, int]:
    def total(name: str, **want: str) -> int:
        return int(sum(v for labels, v in metrics.get(name, [])
                       if all(labels.get(k) == x for k, x in want.items())))

    return {"admits": total("m2g_admission_decisions_total", state="Ready"),
            "defers": total("m2g_admission_decisions_total", state="Retry"),
            "sheds": total("m2g_shed_actions_total", action="shed"),
            "restores": total("m2g_shed_actions_total", action="restore"),
            "drains": total("m2g_shed_actions_total", action="drain"),
            "powerCaps": total("m2g_power_cap_actions_total", action="cap"),
            "capLifts": total("m2g_power_cap_actions_total", action="lift"),
            "resizes": total("m2g_resize_actions_total", action="shrink"),
            "resizeGrows": total("m2g_resize_actions_total", action="grow"),
            "quotaChanges": quota_changes}


def reaction(metrics: Mapping[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any]:
    buckets = [(float(labels["le"].replace("+Inf", "inf")), v)
               for labels, v in metrics.get("m2g_reaction_latency_seconds_bucket", [])]
    return {"reactionSecondsP50": _r(histogram_quantile(buckets, 0.5), 3),
            "reactionSecondsP99": _r(histogram_quantile(buckets, 0.99), 3)}


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, nd)
