"""Rerun the forecast model on a twin run's saved inputs and score it against that run's draw.

A fair before/after of a forecast model change: the twin's forecast scenario saves the snapshot
and configuration its compared forecast was made from (``<baseline>-forecast-inputs.pickle``
in ``--out``, beside ``<baseline>-series.json``). This script makes the forecast again with
whatever ``m2g.planner.forecast`` is on ``PYTHONPATH`` (a worktree of the commit before the
change, or the change) and scores it with the twin's own figures (twinkit.forecast) against
the same run's sampled kW:

    PYTHONPATH=<old worktree>/src:<old worktree>/cli:bench .venv/bin/python \\
        bench/forecast_rescore.py /tmp/fc16/m2g-forecast-inputs.pickle /tmp/fc16/m2g-series.json

Prints one JSON object: the figures (``mapePct``, ``committedMapePct``, ``nrmsePct``,
``biasPct``, ``bandCoveragePct``, ...), the per-interval error and the model's notes; with
the run's ``<baseline>-jobs.json`` as a third argument also ``committedWorkMapePct`` and
``committedFloorPct`` (the committed forecast against the draw of the work it knew of,
twinkit.forecast) and the per-interval ``committedWorkKw``. The
pickle is this machine's own output (``m2g forecast --save-inputs``): load only files you wrote.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any

from twinkit import forecast as F

from m2g.planner.forecast import forecast
from m2g_cli.forecast_view import ForecastOutput, render


def rescore(inputs: dict[str, Any], series: dict[str, Any],
            jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    window = inputs.get("window")
    fc = forecast(inputs["snapshot"], inputs["config"],
                  extra_windows=(window,) if window is not None else ())
    made = json.loads(render(fc, ForecastOutput.JSON))
    samples = [(float(t), float(kw)) for t, kw in series["siteKw"]]
    gpus = [(float(s[0]), float(s[1])) for s in series.get("driverSamples") or []]
    got = F.figures(made, samples, float(series["t0"]), float(series.get("timeScale") or 60.0),
                    gpus, jobs)
    if got is None:
        return {"error": "no whole forecast interval inside the sampled replay"}
    rows = got.pop("intervals")
    got.pop("report", None)
    got["errorPct"] = [r["errorPct"] for r in rows]
    got["forecastKw"] = [r["forecastKw"] for r in rows]
    got["actualKw"] = [r["actualKw"] for r in rows]
    got["committedKw"] = [r["committedKw"] for r in rows]
    if jobs:
        got["committedWorkKw"] = [r["committedWorkKw"] for r in rows]
    got["notes"] = made.get("notes")
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", type=Path, help="<baseline>-forecast-inputs.pickle")
    p.add_argument("series", type=Path, help="<baseline>-series.json of the same run")
    p.add_argument("jobs", type=Path, nargs="?",
                   help="<baseline>-jobs.json of the same run (the committed work's draw)")
    args = p.parse_args()
    try:
        inputs = pickle.loads(args.inputs.read_bytes())  # the twin's own file (--save-inputs)
        series = json.loads(args.series.read_text())
        jobs = json.loads(args.jobs.read_text()) if args.jobs else None
    except (OSError, ValueError, pickle.UnpicklingError) as exc:
        raise SystemExit(f"forecast_rescore: cannot read the run's files: {exc}") from None
    print(json.dumps(rescore(inputs, series, jobs), indent=1))


if __name__ == "__main__":
    main()
