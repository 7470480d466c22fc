"""``make demo``: m2g on a small simulated GB300 NVL72 factory, end to end, in a few minutes.

    python demo/run_demo.py           # the whole story (M2G_DEMO_KEEP=1 leaves it all running)
    python demo/run_demo.py --stop    # stop what a kept demo left running

1. bring up (or reuse) the local control plane with the small factory (2 racks, 144 GPUs), the
   telemetry simulator, Prometheus scraping it and ``m2g run`` with the example policies;
2. submit a mix of firm and flexible work and watch it admitted and the site draw rise;
3. fire a grid event asking for 30 % less power: new flexible work is deferred, running
   flexible work is shed in paced steps until the draw is under the limit, firm work runs on;
4. the event ends: shed work is restored;
5. a summary table with timings, and where to look next.

Everything runs under ``$M2G_RUN`` (default ``~/.cache/m2g/run-demo``) so it never touches
another control plane. Expected failures print one line naming the component and its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from demo_k8s import (
    NAMESPACES,
    Cluster,
    Obj,
    Spec,
    is_running,
    job_of,
)
from demo_procs import DemoError, Proc, free_port, http_get, http_json, stop_group, tail
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

REPO = Path(__file__).resolve().parent.parent
M2G = Path(sys.executable).parent / "m2g"
LOCALCP = [sys.executable, str(REPO / "kind-e2e" / "localcp")]
SITE_CONFIG = REPO / "deploy" / "controller" / "site-config.yaml"
SITE_BUDGET_KW = 400.0  # contracted import capacity: above the factory's full draw (~260 kW)
CUT = 0.30  # the grid asks for 30 % less than the draw when the event fires
EVENT_LENGTH = timedelta(minutes=2)
DRAW_QUERY = "sum(facility_pdu_power_watts) / 1000"  # kW, as m2g reads the racks

MIX = (
    Spec("pretrain-405b", "prod-training", "training", 0, 40, 1.34, "m2g-training",
         "production pre-training: firm (flex tier 0), never curtailed"),
    Spec("chat-api", "inference", "inference", 1, 16, 1.0, "m2g-serving",
         "inference service: flex tier 1, only shed in a grid emergency"),
    Spec("ft-llama-8b", "research", "fine-tuning", 2, 8, 1.21, "m2g-fine-tuning",
         "fine-tune: flex tier 2, may wait or pause"),
    Spec("sft-llama-70b", "research", "fine-tuning", 2, 16, 1.21, "m2g-fine-tuning",
         "SFT: flex tier 2"),
    Spec("synth-data", "research", "batch", 3, 24, 1.29, "m2g-batch",
         "batch synthetic data: flex tier 3, the most flexible"),
    Spec("embed-corpus", "research", "batch", 3, 32, 1.29, "m2g-batch",
         "batch embedding job: flex tier 3"),
)
LATE = Spec("ft-qwen3-8b", "research", "fine-tuning", 2, 8, 1.21, "m2g-fine-tuning",
            "a new fine-tune submitted during the grid event")


@dataclass
class Action:
    reason: str
    at: datetime
    note: str


@dataclass
class Demo:
    """State of one run."""

    run: Path
    keep: bool
    t0: datetime = field(default_factory=lambda: datetime.now(UTC))
    procs: list[Proc] = field(default_factory=list)
    started_cp: bool = False
    cluster: Cluster | None = None
    prom: str = ""
    sim: str = ""
    metrics: str = ""
    event_name: str = ""
    event_start: datetime | None = None
    event_end: datetime | None = None
    target_kw: float = 0.0
    seen: set[str] = field(default_factory=set)
    actions: dict[str, list[Action]] = field(default_factory=dict)
    submitted: dict[str, datetime] = field(default_factory=dict)
    last_draw: float = -100.0
    draw_before: float = 0.0
    under_at: datetime | None = None
    last_draw_at: float = 0.0

    @property
    def work(self) -> Path:
        return self.run / "demo"

    @property
    def kubeconfig(self) -> Path:
        return self.run / "kubeconfig"

    @property
    def k(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster


# ---- output --------------------------------------------------------------------------------

def clock(d: Demo, at: datetime | None = None) -> str:
    return f"[{((at or datetime.now(UTC)) - d.t0).total_seconds():6.1f}s]"


def say(d: Demo, text: str, at: datetime | None = None) -> None:
    print(f"{clock(d, at)} {text}", flush=True)


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 84 - len(title)), flush=True)


def show(d: Demo, args: list[str], label: str) -> str:
    """Run an m2g command and print it with its output (indented)."""
    print(f"\n  $ m2g {label}", flush=True)
    env = {**os.environ, "KUBECONFIG": str(d.kubeconfig)}
    res = subprocess.run([str(M2G), *args], capture_output=True, text=True, env=env,
                         timeout=60, check=False)
    out = (res.stdout or "").rstrip() or (res.stderr or "").strip()
    for line in out.splitlines():
        print("    " + line)
    print(flush=True)
    return out


# ---- bring-up ------------------------------------------------------------------------------

def localcp(d: Demo, *args: str, stream: bool = False) -> int:
    env = {**os.environ, "M2G_RUN": str(d.run)}
    if not stream:
        return subprocess.run([*LOCALCP, *args], env=env, capture_output=True,
                              check=False).returncode
    proc = subprocess.Popen([*LOCALCP, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print("    " + line.rstrip(), flush=True)
    return proc.wait()


def control_plane(d: Demo) -> None:
    if localcp(d, "status") == 0:
        say(d, f"reusing the control plane running in {d.run}")
        if localcp(d, "factory", "apply", "small", stream=True) != 0:
            raise DemoError(f"small factory not created; logs in {d.run / 'logs'}")
        return
    say(d, f"starting the local control plane in {d.run} (a cold build takes ~25 min, once)")
    d.started_cp = True
    if localcp(d, "up", "--factory", "small", stream=True) != 0:
        raise DemoError(f"control plane did not start (python kind-e2e/localcp up); "
                        f"logs in {d.run / 'logs'}")


def kubectl() -> str:
    versions = dict(line.split("=", 1) for line in
                    (REPO / "kind-e2e" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    cache = Path(os.environ.get("M2G_CACHE", str(Path.home() / ".cache" / "m2g")))
    return str(cache / "bin" / f"kubectl-{versions['KUBERNETES_VERSION'].strip()}" / "kubectl")


def kubectl_run(d: Demo, args: list[str], what: str, stdin: str | None = None) -> str:
    res = subprocess.run([kubectl(), "--kubeconfig", str(d.kubeconfig), *args], input=stdin,
                         capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()[:1]
        raise DemoError(f"kubectl: {what} failed: {first[0] if first else res.returncode}")
    return res.stdout


def install_config(d: Demo) -> None:
    kubectl_run(d, ["apply", "--server-side", "--force-conflicts", "-k",
                    str(REPO / "deploy" / "crds")], "applying m2g's CRDs (deploy/crds)")
    kubectl_run(d, ["wait", "--for=condition=Established", "--timeout=30s", "crd",
                    "gridevents.m2g.io", "powerdomains.m2g.io", "policies.m2g.io",
                    "maintenancewindows.m2g.io"], "waiting for m2g's CRDs")
    rendered = kubectl_run(d, ["kustomize", str(REPO / "kueue-config" / "overlays" / "nvl72")],
                           "rendering kueue-config/overlays/nvl72")
    kubectl_run(d, ["apply", "--server-side", "--force-conflicts", "-f", "-"],
                "applying kueue-config/overlays/nvl72", stdin=rendered)
    say(d, "m2g CRDs + kueue-config/overlays/nvl72 applied: ClusterQueues prod-training (72 "
           "GPUs), research (40, borrows idle GPUs), inference (32), each gated by the "
           "m2g-policy AdmissionCheck")
    d.k.set_site_budget("site", SITE_BUDGET_KW)
    say(d, f"site budget: PowerDomain 'site' (level Site) budgetKw {SITE_BUDGET_KW:.0f}")


def clean_slate(d: Demo) -> None:
    if d.k.clean():
        say(d, "deleted the Jobs of an earlier demo run; waiting for their pods to go")
    wait_for(d, "the earlier demo run's workloads and pods to be deleted",
             lambda: d.k.leftovers() == 0, 90, "kube-controller-manager",
             d.run / "logs" / "kube-controller-manager.log", watch=False)


def start_components(d: Demo) -> None:
    logs = d.work / "logs"
    sim_port, prom_port, metrics_port = free_port(), free_port(), free_port()
    d.sim, d.prom = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{prom_port}"
    d.metrics = f"http://127.0.0.1:{metrics_port}"
    sim = Proc("simulator (m2g simulate)", [str(M2G), "simulate", "--kubeconfig",
               str(d.kubeconfig), "--port", str(sim_port), "--interval", "2"],
               logs / "simulator.log").start()
    d.procs.append(sim)
    sim.wait_ready(lambda: b"facility_pdu_power_watts{" in http_get(f"{d.sim}/metrics")[1], 30)
    say(d, f"telemetry simulator: {d.sim}/metrics (DCGM GPU power/temperature/XID, PDU and "
        "rack sensor series)")
    tsdb = d.work / "prometheus" / "tsdb"
    if tsdb.exists():
        subprocess.run(["rm", "-rf", str(tsdb)], check=False)
    prom = Proc("prometheus", [sys.executable, str(REPO / "kind-e2e" / "prometheus"), "serve",
                "--workdir", str(d.work / "prometheus"), "--port", str(prom_port),
                "--sim-target", f"127.0.0.1:{sim_port}", "--scrape-interval", "2s"],
                logs / "prometheus.log").start()
    d.procs.append(prom)
    prom.wait_ready(lambda: site_draw(d) is not None, 45)
    say(d, f"Prometheus: {d.prom} scraping the simulator every 2 s")
    # the GPU power-limit lever (docs/node-agent.md): one agent for every node, with the fake
    # NVML backend (KWOK nodes have no GPUs); it puts the caps m2g decides in force and the
    # simulator draws the capped power, so a cap saves kW here as it would on a real node
    agent = Proc("node agent (m2g node-agent)", [str(M2G), "node-agent", "--kubeconfig",
                 str(d.kubeconfig), "--all-nodes", "--nvml", "fake", "--interval", "2"],
                 logs / "node-agent.log").start()
    d.procs.append(agent)
    say(d, "node agent: m2g node-agent --all-nodes --nvml fake (applies m2g's GPU power caps)")
    # the Deployment's site configuration (deploy/controller/site-config.yaml: DCGM and facility
    # series, planner settings); --prometheus points it at the local Prometheus
    m2g = Proc("m2g run", [str(M2G), "run", "--config", str(SITE_CONFIG), "--kubeconfig",
               str(d.kubeconfig), "--prometheus", d.prom, "--policies", str(REPO / "policies"),
               "--metrics-host", "127.0.0.1",
               "--metrics-port", str(metrics_port), "--resync-seconds", "2", "--check-name",
               "m2g-policy", "--identity", "m2g-demo"], logs / "m2g-run.log").start()
    d.procs.append(m2g)
    m2g.wait_ready(lambda: http_get(f"{d.metrics}/readyz")[0] == 200, 60)
    wait_for(d, "Kueue to activate the ClusterQueues (m2g keeps the m2g-policy check Active)",
             lambda: not d.k.cluster_queues_active(), 60, "m2g run", m2g.log, watch=False)
    say(d, f"m2g run: the example policies (policies/), metrics {d.metrics}/metrics")


# ---- watching ------------------------------------------------------------------------------

def site_draw(d: Demo) -> float | None:
    url = f"{d.prom}/api/v1/query?query={urllib.parse.quote(DRAW_QUERY)}"
    data = http_json(url)
    try:
        return float(data["data"]["result"][0]["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def job_name(wl_name: str) -> str:
    return wl_name.removeprefix("job-").rsplit("-", 1)[0]


def poll(d: Demo) -> None:
    """Print new m2g Events and site-draw changes; fail fast if a component died."""
    for p in d.procs:
        if not p.alive():
            raise p.failure("exited during the demo")
    for e in d.k.m2g_events(d.t0):
        if e["name"] in d.seen:
            continue
        d.seen.add(e["name"])
        job = job_name(e["workload"])
        d.actions.setdefault(f"{e['namespace']}/{job}", []).append(
            Action(e["reason"], e["time"], e["note"]))
        say(d, f"m2g {e['reason']:<9} {e['namespace']}/{job}: {e['note'][:170]}", e["time"])
    draw = site_draw(d)
    now = time.monotonic()
    if draw is not None and abs(draw - d.last_draw) >= 2.0 and now - d.last_draw_at >= 3:
        limit = f" (grid limit {d.target_kw:.0f} kW)" if event_active(d) else ""
        say(d, f"site draw {draw:6.1f} kW{limit}")
        d.last_draw, d.last_draw_at = draw, now


def event_active(d: Demo) -> bool:
    now = datetime.now(UTC)
    return bool(d.event_start and d.event_end and d.event_start <= now < d.event_end)


def wait_for(d: Demo, what: str, check: Callable[[], bool], timeout: float, component: str,
             log: Path, watch: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if watch:
            poll(d)
        if check():
            return
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}; see "
                            f"{component}'s log {log}:\n{tail(log, 8)}")
        time.sleep(1.0)


def states(d: Demo) -> dict[str, Obj]:
    """ns/job → its Workload."""
    return {f"{ns}/{job_of(w)}": w for ns in NAMESPACES for w in d.k.workloads(ns) if job_of(w)}


def all_running(d: Demo, specs: tuple[Spec, ...]) -> bool:
    wls = states(d)
    return all(is_running(wls.get(f"{s.namespace}/{s.name}", {})) for s in specs) and \
        d.k.running_pods() >= sum(s.gpus // 4 for s in specs)


def draw_steady(d: Demo, samples: list[float]) -> bool:
    draw = site_draw(d)
    if draw is None:
        return False
    samples.append(draw)
    return len(samples) >= 4 and max(samples[-4:]) - min(samples[-4:]) < 0.5


def m2g_log(d: Demo) -> Path:
    return d.work / "logs" / "m2g-run.log"


# ---- the story -----------------------------------------------------------------------------

def submit(d: Demo, s: Spec) -> None:
    d.k.submit(s)
    d.submitted[f"{s.namespace}/{s.name}"] = datetime.now(UTC)
    say(d, f"submit {s.namespace}/{s.name}: {s.gpus} GPUs, {s.kind}, flex tier {s.tier}, "
           f"~{s.estimated_kw:.0f} kW  ({s.what})")


def phase_workloads(d: Demo) -> None:
    section("2. A mix of firm and flexible work")
    for s in MIX:
        submit(d, s)
    wait_for(d, "the workloads to be admitted and their pods running",
             lambda: all_running(d, MIX), 120, "m2g run", m2g_log(d))
    say(d, f"all {len(MIX)} workloads admitted (m2g check Ready), "
           f"{sum(s.gpus for s in MIX)} of 144 GPUs busy; waiting for the meter to settle")
    samples: list[float] = []
    wait_for(d, "the site draw to settle", lambda: draw_steady(d, samples), 60,
             "simulator", d.work / "logs" / "simulator.log")
    show(d, ["workloads", "-A", "-o", "wide"], "workloads -A -o wide")
    show(d, ["signals", "--prometheus", d.prom], f"signals --prometheus {d.prom}")


def fire_event(d: Demo) -> float:
    draw = site_draw(d) or 0.0
    d.target_kw = float(math.floor(draw * (1 - CUT)))
    d.draw_before = draw
    start = datetime.now(UTC).replace(microsecond=0)
    d.event_name = f"demo-dr-{start:%H%M%S}"
    d.event_start, d.event_end = start, start + EVENT_LENGTH
    d.k.grid_event(d.event_name, start, "PT2M", d.target_kw)
    say(d, f"GridEvent {d.event_name}: IMPORT_CAPACITY_LIMIT {d.target_kw:.0f} kW for 2 min "
           f"(the site draws {draw:.0f} kW: the utility asks for {CUT:.0%} less)")
    return draw


def phase_event(d: Demo) -> None:
    section("3. Grid event: the utility asks for 30% less power")
    fire_event(d)
    wait_for(d, "m2g to shed flexible work", lambda: any_action(d, "Shed"), 30, "m2g run",
             m2g_log(d))
    submit(d, LATE)
    late = f"{LATE.namespace}/{LATE.name}"
    wait_for(d, f"m2g to defer {late}", lambda: any_action(d, "Deferred", late), 60,
             "m2g run", m2g_log(d))
    wl = states(d).get(late)
    if wl is not None:
        show(d, ["explain", str(wl["metadata"]["name"]), "-n", LATE.namespace, "--policies",
                 str(REPO / "policies"), "--prometheus", d.prom],
             f"explain {wl['metadata']['name']} -n {LATE.namespace}")
    assert d.event_end is not None
    left = (d.event_end - datetime.now(UTC)).total_seconds()
    wait_for(d, "the site draw to fall under the grid limit", lambda: under_target(d),
             max(30.0, left), "m2g run", m2g_log(d))
    d.under_at = datetime.now(UTC)
    say(d, f"site draw under the {d.target_kw:.0f} kW limit; firm and tier-1 work kept running")
    show(d, ["signals", "--prometheus", d.prom], f"signals --prometheus {d.prom}")
    wait_for(d, "the grid event to end", lambda: not event_active(d), left + 5, "m2g run",
             m2g_log(d))


def under_target(d: Demo) -> bool:
    draw = site_draw(d)
    return draw is not None and draw <= d.target_kw


def any_action(d: Demo, reason: str, key: str | None = None) -> bool:
    return any(a.reason == reason for k, acts in d.actions.items() if key in (None, k)
               for a in acts)


def phase_restore(d: Demo) -> None:
    section("4. The event ends: m2g restores what it shed")
    say(d, f"GridEvent {d.event_name} is over ({d.event_end:%H:%M:%S} UTC)")
    wait_for(d, "shed work to be restored and running again",
             lambda: all_running(d, MIX), 120, "m2g run", m2g_log(d))
    # The late job was deferred (Retry) shortly before the event ended; Kueue holds a Retry until
    # its requeue time (m2g caps it at 60 s, Kueue may back off longer), so it may still wait
    # here although m2g would admit it now: m2g explain shows both.
    late = states(d).get(f"{LATE.namespace}/{LATE.name}")
    if late is not None and not is_running(late):
        say(d, f"{LATE.namespace}/{LATE.name} still waits for Kueue to requeue its deferral")
        show(d, ["explain", str(late["metadata"]["name"]), "-n", LATE.namespace, "--policies",
                 str(REPO / "policies"), "--prometheus", d.prom],
             f"explain {late['metadata']['name']} -n {LATE.namespace}")
    samples: list[float] = []
    wait_for(d, "the site draw to settle", lambda: draw_steady(d, samples), 60,
             "simulator", d.work / "logs" / "simulator.log")
    say(d, "the shed work is running again")
    show(d, ["workloads", "-A", "-o", "wide"], "workloads -A -o wide")
    show(d, ["signals", "--prometheus", d.prom], f"signals --prometheus {d.prom}")


# ---- summary -------------------------------------------------------------------------------

def steps(d: Demo) -> list[datetime]:
    """Shed times grouped into paced steps (actions less than 5 s apart are one step)."""
    times = sorted(a.at for acts in d.actions.values() for a in acts if a.reason == "Shed")
    out: list[datetime] = []
    for t in times:
        if not out or (t - out[-1]).total_seconds() > 5:
            out.append(t)
    return out


def secs(a: datetime, b: datetime) -> str:
    return f"{(b - a).total_seconds():.1f}s"


def describe(d: Demo, a: Action, key: str, starts: list[datetime],
             before: list[Action]) -> tuple[str, str]:
    """(what m2g did, latency) of one action; ``before``: the workload's earlier actions."""
    assert d.event_start is not None and d.event_end is not None
    if a.reason == "Shed":
        step = 1 + sum(1 for s in starts[1:] if s <= a.at)
        kw = a.note.split(" kW", 1)[0].removeprefix("shed ")
        return f"shed {kw} kW (step {step})", f"{secs(d.event_start, a.at)} after event start"
    if a.reason == "Restored":
        return "restored", f"{secs(d.event_end, a.at)} after event end"
    if a.reason == "Deferred":
        return "deferred (grid event)", \
            f"{secs(d.submitted.get(key, d.t0), a.at)} after submission"
    restored = [b for b in before if b.reason == "Restored"]
    if restored:
        return "running again", f"{secs(restored[-1].at, a.at)} after restore (Kueue)"
    deferred = [b for b in before if b.reason == "Deferred"]
    if deferred and a.at < d.event_end:  # shedding made room under the limit
        return "admitted: fits under limit", f"{secs(deferred[-1].at, a.at)} after the defer"
    if deferred:
        return "admitted after the event", f"{secs(d.event_end, a.at)} after event end"
    return a.reason.lower(), f"{secs(d.submitted.get(key, d.t0), a.at)} after submission"


