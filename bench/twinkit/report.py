"""report.json, report.md and the exports of a twin run (figures: twinkit.metrics)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twinkit import bound as B
from twinkit import forecast as F
from twinkit import metrics as M
from twinkit import scenarios as S
from twinkit.harness import INLET_LIMIT_C, RunData

Obj = dict[str, Any]


def grid_event(data: RunData) -> M.GridEvent | None:
    if data.event_start is None or data.event_end is None or data.target_kw is None:
        return None
    intervals, start, target = data.intervals, data.event_start, data.target_kw

    def limit(t: float) -> float:
        got = S.limit_at(intervals, t - start)
        return target if got is None else float(got)

    return M.GridEvent(start, data.event_end, data.ramp_s or M.RAMP_DEFAULT_S, target, limit)


def alarm_check(data: RunData) -> Any:
    """(node, t) → was the node on an alarmed rack, or failed, at t?"""
    hot: list[tuple[float, set[str]]] = [
        (t, {r for r, c in inlet.items() if c > INLET_LIMIT_C}) for t, inlet in data.inlet]

    def is_alarmed(node: str, t: float) -> bool:
        for target, _, start, end in data.faults:
            if target == node and start <= t <= (end if end is not None else 1e18):
                return True
        rack = data.nodes.get(node, ("", ""))[0]
        before = [h for ts, h in hot if ts <= t]
        return bool(before) and rack in before[-1]

    return is_alarmed


#: Extra sections of a RUN (docs/twin.md "Extending the twin"): name → a function of the run's
#: data giving the section, or None when it has nothing to say (the section is then left out).
#: E.g. ``"forecast"`` for a scenario that compares m2g's forecast with what happened.
SECTIONS: dict[str, Callable[[RunData], Obj | None]] = {}


def forecast_section(data: RunData) -> Obj | None:
    """The forecast scenario's ``m2g forecast`` against the draw the twin sampled
    (twinkit.forecast); None for a run that made no forecast."""
    fc = data.extra.get("forecast")
    if not fc:
        return None
    gpus = [(float(s[0]), float(s[1])) for s in data.driver.get("samples") or []]
    got = F.figures(fc, data.samples, data.t0, float(data.extra.get("timeScale") or 60.0), gpus,
                    data.driver.get("jobs") or [])
    if got is not None:
        got["forecastCliSeconds"] = M._r(data.extra.get("forecastSeconds"), 1)
        got["deliveryReport"] = (data.log_summary or {}).get("events")
    return got


SECTIONS["forecast"] = forecast_section


def bound_section(data: RunData) -> Obj | None:
    """``performanceBound`` (twinkit.bound): the best weighted performance a controller could
    keep on the jobs running at the event's start while at the target from 30 wall s on;
    None for a run without an event."""
    if data.event_start is None or data.event_end is None or data.target_kw is None:
        return None
    scale = float(data.extra.get("timeScale") or 60.0)
    pre = M.baseline_kw(data.samples, data.event_start)
    if pre is None:
        return None
    jobs, window = data.driver.get("jobs") or [], (data.event_end - data.event_start) * scale
    got = B.performance_bound(jobs, pre - data.target_kw, window,
                              grace_s_trace=BOUND_GRACE_S * scale)
    if got is not None:
        got["graceSeconds"] = BOUND_GRACE_S
        firm = B.firm_arrivals(jobs, data.event_start, data.event_end, scale)
        with_firm = B.performance_bound(jobs, pre - data.target_kw, window,
                                        grace_s_trace=BOUND_GRACE_S * scale, firm_new=firm)
        got["firmArrivals"] = {
            "jobs": len(firm),
            "peakKw": round(max((sum(kw for a, b, kw in firm if a <= t < b)
                                 for t, _, _ in firm), default=0.0), 1),
            "weightedPerformance": (with_firm or {}).get("weightedPerformance")}
    return got


#: The goal: at the target within 30 s of the event's start (issue 15).
BOUND_GRACE_S = 30.0
SECTIONS["performanceBound"] = bound_section


def elastic_section(data: RunData) -> Obj | None:
    """``elastic`` (twinkit.metrics.elastic_figures): the elastic jobs and how many ran shrunk
    in the event, as the job driver saw their pods; None when the replay had none."""
    return M.elastic_figures(data.driver.get("jobs") or [])


SECTIONS["elastic"] = elastic_section


def run_figures(data: RunData, time_scale: float, total_gpus: int, run_end: float) -> Obj:
    jobs = data.driver.get("jobs") or []
    ev = grid_event(data)
    event_trace = ((data.event_end or 0) - (data.event_start or 0)) * time_scale \
        if data.event_start is not None else None
    samples = data.driver.get("samples") or []
    node_rack = {n: rb[0] for n, rb in data.nodes.items()}
    node_block = {n: rb[1] for n, rb in data.nodes.items()}
    bindings = data.driver.get("bindings") or []
    metrics = M.parse_prometheus(data.metrics_text) if data.metrics_text else {}
    controller: Obj = {"reactionSecondsP50": None, "reactionSecondsP99": None,
                       "rssPeakMiB": None}
    if data.metrics_text:
        controller = {**M.reaction(metrics), "rssPeakMiB": M._r(data.rss_peak_mib, 1)}
    figures: Obj = {
        "grid": M.grid_figures(data.samples, ev),
        "workloads": {**M.workload_figures(jobs, time_scale, run_end, event_trace),
                      "admissionLatency": M.admission_latency(jobs, data.decided, data.event_start,
                                                              data.event_end)},
        "placement": M.placement_figures(jobs, node_rack, node_block,
                                         M.alarmed(bindings, alarm_check(data)),
                                         [s[2] for s in samples]),
        "gpuAllocationPctOutsideEvent": M.allocation_outside(samples, total_gpus,
                                                             data.event_start, data.event_end),
        "actions": M.actions_from_metrics(metrics, data.quota_changes),
        "controller": controller,
    }
    data.extra.setdefault("timeScale", time_scale)
    for name, section in SECTIONS.items():
        got = section(data)
        if got is not None:
            figures[name] = got
    return figures


def report(scenario: str, trace: Obj, time_scale: float, runs: dict[str, Obj]) -> Obj:
    return {"scenario": scenario, "trace": trace, "timeScale": time_scale, "runs": runs}


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def _step(v: Obj) -> str:
    """An admission step (``{p50, p95, n}``) in one cell; any other mapping as ``k v; ...``
    (``performanceLostBy``'s shares per cause)."""
    if "p50" not in v:
        return "; ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "none"
    return f"{_fmt(v.get('p50'))} / {_fmt(v.get('p95'))} (n {v.get('n')})"


def markdown(rep: Obj, datas: dict[str, RunData], machine: str) -> str:
    runs = rep["runs"]
    names = list(runs)
    lines = [f"# Model-to-Grid twin: {rep['scenario']}", "",
             f"Trace `{rep['trace']['file']}`: {rep['trace']['jobs']} jobs replayed "
             f"({rep['trace']['rows']} rows; skipped {rep['trace']['skipped']}), arrivals "
             f"compressed ×{rep['trace']['compression']:.2f} to offer "
             f"{rep['trace']['offeredGpus']:.0f} GPUs; time scale {rep['timeScale']:g} "
             f"(one trace hour = {3600 / rep['timeScale']:.0f} wall s). "
             f"Grid figures in wall seconds, workload figures in trace seconds.", "",
             f"Machine: {machine}", "", "## Timeline", ""]
    for name in names:
        for t, what in datas[name].timeline:
            lines.append(f"- {name}: t = {t:.0f} s — {what}")
    lines += ["", "## Figures", "", "| figure | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    for section in ("grid", "workloads", "placement", "actions", "controller",
                    *(s for s in SECTIONS if all(s in runs[n] for n in names))):
        keys = list(runs[names[0]][section])
        for k in keys:
            vals = [runs[n][section].get(k) for n in names]
            if isinstance(vals[0], list) or k in NOT_IN_TABLE:
                continue  # per-interval rows and reports: their own section below
            if isinstance(vals[0], dict):
                subs = list(dict.fromkeys(s for v in vals for s in (v or {})))
                for sub in subs:
                    got = [(v or {}).get(sub) for v in vals]
                    lines.append(f"| {section}.{k}.{sub} | " + " | ".join(
                        _step(g) if isinstance(g, dict) else _fmt(g) for g in got) + " |")
            else:
                lines.append(f"| {section}.{k} | " + " | ".join(_fmt(v) for v in vals) + " |")
    lines.append("| gpuAllocationPctOutsideEvent | "
                 + " | ".join(_fmt(runs[n]["gpuAllocationPctOutsideEvent"]) for n in names)
                 + " |")
    lines += ["", "Run cost: " + "; ".join(
        f"{n} {datas[n].wall_s:.0f} s wall, {datas[n].cpu_s:.0f} s CPU (the control plane, "
        f"simulator, Prometheus, driver, m2g run and the twin; the job driver alone "
        f"{_fmt(datas[n].driver.get('cpuSeconds'))} s over {_fmt(datas[n].driver.get('looks'))}"
        f" looks)" for n in names), "",
        *cpu_lines(datas, names),
        "Plots: site-kw.png, queue-gpus.png, tiers.png. Definitions: docs/twin.md and "
        "docs/twin-metrics.md.", ""]
    lines += forecast_markdown(runs)
    lines += log_markdown(datas)
    return "\n".join(lines)


NOT_IN_TABLE = frozenset({"report", "deliveryReport", "clock"})


def cpu_lines(datas: dict[str, RunData], names: list[str]) -> list[str]:
    """CPU seconds by process at each replay's end, the largest first: whether a run's
    latencies come from its controller's work or from a machine its processes filled."""
    lines = []
    for n in names:
        parts = sorted(datas[n].cpu_parts.items(), key=lambda kv: -kv[1])
        if parts:
            lines.append(f"CPU by process at the end of {n}'s replay (s): "
                         + ", ".join(f"{k} {v:,.0f}" for k, v in parts) + ".")
    return [*lines, ""] if lines else []


def forecast_markdown(runs: Obj) -> list[str]:
    """Per run with a forecast: its intervals against the draw, and what the figures mean."""
    lines: list[str] = []
    for name, run in runs.items():
        fc = run.get("forecast")
        if not fc:
            continue
        lines += [f"## Forecast ({name}): made at t = {fc['madeAtSeconds']:.0f} s, "
                  f"{fc['intervalsCompared']} intervals of {fc['intervalSeconds']:.0f} wall s "
                  f"(one trace hour each)", "",
                  f"MAPE {_fmt(fc['mapePct'])} % (committed work only: "
                  f"{_fmt(fc['committedMapePct'])} %), NRMSE {_fmt(fc['nrmsePct'])} %, bias "
                  f"{_fmt(fc['biasPct'])} %, band coverage {_fmt(fc['bandCoveragePct'])} %, "
                  f"flexible share {_fmt(fc['flexibleSharePct'])} % of the forecast kW. "
                  f"{fc['clock']}.", "",
                  "| hour | start s | forecast kW | low | high | committed kW | actual kW | "
                  "error % | limit kW | flex kW (t1/t2/t3) | GPUs forecast / actual |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in fc["intervals"]:
            flex = "/".join(f"{r['flexKw'].get(t, r['flexKw'].get(str(t), 0)):.0f}"
                            for t in (1, 2, 3))
            lines.append(f"| {r['interval']} | {r['startS']:.0f} | {_fmt(r['forecastKw'])} | "
                         f"{_fmt(r['lowKw'])} | {_fmt(r['highKw'])} | "
                         f"{_fmt(r['committedKw'])} | {_fmt(r['actualKw'])} | "
                         f"{_fmt(r['errorPct'])} | {_fmt(r['limitKw'])} | {flex} | "
                         f"{_fmt(r['forecastGpus'])} / {_fmt(r['actualGpus'])} |")
        lines.append("")
    return lines


def log_markdown(datas: dict[str, RunData]) -> list[str]:
    """What ``m2g report`` says of each run's decision log (<run>/decisions.parquet,
    <run>/lifecycle.parquet): the event's delivery per 30 s interval, actions, lifecycle."""
    lines = ["## Decision logs (`m2g report <out>/<run>`)", ""]
    for name, d in datas.items():
        s = d.log_summary
        if not s:
            lines += [f"- {name}: no decision log summary", ""]
            continue
        records = ", ".join(f"{k} {v}" for k, v in
                            ((s.get("lifecycle") or {}).get("records") or {}).items())
        acts = ", ".join(f"{k} {v}" for k, v in (s.get("actions") or {}).items()) or "none"
        lines.append(f"- **{name}**: {s['rows']['decisions']} decision rows, "
                     f"{s['rows']['lifecycle']} lifecycle records ({records}); actions: {acts}")
        for ev in s.get("events") or []:
            ivs = ev.get("intervals") or []
            lines.append(f"  - event {ev['event']}: target {_fmt(ev['targetKw'])} kW, "
                         f"to target {_fmt(ev['secondsToTarget'])} s, above "
                         f"{_fmt(ev['secondsAboveTarget'])} s, {_fmt(ev['kwhAboveTarget'])} kWh "
                         f"above; compliant intervals {ev['compliantIntervals']}/{len(ivs)}: "
                         + ", ".join(f"{_fmt(i['meanKw'])}/{_fmt(i['targetKw'])}" for i in ivs))
        lines.append("")
    return lines


def exports(out: Path, datas: dict[str, RunData]) -> None:
    for name, d in datas.items():
        inputs = d.extra.get("forecastInputs")
        if inputs and Path(inputs).is_file():  # the forecast's snapshot: forecast_rescore.py
            shutil.copyfile(inputs, out / f"{name}-forecast-inputs.pickle")
        (out / f"{name}-series.json").write_text(json.dumps({
            "t0": d.t0, "timeScale": d.extra.get("timeScale"), "siteKw": d.samples,
            "queue": d.queue, "driverSamples": d.driver.get("samples"),
            "intervals": [vars(i) for i in d.intervals], "eventStart": d.event_start,
            "eventEnd": d.event_end, "targetKw": d.target_kw, "timeline": d.timeline}))
        (out / f"{name}-jobs.json").write_text(json.dumps(d.driver.get("jobs") or []))
