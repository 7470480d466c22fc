"""Golden files for the CLI run against the real control plane, and the normaliser they need.

``M2G_UPDATE_GOLDEN=1 pytest -m e2e tests/e2e/test_cli_golden.py`` rewrites the files under
tests/e2e/golden/ (review the diff), as tests/unit/goldens.py does for the pure renderers.

What the normaliser masks, and only that — everything else in the output is compared as is:

* ``WAIT``/``AGE`` table cells and ``waitSeconds``/``powerAgeSeconds``/``ageSeconds`` values: seconds since the
  workload was created or a reading was taken (``<age>``);
* seconds until the test's grid event ends or its maintenance window starts: policy messages
  ("ends in N s", "window in N s", "retry in Ns": every "in N s") and ``requeueAfterSeconds`` count down with
  the clock (``<secs>``). The event and the window have fixed dates, which stay in the goldens.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"

_AGE_CELL = re.compile(r"^\d+[smh]$")
_STRUCTURED = [
    (re.compile(r'("?(?:waitSeconds|powerAgeSeconds|ageSeconds)"?: )-?[0-9.]+(?:[eE][-+]?\d+)?'),
     r"\1<age>"),
    (re.compile(r'("?requeueAfterSeconds"?: )\d+'), r"\1<secs>"),
    (re.compile(r"\bin \d+( ?s)\b"), r"in <secs>\1"),
]


def _mask_column(lines: list[str], header: str) -> list[str]:
    """Replace the age cells under ``header`` (a left-aligned column of a kubectl-style table)
    with ``<age>``; the cells after it keep their place."""
    out: list[str] = []
    col: int | None = None
    end: int | None = None
    for line in lines:
        found = re.search(rf"(?:^|   ){header}(?:   |$)", line)
        if found and line.split()[0].isupper():
            col = found.start() + (3 if found.start() else 0)
            rest = re.search(r"\S", line[col + len(header):])
            end = None if rest is None else col + len(header) + rest.start()
        elif not line.strip():
            col = None
        elif col is not None and _AGE_CELL.match(line[col:end].strip()):
            tail = "" if end is None else line[end:]
            line = (line[:col] + "<age>" + (" " * 3 if tail else "") + tail).rstrip()
        out.append(line)
    return out


def normalise(text: str) -> str:
    """``text`` with the clock-dependent parts masked (see the module docstring)."""
    lines = text.split("\n")
    for header in ("WAIT", "AGE"):
        lines = _mask_column(lines, header)
    text = "\n".join(lines)
    for pattern, repl in _STRUCTURED:
        text = pattern.sub(repl, text)
    return text


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("M2G_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with M2G_UPDATE_GOLDEN=1"
    want = path.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(keepends=True),
                                        text.splitlines(keepends=True), "golden", "got"))
    assert text == want, f"{name} differs; M2G_UPDATE_GOLDEN=1 to accept:\n{diff}"
