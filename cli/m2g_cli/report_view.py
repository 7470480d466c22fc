"""``m2g report``'s pure part: decision-log rows in, a summary out (docs/decision-log.md).

For each grid event in the log, its delivery as an OpenADR program asks for it: the site draw
against the event's target per interval (``interval_seconds`` from the event's start), with
the figures of docs/twin-metrics.md computed on the log's samples (``Grid``/``Sample``
rows): a sample is above target when draw > target × 1.01; ``secondsToTarget`` is start → the
first sample at or under it; ``secondsAboveTarget`` sums the time from each sample above target
to the next sample; ``kwhAboveTarget`` integrates max(0, draw − target) the same way. Then the
actions m2g took during the event, and the lifecycle totals.

The rows are read as they come (m2g_cli.report_cmd reads the log in batches): nothing keeps a
row, so the memory is the log's width, not its length — but for each grid event's samples.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

TOLERANCE = 1.01
#: the most report intervals of one event: a longer event gets longer intervals
MAX_INTERVALS = 10_000
Row = Mapping[str, Any]


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if out != out else out  # NaN (an empty CSV cell) is missing


_INTERVAL = re.compile(r"^(.+)/(\d+)$")


def grid_event_of(event_id: Any) -> str:
    """The GridEvent an event id of the log belongs to: m2g logs each interval of a GridEvent
    with several intervals as ``<eventID>/<n>``; the report gives the GridEvent's delivery."""
    text = str(event_id or "")
    m = _INTERVAL.match(text)
    return m.group(1) if m else text


Sample = tuple[datetime, float, float]  # time, site draw kW, grid target kW


def _above(draw: float, target: float) -> bool:
    return draw > target * TOLERANCE


def delivery(samples: Sequence[Sample], actions: Mapping[str, int], baseline: float | None,
             event: str, start: datetime, end: datetime, interval_seconds: float
             ) -> dict[str, Any]:
    """One event's delivery from its samples (any order), the actions m2g took during it and
    its baseline: totals and one entry per interval."""
    samples = sorted(s for s in samples if start <= s[0] <= end)
    above_s = kwh = 0.0
    for (t0, d0, tg0), (t1, _, _) in pairwise(samples):
        dt = (t1 - t0).total_seconds()
        if _above(d0, tg0):
            above_s += dt
            kwh += (d0 - tg0) * dt / 3600
    first_ok = next((t for t, d, tg in samples if not _above(d, tg)), None)
    intervals = []
    # at most MAX_INTERVALS (an event from year 1 to 9999 took every byte of memory), each
    # interval's samples found by bisection (a scan per interval was samples × intervals)
    step = max(interval_seconds, (end - start).total_seconds() / MAX_INTERVALS)
    times = [s[0] for s in samples]
    at = start
    while at < end:
        nxt = end if (end - at).total_seconds() <= step else at + timedelta(seconds=step)
        inside = samples[bisect_left(times, at):bisect_left(times, nxt)]
        mean = sum(d for _, d, _ in inside) / len(inside) if inside else None
        target = sum(tg for _, _, tg in inside) / len(inside) if inside else None
        intervals.append({
            "start": at.isoformat(), "end": nxt.isoformat(), "samples": len(inside),
            "meanKw": _round(mean), "maxKw": _round(max((d for _, d, _ in inside), default=None)),
            "targetKw": _round(target),
            "compliant": None if mean is None or target is None else not _above(mean, target)})
        at = nxt
    return {
        "event": event, "start": start.isoformat(), "end": end.isoformat(),
        "intervalSeconds": round(step, 3),
        "baselineKw": _round(baseline),
        "targetKw": _round(samples[-1][2] if samples else None), "samples": len(samples),
        "secondsToTarget": None if first_ok is None else (first_ok - start).total_seconds(),
        "secondsAboveTarget": round(above_s, 1), "kwhAboveTarget": round(kwh, 4),
        "maxKw": _round(max((d for _, d, _ in samples), default=None)),
        "compliantIntervals": sum(1 for i in intervals if i["compliant"]),
        "intervals": intervals, "actions": dict(sorted(actions.items()))}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


class _Decisions:
    """What the report keeps of the decisions, one row at a time: counters, the time span,
    the grid events' spans and baselines, and each event's samples (a tuple a Grid/Sample
    row: the only part that grows with the log, ~100 bytes a sample)."""

    def __init__(self) -> None:
        self.rows = 0
        self.actions: Counter[str] = Counter()
        self.times: list[datetime] = []  # the first and the last
        self.policy_sets: set[str] = set()
        self.spans: dict[str, tuple[datetime, datetime]] = {}
        self.baselines: dict[str, float] = {}
        self.samples: dict[str, list[Sample]] = {}

    def add(self, r: Row) -> None:
        self.rows += 1
        t = r["time"]
        self.times = [min(self.times[0], t), max(self.times[1], t)] if self.times else [t, t]
        if r.get("outcome") != "Sample":
            self.actions[f"{r.get('stage')}/{r.get('outcome')}"] += 1
        if r.get("policy_set"):
            self.policy_sets.add(str(r.get("policy_set")))
        key = grid_event_of(r.get("grid_event"))
        self._span(r, key)
        if key not in self.baselines and (b := _num(r.get("grid_baseline_kw"))) is not None:
            self.baselines[key] = b
        if (r.get("stage") == "Grid" and r.get("outcome") == "Sample"
                and (d := _num(r.get("site_draw_kw"))) is not None
                and (tg := _num(r.get("grid_target_kw"))) is not None):
            self.samples.setdefault(key, []).append((t, d, tg))

    def _span(self, r: Row, key: str) -> None:
        """A GridEvent's intervals (``<eventID>/<n>``) are one event, from its first
        interval's start to its last's end."""
        start, end = r.get("grid_event_start"), r.get("grid_event_end")
        if r.get("grid_event") and isinstance(start, datetime) and isinstance(end, datetime):
            old = self.spans.get(key)
            self.spans[key] = (start, end) if old is None else (min(old[0], start),
                                                                max(old[1], end))

    def events(self) -> list[tuple[str, datetime, datetime]]:
        """(id, start, end) of every grid event the log saw, by start."""
        return sorted(((k, *v) for k, v in self.spans.items()), key=lambda e: (e[1], e[0]))


