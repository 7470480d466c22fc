"""``m2g forecast``: site and power-domain kW for the next hours (m2g.planner.forecast), from
the snapshot the controller decides on (m2g_cli.cluster.read), optionally with a proposed
MaintenanceWindow (``--with-window FILE``) to compare."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from m2g import yamlbounds
from m2g.model.cluster import ClusterSnapshot
from m2g.model.factory import MaintenanceWindow
from m2g.planner.config import PlannerConfig
from m2g.planner.forecast import ForecastConfig, NewWork, forecast
from m2g_cli import term
from m2g_cli.forecast_view import ForecastOutput, plot, render
from m2g_cli.ops_cmd import Context, Kubeconfig, Prom, _view

#: The most intervals one forecast makes: a week at 5 min (each costs ~5 ms at 40 racks)
MAX_INTERVALS = 2016


def load_window(path: Path) -> MaintenanceWindow:
    """A MaintenanceWindow manifest (YAML or JSON) → model; exits 2 with one line if unusable."""
    from m2g.k8s.isolate import checked_window

    try:
        docs = yamlbounds.load_file(path)
        obj = docs[0] if len(docs) == 1 else None
        if not isinstance(obj, dict) or obj.get("kind") != "MaintenanceWindow":
            raise ValueError("not a MaintenanceWindow manifest")
        w = checked_window(obj)
        assert w is not None
        return w
    except (OSError, yaml.YAMLError, ValueError) as exc:
        term.fail(f"--with-window {path}: {exc}", term.USAGE)
    except (TypeError, AttributeError, KeyError) as exc:  # a field of the wrong type
        # (``scope: all``, ``spec: [1]``, ``racks: 5``: a traceback before)
        term.fail(f"--with-window {path}: not a MaintenanceWindow manifest m2g can read "
                  f"({type(exc).__name__}: {str(exc)[:120]})", term.USAGE)


def _planner() -> PlannerConfig:
    """The planner's knobs of ``$M2G_CONFIG`` (the site configuration), else the defaults:
    the forecast's default runtime, pacing (ramp, settle, Retry hold) and levers (caps,
    pauses) are the ones the controller decides with."""
    from m2g_cli.cluster import CliError, planner_config

    try:
        return planner_config()
    except CliError as exc:
        term.fail(str(exc), exc.code)


def _save_inputs(path: Path, snap: ClusterSnapshot, cfg: ForecastConfig,
                 window: MaintenanceWindow | None) -> None:
    """The forecast's inputs, for rerunning a model offline on the same snapshot (the twin's
    before/after of a model change: docs/benchmarks.md, "Forecast")."""
    import pickle

    try:
        path.write_bytes(pickle.dumps({"snapshot": snap, "config": cfg, "window": window}))
    except OSError as exc:
        term.fail(f"--save-inputs {path}: cannot write: {exc.strerror or exc}", 1)


def forecast_cmd(
    hours: Annotated[float, typer.Option("--hours", min=0.01, max=168,
                                         help="Horizon in hours")] = 24.0,
    interval: Annotated[int, typer.Option("--interval", min=10, max=86400,
                                          help="Interval length, seconds")] = 3600,
    new_work: Annotated[NewWork, typer.Option(
        "--new-work", help="Work not yet submitted: persist (it keeps the site at today's GPU "
        "level) | none (committed work only)")] = NewWork.PERSIST,
    output: Annotated[ForecastOutput, typer.Option("--output", "-o",
                                                   help="table | json | csv")] = (
        ForecastOutput.TABLE),
    png: Annotated[Path | None, typer.Option("--png", help="Also plot it to this PNG")] = None,
    with_window: Annotated[Path | None, typer.Option(
        "--with-window", help="A proposed MaintenanceWindow manifest: show its effect")] = None,
    kubeconfig: Kubeconfig = None, context: Context = None, prometheus: Prom = None,
    save_inputs: Annotated[Path | None, typer.Option(
        "--save-inputs", hidden=True,
        help="Also write the snapshot and configuration the forecast is made from (a pickle: "
        "bench/forecast_rescore.py reruns a model on it)")] = None,
) -> None:
    """Day-ahead forecast: kW per interval for the site and each power domain, with bands,
    limits and the flexible kW per flex tier (docs/forecast.md)."""
    steps = hours * 3600 / interval
    if steps > MAX_INTERVALS:  # 168 h at 10 s: 60,480 intervals, 284 s and 1.4 GB at 40 racks
        term.fail(f"--hours {hours:g} at --interval {interval} is {steps:,.0f} intervals; at "
                  f"most {MAX_INTERVALS:,} (a longer --interval or fewer --hours)", term.USAGE)
    window = load_window(with_window) if with_window else None
    if png is not None and (png.is_dir() or not png.parent.is_dir()):  # before the cluster:
        # savefig raised IsADirectoryError / FileNotFoundError after the whole forecast
        term.fail(f"--png {png}: not a file in an existing folder", term.USAGE)
    snap = _view(kubeconfig, context, prometheus).snapshot
    planner = _planner()
    cfg = ForecastConfig(horizon_hours=hours, interval_seconds=interval, new_work=new_work,
                         default_runtime_seconds=planner.default_runtime_seconds,
                         reservation_lead_seconds=planner.reservation_lead_seconds,
                         planner=planner)
    if save_inputs is not None:
        _save_inputs(save_inputs, snap, cfg, window)
    fc = forecast(snap, cfg)
    other = forecast(snap, cfg, extra_windows=(window,)) if window else None
    typer.echo(render(fc, output, other), nl=False)
    if png is not None:
        try:
            plot(fc, png, other)
        except OSError as exc:  # unwritable, a full disk
            term.fail(f"--png {png}: cannot write: {exc.strerror or exc}", 1)
        typer.echo(f"wrote {png}", err=True)
