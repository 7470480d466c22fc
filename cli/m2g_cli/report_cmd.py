"""``m2g report LOG_DIR``: summarise a decision log written by ``m2g run --decision-log``.

Reads ``decisions.parquet`` / ``lifecycle.parquet`` (and a previous run's timestamped files
beside them with ``--all``); a Parquet file still being written has no footer yet, so then the
CSV of the same table is read instead. A file that cannot be read is named in one line: a
``warning:`` when the log has other rows (they are reported), else an ``error:`` (exit 1). The
files are read in batches (``BATCH_ROWS``), never whole: the report's memory is bounded by the
log's width, not its length. The summary itself is m2g_cli.report_view's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from m2g_cli.report_view import render_table, summary
from m2g_cli.views import Output, structured

Rows = list[dict[str, Any]]
T = TypeVar("T")
#: --interval at most a year (an infinite or 1e308-second interval raised OverflowError)
MAX_INTERVAL = 366 * 86400.0
#: Rows read at a time: the report's memory is one batch of the log's columns (its width),
#: not the log (its length). Before, a log was read whole: ~3 KB a decision as Python rows,
#: 5 million decisions ~15 GB (docs/benchmarks.md, "Twenty-fourth session").
BATCH_ROWS = 16_384
#: The CSV read at a time (a row must fit in one: a decision's row is ~200 bytes)
CSV_BLOCK_BYTES = 4 << 20


class LogError(Exception):
    """A decision-log file that cannot be read at all (one line: the file and why)."""


class LogTable:
    """The rows of table ``name`` (decisions, lifecycle) in ``folder``, oldest run first, read
    batch by batch each time it is iterated (m2g_cli.report_view reads the decisions twice).

    A Parquet file still being written has no footer: its CSV is read instead. A CSV row that
    cannot be read (a line cut short when a run was killed, a value not of its column's type,
    no time) is left out and described in ``skipped`` (on the first reading only); the other
    rows are read. A file that cannot be read at all — a Parquet without a footer and no CSV
    beside it (corrupt, cut short, not Parquet), a Parquet or CSV whose data cannot be decoded,
    not a regular file — raises LogError, or, given an ``unreadable`` list, is described there
    (on the first reading only) and left out from where it failed: the other files are read."""

    def __init__(self, folder: Path, name: str, every_run: bool = False,
                 skipped: list[str] | None = None, unreadable: list[str] | None = None) -> None:
        from m2g.records import DECISIONS, LIFECYCLE

        self.schema = {"decisions": DECISIONS, "lifecycle": LIFECYCLE}[name]
        stems = sorted({p.stem for p in folder.glob(f"{name}-*.*")}) if every_run else []
        self.files = [(folder / f"{stem}.parquet", folder / f"{stem}.csv")
                      for stem in [*stems, name]]
        self.skipped = skipped if skipped is not None else []
        self.unreadable = unreadable
        self._noted = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        notes = [] if self._noted else self.skipped
        for parquet, csv in self.files:
            try:
                yield from self._file(parquet, csv, notes)
            except LogError as exc:
                if self.unreadable is None:
                    raise
                if not self._noted:
                    self.unreadable.append(str(exc))
        self._noted = True

    def _file(self, parquet: Path, csv: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
        """The rows of one run's table: its Parquet, else its CSV (see the class)."""
        problem = _footer_problem(parquet)
        if problem is None:
            yield from _complete(_parquet_batches(parquet, self.schema), self.schema, parquet,
                                 notes)
        elif csv.exists() and (not csv.is_file() or csv.stat().st_size):
            yield from _complete(_csv_batches(csv, self.schema, notes), self.schema, csv, notes)
        elif parquet.exists() or parquet.is_symlink():
            raise LogError(f"{parquet}: cannot read: {problem}")


def read_table(folder: Path, name: str, every_run: bool = False,
               skipped: list[str] | None = None) -> Rows:
    """Every row of ``LogTable(folder, name, every_run, skipped)`` in a list."""
    return list(LogTable(folder, name, every_run, skipped))


