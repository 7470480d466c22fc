"""One run of the twin on a fresh local control plane (docs/twin.md "The harness").

``run_baseline`` brings up the control plane in its own ``M2G_RUN`` with an N-rack NVL72 KWOK
factory, installs m2g's CRDs and the shipped kueue-config overlay (quotas scaled to the
factory; without the m2g check for plain Kueue), starts the telemetry simulator, Prometheus,
the job driver and — for the m2g run — the deploy/policies Policy objects and ``m2g run``;
replays the plan, fires the scenario, samples, and tears everything down.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from m2g.k8s.convert import min_flex_tiers
from m2g.model import labels as L
from m2g.sim.power import PowerModel
from twinkit import jobs as J
from twinkit import records as Rec
from twinkit import scenarios as S
from twinkit.kube import Kube
from twinkit.trace import Plan, TraceJob, size_histogram

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "demo"))
from demo_procs import DemoError, Proc, free_port, http_get, http_json  # noqa: E402

M2G = Path(sys.executable).parent / "m2g"
LOCALCP = [sys.executable, str(REPO / "kind-e2e" / "localcp")]
# the facility series m2g reads by default (m2g.signals.config, docs/signals.md): the PDUs of
# every rack, summed, in kW; the rack inlet in °C
DRAW_QUERY = "sum(facility_pdu_power_watts) / 1000"
INLET_QUERY = "facility_rack_inlet_temperature_celsius"
SITE_CONFIG = REPO / "deploy" / "controller" / "site-config.yaml"  # the Deployment's config
DEFAULT_RUNTIME_TRACE_S = 3600.0  # m2g's default expected runtime (PlannerConfig), trace s
INLET_LIMIT_C = 32.0  # m2g's default inlet limit (m2g.k8s.convert.DEFAULT_INLET_LIMIT_C)
SAMPLE_EVERY = 2.0
CREATE_CONCURRENCY = 4  # Job creations in flight at once (threads; the replay loop never waits)
# a scenario's start hook runs once the warm-start jobs are created and this many wall s have
# passed (Kueue and m2g admit them, the pods run, the meter sees it), at most 3× as many
START_AFTER_S = 20.0
Obj = dict[str, Any]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunKind:
    """One kind of run the report compares (``--baselines``)."""

    m2g: bool  # the m2g admission check, the Policy objects and ``m2g run``
    describe: str
    m2g_args: tuple[str, ...] = ()  # extra ``m2g run`` arguments (e.g. a lever set)
    planner: tuple[tuple[str, Any], ...] = ()  # site-configuration planner settings over it
    policies: Path = REPO / "deploy" / "policies"  # a kustomization of Policy objects


#: The run registry (docs/twin.md "Extending the twin"): a variant of m2g (e.g.
#: ``m2g-pause-only``: ``RunKind(True, "...", ("--levers", "pause"))``) is one entry here.
RUNS: dict[str, RunKind] = {
    "kueue": RunKind(False, "plain Kueue: no m2g check, no m2g run"),
    "m2g": RunKind(True, "m2g: the shipped check, deploy/policies and m2g run"),
    "m2g-pause-only": RunKind(True, "m2g with pauses as its only power lever (no GPU caps)",
                              ("--levers", "pause")),
    "m2g-restore-after": RunKind(True, "m2g with shed work restored only after a grid event "
                                 "(restoreDuringEvents: false; the behaviour before 2026-12-02)",
                                 planner=(("restoreDuringEvents", False),)),
    "m2g-gate-before": RunKind(True, "m2g with the admission gate before 2026-12-02's second "
                               "change (preemptorHoldSeconds: 0, headroomEventMinTier: 3: a "
                               "held-back preemptor answered Retry, new flex-1 work not gated "
                               "during an event)",
                               planner=(("preemptorHoldSeconds", 0),
                                        ("headroomEventMinTier", 3))),
    "m2g-hold-new": RunKind(True, "m2g holding all new work during a grid event "
                            "(headroomEventMinTier: 0: firm work too waits for room, and the "
                            "room jobs finishing free goes first to the work m2g paused)",
                            planner=(("headroomEventMinTier", 0),)),
    "m2g-firm-first": RunKind(True, "m2g giving new firm work the room during a grid event "
                              "before the work it paused (restoreBeforeFirm: false; the "
                              "behaviour before 2026-12-06)",
                              planner=(("restoreBeforeFirm", False),)),
    "m2g-lead": RunKind(True, "m2g curtailing for the lowest limit starting within 30 s "
                        "(shedLeadSeconds: 30; the default is 15 s)",
                        planner=(("shedLeadSeconds", 30),)),
    "m2g-no-lead": RunKind(True, "m2g curtailing for the limit in force only (shedLeadSeconds: "
                           "0; the behaviour before 2026-12-07's thirtieth session)",
                           planner=(("shedLeadSeconds", 0),)),
    "m2g-no-ending": RunKind(True, "m2g pausing for the kW of work expected to end within "
                             "seconds too (endingLeadSeconds: 0; the behaviour before "
                             "2026-12-07's twenty-ninth session)",
                             planner=(("endingLeadSeconds", 0),)),
    "m2g-preplace": RunKind(True, "m2g placing a waiting elastic job in one NVLink domain "
                            "before Kueue reserves it (nvlinkPreplace: true; off by default "
                            "until measured)", planner=(("nvlinkPreplace", True),)),
    "m2g-eager": RunKind(True, "m2g reconciling on every change while quiet too "
                         "(--quiet-reconcile-interval 0; the behaviour before 2026-12-07's "
                         "thirty-first session)", ("--quiet-reconcile-interval", "0")),
}


@dataclass
class RunConfig:
    baseline: str  # a key of RUNS
    racks: int
    plan: Plan
    timeline: S.Timeline
    time_scale: float
    horizon_s: float  # wall seconds of replay
    run_dir: Path
    out_dir: Path
    #: install the Policy objects whose decisions follow the wall clock's hour too
    #: (``CLOCK_POLICIES``; ``bench/twin.py --clock-policies``)
    clock_policies: bool = False

    @property
    def kind(self) -> RunKind:
        return RUNS[self.baseline]


#: Shipped Policy objects that decide by the wall clock's hour and weekday, not by anything the
#: replay sets: fairness-time-of-day gives the research ClusterQueue fair-sharing weight 4 from
#: 22:00 to 06:00 UTC, 2 at the weekend, 0.5 on weekday days. The twin leaves them out unless
#: asked: with them, one twin run's figures depended on the hour it ran (2026-12-07: runs at
#: 00:51 and 04:03 UTC had weight 4, the 24th session's at 20:36 UTC on a Sunday weight 2; the
#: plain-Kueue run beside it has no weights of m2g's at all).
CLOCK_POLICIES: frozenset[str] = frozenset({"fairness-time-of-day"})


def twin_policies(docs: list[Any], clock_policies: bool) -> list[Any]:
    """The rendered Policy objects a twin run installs: all of them, less ``CLOCK_POLICIES``
    unless ``clock_policies``."""
    if clock_policies:
        return [d for d in docs if d]
    return [d for d in docs if d and str((d.get("metadata") or {}).get("name", ""))
            not in CLOCK_POLICIES]


@dataclass
class RunData:
    """Everything one run recorded, for the metrics and the plots."""

    baseline: str
    samples: list[tuple[float, float]] = field(default_factory=list)  # t, site kW
    queue: list[tuple[float, int, int]] = field(default_factory=list)  # t, pending, admitted
    inlet: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    quota_changes: int = 0
    intervals: list[S.Interval] = field(default_factory=list)
    event_start: float | None = None
    event_end: float | None = None
    target_kw: float | None = None
    baseline_kw: float | None = None
    ramp_s: float = 0.0
    driver: Obj = field(default_factory=dict)
    metrics_text: str = ""
    rss_peak_mib: float | None = None
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # node → rack, block
    faults: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    submitted: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    #: CPU seconds by process at the replay's end (``process_cpu``)
    cpu_parts: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    firing: Any = None  # the scenario's Firing, once fired
    t0: float = 0.0  # wall epoch of the replay's start
    log_summary: Obj = field(default_factory=dict)  # `m2g report -o json` of the run's log
    decided: dict[str, float] = field(default_factory=dict)  # workload → first Ready decision
    extra: Obj = field(default_factory=dict)  # what a run kind's hooks record (RunKind)


# ---- the control plane and its configuration --------------------------------------------------

def factory_spec(racks: int) -> Obj:
    return {"name": "twin", "racks": racks, "nodesPerRack": 18, "gpusPerNode": 4,
            "racksPerBlock": min(4, racks), "racksPerPowerDomain": min(4, racks),
            "gpuProduct": "NVIDIA-GB200", "flavor": "gb200", "topology": "nvl72"}


def localcp(run: Path, *args: str) -> None:
    env = {**os.environ, "M2G_RUN": str(run)}
    res = subprocess.run([*LOCALCP, *args], env=env, capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-6:])
        raise DemoError(f"localcp {' '.join(args)} failed:\n{tail}")


def kubectl_bin() -> str:
    versions = dict(line.split("=", 1) for line in
                    (REPO / "kind-e2e" / "versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    cache = Path(os.environ.get("M2G_CACHE", str(Path.home() / ".cache" / "m2g")))
    return str(cache / "bin" / f"kubectl-{versions['KUBERNETES_VERSION'].strip()}" / "kubectl")


def kubectl(kubeconfig: Path, args: list[str], stdin: str | None = None) -> str:
    res = subprocess.run([kubectl_bin(), "--kubeconfig", str(kubeconfig), *args], input=stdin,
                         capture_output=True, text=True, timeout=180, check=False)
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()[:2]
        raise DemoError(f"kubectl {' '.join(args[:3])}: {' '.join(first)}")
    return res.stdout


_QTY = re.compile(r"^(\d+)([A-Za-z]*)$")


def scale_quantity(value: str, factor: float) -> str:
    m = _QTY.match(str(value))
    if not m:
        return str(value)
    return f"{round(int(m.group(1)) * factor)}{m.group(2)}"


def kueue_config(rendered: str, racks: int, with_m2g: bool) -> list[Obj]:
    """The shipped overlay (sized for 2 racks) with every quota scaled to ``racks``; for plain
    Kueue, the ClusterQueues lose their admission check (components/without-m2g-check)."""
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    factor = racks / 2.0
    for d in docs:
        if d.get("kind") != "ClusterQueue":
            continue
        for rg in d["spec"].get("resourceGroups") or []:
            for fl in rg.get("flavors") or []:
                for res in fl.get("resources") or []:
                    for key in ("nominalQuota", "borrowingLimit"):
                        if key in res and str(res[key]) != "0":
                            res[key] = scale_quantity(str(res[key]), factor)
        if not with_m2g:
            d["spec"].pop("admissionChecksStrategy", None)
    return docs


def tier_floors(docs: list[Obj]) -> dict[str, int]:
    """Namespace → the least flexible tier its ``default`` LocalQueue's ClusterQueue allows
    (``m2g.io/min-flex-tier``, read as m2g reads it): the tier m2g holds the namespace's jobs
    to, and so the tier the report counts them in (docs/twin.md, "Flex tiers")."""
    cqs = min_flex_tiers(d for d in docs if d.get("kind") == "ClusterQueue")
    out: dict[str, int] = {}
    for d in docs:
        meta = d.get("metadata") or {}
        if d.get("kind") == "LocalQueue" and meta.get("name") == J.LOCAL_QUEUE:
            floor = cqs.get(str((d.get("spec") or {}).get("clusterQueue", "")), 0)
            out[str(meta.get("namespace", ""))] = floor
    return out


def install(cfg: RunConfig, kubeconfig: Path) -> dict[str, int]:
    """Install the CRDs, kueue-config and policies; return the namespaces' tier floors."""
    kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-k",
                         str(REPO / "deploy" / "crds")])
    kubectl(kubeconfig, ["wait", "--for=condition=Established", "--timeout=60s", "crd",
                         "gridevents.m2g.io", "powerdomains.m2g.io", "policies.m2g.io",
                         "maintenancewindows.m2g.io"])
    rendered = kubectl(kubeconfig, ["kustomize", str(REPO / "kueue-config" / "overlays" /
                                                     "nvl72")])
    docs = kueue_config(rendered, cfg.racks, cfg.kind.m2g)
    kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", "-"],
            stdin=yaml.safe_dump_all(docs))
    budget = {"apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain",
              "metadata": {"name": "site"},
              "spec": {"level": "Site", "budgetKw": 200.0 * cfg.racks}}
    kubectl(kubeconfig, ["apply", "--server-side", "-f", "-"], stdin=json.dumps(budget))
    if cfg.kind.m2g:
        rendered = kubectl(kubeconfig, ["kustomize", str(cfg.kind.policies)])
        policies = twin_policies(list(yaml.safe_load_all(rendered)), cfg.clock_policies)
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", "-"],
                stdin=yaml.safe_dump_all(policies))
    return tier_floors(docs)


