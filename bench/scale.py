"""The decision core at scale: one reconcile on generated factories of 100 / 400 / 1,400 GB300
NVL72 racks with 2,000 / 20,000 / 100,000 workloads (issue 14).

Offline, deploy/policies, a mix like a busy site's: 60 % of the workloads running (pods bound,
so nodes have their GPUs allocated), 40 % with quota reserved and m2g's check Pending, an
active grid event (a 30 % import-capacity cut: shedding has work to do), two hot racks (inlet
over the limit), a few unhealthy nodes, one ResourceFlavor per power domain, ClusterQueues of
eight teams with quotas on those flavors.

Each size runs in its own subprocess (``ru_maxrss`` is per process) under an address-space
limit (``--mem-limit-gib``, RLIMIT_AS), so a blow-up fails cleanly instead of taking the
machine. It reports, wall and CPU (``time.process_time``):

* snapshot: ``build_snapshot`` from the raw objects, cold (no memo; dropped once timed) and
  warm (memo, 5 s later);
* plan parts: each part of ``make_plan`` on a fresh snapshot, the evaluator warm (steady state:
  the controller keeps its Evaluator, every reconcile brings a new snapshot);
* make_plan: the whole reconcile on another fresh snapshot, with the Evaluator's decision
  memo dropped (cold) and a controller tick later (warm: 10 s on, a few hundred workloads
  changed, the Evaluator's memo and the plan memo — m2g.planner.memo — of the reconcile
  before; ``steady``), alternated, twice each;
* RSS: after the raw objects were generated, and the process's peak;
* the growth exponent between consecutive sizes: d log(cost) / d log(workloads);
* the plan's digest (sha256 of ``m2g.testing.scale.plan_record`` of the first plan, every
  decision and message): ``--plans FILE`` records it per size on a first run and compares
  on later ones (``same plan`` / ``PLAN DIFFERS``), so a speed-up is checked to decide the
  same as the code that recorded the file, at sizes the unit test does not reach.

Run: ``make bench-scale`` or ``.venv/bin/python bench/scale.py --sizes 100,400``. A script:
it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import itertools
import json
import math
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {100: 2_000, 400: 20_000, 1_400: 100_000}


# ---- one size, in this process --------------------------------------------------------------

def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(f: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w0, time.process_time() - c0


def digest(plan: Any) -> str:
    """The sha256 of a plan's every decision and message (m2g.testing.scale.plan_record)."""
    from m2g.testing.scale import plan_record

    return hashlib.sha256(json.dumps(plan_record(plan), sort_keys=True, default=str).encode()
                          ).hexdigest()


def run_size(racks: int, workloads: int, policies: Path, engine: str,
             out: dict[str, Any]) -> dict[str, Any]:
    """Fill ``out`` as it goes, so a MemoryError still reports what was measured before."""
    from m2g.k8s import build as kb
    from m2g.planner import plan as planner
    from m2g.planner.config import PlannerConfig
    from m2g.planner.inputs import InputBuilder
    from m2g.policy import Evaluator, load_dir
    from m2g.testing.scale import LABELS, NOW, generate

    (objs, readings), out["generate_s"], _ = timed(lambda: generate(racks, workloads))
    gc.collect()
    out["raw_rss_mib"] = rss_mib()
    ev = Evaluator(load_dir(policies, engine))
    cfg = PlannerConfig()
    memo = kb.SnapshotMemo()

    def snap_at(seconds: int, raw: Any = objs) -> Any:
        return kb.build_snapshot(raw, readings, NOW + timedelta(seconds=seconds), memo=memo,
                                 labels=LABELS)

    def cold() -> None:
        """A snapshot without the memo, dropped once built: a controller never holds one
        beside its memo's (bound to ``_`` it stayed alive through the first reconcile, ~400
        MiB at 1,400 racks, until 2026-12-03)."""
        kb.build_snapshot(objs, readings, NOW, labels=LABELS)

    _, out["snapshot_cold_wall"], out["snapshot_cold_cpu"] = timed(cold)
    snap_at(0)
    snap, out["snapshot_warm_wall"], out["snapshot_warm_cpu"] = timed(lambda: snap_at(5))
    pending = sum(1 for w in snap.workloads if w.check_state is not None
                  and w.check_state.value == "Pending")
    out["pending"], out["domains"] = pending, len(InputBuilder(snap).v.domains)
    first, out["plan_first_wall"], out["plan_first_cpu"] = timed(
        lambda: planner.make_plan(snap, ev, cfg))
    out["decisions"] = {"checks": len(first.checks), "quotas": len(first.quotas),
                        "sheds": len(first.sheds), "stops": len(first.stops)}
    out["plan_sha256"] = digest(first)
    first = snap = None  # as a controller: one snapshot alive at a time
    out["parts"] = plan_parts(ev, cfg, snap_at(10))
    steady(objs, snap_at, ev, cfg, out)
    out["peak_rss_mib"] = peak_mib()
    return out