def _why(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 200 characters, with what is not printable
    written as an escape (pyarrow quotes bytes of a corrupt file: they must not reach the
    terminal)."""
    line = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def _footer_problem(path: Path) -> str | None:
    """Why the Parquet file ``path`` cannot be read (one line), or None when it can: one
    still being written has no footer yet (then its CSV is read)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return "not a regular file" if path.exists() else "no such file"
    try:
        pq.read_metadata(path)
    except (OSError, ValueError) as exc:  # still open, or not ours
        return _why(exc)
    return None


def _parquet_batches(path: Path, schema: Any) -> Iterator[Rows]:
    """The rows of one Parquet file of ``schema``, a batch at a time (a column the file lacks
    reads as empty). Row group by row group: pyarrow.dataset's scanner read ahead ~100 MiB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            yield _conform(batch, schema).to_pylist()
    except (OSError, pa.ArrowException, ValueError, OverflowError) as exc:  # OverflowError:
        # a time pyarrow holds that Python's datetime cannot (after year 9999)
        raise LogError(f"{path}: cannot read: {_why(exc)}") from None


def _csv_batches(path: Path, schema: Any, notes: list[str]) -> Iterator[Rows]:
    """The rows of one CSV of ``schema``, a batch at a time: read as text, each batch's
    columns converted by pyarrow; in a batch where a value does not convert, row by row, the
    rows that do not convert left out (before, one bad cell or a line cut short raised out of
    ``m2g report``)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not path.is_file():
        raise LogError(f"{path}: not a regular file")
    cut: list[str] = []

    def ragged(row: Any) -> str:
        cut.append(str(row.text)[:60])
        return "skip"

    text = pacsv.ConvertOptions(column_types={f.name: pa.string() for f in schema},
                                strings_can_be_null=True)
    try:
        reader = _quiet(ragged, lambda: pacsv.open_csv(
            path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(invalid_row_handler=ragged), convert_options=text))
        while (batch := _quiet(ragged, lambda: _next_batch(reader))) is not None:
            yield _converted(batch, schema, path, notes)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise LogError(f"{path}: cannot read: {_why(exc)}") from None
    if cut:
        notes.append(f"{path}: {len(cut)} row(s) with the wrong number of columns left out "
                     f"(first: {cut[0]!r})")


def _next_batch(reader: Any) -> Any:
    """The next batch of a pyarrow reader, None at its end."""
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


def _quiet(handler: object, call: Callable[[], T]) -> T:
    """``call()``, with the exceptions ``handler`` raises inside pyarrow dropped: pyarrow
    decodes an invalid row's text as UTF-8 before it calls its handler, and a row that is not
    UTF-8 was printed as an "Exception ignored" traceback to stderr — the read then fails
    with one line (LogError), which names the file."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.object is not handler:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        return call()
    finally:
        sys.unraisablehook = previous


def _conform(batch: Any, schema: Any) -> Any:
    """``batch`` with exactly ``schema``'s columns, each cast to its type (a column the
    batch lacks reads as empty); raises pyarrow's error when a value does not convert."""
    import pyarrow as pa

    names = set(batch.schema.names)
    return pa.RecordBatch.from_arrays(
        [batch.column(f.name).cast(f.type) if f.name in names
         else pa.nulls(batch.num_rows, f.type) for f in schema], schema=schema)


def _converted(batch: Any, schema: Any, path: Path, notes: list[str]) -> Rows:
    """A batch of text read as ``schema``: by columns, or row by row if a value does not
    convert."""
    import pyarrow as pa

    try:
        typed: Rows = _conform(batch, schema).to_pylist()
    except (pa.ArrowException, ValueError, OverflowError):
        rows = (_typed(r, schema, path, notes) for r in batch.to_pylist())
        return [r for r in rows if r is not None]
    return typed


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


def _complete(batches: Iterable[Rows], schema: Any, path: Path, notes: list[str]
              ) -> Iterator[dict[str, Any]]:
    """Every row with every column of ``schema`` (a missing column reads as empty) and a
    time; a row without a time is left out (noted once for the file)."""
    from datetime import datetime

    names = [f.name for f in schema]
    dropped = 0
    for rows in batches:
        for r in rows:
            row = {n: r.get(n) for n in names}
            if isinstance(row["time"], datetime):
                yield row
            else:
                dropped += 1
    if dropped:
        notes.append(f"{path}: {dropped} row(s) without a time left out")


def _warn(notes: list[str], most: int = 20) -> None:
    """The first ``most`` notes as ``warning:`` lines, then how many more there were."""
    for note in notes[:most]:
        typer.echo(f"warning: {note}", err=True)
    if len(notes) > most:
        typer.echo(f"warning: ... and {len(notes) - most} more", err=True)


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
    """Summarise a decision log: grid events' delivery, m2g's actions, lifecycle totals.

    Each grid event's delivery is its kW vs the target per interval, like an OpenADR report."""
    if not log_dir.is_dir():
        typer.echo(f"error: {log_dir}: no such folder (m2g run --decision-log DIR writes one)",
                   err=True)
        raise typer.Exit(1)
    skipped: list[str] = []
    unreadable: list[str] = []
    data = summary(LogTable(log_dir, "decisions", every_run, skipped, unreadable),
                   LogTable(log_dir, "lifecycle", every_run, skipped, unreadable),
                   interval, event)
    _warn(skipped)
    if not data["rows"]["decisions"] and not data["rows"]["lifecycle"]:
        for problem in unreadable:
            typer.echo(f"error: {problem}", err=True)
        if not unreadable:
            typer.echo(f"error: {log_dir}: no decisions.* or lifecycle.* files with rows",
                       err=True)
        raise typer.Exit(1)
    for problem in unreadable:
        typer.echo(f"warning: {problem} (left out from there; the other rows are reported)",
                   err=True)
    text = render_table(data) if output in (Output.TABLE, Output.WIDE) else structured(data,
                                                                                      output)
    typer.echo(text, nl=False)