def untouched(s: Spec) -> str:
    if s.tier == 0:
        return "untouched: tier 0 never shed"
    return f"kept running (tier {s.tier})"


def summary(d: Demo) -> None:
    section("5. Summary: what m2g did")
    starts = steps(d)
    print(f"\n  {'WORKLOAD':<27} {'TIER':>4} {'GPUS':>4} {'EST KW':>6}  {'WHAT M2G DID':<28} "
          f"{'WHEN':>7}  LATENCY")
    for s in (*MIX, LATE):
        key = f"{s.namespace}/{s.name}"
        acts = sorted(d.actions.get(key, []), key=lambda a: a.at)
        acts = [a for i, a in enumerate(acts)  # a repeated Admitted Event adds nothing
                if i == 0 or a.reason != "Admitted" or acts[i - 1].reason != "Admitted"]
        rows = [(*describe(d, a, key, starts, acts[:i]), clock(d, a.at)[1:-1].strip())
                for i, a in enumerate(acts)]
        if not any(a.reason in ("Shed", "Deferred") for a in acts):
            rows.append((untouched(s), "", ""))
        for i, (what, latency, when) in enumerate(rows or [("nothing", "", "")]):
            head = f"{key:<27} {s.tier:>4} {s.gpus:>4} {s.estimated_kw:>6.1f}" if i == 0 \
                else " " * 44
            print(f"  {head}  {what:<28} {when:>7}  {latency}")
    assert d.event_start is not None and d.event_end is not None
    print(f"\n  Grid event {d.event_name}: limit {d.target_kw:.0f} kW (draw was "
          f"{d.draw_before:.0f} kW) from {clock(d, d.event_start)[1:-1].strip()} to "
          f"{clock(d, d.event_end)[1:-1].strip()}; {len(starts)} shed step(s) at "
          + ", ".join(clock(d, t)[1:-1].strip() for t in starts)
          + (f"; under the limit at {clock(d, d.under_at)[1:-1].strip()} "
             f"({secs(d.event_start, d.under_at)} after event start)" if d.under_at else ""))