def plan_parts(ev: Any, cfg: Any, snap: Any) -> dict[str, dict[str, float]]:
    """Each part of make_plan on ``snap``, wall and CPU (the collector paused, as make_plan
    runs them)."""
    from m2g.model.collector import collector_paused
    from m2g.planner.admission import check_updates
    from m2g.planner.capacity import capacity_updates
    from m2g.planner.fairness import weight_updates
    from m2g.planner.inputs import InputBuilder
    from m2g.planner.kai import kai_updates
    from m2g.planner.nodes import drain_actions, taint_updates
    from m2g.planner.shedding import shed_actions

    b = InputBuilder(snap)
    sheds: list[Any] = []
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("capacity", lambda: capacity_updates(ev, b, cfg)),
        ("shedding", lambda: sheds.extend(shed_actions(ev, b, cfg)[0])),
        ("kai", lambda: kai_updates(snap, cfg)),
        ("drains", lambda: drain_actions(b, cfg, frozenset(
            f"{a.namespace}/{a.name}" for a in sheds))),
        ("admission", lambda: check_updates(ev, b, cfg)),
        ("fairness", lambda: weight_updates(ev, b)),
        ("taints", lambda: taint_updates(b, cfg)),
    ]
    out = {}
    for name, f in parts:
        with collector_paused():
            _, wall, cpu = timed(f)
        out[name] = {"wall": wall, "cpu": cpu}
    return out


