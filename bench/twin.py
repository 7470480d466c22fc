"""The Model-to-Grid twin: m2g side by side with plain Kueue on a real trace (docs/twin.md).

    python bench/twin.py [--racks 16] [--trace FILE] [--scenario dr-srp] [--out DIR]
                         [--baselines kueue,m2g] [--time-scale 60] [--demand 0.9] ...

For each baseline, on a fresh local control plane (``$M2G_RUN``-kueue / -m2g): an N-rack NVL72
KWOK factory, the telemetry simulator, Prometheus, the job driver and, for m2g, the shipped
policies and ``m2g run``; the trace replayed, the scenario fired, everything torn down. Then
``--out`` gets report.json (figures: docs/twin-metrics.md), report.md, the plots and
the per-run series and job records. A benchmark script: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twinkit import harness as H
from twinkit import plots
from twinkit import report as R
from twinkit import scenarios as S
from twinkit import trace as T

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "data" / "openb" / "openb_pod_list_default.csv"
SRP_POWER = REPO / "data" / "emerald-dr-2025" / "SRP_total_power.csv"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="twin.py", description=__doc__.splitlines()[0])
    p.add_argument("--racks", type=int, default=16, help="NVL72 racks (72 GPUs each)")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                   help="a CSV with openb's pod-list columns")
    p.add_argument("--scenario", choices=[s.value for s in S.Scenario], default="dr-srp")
    p.add_argument("--baselines", default="kueue,m2g",
                   help=f"runs to compare, of: {', '.join(H.RUNS)}")
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "twin")
    p.add_argument("--time-scale", type=float, default=60.0,
                   help="trace seconds per wall second (60: one trace hour = one minute)")
    p.add_argument("--demand", type=float, default=0.9,
                   help="re-time arrivals to offer this share of the factory's GPUs "
                        "(0: replay the window as recorded)")
    p.add_argument("--window-start", type=int, help="trace second the replay starts at "
                   "(default: after the trace's last gap longer than a day)")
    p.add_argument("--warm-hours", type=float, default=12.0,
                   help="trace hours of history before the replay starts: the jobs still "
                        "running then are submitted at once (warm start; 0: empty factory)")
    p.add_argument("--event-at-hours", type=float, default=3.0,
                   help="trace hours of replay before the scenario's event")
    p.add_argument("--after-seconds", type=float, default=150.0,
                   help="wall seconds replayed after the event ends")
    p.add_argument("--event-hours", type=float,
                   help="event length in trace hours (default: the SRP event's)")
    p.add_argument("--gpu-scale", type=float, default=T.Mapping.gpu_scale)
    p.add_argument("--seed", type=int, default=T.Mapping.seed)
    p.add_argument("--gang-topology", choices=("required", "preferred"),
                   default=T.Mapping.gang_topology,
                   help="what an m2g-made gang of <= 72 GPUs asks Kueue TAS for: its NVLink "
                   "domain required (the templates) or one rack only preferred")
    p.add_argument("--elastic-share", type=float, default=T.Mapping.elastic_probability,
                   help="share of the multi-pod fine-tuning and batch jobs (<= 72 GPUs) "
                   "submitted as elastic Jobs m2g may shrink (docs/twin.md; 0: none)")
    p.add_argument("--no-elastic", dest="elastic_share", action="store_const", const=0.0,
                   help="no elastic job (--elastic-share 0: the mapping before 2026-12-05)")
    p.add_argument("--clock-policies", action="store_true",
                   help="install the shipped policies that decide by the wall clock's hour "
                   "(fairness-time-of-day) in the m2g runs too; left out by default, so that "
                   "a run's figures do not depend on when it ran")
    p.add_argument("--run-dir", type=Path, help="M2G_RUN prefix (default $M2G_RUN or "
                   "~/.cache/m2g/run-twin); each baseline runs in <prefix>-<baseline>")
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> tuple[T.Plan, S.Timeline, float]:
    try:
        text = args.trace.read_text(errors="replace")
    except OSError as exc:
        raise T.TraceError(f"cannot read the trace {args.trace}: {exc.strerror}") from None
    shape = S.srp_shape(SRP_POWER.read_text())
    if args.event_hours:
        shape = S.EventShape(shape.depth, shape.ramp_s, args.event_hours * 3600, shape.pre_kw,
                             shape.plateau_kw)
    tl = S.timeline(S.Scenario(args.scenario), shape, args.time_scale,
                    args.event_at_hours * 3600)
    horizon_wall = tl.end_s + args.after_seconds
    read = T.read_trace(text)
    mapping = T.Mapping(seed=args.seed, gpu_scale=args.gpu_scale,
                        gang_topology=args.gang_topology,
                        elastic_probability=args.elastic_share)
    plan = T.plan_jobs(read, mapping, factory_gpus=args.racks * 72,
                       horizon_s=horizon_wall * args.time_scale,
                       demand=args.demand or None, start=args.window_start,
                       warm_s=args.warm_hours * 3600)
    return plan, tl, horizon_wall


def machine() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.racks < 1 or args.time_scale <= 0:
        print("error: --racks and --time-scale must be positive", file=sys.stderr)
        return 2
    if not 0.0 <= args.elastic_share <= 1.0:
        print("error: --elastic-share must be from 0 to 1", file=sys.stderr)
        return 2
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    if not baselines or any(b not in H.RUNS for b in baselines):
        print(f"error: --baselines is a list of {', '.join(H.RUNS)}", file=sys.stderr)
        return 2
    try:
        plan, tl, horizon = make_plan(args)
    except (T.TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = ", ".join(f"{n} {r}" for r, n in sorted(plan.skipped.items())) or "none"
    H.log(f"trace {args.trace.name}: {plan.rows} rows, {len(plan.jobs)} jobs in the replay "
          f"(skipped: {skipped}); arrivals ×{plan.compression:.2f} → {plan.offered_gpus:.0f} "
          f"GPUs offered of {args.racks * 72}; "
          f"{sum(1 for j in plan.jobs if j.elastic)} elastic"
          + "".join(f"; {n}" for n in plan.notes))
    prefix = args.run_dir or Path(os.environ.get("M2G_RUN") or
                                  Path.home() / ".cache" / "m2g" / "run-twin")
    args.out.mkdir(parents=True, exist_ok=True)
    datas: dict[str, H.RunData] = {}
    runs = {}
    load_before = machine()
    t_start = time.time()
    try:
        for b in baselines:
            cfg = H.RunConfig(b, args.racks, plan, tl, args.time_scale, horizon,
                              Path(f"{prefix}-{b}"), args.out, args.clock_policies)
            datas[b] = H.run_baseline(cfg)
            runs[b] = R.run_figures(datas[b], args.time_scale, args.racks * 72, horizon)
    except H.DemoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    trace_info = {"file": args.trace.name, "rows": plan.rows, "jobs": len(plan.jobs),
                  "skipped": plan.skipped, "windowStart": plan.window_start,
                  "compression": round(plan.compression, 4),
                  "offeredGpus": round(plan.offered_gpus, 1), "censored": plan.censored,
                  "gpuScale": args.gpu_scale, "seed": args.seed, "racks": args.racks,
                  "gangTopology": args.gang_topology,
                  "elasticShare": args.elastic_share,
                  "elasticJobs": sum(1 for j in plan.jobs if j.elastic),
                  "warmHours": args.warm_hours,
                  "prefilled": sum(1 for j in plan.jobs if j.prefill),
                  "clockPolicies": sorted(H.CLOCK_POLICIES) if args.clock_policies else []}
    rep = R.report(args.scenario, trace_info, args.time_scale, runs)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    mach = f"{load_before} before, {machine()} after; {time.time() - t_start:.0f} s in all"
    if not args.clock_policies:
        mach += (f". Policies by the wall clock's hour left out of the m2g runs: "
                 f"{', '.join(sorted(H.CLOCK_POLICIES))} (--clock-policies)")
    (args.out / "report.md").write_text(R.markdown(rep, datas, mach))
    R.exports(args.out, datas)
    plots.site_kw(args.out / "site-kw.png", datas,
                  f"{args.scenario}: site draw vs grid limit ({args.racks} racks)")
    plots.queue_gpus(args.out / "queue-gpus.png", datas, args.racks * 72)
    plots.tiers(args.out / "tiers.png", runs)
    print(json.dumps(rep, indent=1))
    H.log(f"report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
