"""The forecast scenario's figures (pure; docs/twin.md "The forecast scenario").

``figures`` compares what ``m2g forecast -o json`` said at the replay's start with the site
draw the twin then sampled, interval by interval: the forecast's intervals are in m2g's clock
(wall seconds; one interval = one trace hour at the twin's time scale), the actual of an
interval is the mean of the site-draw samples inside it. Only whole intervals inside the
replay are compared.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

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


def _mape(rows: list[Obj], key: str) -> float | None:
    errs = [abs(r[key] - r["actualKw"]) / r["actualKw"] * 100 for r in rows
            if r.get(key) is not None and r["actualKw"] > 0]
    return _r(_mean(errs), 2)


def figures(fc: Obj, samples: list[tuple[float, float]], t0: float, time_scale: float,
            gpu_samples: list[tuple[float, float]] | None = None) -> Obj | None:
    """``runs.<run>.forecast`` (docs/twin-metrics.md "Forecast"); None without a comparison."""
    rows = compare(fc, samples, t0, gpu_samples)
    if not rows:
        return None
    interval = float(fc.get("intervalSeconds") or rows[0]["endS"] - rows[0]["startS"])
    actual = [r["actualKw"] for r in rows]
    mean_actual = sum(actual) / len(actual)
    rmse = math.sqrt(sum((r["forecastKw"] - r["actualKw"]) ** 2 for r in rows) / len(rows))
    flex = [sum(r["flexKw"].values()) / r["forecastKw"] * 100 for r in rows
            if r["forecastKw"] > 0]
    return {
        "clock": "intervals and madeAtSeconds in wall seconds from the replay's start "
                 "(m2g's clock); one interval = one trace hour; horizonHours in trace hours",
        "madeAtSeconds": round(_epoch(fc["madeAt"]) - t0, 1),
        "intervalSeconds": interval,
        "horizonHours": round(len(rows) * interval * time_scale / 3600, 2),
        "intervalsCompared": len(rows),
        "mapePct": _mape(rows, "forecastKw"),
        "nrmsePct": _r(rmse / mean_actual * 100, 2) if mean_actual else None,
        "biasPct": _r(sum(r["forecastKw"] - r["actualKw"] for r in rows) / len(rows)
                      / mean_actual * 100, 2) if mean_actual else None,
        "bandCoveragePct": _r(sum(1 for r in rows if r["inBand"]) / len(rows) * 100),
        "committedMapePct": _mape(rows, "committedKw"),
        "flexibleSharePct": _r(_mean(flex)),
        "calibrationKw": fc.get("calibrationKw"),
        "intervals": rows,
        "report": fc.get("report"),
    }