# ---- processes --------------------------------------------------------------------------------

@dataclass
class Procs:
    sim: str = ""
    prom: str = ""
    metrics: str = ""
    list: list[Proc] = field(default_factory=list)
    m2g: Proc | None = None
    driver: Proc | None = None

    def stop(self) -> None:
        for p in reversed(self.list):
            with contextlib.suppress(Exception):
                p.stop()


def prom_value(prom: str, query: str) -> list[tuple[dict[str, str], float]]:
    data = http_json(f"{prom}/api/v1/query?query={urllib.parse.quote(query)}")
    try:
        return [(r["metric"], float(r["value"][1])) for r in data["data"]["result"]]
    except (TypeError, KeyError, IndexError, ValueError):
        return []


def decision_dir(cfg: RunConfig) -> Path:
    return cfg.run_dir / "twin-decision-log"


def site_config(cfg: RunConfig) -> Path:
    """The shipped site configuration with the planner's ``defaultRuntimeSeconds`` (what m2g
    assumes of a workload without ``m2g.io/expected-runtime-seconds``: the foreign jobs) in
    the twin's wall time, like the annotations the twin writes: one trace hour."""
    doc = yaml.safe_load(SITE_CONFIG.read_text()) or {}
    planner = doc.setdefault("planner", {})
    planner["defaultRuntimeSeconds"] = max(1.0, DEFAULT_RUNTIME_TRACE_S / cfg.time_scale)
    planner.update(dict(cfg.kind.planner))
    path = cfg.run_dir / "twin-site-config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_processes(cfg: RunConfig, kubeconfig: Path, procs: Procs) -> None:
    logs = cfg.run_dir / "twin-logs"
    subprocess.run(["rm", "-rf", str(decision_dir(cfg))], check=False)
    sim_port, prom_port, metrics_port = free_port(), free_port(), free_port()
    procs.sim, procs.prom = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{prom_port}"
    procs.metrics = f"http://127.0.0.1:{metrics_port}"
    sim = Proc("simulator", [str(M2G), "simulate", "--kubeconfig", str(kubeconfig), "--port",
               str(sim_port), "--interval", "2"], logs / "simulator.log").start()
    procs.list.append(sim)
    sim.wait_ready(lambda: b"facility_pdu_power_watts{" in http_get(
        f"{procs.sim}/metrics")[1], 60)
    workdir = cfg.run_dir / "twin-prometheus"
    subprocess.run(["rm", "-rf", str(workdir)], check=False)
    prom = Proc("prometheus", [sys.executable, str(REPO / "kind-e2e" / "prometheus"), "serve",
                "--workdir", str(workdir), "--port", str(prom_port), "--sim-target",
                f"127.0.0.1:{sim_port}", "--scrape-interval", "2s"],
                logs / "prometheus.log").start()
    procs.list.append(prom)
    prom.wait_ready(lambda: bool(prom_value(procs.prom, DRAW_QUERY)), 90)
    if not cfg.kind.m2g:
        return
    # the GPU power-limit lever: one fake-NVML agent per node (docs/node-agent.md)
    agent = Proc("node agent", [str(M2G), "node-agent", "--kubeconfig", str(kubeconfig),
                 "--all-nodes", "--nvml", "fake", "--interval", "2"],
                 logs / "node-agent.log").start()
    procs.list.append(agent)
    m2g = Proc("m2g run", [str(M2G), "run", "--config", str(site_config(cfg)),
               "--kubeconfig", str(kubeconfig), "--prometheus",
               procs.prom, "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
               "--resync-seconds", "5", "--check-name", "m2g-policy", "--identity", "twin",
               "--decision-log", str(decision_dir(cfg)), *cfg.kind.m2g_args],
               logs / "m2g-run.log").start()
    procs.list.append(m2g)
    procs.m2g = m2g
    m2g.wait_ready(lambda: http_get(f"{procs.metrics}/readyz")[0] == 200, 120)


