"""Derive another trace from an openb-format pod list, to replay conditions a model was not
tuned on (docs/twin.md, "Another trace").

    python bench/trace_variant.py --runtimes long  [--split SECONDS] [--trace FILE] --out FILE
    python bench/trace_variant.py --runtimes short [--split SECONDS] [--trace FILE] --out FILE

Keeps the trace's GPU pods whose runtime (``deletion_time − scheduled_time``, as the twin reads
it: bench/twinkit/trace.py) is at least ``--split`` (``long``) or below it (``short``); the
default split is the GPU pods' median runtime. Rows are written unchanged (every column, in
the trace's order), so ``bench/twin.py --trace FILE`` reads the result as it reads openb; the
twin then re-times arrivals to the ``--demand`` asked for. Rows the twin would skip (no GPU,
never scheduled, unreadable) are left out. Prints one line: rows kept, the split.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twinkit import trace as T

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "data" / "openb" / "openb_pod_list_default.csv"


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def variant(text: str, runtimes: str, split: float | None = None) -> tuple[str, float, int]:
    """The rows of ``text`` whose GPU pod runs at least (``long``) or under (``short``)
    ``split`` seconds (None: the median); returns the CSV, the split and the rows kept."""
    read = T.read_trace(text)
    if not read.pods:
        raise T.TraceError("the trace has no usable GPU pod")
    cut = median([float(p.runtime) for p in read.pods]) if split is None else split
    keep = {p.name for p in read.pods if (p.runtime >= cut) == (runtimes == "long")}
    rows = csv.DictReader(io.StringIO(text))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows.fieldnames or ()), lineterminator="\n")
    w.writeheader()
    kept = 0
    for row in rows:
        if str(row.get("name") or "").strip() in keep:
            w.writerow(row)
            kept += 1
    if not kept:
        raise T.TraceError(f"no GPU pod runs {'at least' if runtimes == 'long' else 'under'} "
                           f"{cut:.0f} s")
    return out.getvalue(), cut, kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trace_variant.py", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                   help="a CSV with openb's pod-list columns")
    p.add_argument("--runtimes", choices=("long", "short"), required=True,
                   help="keep the GPU pods running at least (long) or under (short) the split")
    p.add_argument("--split", type=float, help="runtime in trace seconds (default: the median)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.split is not None and args.split <= 0:
        print("error: --split must be positive", file=sys.stderr)
        return 2
    try:
        text = args.trace.read_text(errors="replace")
        got, cut, kept = variant(text, args.runtimes, args.split)
        args.out.write_text(got)
    except OSError as exc:
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except T.TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    how = "at least" if args.runtimes == "long" else "under"
    print(f"{args.out}: {kept} GPU pods running {how} {cut:.0f} s (of {args.trace.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
