"""The forecast scenario's figures (pure; docs/twin.md "The forecast scenario").

``figures`` compares what ``m2g forecast -o json`` said at the replay's start with the site
draw the twin then sampled, interval by interval: the forecast's intervals are in m2g's clock
(wall seconds; one interval = one trace hour at the twin's time scale), the actual of an
interval is the mean of the site-draw samples inside it. Only whole intervals inside the
replay are compared.

With the driver's job records (``jobs``), each interval also gets ``committedWorkKw``: the
sampled draw less what the work submitted after the forecast was made drew above idle (its
GPUs × its kind's kW per GPU less the idle kW, from its first bound pod to its finish: the
simulator's uncapped power model, so capped or paused new work counts at full draw). That
is the draw of the work the committed forecast (``committedKw``) knew of, so
``committedWorkMapePct`` scores the committed forecast on the work it forecasts, and
``committedFloorPct`` is the committed-only MAPE an exact forecast of that work scores
against the site's draw (the share of the draw that work arriving later accounts for).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from m2g.model.inputs import WorkloadKind
from m2g.planner.forecast import KIND_KW_PER_GPU, ForecastConfig

Obj = dict[str, Any]


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _r(v: float | None, nd: int = 1) -> float | None:
    return None if v is None else round(v, nd)


def compare(fc: Obj, samples: list[tuple[float, float]], t0: float,
            gpu_samples: list[tuple[float, float]] | None = None) -> list[Obj]:
    """One row per forecast interval that lies wholly inside the sampled replay."""
    last = max((t for t, _ in samples), default=-math.inf)
    rows: list[Obj] = []
    for n, iv in enumerate(fc.get("intervals") or []):
        start, end = _epoch(iv["start"]) - t0, _epoch(iv["end"]) - t0
        inside = [kw for t, kw in samples if start <= t < end]
        if not inside or end > last + 2.5:  # the last sample is at most one period before
            continue
        actual = sum(inside) / len(inside)
        gpus = _mean([g for t, g in gpu_samples or [] if start <= t < end])
        flex = {t: iv.get(f"flexTier{t}Kw", 0.0) for t in (1, 2, 3)}
        rows.append({
            "interval": n, "startS": round(start, 1), "endS": round(end, 1),
            "forecastKw": iv["siteKw"], "lowKw": iv["lowKw"], "highKw": iv["highKw"],
            "committedKw": iv.get("committedKw"), "actualKw": round(actual, 1),
            "errorPct": round((iv["siteKw"] - actual) / actual * 100, 2) if actual else None,
            "inBand": iv["lowKw"] <= actual <= iv["highKw"], "limitKw": iv.get("limitKw"),
            "flexKw": flex, "forecastGpus": iv.get("busyGpus"),
            "newWorkGpus": iv.get("newWorkGpus"), "actualGpus": _r(gpus)})
    return rows


def _above_idle(kind: str) -> float:
    """kW per GPU a job of ``kind`` draws above idle (a foreign job: the unspecified kind's)."""
    try:
        k = WorkloadKind(kind)
    except ValueError:
        k = WorkloadKind.UNSPECIFIED
    per_gpu = KIND_KW_PER_GPU.get(k, KIND_KW_PER_GPU[WorkloadKind.UNSPECIFIED])
    return per_gpu - ForecastConfig().idle_kw_per_gpu


def later_work_kw(jobs: list[Obj], made: float, start: float, end: float) -> float:
    """Mean kW over [start, end) (wall s from the replay's start) that the jobs submitted
    after ``made`` drew above idle: each from its first bound pod to its finish (or on)."""
    kw = 0.0
    for j in jobs:
        sub, bound = j.get("submitted"), j.get("bound")
        if sub is None or bound is None or sub <= made:
            continue
        fin = j.get("finished")
        overlap = min(end, math.inf if fin is None else fin) - max(start, bound)
        if overlap > 0:
            kw += j["gpus"] * _above_idle(j.get("kind") or "") * overlap / (end - start)
    return kw


def _committed_work(rows: list[Obj], jobs: list[Obj], made: float) -> None:
    for r in rows:
        r["committedWorkKw"] = round(r["actualKw"] - later_work_kw(jobs, made, r["startS"],
                                                                   r["endS"]), 1)


def _mape(rows: list[Obj], key: str, against: str = "actualKw") -> float | None:
    errs = [abs(r[key] - r[against]) / r[against] * 100 for r in rows
            if r.get(key) is not None and r.get(against) is not None and r[against] > 0]
    return _r(_mean(errs), 2)


def figures(fc: Obj, samples: list[tuple[float, float]], t0: float, time_scale: float,
            gpu_samples: list[tuple[float, float]] | None = None,
            jobs: list[Obj] | None = None) -> Obj | None:
    """``runs.<run>.forecast`` (docs/twin-metrics.md "Forecast"); None without a comparison.
    ``jobs``: the driver's job records (``committedWorkKw`` and the figures on it)."""
    rows = compare(fc, samples, t0, gpu_samples)
    if not rows:
        return None
    made = _epoch(fc["madeAt"]) - t0
    if jobs:
        _committed_work(rows, jobs, made)
    interval = float(fc.get("intervalSeconds") or rows[0]["endS"] - rows[0]["startS"])
    actual = [r["actualKw"] for r in rows]
    mean_actual = sum(actual) / len(actual)
    rmse = math.sqrt(sum((r["forecastKw"] - r["actualKw"]) ** 2 for r in rows) / len(rows))
    flex = [sum(r["flexKw"].values()) / r["forecastKw"] * 100 for r in rows
            if r["forecastKw"] > 0]
    return {
        "clock": "intervals and madeAtSeconds in wall seconds from the replay's start "
                 "(m2g's clock); one interval = one trace hour; horizonHours in trace hours",
        "madeAtSeconds": round(made, 1),
        "intervalSeconds": interval,
        "horizonHours": round(len(rows) * interval * time_scale / 3600, 2),
        "intervalsCompared": len(rows),
        "mapePct": _mape(rows, "forecastKw"),
        "nrmsePct": _r(rmse / mean_actual * 100, 2) if mean_actual else None,
        "biasPct": _r(sum(r["forecastKw"] - r["actualKw"] for r in rows) / len(rows)
                      / mean_actual * 100, 2) if mean_actual else None,
        "bandCoveragePct": _r(sum(1 for r in rows if r["inBand"]) / len(rows) * 100),
        "committedMapePct": _mape(rows, "committedKw"),
        "committedWorkMapePct": _mape(rows, "committedKw", "committedWorkKw") if jobs else None,
        "committedFloorPct": _mape(rows, "committedWorkKw") if jobs else None,
        "flexibleSharePct": _r(_mean(flex)),
        "calibrationKw": fc.get("calibrationKw"),
        "intervals": rows,
        "report": fc.get("report"),
    }
