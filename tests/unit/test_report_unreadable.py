"""``m2g report`` on a log with a file it cannot read: the file is named in one line, and the
other files' rows are reported with that ``warning:`` (exit 0), or, when nothing else has rows,
each unreadable file is an ``error:`` line (exit 1). Before, a Parquet file without a footer
and no CSV beside it (corrupt, cut short, not Parquet) was passed over in silence — the report
said "0 decisions", or "no decisions.* or lifecycle.* files with rows" — and one whose data
could not be decoded, or a CSV that could not be, ended the whole report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g_cli.app import app
from tests.unit.goldens import golden
from tests.unit.test_decision_log import scripted


def _log(folder: Path, csv: bool = False) -> Path:
    """The scripted event's log, closed (Parquet with footers); its CSVs removed unless
    ``csv`` (a log copied without them, or whose run renamed them away)."""
    scripted(folder)
    if not csv:
        for f in folder.glob("*.csv"):
            f.unlink()
    return folder


def _report(folder: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["report", str(folder), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output.replace(str(folder), "LOG")


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def _garble(path: Path, start: int, end: int) -> None:
    data = bytearray(path.read_bytes())
    for i in range(start, end):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_corrupt_parquet_is_named_and_the_other_table_reported(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _cut(log / "decisions.parquet", 3000)  # no footer, no CSV: it was "0 decisions"
    code, out = _report(log)
    assert code == 0
    golden("report_unreadable_parquet.txt", out)
    assert out.splitlines()[0] == (
        "warning: LOG/decisions.parquet: cannot read: Parquet magic bytes not found in "
        "footer. Either the file is corrupted or this is not a parquet file. (left out from "
        "there; the other rows are reported)")
    assert "8 lifecycle records" in out


def test_nothing_readable_names_every_unreadable_file(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _cut(log / "decisions.parquet", 3000)
    (log / "lifecycle.parquet").write_bytes(b"")
    code, out = _report(log)
    assert code == 1
    assert out.splitlines() == [
        "error: LOG/decisions.parquet: cannot read: Parquet magic bytes not found in footer. "
        "Either the file is corrupted or this is not a parquet file.",
        "error: LOG/lifecycle.parquet: cannot read: Parquet file size is 0 bytes"]


def test_a_parquet_whose_data_cannot_be_decoded_leaves_the_others_reported(
        tmp_path: Path) -> None:
    """The footer is whole, the first pages are not: reading raised out of the report
    (exit 1, nothing reported). What the file says is not printed raw to the terminal."""
    log = _log(tmp_path)
    _garble(log / "decisions.parquet", 4, 400)
    code, out = _report(log)
    assert code == 0
    first, *rest = out.splitlines()
    assert first.startswith("warning: LOG/decisions.parquet: cannot read: ")
    assert first.endswith("(left out from there; the other rows are reported)")
    assert all(c == "\n" or c.isprintable() for c in out)
    assert any("8 lifecycle records" in line for line in rest)


@pytest.mark.parametrize("row", ["ragged", "whole"])
def test_an_unreadable_csv_of_a_running_log_is_named(tmp_path: Path, row: str) -> None:
    """While the run is on, its Parquet has no footer and the CSV is read: a CSV that is not
    UTF-8 ended the whole report (exit 1), and a row of the wrong width that is not UTF-8
    printed pyarrow's "Exception ignored" traceback first."""
    log = _log(tmp_path, csv=True)
    _cut(log / "decisions.parquet", 3000)  # still being written
    csv = log / "decisions.csv"
    line = csv.read_bytes().splitlines()[1]
    bad = (b'"2026-11-30T14:09:00Z","Grid","\xff\xfe"' if row == "ragged"
           else line.replace(b"2026", b"\xff\xfe", 1))
    with csv.open("ab") as f:
        f.write(bad + b"\n")
    code, out = _report(log)
    assert code == 0
    assert out.splitlines()[0].startswith("warning: LOG/decisions.csv: cannot read: ")
    assert "Traceback" not in out and "Exception ignored" not in out
    assert "8 lifecycle records" in out


def test_a_previous_runs_corrupt_file_leaves_this_runs_reported(tmp_path: Path) -> None:
    """``--all``: a previous run's Parquet that cannot be read is named; every row of this
    run's files is reported, the same as without ``--all``."""
    log = _log(tmp_path)
    shutil.copy(log / "decisions.parquet", log / "decisions-20261130T120000Z.parquet")
    _cut(log / "decisions-20261130T120000Z.parquet", 100)
    code, alone = _report(log)
    code_all, out = _report(log, "--all")
    assert (code, code_all) == (0, 0)
    assert out.splitlines()[0].startswith(
        "warning: LOG/decisions-20261130T120000Z.parquet: cannot read: ")
    assert out.splitlines()[1:] == alone.splitlines()
