"""``m2g report LOG_DIR``: summarise a decision log written by ``m2g run --decision-log``.

Reads ``decisions.parquet`` / ``lifecycle.parquet`` (and a previous run's timestamped files
beside them with ``--all``); a Parquet file still being written has no footer yet, so then the
CSV of the same table is read instead. The summary itself is m2g_cli.report_view's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from m2g_cli.report_view import render_table, summary
from m2g_cli.views import Output, structured

Rows = list[dict[str, Any]]


def read_table(folder: Path, name: str, every_run: bool = False) -> Rows:
    """The rows of table ``name`` (decisions, lifecycle) in ``folder``, oldest run first."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from m2g.records import DECISIONS, LIFECYCLE
    schema = {"decisions": DECISIONS, "lifecycle": LIFECYCLE}[name]
    stems = sorted({p.stem for p in folder.glob(f"{name}-*.*")}) if every_run else []
    rows: Rows = []
    for stem in [*stems, name]:
        parquet, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
        try:
            rows += pq.read_table(parquet, schema=schema).to_pylist()
            continue
        except (OSError, ValueError):  # missing, or still open (no footer yet)
            pass
        if csv.exists() and csv.stat().st_size:
            opts = pacsv.ConvertOptions(column_types=schema, strings_can_be_null=True)
            rows += pacsv.read_csv(csv, convert_options=opts).to_pylist()
    return rows


def report(
    log_dir: Annotated[Path, typer.Argument(help="the folder of m2g run --decision-log")],
    output: Annotated[Output, typer.Option("--output", "-o", help="table | json | yaml")] =
    Output.TABLE,
    interval: Annotated[float, typer.Option(
        "--interval", min=1.0, help="report interval of a grid event, seconds")] = 60.0,
    event: Annotated[str | None, typer.Option("--event", help="only this grid event id")] = None,
    every_run: Annotated[bool, typer.Option(
        "--all", help="include the previous runs' files kept in the folder")] = False,
) -> None:
    """Summarise a decision log: each grid event's delivery (kW vs target per interval, like
    an OpenADR report), the actions m2g took, and the workload lifecycle totals."""
    if not log_dir.is_dir():
        typer.echo(f"error: {log_dir}: no such folder (m2g run --decision-log DIR writes one)",
                   err=True)
        raise typer.Exit(1)
    decisions = read_table(log_dir, "decisions", every_run)
    lifecycle = read_table(log_dir, "lifecycle", every_run)
    if not decisions and not lifecycle:
        typer.echo(f"error: {log_dir}: no decisions.* or lifecycle.* files with rows", err=True)
        raise typer.Exit(1)
    data = summary(decisions, lifecycle, interval, event)
    text = render_table(data) if output in (Output.TABLE, Output.WIDE) else structured(data,
                                                                                      output)
    typer.echo(text, nl=False)
