"""Admission-decision benchmark: 10,000 varied workloads through the example policy set.

Run with ``make bench`` (or ``python bench/policy_bench.py --help``). Both CEL runtimes are
measured in the same process and run, so their ratio is meaningful on a noisy machine. The
workloads and factory scenarios are m2g.testing.scenarios (openb trace, 16 NVL72 racks).

Two numbers per engine:
* single — ``Evaluator.admission``, one input at a time (converting the whole input each time);
* batch  — ``Evaluator.admission_many`` over all inputs: those sharing a snapshot and queue are
  evaluated together (what the AdmissionCheck controller does each reconcile); reported as the
  amortised time per decision, and the median per-decision time over batches of 100.
Medians are wall-clock; "CPU median" is the thread's CPU time (time.thread_time_ns), which a
busy machine inflates much less. docs/benchmarks.md has the method and numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from m2g.model.inputs import PolicyInput
from m2g.policy import Evaluator, available_engines, load_dir
from m2g.testing.scenarios import inputs

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    engine: str
    mode: str
    n: int
    median_us: float
    p99_us: float
    per_s: float
    decisions: dict[str, int]
    cpu_median_us: float = 0.0


def _count(results: list[object]) -> dict[str, int]:
    counts = {"Admit": 0, "Defer": 0, "Reject": 0}
    for r in results:
        counts[r.decision.value] += 1  # type: ignore[attr-defined]
    return counts


def single(ev: Evaluator, items: list[PolicyInput]) -> Result:
    times, cpu, results = [], [], []
    start = time.perf_counter()
    for inp in items:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        results.append(ev.admission(inp))
        cpu.append(time.thread_time_ns() - c0)
        times.append(time.perf_counter_ns() - t0)
    total = time.perf_counter() - start
    times.sort()
    return Result(ev.policy_set.runtime.name, "single", len(items),
                  statistics.median(times) / 1000, times[int(len(times) * 0.99) - 1] / 1000,
                  len(items) / total, _count(results), statistics.median(cpu) / 1000)


def batch(ev: Evaluator, items: list[PolicyInput], size: int = 100) -> Result:
    per_decision, cpu, results = [], [], []
    start = time.perf_counter()
    for k in range(0, len(items), size):
        chunk = items[k:k + size]
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        results += ev.admission_many(chunk)
        cpu.append((time.thread_time_ns() - c0) / len(chunk))
        per_decision.append((time.perf_counter_ns() - t0) / len(chunk))
    total = time.perf_counter() - start
    per_decision.sort()
    return Result(ev.policy_set.runtime.name, f"batch{size}", len(items),
                  statistics.median(per_decision) / 1000,
                  per_decision[max(0, int(len(per_decision) * 0.99) - 1)] / 1000,
                  len(items) / total, _count(results), statistics.median(cpu) / 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policies", type=Path, default=ROOT / "policies")
    ap.add_argument("-n", type=int, default=10_000, help="workloads (default 10000)")
    ap.add_argument("--python-n", type=int, default=None,
                    help="workloads for the pure-Python engine (default: same as -n)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    items = inputs(args.n)
    engines = available_engines()
    pset = load_dir(args.policies, engines[0])
    print(f"{len(items)} workloads, {len(pset.policies)} policies "
          f"({sum(len(p.rules) for p in pset.policies)} rules) from {args.policies}")
    results: list[Result] = []
    for engine in engines:
        ev = Evaluator(load_dir(args.policies, engine))
        n = args.python_n if engine == "cel-python" and args.python_n else args.n
        ev.admission_many(items[:50])  # warm up
        runs = [single(ev, items[:n])]
        if engine != "cel-python":
            runs.append(batch(ev, items[:n]))
        for r in runs:
            results.append(r)
            print(f"{r.engine:16} {r.mode:8} n={r.n:6}  median {r.median_us:8.1f} µs/decision"
                  f"  p99 {r.p99_us:8.1f}  {r.per_s:9.0f} decisions/s  {r.decisions}"
                  f"  (CPU median {r.cpu_median_us:.1f} µs)")
    by = {(r.engine, r.mode): r for r in results}
    slow = by.get(("cel-python", "single"))
    for mode in ("single", "batch100"):
        fast = by.get(("cel-expr-python", mode))
        if fast and slow:
            print(f"cel-python single / cel-expr-python {mode}: "
                  f"{slow.median_us / fast.median_us:.0f}x (median µs per decision; CPU time: "
                  f"{slow.cpu_median_us / fast.cpu_median_us:.0f}x)")
    fast1 = by.get(("cel-expr-python", "single"))
    if fast1 and slow and fast1.n == slow.n and fast1.decisions != slow.decisions:
        print(f"WARNING: engines disagree: {fast1.decisions} vs {slow.decisions}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