def next_steps(d: Demo) -> None:
    section("Where to look next")
    kc = f"KUBECONFIG={d.kubeconfig}"
    if not d.keep:
        print("\n  (the demo stops everything when it ends: run `M2G_DEMO_KEEP=1 make demo` to "
              "keep it all running and try these)")
    print(f"""
  export {kc}
  .venv/bin/m2g workloads -A -o wide               # m2g's check state and message per workload
  .venv/bin/m2g queues                             # quota (m2g-derated vs base), usage
  .venv/bin/m2g signals --prometheus {d.prom}   # power vs budget and grid limit
  .venv/bin/m2g explain <job or workload> -n research --policies policies --prometheus {d.prom}
  {kubectl()} get events -A --field-selector reportingComponent=m2g.io/policy
  curl -s {d.metrics}/metrics | grep ^m2g_     # m2g's own metrics
  logs: {d.work / 'logs'} (m2g-run, simulator, prometheus), {d.run / 'logs'} (control plane)
  docs/quickstart.md, docs/policies.md, docs/signals.md""")


# ---- lifecycle -----------------------------------------------------------------------------

def record_pids(d: Demo) -> None:
    state = {"procs": [{"name": p.name, "pid": p.pid} for p in d.procs],
             "startedControlPlane": d.started_cp}
    (d.work / "pids.json").write_text(json.dumps(state))