def _event_actions(decisions: Iterable[Row], chosen: Sequence[tuple[str, datetime, datetime]]
                   ) -> dict[str, Counter[str]]:
    """The actions (not Grid rows) inside each event's span: a second reading of the log,
    now that the spans are known."""
    out: dict[str, Counter[str]] = {ev: Counter() for ev, _, _ in chosen}
    if not chosen:
        return out
    for r in decisions:
        if r.get("outcome") == "Sample" or r.get("stage") == "Grid":
            continue
        for ev, start, end in chosen:
            if start <= r["time"] <= end:
                out[ev][f"{r.get('stage')}/{r.get('outcome')}"] += 1
    return out


def _lifecycle(lifecycle: Iterable[Row]) -> tuple[int, list[datetime], dict[str, Any]]:
    """Rows, the first and last time, and the totals: records by event and, from each
    workload's latest record (of equal times the later one; one small entry a workload),
    GPU-hours and kWh."""
    rows, life = 0, Counter[str]()
    times: list[datetime] = []
    final: dict[str, tuple[datetime, float, float]] = {}
    for r in lifecycle:
        rows += 1
        t = r["time"]
        times = [min(times[0], t), max(times[1], t)] if times else [t, t]
        life[str(r.get("event"))] += 1
        w = str(r.get("workload"))
        if w not in final or t >= final[w][0]:
            final[w] = (t, _num(r.get("gpu_seconds")) or 0.0, _num(r.get("kwh")) or 0.0)
    gpu_s = sum(g for _, g, _ in final.values())
    kwh = sum(k for _, _, k in final.values())
    return rows, times, {"records": dict(sorted(life.items())), "workloads": len(final),
                         "gpuHours": round(gpu_s / 3600, 3), "kwhEstimated": round(kwh, 3)}


def summary(decisions: Iterable[Row], lifecycle: Iterable[Row], interval_seconds: float,
            only_event: str | None = None) -> dict[str, Any]:
    """The report of a log. ``decisions`` is read twice (a list, or a
    m2g_cli.report_cmd.LogTable, which reads its files again), ``lifecycle`` once; neither is
    held: what is kept is the summary's own state (see ``_Decisions``)."""
    dec = _Decisions()
    for r in decisions:
        dec.add(r)
    life_rows, life_times, life = _lifecycle(lifecycle)
    chosen = [e for e in dec.events() if only_event is None or e[0] == grid_event_of(only_event)]
    acted = _event_actions(decisions, chosen)
    times = [*dec.times, *life_times]
    return {
        "from": min(times).isoformat() if times else None,
        "to": max(times).isoformat() if times else None,
        "rows": {"decisions": dec.rows, "lifecycle": life_rows},
        "policySets": sorted(dec.policy_sets),
        "actions": dict(sorted(dec.actions.items())),
        "events": [delivery(dec.samples.get(ev, []), acted[ev], dec.baselines.get(ev), ev,
                            start, end, interval_seconds) for ev, start, end in chosen],
        "lifecycle": life,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_table(s: Mapping[str, Any]) -> str:
    """The summary as text: one block per event, then actions and lifecycle."""
    from m2g_cli.views import table
    lines = [f"decision log {s['from']} .. {s['to']}: {s['rows']['decisions']} decisions, "
             f"{s['rows']['lifecycle']} lifecycle records; policy sets: "
             f"{', '.join(s['policySets']) or '-'}", ""]
    for ev in s["events"]:
        lines.append(f"GRID EVENT {ev['event']}  {ev['start']} .. {ev['end']}  baseline "
                     f"{_cell(ev['baselineKw'])} kW  target {_cell(ev['targetKw'])} kW")
        lines.append(f"  to target {_cell(ev['secondsToTarget'])} s, above target "
                     f"{_cell(ev['secondsAboveTarget'])} s ({_cell(ev['kwhAboveTarget'])} kWh), "
                     f"max {_cell(ev['maxKw'])} kW, {ev['compliantIntervals']}/"
                     f"{len(ev['intervals'])} intervals compliant")
        rows = [[i["start"][11:19], i["end"][11:19], _cell(i["meanKw"]), _cell(i["maxKw"]),
                 _cell(i["targetKw"]), _cell(i["compliant"]), str(i["samples"])]
                for i in ev["intervals"]]
        lines.append(table(["FROM", "TO", "MEAN KW", "MAX KW", "TARGET KW", "OK", "SAMPLES"],
                           rows).rstrip("\n"))
        if ev["actions"]:
            lines.append("  actions: " + ", ".join(f"{k} {v}" for k, v in ev["actions"].items()))
        lines.append("")
    lines.append("ACTIONS " + (", ".join(f"{k} {v}" for k, v in s["actions"].items()) or "-"))
    lc = s["lifecycle"]
    lines.append("LIFECYCLE " + (", ".join(f"{k} {v}" for k, v in lc["records"].items()) or "-")
                 + f"; {lc['workloads']} workloads, {lc['gpuHours']:g} GPU-hours, "
                 f"{lc['kwhEstimated']:g} kWh (estimated)")
    return "\n".join(lines) + "\n"
