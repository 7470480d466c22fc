"""Scenarios of the twin (pure; docs/twin.md "Scenarios").

Each scenario is a timeline in wall seconds from the replay's start: what to create or inject,
when, and for how long. The grid ones follow the SRP demand-response event of the Emerald AI /
EPRI / SRP field demonstration (data/emerald-dr-2025/SRP_total_power.csv): ``srp_shape``
measures its depth (plateau below the pre-event draw), its ramp and its length from the file.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from enum import StrEnum


class Scenario(StrEnum):
    DR_SRP = "dr-srp"
    DR_PERCENT = "dr-percent"
    COOLING = "cooling"
    XID_STORM = "xid-storm"
    MAINTENANCE = "maintenance"
    FORECAST = "forecast"  # dr-srp notified at the replay's start, with m2g's forecast then


GRID_SCENARIOS = frozenset({Scenario.DR_SRP, Scenario.DR_PERCENT, Scenario.FORECAST})


@dataclass(frozen=True)
class EventShape:
    """A DR event in trace seconds: ``depth`` = 1 − plateau / pre-event draw."""

    depth: float
    ramp_s: float
    duration_s: float
    pre_kw: float
    plateau_kw: float


def srp_shape(csv_text: str, drop: float = 0.10, settle: float = 0.02,
              hold: int = 5) -> EventShape:
    """From a per-minute ``timestamp,total`` power file: pre-event draw = mean of the first
    hour; the event = the longest run of minutes more than ``drop`` below it, starting one
    minute earlier (the draw starts falling there); plateau = median of the event after its
    ramp; ramp = start → first minute within ``settle`` of the plateau."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    kw = [float(r[1]) / 1000.0 for r in rows[1:] if len(r) >= 2 and r[1].strip()]
    if len(kw) < 120:
        raise ValueError("need at least two hours of per-minute power")
    pre = statistics.fmean(kw[:60])
    best, run_start = (0, 0), None
    for i, v in enumerate([*kw, pre]):
        if v < pre * (1 - drop) and run_start is None:
            run_start = i
        elif v >= pre * (1 - drop) and run_start is not None:
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
            run_start = None
    start, end = max(0, best[0] - 1), best[1]
    if end - start < 10:
        raise ValueError("no demand-response event found in the power file")
    rough = statistics.median(kw[start:end])
    ramp = next((i for i in range(start, end)
                 if all(v <= rough * (1 + settle) for v in kw[i:i + hold])), start) - start
    plateau = statistics.median(kw[start + ramp:end])
    return EventShape(1 - plateau / pre, ramp * 60.0, (end - start) * 60.0, pre, plateau)


@dataclass(frozen=True)
class Interval:
    """One GridEvent interval (wall seconds from the event's start)."""

    offset_s: float
    duration_s: float
    limit_kw: float


def ramp_intervals(pre_kw: float, depth: float, ramp_s: float, duration_s: float,
                   steps: int = 4) -> list[Interval]:
    """IMPORT_CAPACITY_LIMIT intervals: ``steps`` equal steps from the pre-event draw down to
    the target over the ramp, then the target until the end (wall seconds, whole seconds)."""
    target = pre_kw * (1 - depth)
    out: list[Interval] = []
    step = max(1, round(ramp_s / steps)) if ramp_s > 0 else 0
    t = 0
    for k in range(steps if step else 0):
        limit = pre_kw - (pre_kw - target) * (k + 1) / steps
        out.append(Interval(t, step, round(limit, 1)))
        t += step
    out.append(Interval(t, max(1, round(duration_s - t)), round(target, 1)))
    return out


def limit_at(intervals: list[Interval], offset_s: float) -> float | None:
    """The limit in force ``offset_s`` after the event's start (None outside it)."""
    for iv in intervals:
        if iv.offset_s <= offset_s < iv.offset_s + iv.duration_s:
            return iv.limit_kw
    return None


@dataclass(frozen=True)
class Timeline:
    """When the scenario's event starts and ends (wall seconds from the replay's start)."""

    scenario: Scenario
    start_s: float
    duration_s: float
    ramp_s: float
    depth: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def timeline(scenario: Scenario, shape: EventShape, time_scale: float,
             event_at_trace_s: float) -> Timeline:
    """The scenario's event in wall seconds: the SRP shape scaled by the time scale for the
    grid scenarios; the other scenarios last as long as the SRP event, without a ramp."""
    start = event_at_trace_s / time_scale
    duration = shape.duration_s / time_scale
    ramp = shape.ramp_s / time_scale if scenario in GRID_SCENARIOS else 0.0
    return Timeline(scenario, start, duration, ramp, shape.depth)
