"""What a warm reconcile could keep from the reconcile before (issue 14, "incremental
decisions"): over bench/plan_parts.py's sequence (the generated factory of bench/scale.py, a
snapshot through its memo each tick, ``--changed`` workloads changed and the clock 10 s on),
how many of each tick's per-workload inputs and results equal the tick before's, by key:

* states: the snapshot's WorkloadState is the same object (the snapshot memo kept it);
* batch items (both policy stages): the stored view the same object, the queue view equal,
  the time fields (``WorkloadItem.updates``: wait, checkpoint age, a raised kW) equal;
* the Preemption stage's results equal (every field: eligible, score, reasons and their
  messages, minCap), and their decision alone (eligible, minCap) equal;
* the Admission stage's results equal, and their decision alone (decision, requeueAfter);
* the plan's answers (CheckUpdates) equal, and its shed actions.

A result memoised per workload by its inputs can be reused only where its inputs are equal;
one memoised by a coarser key (its class without the time fields) only where the result is
equal too. Each tick also prints ``make_plan``'s CPU seconds (the stages are evaluated a
second time, by an Evaluator of their own, outside that timer).

Run: ``.venv/bin/python bench/plan_reuse.py --racks 1400`` (heavy at 1,400 racks: ~1.5 GiB,
about two minutes). A script: it prints counts and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {100: 2_000, 400: 20_000, 1_400: 100_000}


def same(before: dict[str, Any], now: dict[str, Any], eq: Callable[[Any, Any], bool]
         ) -> tuple[int, int]:
    """(how many keys of ``now`` had an ``eq`` value in ``before``, how many keys ``now``
    has)."""
    get = before.get
    return sum(1 for k, v in now.items() if (b := get(k)) is not None and eq(b, v)), len(now)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--racks", type=int, default=400)
    ap.add_argument("--ticks", type=int, default=3)
    ap.add_argument("--changed", type=int, default=300,
                    help="workloads changed per tick (at most a twentieth)")
    ap.add_argument("--policies", type=Path, default=ROOT / "deploy" / "policies")
    args = ap.parse_args(argv)

    from m2g.k8s import build as kb
    from m2g.planner import plan as planner
    from m2g.planner import sparse
    from m2g.planner.admission import _groups
    from m2g.planner.config import PlannerConfig
    from m2g.planner.inputs import InputBuilder
    from m2g.policy import Evaluator, load_dir
    from m2g.testing.scale import LABELS, NOW, generate, tick

    size = WORKLOADS.get(args.racks, args.racks * 20)
    changed = min(args.changed, size // 20)  # as bench/scale.py's ``steady``
    objs, readings = generate(args.racks, size)
    ev = Evaluator(load_dir(args.policies, "cel-expr-python"))  # make_plan's, as a controller's
    stages = Evaluator(load_dir(args.policies, "cel-expr-python"))  # the stages' results here
    cfg = PlannerConfig()
    memo = kb.SnapshotMemo()

    def snap_at(seconds: int) -> Any:
        return kb.build_snapshot(objs, readings, NOW + timedelta(seconds=seconds), memo=memo,
                                 labels=LABELS)

    planner.make_plan(snap_at(0), ev, cfg)  # the memo and the Evaluator warm
    print(f"{args.racks} racks / {size:,} workloads, {changed} changed per tick; "
          "per tick: how many equal the tick before's (of how many)")
    before: dict[str, dict[str, Any]] | None = None
    for i in range(1, args.ticks + 1):
        objs = tick(objs, 10 * i, changed)
        snap = snap_at(10 * i)
        start = time.process_time()
        plan = planner.make_plan(snap, ev, cfg)
        cpu = time.process_time() - start
        b = InputBuilder(snap, cfg.default_kw_per_gpu)
        running = list(sparse.of(snap).admitted)
        waiting = [w for _, ws in _groups(snap.workloads, stages, {}).values() for _, w in ws]
        run_items, wait_items = b.items(running), b.items(waiting)
        now: dict[str, dict[str, Any]] = {
            "states": {w.key: w for w in snap.workloads},
            "items": {w.key: it for w, it in zip(running + waiting, run_items + wait_items,
                                                 strict=True)},
            "preemption": {w.key: r for w, r in zip(
                running, stages.preemption_items(b.base(), run_items), strict=True)},
            "admission": {w.key: r for w, r in zip(
                waiting, stages.admission_items(b.base(), wait_items), strict=True)},
            "checks": {f"{u.namespace}/{u.name}": u for u in plan.checks},
            "sheds": {f"{a.namespace}/{a.name}": a for a in plan.sheds},
        }
        distinct = (f"distinct results: Preemption "
                    f"{len({id(r) for r in now['preemption'].values()}):,}, Admission "
                    f"{len({id(r) for r in now['admission'].values()}):,}")
        print(f"tick {i}: make_plan {cpu:.3f} s CPU; {distinct}")
        if before is not None:
            rows = [
                ("states, the same object", same(before["states"], now["states"],
                                                 lambda a, b: a is b)),
                ("items, stored view the same object", same(
                    before["items"], now["items"], lambda a, b: a.stored is b.stored)),
                ("items, queue view equal", same(
                    before["items"], now["items"], lambda a, b: a.queue == b.queue)),
                ("items, time fields equal", same(
                    before["items"], now["items"], lambda a, b: a.updates == b.updates)),
                ("Preemption results equal", same(before["preemption"], now["preemption"],
                                                  lambda a, b: a == b)),
                ("Preemption (eligible, minCap) equal", same(
                    before["preemption"], now["preemption"],
                    lambda a, b: (a.eligible, a.min_cap) == (b.eligible, b.min_cap))),
                ("Admission results equal", same(before["admission"], now["admission"],
                                                 lambda a, b: a == b)),
                ("Admission (decision, requeueAfter) equal", same(
                    before["admission"], now["admission"],
                    lambda a, b: (a.decision, a.requeue_after_seconds)
                    == (b.decision, b.requeue_after_seconds))),
                ("plan CheckUpdates equal", same(before["checks"], now["checks"],
                                                 lambda a, b: a == b)),
                ("plan shed actions equal", same(before["sheds"], now["sheds"],
                                                 lambda a, b: a == b)),
            ]
            for name, (hit, total) in rows:
                share = f"{100 * hit / total:5.1f} %" if total else "    -"
                print(f"  {name:42s} {hit:>8,} / {total:<8,} {share}")
        before = now
        snap = plan = None
    print(f"load average {os.getloadavg()[0]:.2f}; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
