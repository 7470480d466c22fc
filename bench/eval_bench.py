"""``m2g policy eval`` streaming benchmark: JSON Lines in, one decision line out, both engines.

Run with ``make bench-eval`` (or ``python bench/eval_bench.py --help``). The inputs are the
policy bench's (m2g.testing.scenarios: openb trace workloads over four 16-rack scenarios),
written as JSON Lines as a user would hand them to ``m2g policy eval``; every line carries its
full factory part. Each engine streams the same file through m2g_cli.policy_eval (the code
behind the command, minus process start-up) in the same process and run, so the ratio is
meaningful on a noisy machine. Reported per decision: wall and CPU time (the process's), and the
peak traced Python memory of the stream (constant in the number of lines).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import tracemalloc
from pathlib import Path

from m2g.policy import Evaluator, Stage, available_engines, load_dir
from m2g.testing.scenarios import inputs
from m2g_cli.policy_eval import evaluate_stream

ROOT = Path(__file__).resolve().parent.parent


def jsonl(n: int, domains: bool = True) -> bytes:
    """``n`` inputs as JSON Lines (``topology`` and ``facts`` are derived, so they are left
    out; so are the ``domains`` unless asked: the 16-rack factory is ~11 KB a line)."""
    out = io.StringIO()
    drop = {"topology", "facts"} if domains else {"topology", "facts", "domains", "domain"}
    for inp in inputs(n):
        data = inp.model_dump(mode="json", by_alias=True, exclude=drop)
        out.write(json.dumps(data, separators=(",", ":")) + "\n")
    return out.getvalue().encode()


def stream(ev: Evaluator, data: bytes, trace: bool) -> dict[str, float]:
    """Stream ``data`` through ``ev`` (warmed up by the caller: its fused programs compile on
    first use, once per process, which is not a per-decision cost)."""
    lines: list[str] = []
    if trace:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    total, bad = evaluate_stream(ev, Stage.ADMISSION, io.BytesIO(data), "bench",
                                 lambda s: lines.append(s[:0]), lambda s: None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    assert bad == 0, f"{bad} bad inputs"
    return {"n": total, "wall_us": wall / total * 1e6, "cpu_us": cpu / total * 1e6,
            "peak_mib": peak / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policies", type=Path, default=ROOT / "policies")
    ap.add_argument("-n", type=int, default=4000, help="inputs for cel-expr-python")
    ap.add_argument("--python-n", type=int, default=400, help="inputs for cel-python")
    ap.add_argument("--memory", action="store_true",
                    help="also trace Python memory (slows both engines)")
    args = ap.parse_args()
    for domains in (False, True):
        data = jsonl(max(args.n, args.python_n), domains)
        lines = data.splitlines(keepends=True)
        print(f"{len(lines)} JSON Lines inputs {'with' if domains else 'without'} the factory's "
              f"domains, {len(data) / len(lines):.0f} bytes each")
        run(args, lines)
    return 0


def run(args: argparse.Namespace, lines: list[bytes]) -> None:
    res = {}
    for engine in available_engines():
        n = args.python_n if engine == "cel-python" else args.n
        part = b"".join(lines[:n])
        ev = Evaluator(load_dir(args.policies, engine))
        stream(ev, b"".join(lines[:200]), False)  # warm up: compile the fused programs
        r = res[engine] = stream(ev, part, args.memory)
        mem = f"  peak {r['peak_mib']:.1f} MiB traced" if args.memory else ""
        print(f"{engine:16} n={r['n']:6.0f}  {r['wall_us']:8.1f} µs/decision wall  "
              f"{r['cpu_us']:8.1f} µs CPU{mem}")
    if len(res) == 2:
        fast, slow = res["cel-expr-python"], res["cel-python"]
        print(f"cel-python / cel-expr-python: {slow['wall_us'] / fast['wall_us']:.0f}x wall, "
              f"{slow['cpu_us'] / fast['cpu_us']:.0f}x CPU")


if __name__ == "__main__":
    sys.exit(main())