def shutdown(d: Demo) -> None:
    if d.keep:
        record_pids(d)
        print(f"\nM2G_DEMO_KEEP=1: everything keeps running (KUBECONFIG={d.kubeconfig}).\n"
              f"Stop it with: M2G_RUN={d.run} .venv/bin/python demo/run_demo.py --stop")
        return
    for p in reversed(d.procs):
        p.stop()
    if d.cluster is not None and not d.started_cp:
        d.cluster.clean()  # a reused control plane is left as it was found, minus the demo
    if d.cluster is not None:
        d.cluster.close()
    if d.started_cp:
        localcp(d, "down")
    print(f"\nstopped everything the demo started ({len(d.procs)} processes"
          + (", the control plane" if d.started_cp else "") + ")", flush=True)


def stop_kept(run: Path, control_plane: bool = True) -> int:
    """Stop the processes a kept demo left running (only pids whose command line names this run
    directory: a recycled pid is never signalled) and, if it started it, the control plane."""
    pids = run / "demo" / "pids.json"
    if not pids.exists():
        if control_plane:
            print(f"nothing to stop: {pids} not found")
        return 0
    state = json.loads(pids.read_text())
    for p in state["procs"]:
        cmdline = Path(f"/proc/{p['pid']}/cmdline")
        if cmdline.exists() and str(run) in cmdline.read_text(errors="replace"):
            stop_group(int(p["pid"]))
            print(f"stopped {p['name']} (pid {p['pid']}) left running by an earlier demo")
    if control_plane and state.get("startedControlPlane"):
        subprocess.run([*LOCALCP, "down"], env={**os.environ, "M2G_RUN": str(run)}, check=False)
    pids.unlink()
    return 0


