"""Where a warm reconcile's CPU goes, part by part (issue 14): the controller's sequence at one
size of bench/scale.py's generated factory — a snapshot through its memo a tick later, then
``make_plan`` with the Evaluator's memo of the reconcile before, no collection between —
with CPU timers (``time.process_time``) wrapped around the planner's parts.

Each tick ``m2g.testing.scale.tick`` changes ``--changed`` workloads (checkpoint reports and
priority edits) and moves the clock 10 s. Per tick it prints the snapshot's and the plan's CPU
seconds and the plan's digest (the first 16 hex digits of bench/scale.py's: the same digests
tick for tick on two trees say they decide the same), then each wrapped part's CPU seconds
per tick, largest first, and the snapshot's and the plan's wall seconds per tick, the load
average at the end and the process's peak RSS. A part's time includes the parts it calls
(``power_actions`` includes ``Ladders`` and the Preemption stage's
``Evaluator.preemption_items``).
``--profile FILE`` also writes a cProfile of the last tick's ``make_plan`` (profiled: about
twice as slow; read it for shares, not for seconds).

Run: ``.venv/bin/python bench/plan_parts.py --racks 1400``. Heavy at 1,400 racks (~1.5 GiB,
about a minute): a script, it prints figures and asserts nothing about time. To compare two
trees, run this script alternately with each tree's ``src`` first on ``PYTHONPATH`` (a ``git
archive`` copy) in one session and compare the per-tick figures and digests.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import hashlib
import importlib
import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {100: 2_000, 400: 20_000, 1_400: 100_000}

#: (module, function): wrapped wherever the m2g modules hold the function by name
FUNCTIONS = [
    ("m2g.planner.shedding", "power_actions"), ("m2g.planner.admission", "check_updates"),
    ("m2g.planner.headroom", "share_beyond"), ("m2g.planner.split", "split"),
    ("m2g.planner.capacity", "capacity_updates"), ("m2g.planner.curtail", "node_limit_updates"),
    ("m2g.planner.nodes", "taint_updates"), ("m2g.planner.nodes", "drain_actions"),
    ("m2g.planner.preemptors", "hold"), ("m2g.planner.sparse", "select"),
    ("m2g.planner.curtail", "exclusive_workloads"), ("m2g.planner.shedding", "candidates"),
    ("m2g.planner.admission", "_groups"), ("m2g.planner.resize", "shrinkable"),
]
#: (module, class, method)
METHODS = [
    ("m2g.planner.inputs", "InputBuilder", "__init__"),
    ("m2g.planner.inputs", "InputBuilder", "items"),
    ("m2g.planner.curtail", "Ladders", "__init__"),
    ("m2g.policy.evaluate", "Evaluator", "preemption_items"),
    ("m2g.policy.evaluate", "Evaluator", "admission_items"),
]


def wrap_parts(acc: dict[str, float]) -> None:
    """Wrap each part in a CPU timer adding to ``acc`` by the part's name."""

    def timer(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            start = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[name] += time.process_time() - start
        return timed

    for mod, name in FUNCTIONS:
        orig = getattr(importlib.import_module(mod), name)
        wrapped = timer(name, orig)
        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").startswith("m2g"):
                for attr, value in list(vars(m).items()):
                    if value is orig:
                        setattr(m, attr, wrapped)
    for mod, cls_name, name in METHODS:
        cls = getattr(importlib.import_module(mod), cls_name)
        setattr(cls, name, timer(f"{cls_name}.{name}", getattr(cls, name)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--racks", type=int, default=400)
    ap.add_argument("--ticks", type=int, default=4)
    ap.add_argument("--changed", type=int, default=300,
                    help="workloads changed per tick (at most a twentieth)")
    ap.add_argument("--policies", type=Path, default=ROOT / "deploy" / "policies")
    ap.add_argument("--profile", type=Path, help="a cProfile of the last tick's make_plan")
    ap.add_argument("--no-plan-memo", action="store_true",
                    help="plan without m2g.planner.memo.PlanMemo (as before the 31st session; "
                    "a tree without it plans without it anyway)")
    args = ap.parse_args(argv)

    from m2g.k8s import build as kb
    from m2g.planner import plan as planner
    from m2g.planner.config import PlannerConfig
    from m2g.policy import Evaluator, load_dir
    from m2g.testing.scale import LABELS, NOW, generate, plan_record, tick

    acc: dict[str, float] = defaultdict(float)
    wrap_parts(acc)
    size = WORKLOADS.get(args.racks, args.racks * 20)
    changed = min(args.changed, size // 20)  # as bench/scale.py's ``steady``
    objs, readings = generate(args.racks, size)
    ev = Evaluator(load_dir(args.policies, "cel-expr-python"))
    cfg = PlannerConfig()
    memo = kb.SnapshotMemo()
    try:  # the plan memo the controller keeps (m2g.planner.memo; absent in older trees)
        from m2g.planner.memo import PlanMemo
        kept: dict[str, Any] = {} if args.no_plan_memo else {"memo": PlanMemo()}
    except ImportError:
        kept = {}

    def snap_at(seconds: int) -> Any:
        return kb.build_snapshot(objs, readings, NOW + timedelta(seconds=seconds), memo=memo,
                                 labels=LABELS)

    def digest(plan: Any) -> str:
        return hashlib.sha256(json.dumps(plan_record(plan), sort_keys=True, default=str)
                              .encode()).hexdigest()[:16]

    planner.make_plan(snap_at(0), ev, cfg, **kept)  # the memos and the Evaluator warm
    rows: list[tuple[float, float, str, dict[str, float]]] = []
    walls: list[tuple[float, float]] = []
    for i in range(1, args.ticks + 1):
        objs = tick(objs, 10 * i, changed)
        start, wall = time.process_time(), time.perf_counter()
        snap = snap_at(10 * i)
        built, wall_built = time.process_time(), time.perf_counter()
        acc.clear()
        prof = cProfile.Profile() if args.profile and i == args.ticks else None
        if prof is not None:
            prof.enable()
        plan = planner.make_plan(snap, ev, cfg, **kept)
        if prof is not None:
            prof.disable()
            prof.dump_stats(str(args.profile))
        done, wall_done = time.process_time(), time.perf_counter()
        rows.append((built - start, done - built, digest(plan), dict(acc)))
        walls.append((wall_built - wall, wall_done - wall_built))
        snap = plan = None
    print(f"{args.racks} racks / {size:,} workloads, {changed} changed per tick, "
          f"plan memo {'on' if kept else 'off'}"
          + (f" (reused: {dict(kept['memo'].reused)})" if kept else "")
          + ", CPU seconds per tick")
    print("snapshot   " + " ".join(f"{r[0]:.3f}" for r in rows))
    print("make_plan  " + " ".join(f"{r[1]:.3f}" for r in rows))
    print("digest     " + " ".join(r[2] for r in rows))
    print("wall: snapshot " + " ".join(f"{w[0]:.3f}" for w in walls)
          + "; make_plan " + " ".join(f"{w[1]:.3f}" for w in walls)
          + f"; load average {os.getloadavg()[0]:.2f}; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for name in sorted(rows[0][3], key=lambda k: -rows[0][3][k]):
        print(f"  {name:28s} " + " ".join(f"{r[3].get(name, 0.0):.3f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