def steady(objs: Any, snap_at: Callable[[int, Any], Any], ev: Any, cfg: Any,
           out: dict[str, Any], changed: int = 300) -> None:
    """make_plan in steady state, twice each way, alternated: **cold** (the Evaluator's
    compiled programs warm but its decision memo dropped, ``Evaluator.forget``: as a
    restarted controller's first reconcile, and as every reconcile before the memo) and
    **warm** (a controller tick later: 10 s on, ``changed`` workloads changed in the raw
    objects, ``m2g.testing.scale.tick``; the memo of the reconcile before). Both minima, and
    every run, are reported. A full collection (untimed) before each: a collection of the
    cyclic GC, due by the allocations of everything before, otherwise lands in one run or
    another (3 → 7–9 s CPU at 1,400 racks, 2026-12-04)."""
    from m2g.planner import plan as planner
    from m2g.testing.scale import tick

    try:  # the plan memo the controller keeps (m2g.planner.memo; absent in older trees)
        from m2g.planner.memo import PlanMemo
    except ImportError:
        PlanMemo = None
    runs: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    same: list[bool] = []
    changed = min(changed, int(out["workloads"]) // 20)
    for t in (15, 35):
        getattr(ev, "forget", lambda: None)()  # (absent before the memo: A/B runs)
        # cold: a new plan memo too; warm: the one the cold plan left
        kept: dict[str, Any] = {} if PlanMemo is None else {"memo": PlanMemo()}
        snap = snap_at(t, objs)
        gc.collect()  # untimed: a collection the earlier runs' garbage is due lands in none
        _, wall, cpu = timed(functools.partial(planner.make_plan, snap, ev, cfg, **kept))
        runs["cold"].append((wall, cpu))
        objs, snap = tick(objs, t + 10, changed), None  # one snapshot alive at a time
        snap = snap_at(t + 10, objs)
        gc.collect()
        warm, wall, cpu = timed(functools.partial(planner.make_plan, snap, ev, cfg, **kept))
        runs["warm"].append((wall, cpu))
        warm = digest(warm)
        # the same snapshot without the Evaluator's memo and the plan memo: the same plan?
        getattr(ev, "forget", lambda: None)()
        same.append(warm == digest(planner.make_plan(snap, ev, cfg)))
        snap = None
    out["warm_same_plan"] = all(same)
    out["tick_changed"] = changed
    out["plan_runs"] = runs
    out["plan_wall"], out["plan_cpu"] = min(runs["cold"], key=lambda r: r[1])
    out["plan_warm_wall"], out["plan_warm_cpu"] = min(runs["warm"], key=lambda r: r[1])


# ---- the driver -----------------------------------------------------------------------------

def child(args: argparse.Namespace) -> int:
    limit = int(args.mem_limit_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    size = args.workloads or WORKLOADS.get(args.child, args.child * 20)
    res: dict[str, Any] = {"racks": args.child, "workloads": size}
    try:
        run_size(args.child, res["workloads"], args.policies, args.engine, res)
    except MemoryError:
        res["error"] = f"MemoryError under {args.mem_limit_gib:g} GiB"
    print(json.dumps(res))
    return 0


def exponent(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    try:
        return f"{math.log(b[key] / a[key]) / math.log(b['workloads'] / a['workloads']):.2f}"
    except (KeyError, ValueError, ZeroDivisionError):
        return "—"


def report(results: list[dict[str, Any]]) -> None:
    ok = [r for r in results if "error" not in r]
    print("\n| size | pending | domains | snapshot cold / warm (wall, CPU) | make_plan first "
          "| make_plan cold memo (wall / CPU) | make_plan warm memo, a tick later (wall / CPU) "
          "| raw RSS | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            done = ", ".join(f"{k} {v:.2f}" for k, v in r.items()
                             if isinstance(v, float) and k.endswith(("wall", "cpu", "mib")))
            print(f"| {r['racks']} racks | {r['error']} | {done} | | | | | |")
            continue
        print(f"| {r['racks']} racks / {r['workloads']:,} | {r['pending']:,} | {r['domains']:,} "
              f"| {r['snapshot_cold_wall']:.2f} s ({r['snapshot_cold_cpu']:.2f}) / "
              f"{r['snapshot_warm_wall']:.2f} s ({r['snapshot_warm_cpu']:.2f}) "
              f"| {r['plan_first_wall']:.2f} s ({r['plan_first_cpu']:.2f} CPU) "
              f"| {r['plan_wall']:.3f} s / {r['plan_cpu']:.3f} s "
              f"| {r['plan_warm_wall']:.3f} s / {r['plan_warm_cpu']:.3f} s "
              f"({r['tick_changed']} changed) "
              f"| {r['raw_rss_mib']:.0f} MiB | {r['peak_rss_mib']:.0f} MiB |")
    if ok:
        names = list(ok[0]["parts"])
        print("\nplan parts, wall / CPU seconds (steady state: warm evaluator, new snapshot)\n")
        print("| size | " + " | ".join(names) + " |")
        print("| --- |" + " --- |" * len(names))
        for r in ok:
            print(f"| {r['racks']} racks | " + " | ".join(
                f"{r['parts'][n]['wall']:.3f} / {r['parts'][n]['cpu']:.3f}" for n in names) + " |")
        for r in ok:
            print(f"make_plan CPU at {r['racks']} racks, every run: cold "
                  + ", ".join(f"{c:.3f}" for _, c in r["plan_runs"]["cold"]) + "; warm "
                  + ", ".join(f"{c:.3f}" for _, c in r["plan_runs"]["warm"])
                  + ("; each warm plan the same as the same snapshot's without the memo"
                     if r["warm_same_plan"] else "; A WARM PLAN DIFFERS from the cold one"))
        for r in ok:
            print(f"decisions at {r['racks']} racks: {r['decisions']}, plan "
                  f"{r['plan_sha256'][:16]} {r.get('plan_check', '')}")
    for a, b in itertools.pairwise(ok):
        print(f"growth {a['racks']}→{b['racks']} racks (per ×workloads): make_plan CPU "
              f"{exponent(a, b, 'plan_cpu')} (warm memo {exponent(a, b, 'plan_warm_cpu')}), "
              f"snapshot warm CPU "
              f"{exponent(a, b, 'snapshot_warm_cpu')}, peak RSS {exponent(a, b, 'peak_rss_mib')}")


def check_plans(path: Path, results: list[dict[str, Any]]) -> None:
    """Compare each size's plan digest with ``path``'s (keyed by racks/workloads); record the
    sizes it lacks."""
    known: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    for r in results:
        if "plan_sha256" not in r:
            continue
        key = f"{r['racks']}/{r['workloads']}"
        if key in known:
            r["plan_check"] = ("same plan" if known[key] == r["plan_sha256"]
                               else "PLAN DIFFERS from " + str(path))
        else:
            known[key] = r["plan_sha256"]
            r["plan_check"] = "recorded in " + str(path)
    path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="100,400,1400", help="racks, comma-separated")
    ap.add_argument("--workloads", type=int, default=0,
                    help="workloads (default: 2,000 / 20,000 / 100,000 for 100 / 400 / 1,400)")
    ap.add_argument("--policies", type=Path, default=ROOT / "deploy" / "policies")
    ap.add_argument("--engine", default="cel-expr-python")
    ap.add_argument("--mem-limit-gib", type=float, default=8.0,
                    help="address-space limit of each size's subprocess")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--plans", type=Path,
                    help="plan digests per size: recorded where missing, compared otherwise")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    results = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        cmd = [sys.executable, __file__, "--child", str(size), "--policies", str(args.policies),
               "--engine", args.engine, "--mem-limit-gib", str(args.mem_limit_gib)]
        if args.workloads:
            cmd += ["--workloads", str(args.workloads)]
        print(f"{size} racks ...", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = (proc.stdout.strip().splitlines() or [""])[-1]
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            results.append({"racks": size, "error": f"exit {proc.returncode}: {tail[:120]}"})
    if args.plans:
        check_plans(args.plans, results)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