def story(d: Demo) -> None:
    section("1. Bring-up: control plane, small factory, simulator, Prometheus, m2g run")
    stop_kept(d.run, control_plane=False)  # one m2g run per control plane
    control_plane(d)
    d.cluster = Cluster(d.kubeconfig)
    install_config(d)
    clean_slate(d)
    start_components(d)
    phase_workloads(d)
    phase_event(d)
    phase_restore(d)
    summary(d)
    next_steps(d)
    say(d, "demo finished")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("--stop", action="store_true", help="stop what a kept demo left running")
    args = parser.parse_args(argv)
    default_run = Path.home() / ".cache" / "m2g" / "run-demo"
    run = Path(os.environ.get("M2G_RUN") or default_run)
    if args.stop:
        return stop_kept(run)
    d = Demo(run=run, keep=os.environ.get("M2G_DEMO_KEEP") == "1")
    d.work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    code = 0
    try:
        story(d)
    except DemoError as exc:
        print(f"\nerror: {exc}", file=sys.stderr, flush=True)
        code = 1
    except (ApiException, HTTPError, OSError) as exc:
        print(f"\nerror: Kubernetes API server (logs in {run / 'logs'}): "
              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr, flush=True)
        code = 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr, flush=True)
        code = 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            shutdown(d)
    return code


if __name__ == "__main__":
    sys.exit(main())
