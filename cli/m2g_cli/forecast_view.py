"""Renderers of ``m2g forecast`` (pure: a Forecast in, text or a PNG out).

``-o table`` (kubectl-like columns), ``json`` (the forecast, and an OpenADR-3-report-like
``report``: one resource per domain, intervals of kW), ``csv`` (one row per interval).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from m2g.planner.forecast import Forecast, Interval


class ForecastOutput(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def _t(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _domains(fc: Forecast) -> list[str]:
    return sorted({d for i in fc.intervals for d in i.domains})


def _row(i: Interval, doms: list[str], other: Interval | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "start": _t(i.start), "end": _t(i.end), "siteKw": i.site_kw, "lowKw": i.low_kw,
        "highKw": i.high_kw, "limitKw": i.limit_kw, "shedKw": i.shed_kw,
        "busyGpus": i.busy_gpus, **{f"flexTier{t}Kw": i.flex_kw.get(t, 0.0) for t in (1, 2, 3)},
        "committedKw": i.committed_kw, "newWorkGpus": i.new_work_gpus,
        "domains": {d: i.domains.get(d, 0.0) for d in doms}}
    if other is not None:
        row["withWindowKw"] = other.site_kw
        row["deltaKw"] = round(other.site_kw - i.site_kw, 3)
    return row


def rows(fc: Forecast, with_window: Forecast | None = None) -> list[dict[str, Any]]:
    doms = _domains(fc)
    others = with_window.intervals if with_window else (None,) * len(fc.intervals)
    return [_row(i, doms, o) for i, o in zip(fc.intervals, others, strict=True)]


def report(fc: Forecast) -> dict[str, Any]:
    """OpenADR 3 report-like: per resource (the site, each power domain) one interval list."""
    period = {"start": _t(fc.made_at), "duration": f"PT{fc.interval_seconds}S"}
    resources = [{"resourceName": fc.site, "intervalPeriod": period, "intervals": [
        {"id": n, "payloads": [{"type": "USAGE_FORECAST", "values": [i.site_kw]},
                               {"type": "USAGE_FORECAST_LOW", "values": [i.low_kw]},
                               {"type": "USAGE_FORECAST_HIGH", "values": [i.high_kw]},
                               {"type": "USAGE_FORECAST_COMMITTED",
                                "values": [i.committed_kw if i.committed_kw is not None
                                           else i.site_kw]},
                               *({"type": f"FLEXIBLE_TIER_{t}", "values": [i.flex_kw.get(t, 0)]}
                                 for t in (1, 2, 3))]}
        for n, i in enumerate(fc.intervals)]}]
    resources += [{"resourceName": d, "intervalPeriod": period, "intervals": [
        {"id": n, "payloads": [{"type": "USAGE_FORECAST", "values": [i.domains.get(d, 0.0)]}]}
        for n, i in enumerate(fc.intervals)]} for d in _domains(fc)]
    return {"reportName": f"m2g-forecast-{_t(fc.made_at)}", "payloadUnits": "KW",
            "resources": resources}


def render(fc: Forecast, output: ForecastOutput, with_window: Forecast | None = None) -> str:
    data = rows(fc, with_window)
    if output is ForecastOutput.JSON:
        return json.dumps({"madeAt": _t(fc.made_at), "site": fc.site,
                           "intervalSeconds": fc.interval_seconds,
                           "calibrationKw": fc.calibration_kw, "notes": list(fc.notes),
                           "intervals": data, "report": report(fc)}, indent=2) + "\n"
    doms = _domains(fc)
    flat = [{**{k: v for k, v in r.items() if k != "domains"},
             **{f"{d}Kw": v for d, v in r["domains"].items()}} for r in data]
    if output is ForecastOutput.CSV:
        buf = io.StringIO()
        cols = list(flat[0]) if flat else ["start"]
        w = csv.DictWriter(buf, cols, lineterminator="\n")
        w.writeheader()
        w.writerows({k: "" if v is None else v for k, v in r.items()} for r in flat)
        return buf.getvalue()
    return _table(fc, flat, doms, with_window is not None)


def _table(fc: Forecast, flat: list[dict[str, Any]], doms: list[str], compare: bool) -> str:
    head = ["START", "SITE-KW", "LOW", "HIGH", "LIMIT", "SHED", "GPUS", "FLEX1", "FLEX2",
            "FLEX3", *[d.upper() for d in doms]] + (["WITH-WINDOW", "DELTA"] if compare else [])
    keys = ["start", "siteKw", "lowKw", "highKw", "limitKw", "shedKw", "busyGpus",
            "flexTier1Kw", "flexTier2Kw", "flexTier3Kw", *[f"{d}Kw" for d in doms]] + (
        ["withWindowKw", "deltaKw"] if compare else [])

    def cell(k: str, v: Any) -> str:
        if v is None:
            return "-"
        if k == "start":
            return str(v)[5:16].replace("T", " ")
        return f"{v:.0f}" if k == "busyGpus" else f"{v:.1f}"

    table = [head] + [[cell(k, r.get(k)) for k in keys] for r in flat]
    widths = [max(len(row[c]) for row in table) for c in range(len(head))]
    lines = ["   ".join(x.ljust(widths[c]) for c, x in enumerate(row)).rstrip()
             for row in table]
    lines += [f"# {n}" for n in fc.notes]
    return "\n".join(lines) + "\n"


def plot(fc: Forecast, path: Path, with_window: Forecast | None = None) -> None:
    """A PNG: site kW with its band, the limits, each domain, and the proposed window's run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [(i.start - fc.made_at).total_seconds() / 3600 for i in fc.intervals]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.fill_between(xs, [i.low_kw for i in fc.intervals], [i.high_kw for i in fc.intervals],
                    step="post", alpha=0.25, label="band")
    ax.step(xs, [i.site_kw for i in fc.intervals], where="post", label=f"{fc.site} kW")
    for d in _domains(fc):
        ax.step(xs, [i.domains.get(d, 0.0) for i in fc.intervals], where="post", lw=0.8,
                label=d)
    limits = [i.limit_kw if i.limit_kw is not None else float("nan") for i in fc.intervals]
    ax.step(xs, limits, where="post", color="red", ls="--", label="limit")
    if with_window is not None:
        ax.step(xs, [i.site_kw for i in with_window.intervals], where="post", ls=":",
                label="with window")
    ax.set_ylabel("kW")
    ax.set_xlabel("hours ahead")
    ax.set_title(f"m2g forecast from {_t(fc.made_at)}")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