def wait_queues_active(kube: Kube, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cqs = kube.cluster_queues()
        if cqs and all(any(c.get("type") == "Active" and c.get("status") == "True"
                           for c in (cq.get("status") or {}).get("conditions") or [])
                       for cq in cqs):
            return
        time.sleep(1)
    raise DemoError("the ClusterQueues did not become Active (is the m2g check answered?)")


def rss_peak_mib(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return None


def children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system + t.user + t.system


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, with reaped children) of a live process; 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def pid_file_cpu(run: Path) -> dict[str, float]:
    """CPU seconds of each control-plane process with a pid file in ``run/pids``, by name."""
    out: dict[str, float] = {}
    for f in sorted((run / "pids").glob("*.pid")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[f.stem] = proc_cpu(int(f.read_text().split()[0]))
    return out


def process_cpu(run: Path, procs: Procs) -> dict[str, float]:
    """CPU seconds so far of each live process of a run, by name: the control plane's
    components (``pid_file_cpu``) and the twin's own (simulator, Prometheus, node agent, m2g
    run, job driver) — which of them took the machine's two cores."""
    out = {name: round(cpu, 1) for name, cpu in pid_file_cpu(run).items()}
    for p in procs.list:
        if p.alive():
            out[p.name] = round(proc_cpu(p.pid), 1)
    return out


def control_plane_cpu(run: Path) -> float:
    """CPU seconds of the control plane's processes (pid files in ``run/pids``)."""
    return sum(pid_file_cpu(run).values())


# ---- the scenario -----------------------------------------------------------------------------

def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def post_fault(sim: str, body: Obj) -> None:
    import urllib.request

    req = urllib.request.Request(f"{sim}/faults", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with contextlib.suppress(OSError):
        opener.open(req, timeout=5).read()


def clear_faults(sim: str) -> None:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with contextlib.suppress(OSError):
        opener.open(urllib.request.Request(f"{sim}/faults", method="DELETE"), timeout=5).read()


@dataclass
class Firing:
    """What a scenario's start (or end) hook gets: the run, its records and the cluster."""

    cfg: RunConfig
    data: RunData
    kube: Kube
    procs: Procs
    start: int  # wall epoch of the event's start (whole seconds)
    pre_kw: float  # mean site draw of the 60 wall s before it
    name: str  # a name for the objects the scenario creates

    def grid_event(self, spec: Obj) -> None:
        self.kube.create_cluster_object("gridevents", {
            "apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
            "metadata": {"name": self.name}, "spec": {"eventID": self.name, **spec}})

    def note(self, what: str, at: float | None = None) -> None:
        self.data.timeline.append((self.cfg.timeline.start_s if at is None else at, what))


def _ramp_event(f: Firing, program: str, pre_kw: float) -> None:
    """A GridEvent whose IMPORT_CAPACITY_LIMIT ramps from ``pre_kw`` down by the scenario's
    depth over its ramp and holds (S.ramp_intervals); the run's target is its last limit."""
    tl, data = f.cfg.timeline, f.data
    data.intervals = S.ramp_intervals(pre_kw, tl.depth, tl.ramp_s, tl.duration_s)
    data.target_kw, data.ramp_s = data.intervals[-1].limit_kw, tl.ramp_s
    f.grid_event({"programName": program, "intervals": [
        {"start": rfc3339(f.start + iv.offset_s), "duration": f"PT{int(iv.duration_s)}S",
         "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": iv.limit_kw}}
        for iv in data.intervals]})


def _dr_srp(f: Firing) -> None:
    tl, data = f.cfg.timeline, f.data
    _ramp_event(f, "twin-srp", f.pre_kw)
    f.note(f"GridEvent {f.name}: IMPORT_CAPACITY_LIMIT from {data.intervals[0].limit_kw:.0f} "
           f"to {data.target_kw:.0f} kW over {tl.ramp_s:.0f} s (pre-event draw "
           f"{f.pre_kw:.0f} kW)")


def _dr_percent(f: Firing) -> None:
    tl, data = f.cfg.timeline, f.data
    pct = round(tl.depth * 100, 1)
    data.target_kw, data.ramp_s = f.pre_kw * (1 - tl.depth), 30.0
    data.intervals = [S.Interval(0, tl.duration_s, data.target_kw)]
    f.grid_event({"programName": "twin-percent", "targetReductionPercent": pct, "intervals": [
        {"start": rfc3339(f.start), "duration": f"PT{int(tl.duration_s)}S",
         "payload": {"type": "SIMPLE", "value": 1}}]})
    f.note(f"GridEvent {f.name}: {pct}% below baseline ({f.pre_kw:.0f} kW measured → target "
           f"{data.target_kw:.0f} kW)")


def _cooling(f: Firing) -> None:
    post_fault(f.procs.sim, {"kind": "cooling-degraded", "rack": "rack-001", "deltaC": 12})
    f.data.faults.append(("rack:rack-001", "cooling", f.cfg.timeline.start_s,
                          f.cfg.timeline.end_s))
    f.note("cooling degraded on rack-001 (+12 °C)")


def _xid_storm(f: Firing) -> None:
    rack = f"r{min(2, f.cfg.racks - 1):03d}"  # rack-002, or the last rack of a smaller factory
    for n in range(6):
        node = f"twin-{rack}-n{n:02d}"
        post_fault(f.procs.sim, {"kind": "tray-failed", "node": node, "xid": 79})
        f.data.faults.append((node, "xid", f.cfg.timeline.start_s, f.cfg.timeline.end_s))
    f.note(f"XID 79 on trays twin-{rack}-n00..n05")


def _maintenance(f: Firing) -> None:
    block = "block-01" if f.cfg.racks > 4 else "block-00"
    f.kube.create_cluster_object("maintenancewindows", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "MaintenanceWindow",
        "metadata": {"name": f.name},
        "spec": {"start": rfc3339(f.start), "end": rfc3339(f.start + f.cfg.timeline.duration_s),
                 "reason": "twin maintenance", "scope": {"blocks": [block]}}})
    f.note(f"MaintenanceWindow on {block}")


def _clear_faults(f: Firing) -> None:
    clear_faults(f.procs.sim)


def _forecast_start(f: Firing) -> None:
    """The forecast scenario at the replay's start, in a thread (the loop goes on): ``m2g
    forecast`` over the rest of the replay in one-trace-hour intervals; the dr-srp GridEvent,
    notified now for its start ``event-at-hours`` later, its limits from that forecast's
    mean over the event's hours (the site's day-ahead baseline); then the forecast again, now
    with the event: the one the report compares with the draw."""
    now = time.time() - f.data.t0
    interval = max(10, round(3600 / f.cfg.time_scale))
    count = int((f.cfg.horizon_s - now) // interval)
    if count < 1:
        f.note("no whole forecast interval left in the replay: no forecast", now)
        return
    f.data.extra["timeScale"] = f.cfg.time_scale
    threading.Thread(target=_notify_and_forecast, args=(f, interval, count), daemon=True,
                     name="twin-forecast").start()


def _notify_and_forecast(f: Firing, interval: int, count: int) -> None:
    tl, data = f.cfg.timeline, f.data
    base_fc = _run_forecast(f, interval, count)
    if base_fc is None:
        return
    t0 = data.t0
    during = [iv["siteKw"] for iv in base_fc.get("intervals") or []
              if _iso(iv["start"]) - t0 < tl.end_s and _iso(iv["end"]) - t0 > tl.start_s]
    pre = sum(during) / len(during) if during else 0.0
    _ramp_event(f, "twin-forecast", pre)
    f.note(f"GridEvent {f.name} notified for t = {tl.start_s:.0f} s: IMPORT_CAPACITY_LIMIT "
           f"from {data.intervals[0].limit_kw:.0f} to {data.target_kw:.0f} kW (m2g's forecast "
           f"for the event's hours: {pre:.0f} kW)", time.time() - t0)
    left = int((f.cfg.horizon_s - (time.time() - t0)) // interval)
    if not f.cfg.kind.m2g:
        return  # plain Kueue: the same event, no m2g to forecast (or shed) for it
    inputs = f.cfg.run_dir / "twin-forecast-inputs.pickle"
    fc = _run_forecast(f, interval, max(1, left), inputs)
    if fc is not None:
        data.extra["forecast"] = fc
        data.extra["forecastBaselineKw"] = pre
        if inputs.is_file():
            data.extra["forecastInputs"] = str(inputs)


def _iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _run_forecast(f: Firing, interval: int, count: int,
                  inputs: Path | None = None) -> Obj | None:
    """``m2g forecast -o json``; ``inputs``: also save the snapshot and configuration it is
    made from there (bench/forecast_rescore.py reruns a model on them)."""
    env = {**os.environ, "M2G_CONFIG": str(f.cfg.run_dir / "twin-site-config.yaml")}
    cmd = [str(M2G), "forecast", "--kubeconfig", str(f.cfg.run_dir / "kubeconfig"),
           "--prometheus", f.procs.prom, "-o", "json", "--interval", str(interval),
           "--hours", f"{count * interval / 3600:.6f}"]
    if inputs is not None:
        cmd += ["--save-inputs", str(inputs)]
    started = time.time()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    try:
        fc: Obj | None = json.loads(res.stdout) if res.returncode == 0 else None
    except ValueError:
        fc = None
    if fc is None:
        log(f"{f.cfg.baseline}: m2g forecast failed: {(res.stderr or '').strip()[:300]}")
        return None
    f.data.extra["forecastSeconds"] = time.time() - started
    log(f"{f.cfg.baseline}: forecast made at {fc.get('madeAt')}: {count} intervals of "
        f"{interval} s in {time.time() - started:.1f} s")
    return fc


def _forecast_fire(f: Firing) -> None:
    f.note(f"the notified GridEvent starts (pre-event draw {f.pre_kw:.0f} kW)")


@dataclass(frozen=True)
class ScenarioHooks:
    """A scenario's side effects: ``fire`` at the event's start, ``end`` (optional) at its
    end, ``start`` (optional) once at the replay's start, when the warm-start jobs are in
    (``START_AFTER_S``). A grid scenario's ``fire`` (or ``start``) sets ``data.target_kw`` /
    ``intervals`` / ``ramp_s``."""

    fire: Callable[[Firing], None]
    end: Callable[[Firing], None] | None = None
    start: Callable[[Firing], None] | None = None


#: The scenario registry (docs/twin.md "Extending the twin"): a new scenario is a member of
#: ``scenarios.Scenario`` plus an entry here.
SCENARIOS: dict[S.Scenario, ScenarioHooks] = {
    S.Scenario.DR_SRP: ScenarioHooks(_dr_srp),
    S.Scenario.DR_PERCENT: ScenarioHooks(_dr_percent),
    S.Scenario.COOLING: ScenarioHooks(_cooling, _clear_faults),
    S.Scenario.XID_STORM: ScenarioHooks(_xid_storm, _clear_faults),
    S.Scenario.MAINTENANCE: ScenarioHooks(_maintenance),
    S.Scenario.FORECAST: ScenarioHooks(_forecast_fire, start=_forecast_start),
}


def _firing(cfg: RunConfig, data: RunData, kube: Kube, procs: Procs) -> Firing:
    start = int(time.time())
    name = data.extra.get("eventName") or f"twin-{cfg.baseline}-{start}"  # notified at start
    return Firing(cfg, data, kube, procs, start, _baseline(data.samples, cfg.timeline.start_s),
                  name)


def fire(cfg: RunConfig, data: RunData, kube: Kube, procs: Procs, t0: float) -> Firing:
    """Start the scenario's event now (wall ``t0 + timeline.start_s``)."""
    tl = cfg.timeline
    data.event_start, data.event_end = tl.start_s, tl.end_s
    f = _firing(cfg, data, kube, procs)
    data.baseline_kw = f.pre_kw
    SCENARIOS[tl.scenario].fire(f)
    return f


def end_scenario(cfg: RunConfig, data: RunData, procs: Procs, f: Firing | None = None) -> None:
    hook = SCENARIOS[cfg.timeline.scenario].end
    if hook is not None and f is not None:
        hook(f)
    data.timeline.append((cfg.timeline.end_s, f"{cfg.timeline.scenario} ends"))


def _baseline(samples: list[tuple[float, float]], start: float) -> float:
    vals = [kw for t, kw in samples if start - 60 <= t < start] or [kw for _, kw in samples[-5:]]
    return sum(vals) / len(vals) if vals else 0.0


# ---- the replay -------------------------------------------------------------------------------

def write_plan(cfg: RunConfig, t0: float, path: Path,
               floors: Mapping[str, int] | None = None) -> None:
    """The driver's plan; each job's tier raised to its namespace's floor (``tier_floors``)."""
    from dataclasses import asdict, replace

    floors = floors or {}
    jobs = [replace(j, tier=max(j.tier, floors.get(j.namespace, 0))) for j in cfg.plan.jobs]
    path.write_text(json.dumps({
        "timeScale": cfg.time_scale, "t0": t0,
        "eventStart": cfg.timeline.start_s, "eventEnd": cfg.timeline.end_s,
        "sizes": {str(k): v for k, v in size_histogram(cfg.plan.jobs).items()},
        "jobs": [asdict(j) for j in jobs]}))


def replay(cfg: RunConfig, data: RunData, kube: Kube, procs: Procs, t0: float,
           progress: Callable[[str], None] = log) -> None:
    model = PowerModel()
    pending = sorted(cfg.plan.jobs, key=lambda j: j.arrival)
    prefill = sum(1 for j in pending if j.prefill)
    i, fired, ended, started = 0, False, False, SCENARIOS[cfg.timeline.scenario].start is None
    last_sample, last_print = 0.0, 0.0
    quotas: dict[str, str] = {}
    pool = ThreadPoolExecutor(CREATE_CONCURRENCY, thread_name_prefix="twin-create")
    inflight: set[Future[None]] = set()
    try:
        while True:
            t = time.time() - t0
            if t >= cfg.horizon_s:
                break
            inflight = {f for f in inflight if not f.done()}
            while (i < len(pending) and pending[i].arrival / cfg.time_scale <= t
                   and len(inflight) < CREATE_CONCURRENCY * 2):  # bounded: the rest next round
                inflight.add(pool.submit(_create, kube, data, pending[i],
                                         J.manifest(pending[i], cfg.time_scale, model)))
                i += 1
            if not started and ((i >= prefill and not inflight and t >= START_AFTER_S)
                                or t >= START_AFTER_S * 3):
                started = True
                _start_hook(cfg, data, kube, procs, t0)
            fired, ended, last_sample, last_print = _round(
                cfg, data, kube, procs, t0, t, (fired, ended, last_sample, last_print), quotas,
                f"{i}/{len(pending)}", progress)
            time.sleep(0.25)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _start_hook(cfg: RunConfig, data: RunData, kube: Kube, procs: Procs, t0: float) -> None:
    hook = SCENARIOS[cfg.timeline.scenario].start
    assert hook is not None
    start = int(t0 + cfg.timeline.start_s)
    data.extra["eventName"] = f"twin-{cfg.baseline}-{start}"
    hook(Firing(cfg, data, kube, procs, start, 0.0, data.extra["eventName"]))


def _create(kube: Kube, data: RunData, job: TraceJob, body: Obj) -> None:
    try:
        kube.create_job(body)
        data.submitted += 1  # one thread at a time holds the GIL on +=: good enough for a count
    except Exception as exc:  # one bad create must not stop the replay
        log(f"create {job.name} failed: {str(exc).splitlines()[0][:160]}")


def _round(cfg: RunConfig, data: RunData, kube: Kube, procs: Procs, t0: float, t: float,
           state: tuple[bool, bool, float, float], quotas: dict[str, str], submitted: str,
           progress: Callable[[str], None]) -> tuple[bool, bool, float, float]:
    """One round of the replay loop besides creations: the scenario, samples, the log line and
    the processes' health. Returns the new (fired, ended, last_sample, last_print)."""
    fired, ended, last_sample, last_print = state
    if not fired and t >= cfg.timeline.start_s:
        data.firing = fire(cfg, data, kube, procs, t0)
        fired = True
    if fired and not ended and t >= cfg.timeline.end_s:
        end_scenario(cfg, data, procs, data.firing)
        ended = True
    if t - last_sample >= SAMPLE_EVERY:
        last_sample = t
        _sample(data, kube, procs, t, quotas)
    if t - last_print >= 30:
        last_print = t
        draw = data.samples[-1][1] if data.samples else float("nan")
        q = data.queue[-1] if data.queue else (0, 0, 0)
        progress(f"{cfg.baseline}: t={t:5.0f}/{cfg.horizon_s:.0f}s due {submitted} "
                 f"(created {data.submitted}), pending {q[1]}, admitted {q[2]}, "
                 f"site {draw:.0f} kW")
    for p in procs.list:
        if not p.alive():
            raise p.failure("exited during the replay")
    return fired, ended, last_sample, last_print


def _sample(data: RunData, kube: Kube, procs: Procs, t: float, quotas: dict[str, str]) -> None:
    draw = prom_value(procs.prom, DRAW_QUERY)
    if draw:
        data.samples.append((t, draw[0][1]))
    inlet = {m.get("rack", ""): v for m, v in prom_value(procs.prom, INLET_QUERY)}
    if inlet:
        data.inlet.append((t, inlet))
    try:
        cqs = kube.cluster_queues()
    except Exception:
        return
    pending = admitted = 0
    for cq in cqs:
        st = cq.get("status") or {}
        pending += int(st.get("pendingWorkloads") or 0)
        admitted += int(st.get("admittedWorkloads") or 0)
        gpu = [r.get("nominalQuota") for rg in cq["spec"].get("resourceGroups") or []
               for fl in rg.get("flavors") or [] for r in fl.get("resources") or []
               if r.get("name") == "nvidia.com/gpu"]
        key, value = cq["metadata"]["name"], json.dumps(gpu)
        if key in quotas and quotas[key] != value:
            data.quota_changes += 1
        quotas[key] = value
    data.queue.append((t, pending, admitted))


# ---- one baseline, start to end ---------------------------------------------------------------

def run_baseline(cfg: RunConfig) -> RunData:
    data = RunData(cfg.baseline)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    factory = cfg.run_dir / "twin-factory.yaml"
    factory.write_text(yaml.safe_dump(factory_spec(cfg.racks)))
    kubeconfig = cfg.run_dir / "kubeconfig"
    procs = Procs()
    wall0, cpu0 = time.time(), children_cpu()
    log(f"{cfg.baseline}: starting the control plane in {cfg.run_dir} "
        f"({cfg.racks} racks, {cfg.racks * 72} GPUs)")
    localcp(cfg.run_dir, "up", "--factory", str(factory))
    kube: Kube | None = None
    try:
        kube = Kube(kubeconfig)
        floors = install(cfg, kubeconfig)
        start_processes(cfg, kubeconfig, procs)
        wait_queues_active(kube)
        for n in kube.nodes():
            labels = n["metadata"].get("labels") or {}
            data.nodes[n["metadata"]["name"]] = (labels.get(L.RACK, ""),
                                                 labels.get(L.BLOCK, ""))
        t0 = data.t0 = time.time() + 1.0
        plan_file = cfg.run_dir / "twin-plan.json"
        write_plan(cfg, t0, plan_file, floors)
        driver_out = cfg.run_dir / "twin-driver.json"
        driver = Proc("job driver", [sys.executable, str(REPO / "bench" / "twinkit" /
                                                         "driver.py"),
                      "--kubeconfig", str(kubeconfig), "--plan", str(plan_file), "--sim",
                      procs.sim, "--out", str(driver_out)],
                      cfg.run_dir / "twin-logs" / "driver.log").start()
        procs.list.append(driver)
        procs.driver = driver
        log(f"{cfg.baseline}: replaying {len(cfg.plan.jobs)} jobs over {cfg.horizon_s:.0f} s; "
            f"{cfg.timeline.scenario} at {cfg.timeline.start_s:.0f}–{cfg.timeline.end_s:.0f} s")
        replay(cfg, data, kube, procs, t0)
        data.cpu_parts = process_cpu(cfg.run_dir, procs)
        if procs.m2g is not None:
            data.metrics_text = http_get(f"{procs.metrics}/metrics", timeout=10)[1].decode()
            data.rss_peak_mib = rss_peak_mib(procs.m2g.pid)
        driver.stop(grace=60)
        procs.list.remove(driver)
        if driver_out.exists():
            data.driver = json.loads(driver_out.read_text())
        else:
            raise DemoError(f"the job driver wrote no records; see {driver.log}")
    finally:
        cp_cpu = control_plane_cpu(cfg.run_dir)  # not our children: started by localcp
        procs.stop()
        if kube is not None:
            kube.close()
        with contextlib.suppress(DemoError):
            localcp(cfg.run_dir, "down")
        data.wall_s, data.cpu_s = time.time() - wall0, children_cpu() - cpu0 + cp_cpu
    write_decision_log(cfg, data)
    log(f"{cfg.baseline}: done in {data.wall_s:.0f} s wall")
    return data


def write_decision_log(cfg: RunConfig, data: RunData) -> None:
    """``<out>/<run>/decisions.*`` and ``lifecycle.*`` (twinkit.records), and the run's
    ``m2g report`` summary in ``data.log_summary``."""
    dest = cfg.out_dir / cfg.baseline
    jobs = data.driver.get("jobs") or []
    if data.metrics_text:  # m2g run's /metrics at the replay's end (reconcile histograms...)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "metrics.txt").write_text(data.metrics_text)
    if cfg.kind.m2g:
        if not Rec.copy_log(decision_dir(cfg), dest):
            log(f"{cfg.baseline}: m2g run wrote no decision log")
            return
        data.decided = Rec.first_ready(dest, data.t0)
        Rec.append_lifecycle(dest, Rec.admission_rows(jobs, data.t0))
    else:
        def limit(t: float) -> float | None:
            got = S.limit_at(data.intervals, t - (data.event_start or 0.0))
            return data.target_kw if got is None else got

        event = data.firing.name if data.firing is not None and data.target_kw else None
        node_rack = {n: rb[0] for n, rb in data.nodes.items()}
        Rec.write(dest, Rec.grid_samples(data.samples, data.t0, event, data.event_start,
                                         data.event_end, limit),
                  sorted(Rec.lifecycle(jobs, data.t0, node_rack, cfg.horizon_s)
                         + Rec.admission_rows(jobs, data.t0), key=lambda r: r["time"]))
    res = subprocess.run([str(M2G), "report", str(dest), "-o", "json", "--interval", "30"],
                         capture_output=True, text=True, timeout=120, check=False)
    try:
        data.log_summary = json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        data.log_summary = {}
    if not data.log_summary:
        log(f"{cfg.baseline}: m2g report {dest} failed: {(res.stderr or '').strip()[:200]}")
