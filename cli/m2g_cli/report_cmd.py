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
#: --interval at most a year (an infinite or 1e308-second interval raised OverflowError)
MAX_INTERVAL = 366 * 86400.0


class LogError(Exception):
    """A decision-log file that cannot be read at all (one line: the file and why)."""


def read_table(folder: Path, name: str, every_run: bool = False,
               skipped: list[str] | None = None) -> Rows:
    """The rows of table ``name`` (decisions, lifecycle) in ``folder``, oldest run first.
    A CSV row that cannot be read (a line cut short when a run was killed, a value not of its
    column's type, no time) is left out and described in ``skipped``; the other rows are
    read. Raises LogError for a file that cannot be read at all."""
    import pyarrow.parquet as pq

    from m2g.records import DECISIONS, LIFECYCLE
    schema = {"decisions": DECISIONS, "lifecycle": LIFECYCLE}[name]
    stems = sorted({p.stem for p in folder.glob(f"{name}-*.*")}) if every_run else []
    rows: Rows = []
    notes = skipped if skipped is not None else []
    for stem in [*stems, name]:
        parquet, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
        try:
            if parquet.is_file():
                rows += _complete(pq.read_table(parquet, schema=schema).to_pylist(), schema,
                                  parquet, notes)
                continue
        except (OSError, ValueError):  # still open (no footer yet), or not ours: the CSV
            pass
        if csv.exists() and (not csv.is_file() or csv.stat().st_size):
            rows += _complete(_read_csv(csv, schema, notes), schema, csv, notes)
    return rows


def _read_csv(path: Path, schema: Any, notes: list[str]) -> Rows:
    """The rows of one CSV of ``schema``: typed by pyarrow; when a value does not convert,
    every value read as text and converted row by row, the rows that do not convert left
    out (before, one bad cell or a line cut short raised out of ``m2g report``)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not path.is_file():
        raise LogError(f"{path}: not a regular file")
    cut: list[str] = []

    def ragged(row: Any) -> str:
        cut.append(str(row.text)[:60])
        return "skip"

    parse = pacsv.ParseOptions(invalid_row_handler=ragged)
    try:
        try:
            typed = pacsv.ConvertOptions(column_types=schema, strings_can_be_null=True)
            got: Rows = pacsv.read_csv(path, parse_options=parse,
                                       convert_options=typed).to_pylist()
        except pa.ArrowInvalid as exc:
            if "conversion error" not in str(exc):
                raise
            cut.clear()
            text = {f.name: pa.string() for f in schema}
            raw = pacsv.read_csv(path, parse_options=parse, convert_options=pacsv.ConvertOptions(
                column_types=text, strings_can_be_null=True)).to_pylist()
            got = [r for r in (_typed(r, schema, path, notes) for r in raw) if r is not None]
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise LogError(f"{path}: cannot read: {str(exc).splitlines()[0][:200]}") from None
    if cut:
        notes.append(f"{path}: {len(cut)} row(s) with the wrong number of columns left out "
                     f"(first: {cut[0]!r})")
    return got


def _typed(row: dict[str, Any], schema: Any, path: Path, notes: list[str]
           ) -> dict[str, Any] | None:
    """``row`` (text) converted to ``schema``'s types, or None (noted) when a value does not
    convert."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for f in schema:
        value = row.get(f.name)
        try:
            out[f.name] = None if value is None else pa.scalar(value).cast(f.type).as_py()
        except (pa.ArrowException, ValueError, OverflowError) as exc:
            notes.append(f"{path}: a row left out: column {f.name}: "
                         f"{str(exc).splitlines()[0][:120]}")
            return None
    return out


def _complete(rows: Rows, schema: Any, path: Path, notes: list[str]) -> Rows:
    """Every row with every column of ``schema`` (a missing column reads as empty) and a
    time; a row without a time is left out (noted)."""
    from datetime import datetime

    names = [f.name for f in schema]
    out = [{n: r.get(n) for n in names} for r in rows]
    kept = [r for r in out if isinstance(r["time"], datetime)]
    if len(kept) < len(out):
        notes.append(f"{path}: {len(out) - len(kept)} row(s) without a time left out")
    return kept


def report(
    log_dir: Annotated[Path, typer.Argument(help="the folder of m2g run --decision-log")],
    output: Annotated[Output, typer.Option("--output", "-o", help="table | json | yaml")] =
    Output.TABLE,
    interval: Annotated[float, typer.Option(
        "--interval", min=1.0, max=MAX_INTERVAL,
        help="report interval of a grid event, seconds")] = 60.0,
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
    skipped: list[str] = []
    try:
        decisions = read_table(log_dir, "decisions", every_run, skipped)
        lifecycle = read_table(log_dir, "lifecycle", every_run, skipped)
    except LogError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for note in skipped[:20]:
        typer.echo(f"warning: {note}", err=True)
    if len(skipped) > 20:
        typer.echo(f"warning: ... and {len(skipped) - 20} more", err=True)
    if not decisions and not lifecycle:
        typer.echo(f"error: {log_dir}: no decisions.* or lifecycle.* files with rows", err=True)
        raise typer.Exit(1)
    data = summary(decisions, lifecycle, interval, event)
    text = render_table(data) if output in (Output.TABLE, Output.WIDE) else structured(data,
                                                                                      output)
    typer.echo(text, nl=False)
