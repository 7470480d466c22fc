"""Controller latency benchmark: GridEvent created → every resulting shed visible in the API server.

Run with ``make bench-controller`` (or ``python bench/controller_latency.py --help``). Needs the
local control plane (docs/control-plane.md): ``--up`` starts one with the factory in its own
``M2G_RUN`` (``--run-dir``, default ``~/.cache/m2g/run-bench-<factory>``) and ``--down`` stops
it afterwards.

1. Setup: m2g's CRDs, a site PowerDomain (budget far above the draw), a ClusterQueue with the
   whole factory's GPUs and m2g's admission check, LocalQueues in a few namespaces; the
   controller as its own process (bench/controller_proc.py: the objects of ``m2g run`` with
   modelled power, pauses as its only power lever: with GPU caps on, m2g would meet the
   shortfall by capping flexible jobs first and shed nothing; caps are timed by the twin,
   bench/twin.py); then ``--workloads`` batch/v1 Jobs (1–2 pods of 1–4 GPUs, flex tiers 0–3),
   created concurrently (bounded), and waited for until every Workload is Admitted (m2g
   answered its check) and every pod runs.
2. ``--repeats`` times: compute the site draw the controller sees (idle + 1.3 kW per bound GPU)
   and the workloads the planner will shed for ``--shed-kw`` of savings, with the planner's own
   ``choose_victims`` (score = flex tier, saving = 82 % of the estimate: highest tier first,
   the fewest workloads among equal tiers); create a GridEvent whose IMPORT_CAPACITY_LIMIT
   leaves just under that shortfall (a few hundredths of a kW either way give the same set);
   t0 = the create call's return; a Workload watch stream records when each shed
   (``spec.active: false``) arrives. Latency = last expected change − t0 (and the first one).
   Then the event is deleted, the restore is timed the same way, and the bench waits until
   everything is admitted and running again.
3. Report: p50/p99 (nearest rank) of first/all changes and of the restore, the controller's
   reconcile durations (its JSON log: snapshot / plan / apply), its Prometheus histograms, its
   RSS (VmRSS, VmHWM from /proc) and the machine's load.

What "all changes" means: the shed is paced (``ramp_kw_per_second``, ``max_step_kw``: pausing
MW of training is itself a grid transient), so the goal is read per paced step. The bench sets
the ramp high and the step to twice ``--shed-kw`` so that the whole event is one step; with the
product defaults (50 kW/s, 500 kW per reconcile) an event of up to 500 kW of savings is one
step too, and a larger one takes one step per reconcile at the ramp's pace by design.
A benchmark script, never a test: it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from m2g.k8s import client as k
from m2g.k8s.cache import WatchCache
from m2g.k8s.convert import allocated_gpus
from m2g.model import labels as L
from m2g.planner.config import PlannerConfig
from m2g.planner.shedding import Candidate, choose_victims
from m2g.testing import kit
from m2g.testing.kit import standard_policies

ROOT = Path(__file__).resolve().parent.parent
LOCALCP = ROOT / "kind-e2e" / "localcp"
GPU = "nvidia.com/gpu"
CHECK = "m2g-bench"
CQ = "m2g-bench"
SITE = "m2g-bench-site"
PROGRAM = "m2g-bench"
NS_LABEL = "m2g.io/bench"
IDLE_KW, KW_PER_GPU = 20.0, 1.3  # as bench/controller_proc.py
JOBS = k.Resource("batch", "v1", "jobs", "Job", True)
CRDS = k.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                  "CustomResourceDefinition", False)
#: (pods, GPUs per pod): 24 GPUs per 8 workloads, so 2,000 workloads use 6,000 of 7,200 GPUs.
SHAPES = [(1, 1), (1, 2), (1, 4), (2, 2), (1, 1), (1, 2), (2, 4), (1, 2)]
DEFAULTS = {"large": (2000, 500.0), "small": (40, 20.0)}  # workloads, shed kW

POLICIES = standard_policies("bench")  # the e2e tests' policies (m2g.testing.kit)


# ---- small helpers -------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def nearest_rank(values: Iterable[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return math.nan
    return data[max(0, math.ceil(q * len(data)) - 1)]


def p50_p99(values: list[float]) -> str:
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return "no samples"
    missed = f", {len(values) - len(ok)} incomplete" if len(ok) < len(values) else ""
    return f"p50 {nearest_rank(ok, 0.5):.3f} s, p99 {nearest_rank(ok, 0.99):.3f} s " \
           f"(min {min(ok):.3f}, max {max(ok):.3f}, n={len(ok)}{missed})"


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = obj.get("metadata") or {}
    return m


def admitted(wl: dict[str, Any]) -> bool:
    return any(c.get("type") == "Admitted" and c.get("status") == "True"
               for c in (wl.get("status") or {}).get("conditions") or [])


def active(wl: dict[str, Any]) -> bool:
    return (wl.get("spec") or {}).get("active", True) is not False


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BenchTimeout(Exception):
    """A wait that did not end: the bench stops with this one line (exit 1), no traceback."""


async def until(what: str, check: Callable[[], bool], timeout: float,
                every: float = 0.5, progress: Callable[[], str] | None = None) -> float:
    """Wait (on local caches, not the API) until ``check()``; returns the seconds waited."""
    t = time.monotonic()
    while not check():
        if time.monotonic() - t > timeout:
            where = f" ({progress()})" if progress else ""
            raise BenchTimeout(f"timed out after {timeout:.0f}s waiting for {what}{where}")
        await asyncio.sleep(every)
    return time.monotonic() - t


# ---- the workload mix ----------------------------------------------------------------------

@dataclass(frozen=True)
class JobSpec:
    namespace: str
    name: str
    tier: int
    pods: int
    gpus_per_pod: int

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def kw(self) -> float:
        return round(self.gpus * KW_PER_GPU, 1)

    def body(self) -> dict[str, Any]:
        return kit.job(self.name, self.tier, self.pods, self.gpus_per_pod,
                       namespace=self.namespace)


def job_mix(n: int, namespaces: int) -> list[JobSpec]:
    jobs = []
    for i in range(n):
        pods, per_pod = SHAPES[(i // 4) % len(SHAPES)]
        jobs.append(JobSpec(f"bench-{i % namespaces}", f"w{i:05d}", i % 4, pods, per_pod))
    return jobs


# ---- the cluster side ----------------------------------------------------------------------

def localcp(run_dir: Path, *args: str) -> None:
    env = {**os.environ, "M2G_RUN": str(run_dir)}
    subprocess.run([sys.executable, str(LOCALCP), *args], env=env, check=True, stdout=sys.stderr)


async def install_crds(kube: k.Kube) -> None:
    names = []
    for path in sorted((ROOT / "deploy" / "crds").glob("m2g.io_*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        await kube.apply(CRDS, body["metadata"]["name"], body, field_manager="m2g-bench")
    for name in names:
        for _ in range(60):
            crd = await kube.get(CRDS, name)
            if any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (crd.get("status") or {}).get("conditions") or []):
                break
            await asyncio.sleep(0.5)


async def setup_queues(kube: k.Kube, namespaces: int, gpus: int) -> None:
    ns_res = k.NAMESPACES
    for i in range(namespaces):
        name = f"bench-{i}"
        await kube.apply(ns_res, name, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": {NS_LABEL: "true"}}}, field_manager="m2g-bench")
    await kube.apply(k.CLUSTER_QUEUES, CQ, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": CQ},
        "spec": {"namespaceSelector": {"matchLabels": {NS_LABEL: "true"}},
                 "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [{
                     "name": "gb200", "resources": [
                         {"name": "cpu", "nominalQuota": "100000"},
                         {"name": "memory", "nominalQuota": "100000Gi"},
                         {"name": GPU, "nominalQuota": str(gpus)}]}]}]}},
        field_manager="m2g-bench")
    for i in range(namespaces):
        await kube.apply(k.LOCAL_QUEUES, "default", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": f"bench-{i}"},
            "spec": {"clusterQueue": CQ}}, namespace=f"bench-{i}", field_manager="m2g-bench")
    await kube.apply(k.POWER_DOMAINS, SITE, {
        "apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain", "metadata": {"name": SITE},
        "spec": {"level": "Site", "budgetKw": 1_000_000}}, field_manager="m2g-bench")


async def create_jobs(kube: k.Kube, jobs: list[JobSpec], parallel: int) -> int:
    """Create the Jobs not there yet (a rerun reuses a loaded cluster); returns how many."""
    there = set()
    for ns in sorted({j.namespace for j in jobs}):
        there |= {f"{ns}/{meta(o).get('name')}" for o in
                  (await kube.list(JOBS, ns)).get("items") or []}
    jobs = [j for j in jobs if f"{j.namespace}/{j.name}" not in there]
    sem = asyncio.Semaphore(parallel)

    async def one(j: JobSpec) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    await kube.create(JOBS, j.body(), namespace=j.namespace)
                    return
                except k.AlreadyExists:
                    return
                except k.RetryableError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(1 + attempt)
    # big pods first: the scheduler places them before the small ones fragment the nodes
    await asyncio.gather(*(one(j) for j in sorted(jobs, key=lambda j: -j.gpus_per_pod)))
    return len(jobs)


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def reconciles(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith('{"reconcile"'):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_controller(kubeconfig: Path, policy_dir: Path, log_path: Path,
                           args: argparse.Namespace) -> Controller:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "controller_proc.py"),
           "--kubeconfig", str(kubeconfig), "--policies", str(policy_dir),
           "--metrics-port", str(port), "--resync-seconds", str(args.resync_seconds),
           "--check-name", CHECK, "--ramp-kw-per-second", str(args.ramp_kw_per_second),
           "--max-step-kw", str(args.max_step_kw),
           "--min-reconcile-interval", str(args.min_reconcile_interval),
           *(["--no-trim"] if args.no_trim else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_path.open("wb"))
    ctl = Controller(proc, log_path, port)
    deadline = time.monotonic() + 300
    async with httpx.AsyncClient(trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"controller exited; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                        ).status_code == 200:
                    return ctl
            await asyncio.sleep(1)
    raise TimeoutError(f"controller not ready in 300 s; see {log_path}")


def histogram(text: str, name: str) -> tuple[float, float]:
    """(count, sum) of a Prometheus histogram in exposition text."""
    count = re.search(rf"^{name}_count (\S+)$", text, re.M)
    total = re.search(rf"^{name}_sum (\S+)$", text, re.M)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)


# ---- the measurement -----------------------------------------------------------------------

@dataclass
class World:
    """The bench's own watch caches (Workloads, Pods, Nodes) and the job specs."""

    workloads: WatchCache
    pods: WatchCache
    jobs: dict[str, JobSpec]  # "ns/jobname" → spec
    racks_of: dict[str, str] = field(default_factory=dict)

    def spec_of(self, wl: dict[str, Any]) -> JobSpec | None:
        owners = meta(wl).get("ownerReferences") or []
        name = owners[0].get("name") if owners else None
        return self.jobs.get(f"{meta(wl).get('namespace')}/{name}")

    def mine(self) -> dict[str, tuple[dict[str, Any], JobSpec]]:
        out = {}
        for key, wl in self.workloads.view().items():
            spec = self.spec_of(dict(wl))
            if spec is not None:
                out[key] = (dict(wl), spec)
        return out

    def expected_pods(self) -> int:
        return sum(j.pods for j in self.jobs.values())

    def running_pods(self) -> int:
        return sum(1 for p in self.pods.view().values()
                   if (p.get("status") or {}).get("phase") == "Running"
                   and not meta(dict(p)).get("deletionTimestamp")
                   and meta(dict(p)).get("namespace", "").startswith("bench-"))

    def pods_total(self) -> int:
        return sum(1 for p in self.pods.view().values()
                   if meta(dict(p)).get("namespace", "").startswith("bench-"))

    def progress(self) -> str:
        mine = self.mine()
        done = sum(admitted(wl) and active(wl) for wl, _ in mine.values())
        return (f"{done}/{len(self.jobs)} workloads admitted, "
                f"{self.running_pods()}/{self.expected_pods()} pods running")

    def steady(self) -> bool:
        mine = self.mine()
        return (len(mine) == len(self.jobs)
                and all(admitted(wl) and active(wl) for wl, _ in mine.values())
                and self.running_pods() == self.expected_pods()
                and self.pods_total() == self.expected_pods())

    def draw_kw(self) -> float:
        """The site draw bench/controller_proc.py models from the same pods."""
        gpus = sum(g for node, g in allocated_gpus(self.pods.view().values()).items()
                   if node in self.racks_of)
        return IDLE_KW * len(set(self.racks_of.values())) + gpus * KW_PER_GPU

    def candidates(self, fraction: float) -> list[Candidate]:
        """The shed candidates as the planner scores them: admitted and active, flex tier ≥ 1,
        score = tier, saving = ``fraction`` of the estimate (PlannerConfig.shed_saving_fraction)."""
        return [Candidate(float(spec.tier), key, spec.kw * fraction)
                for key, (wl, spec) in self.mine().items()
                if spec.tier >= 1 and admitted(wl) and active(wl)]


def victims_for(cands: list[Candidate], shed_kw: float, step: float
                ) -> tuple[set[str], float]:
    """The workloads the planner sheds (``choose_victims``, the planner's own choice) for a
    shortfall just under what covers ``shed_kw``, chosen so that a few hundredths of a kW
    either way (rounding, float sums) give the same set; and that shortfall."""
    config = PlannerConfig()
    first = choose_victims(cands, shed_kw, step, config)
    if not first:
        raise RuntimeError("no flexible workload to shed")
    covered = sum(c.kw for c in first)
    for margin in (0.1, 0.2, 0.35, 0.5, 0.75):
        shortfall = covered - margin
        sets = [{c.key for c in choose_victims(cands, shortfall + d, step, config)}
                for d in (-0.03, 0.0, 0.03)]
        if sets[0] == sets[1] == sets[2]:
            return sets[1], shortfall
    raise RuntimeError(f"no shortfall near {covered:.2f} kW gives a stable set of victims")


@dataclass
class Sample:
    victims: int
    shed_kw: float
    first_s: float
    all_s: float
    restore_s: float
    unexpected: int
    reconciles_between: int
    late: int = 0  # more sheds while the event lasted, after the step (none expected)
    evict_s: float = math.nan  # first shed seen → every shed workload's pods gone


async def one_round(kube: k.Kube, world: World, ctl: Controller, shed_kw: float,
                    step_kw: float, i: int) -> Sample:
    draw = world.draw_kw()
    victims, shortfall = victims_for(world.candidates(PlannerConfig().shed_saving_fraction),
                                     shed_kw, step_kw)
    target = round(draw - shortfall, 2)
    seen: dict[str, float] = {}
    back: dict[str, float] = {}
    all_shed, all_back = asyncio.Event(), asyncio.Event()

    def on_change(kind: str, key: str, obj: Any) -> None:
        now = time.monotonic()
        if kind == "DELETED":
            return
        if not active(obj):
            seen.setdefault(key, now)
            if victims <= seen.keys():
                all_shed.set()
        elif key in seen and all_shed.is_set():
            back.setdefault(key, now)
            if seen.keys() <= back.keys():
                all_back.set()

    unsubscribe = world.workloads.subscribe(on_change)
    name = f"bench-{i:03d}-{int(time.time())}"
    start = datetime.now(UTC) - timedelta(minutes=1)
    body = kit.grid_event(name, start, 60, target, PROGRAM)
    n_before = len(ctl.reconciles())
    try:
        await kube.create(k.GRID_EVENTS, body)
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):  # a mismatch is reported, not fatal
            await asyncio.wait_for(all_shed.wait(), 120)
        await asyncio.sleep(2)  # anything shed beyond the expected set shows up here
        all_shed.set()
        first = min(seen.values()) - t0 if seen else math.nan  # nothing shed: a mismatch
        last = max(seen[k] for k in victims) - t0 if victims <= seen.keys() else math.nan
        unexpected = len(set(seen) - victims) + len(victims - set(seen))
        n_early = len(seen)
        n_between = len(ctl.reconciles()) - n_before
        # let Kueue finish evicting before the restore: Kueue v0.19.2 can leave a Workload
        # that is reactivated mid-eviction Admitted with its Job suspended ("restore info:
        # Job is invalid"), which a real grid event (minutes long) never provokes
        mine = world.mine()
        shed_pods = sum(mine[key][1].pods for key in seen if key in mine)
        await until("the shed pods to be gone",
                    lambda: world.pods_total() <= world.expected_pods() - shed_pods, 600)
        evict = time.monotonic() - t0 - first
        late = len(seen) - n_early
        await kube.delete(k.GRID_EVENTS, name)
        t1 = time.monotonic()
        if seen.keys() <= back.keys():
            all_back.set()
        await asyncio.wait_for(all_back.wait(), 600)
        restore = max(back.values()) - t1
    finally:
        unsubscribe()
        with contextlib.suppress(k.KubeError):
            await kube.delete(k.GRID_EVENTS, name)
    log(f"round {i}: draw {draw:.1f} kW, target {target:.1f} kW, {len(victims)} shed "
        f"({shortfall:.1f} kW): first {first:.3f} s, all {last:.3f} s, restore {restore:.3f} s"
        f"; pods gone {evict:.1f} s after the first shed"
        + (f", {unexpected} unexpected" if unexpected else "") + (f", {late} late" if late else ""))
    await until("everything admitted and running again", world.steady, 1800, every=1,
                progress=world.progress)
    await asyncio.sleep(1)
    return Sample(len(victims), shortfall, first, last, restore, unexpected, n_between, late,
                  evict)


async def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.up:
        log(f"starting the control plane with factory {args.factory} in {run_dir}")
        localcp(run_dir, "up", "--factory", args.factory)
    kubeconfig = run_dir / "kubeconfig"
    load_start = os.getloadavg()
    kube = await k.connect(kubeconfig)
    ctl: Controller | None = None
    world: World | None = None
    report: dict[str, Any] = {"factory": args.factory, "workloads": args.workloads,
                              "load_start": load_start}
    try:
        nodes = (await kube.list(k.NODES, params={
            "labelSelector": f"m2g.io/factory={args.factory}"})).get("items") or []
        racks_of = {meta(n)["name"]: meta(n)["labels"][L.RACK] for n in nodes}
        gpus = sum(int((n.get("status") or {}).get("allocatable", {}).get(GPU, 0))
                   for n in nodes)
        jobs = job_mix(args.workloads, args.namespaces)
        need = sum(j.gpus for j in jobs)
        log(f"factory {args.factory}: {len(nodes)} nodes, {len(set(racks_of.values()))} racks, "
            f"{gpus} GPUs; {len(jobs)} workloads want {need} GPUs, "
            f"{sum(j.pods for j in jobs)} pods")
        if need > gpus:
            raise SystemExit(f"{need} GPUs wanted, the factory has {gpus}")
        await install_crds(kube)
        await setup_queues(kube, args.namespaces, gpus)
        world = World(WatchCache(kube, k.WORKLOADS), WatchCache(
            kube, k.PODS, params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}),
            {f"{j.namespace}/{j.name}": j for j in jobs}, racks_of)
        for c in (world.workloads, world.pods):
            c.start()
            await c.wait_synced(120)
        with tempfile.TemporaryDirectory(prefix="m2g-bench-") as tmp:
            policy_dir = Path(tmp)
            for fname, text in POLICIES.items():
                (policy_dir / fname).write_text(text)
            log_path = run_dir / "logs" / "m2g-bench-controller.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            t = time.monotonic()
            ctl = await start_controller(kubeconfig, policy_dir, log_path, args)
            report["controller_start_s"] = time.monotonic() - t
            report["rss_idle_mib"] = proc_memory(ctl.proc.pid)
            report["cpu_idle_s"] = proc_cpu(ctl.proc.pid)
            log(f"controller pid {ctl.proc.pid} ready in {report['controller_start_s']:.1f} s "
                f"(log {log_path}); RSS {report['rss_idle_mib']}")
            t = time.monotonic()
            report["created"] = await create_jobs(kube, jobs, args.parallel)
            report["create_s"] = time.monotonic() - t
            log(f"{report['created']} Jobs created in {report['create_s']:.1f} s (the others "
                "existed); waiting for admission")
            t = time.monotonic()
            await until("every workload admitted and every pod running", world.steady,
                        args.setup_timeout, every=2, progress=world.progress)
            report["admit_s"] = time.monotonic() - t
            report["rss_loaded_mib"] = proc_memory(ctl.proc.pid)
            report["cpu_loaded_s"] = proc_cpu(ctl.proc.pid)
            log(f"all admitted and running after {report['admit_s']:.1f} s more; "
                f"RSS {report['rss_loaded_mib']}")
            await asyncio.sleep(3)
            n_setup = len(ctl.reconciles())
            samples = []
            report["rounds_mem"] = []
            for i in range(args.repeats):
                samples.append(await one_round(kube, world, ctl, args.shed_kw,
                                               args.max_step_kw, i))
                report["rounds_mem"].append({**proc_memory(ctl.proc.pid),
                                             "cpu_s": proc_cpu(ctl.proc.pid)})
                log(f"round {i}: controller {report['rounds_mem'][-1]}")
            recs = ctl.reconciles()
            report["rss_end_mib"] = proc_memory(ctl.proc.pid)
            report["cpu_end_s"] = proc_cpu(ctl.proc.pid)
            report["metrics"] = ctl.metrics()
    finally:
        if ctl is not None:
            ctl.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                ctl.proc.wait(15)
        if world is not None:  # before the API server goes: no watch error after the report
            for cache in (world.workloads, world.pods):
                await cache.stop()
        await kube.close()
        if args.down:
            localcp(run_dir, "down")
    report["load_end"] = os.getloadavg()
    print_report(args, report, samples, recs[n_setup:], recs[:n_setup], len(nodes), gpus, jobs)
    return 0


def api_calls(recs: list[dict[str, Any]]) -> str:
    """The controller's API calls in ``recs`` by kind: count, mean and max seconds each."""
    total: dict[str, list[float]] = {}
    for r in recs:
        for key, (n, secs, top) in (r.get("requests") or {}).items():
            row = total.setdefault(key, [0, 0.0, 0.0])
            row[0] += n
            row[1] += secs
            row[2] = max(row[2], top)
    return "; ".join(f"{key} {n:.0f} (mean {secs / n:.3f} s, max {top:.3f} s)"
                     for key, (n, secs, top) in sorted(total.items()) if n) or "none recorded"


def heap_line(recs: list[dict[str, Any]]) -> str:
    """glibc's heap and the trims, from the controller's log (bench/controller_proc.py)."""
    heaps = [r["heap"] for r in recs if r.get("heap")]
    trims = [r["trim_mib"] for r in recs if r.get("trim_mib")]
    if not heaps:
        return "  controller C heap: not logged"
    last = heaps[-1]
    text = (f"  controller C heap (glibc, MiB) at the end: in use {last[0]:.0f}, free "
            f"{last[1]:.0f}, mmapped {last[2]:.0f}; free at most {max(h[1] for h in heaps):.0f}")
    if trims:
        freed = [a - b for a, b in trims]
        text += (f"; {len(trims)} trims returned {sum(freed):.1f} MiB of RSS in all (at most "
                 f"{max(freed):.1f} at once)")
    return text


def print_report(args: argparse.Namespace, report: dict[str, Any], samples: list[Sample],
                 recs: list[dict[str, Any]], setup_recs: list[dict[str, Any]], nodes: int,
                 gpus: int, jobs: list[JobSpec]) -> None:
    shed_recs = [r for r in recs if r["sheds"] > 0]
    metrics = report["metrics"]
    rc, rs = histogram(metrics, "m2g_reconcile_duration_seconds")
    ac, asum = histogram(metrics, "m2g_reaction_latency_seconds")
    lines = [
        f"controller latency — factory {args.factory}: {nodes} nodes, {gpus} GPUs; "
        f"{len(jobs)} workloads ({sum(j.pods for j in jobs)} pods, {sum(j.gpus for j in jobs)} "
        f"GPUs); {args.repeats} rounds, {statistics.mean(s.victims for s in samples):.0f} "
        f"workloads / {statistics.mean(s.shed_kw for s in samples):.0f} kW shed per round; "
        f"reconciles at most every {args.min_reconcile_interval:g} s",
        f"  setup: controller ready {report['controller_start_s']:.1f} s, "
        f"{report['created']} Jobs created in {report['create_s']:.1f} s ({args.parallel} "
        f"parallel; {len(jobs) - report['created']} existed), "
        f"all admitted + running {report['admit_s']:.1f} s later "
        f"({len(setup_recs)} reconciles, max "
        f"{max((r['total_s'] for r in setup_recs), default=0):.2f} s)",
        f"  GridEvent -> first shed visible: {p50_p99([s.first_s for s in samples])}",
        f"  GridEvent -> all sheds visible:  {p50_p99([s.all_s for s in samples])}",
        f"  event deleted -> all restored:  {p50_p99([s.restore_s for s in samples])}",
        f"  sheds other than predicted (extra or missing): {sum(s.unexpected for s in samples)}",
        f"  sheds later while the event lasted (none expected): {sum(s.late for s in samples)}",
        f"  first shed -> every shed workload's pods gone (Kueue's eviction): "
        f"{p50_p99([s.evict_s for s in samples])}",
    ]
    if shed_recs:
        lines.append(
            f"  reconciles that shed or restored ({len(shed_recs)}): total "
            f"{p50_p99([r['total_s'] for r in shed_recs])}")
        for part in ("snapshot_s", "plan_s", "apply_s"):
            vals = [r[part] for r in shed_recs]
            lines.append(f"    {part[:-2]:>8}: p50 {nearest_rank(vals, .5):.3f} s, "
                         f"p99 {nearest_rank(vals, .99):.3f} s")
        lines.append(f"    API calls in them: {api_calls(shed_recs)}")
    if recs:
        lines.append(f"  all reconciles during the rounds ({len(recs)}): "
                     f"{p50_p99([r['total_s'] for r in recs])}")
    lines += [
        f"  controller metrics: m2g_reconcile_duration_seconds n={rc:.0f} mean "
        f"{rs / rc if rc else 0:.3f} s; m2g_reaction_latency_seconds n={ac:.0f} mean "
        f"{asum / ac if ac else 0:.3f} s",
        "  controller RSS: idle {:.0f} MiB, loaded {:.0f} MiB, end {:.0f} MiB; peak (VmHWM) "
        "{:.0f} MiB".format(report["rss_idle_mib"].get("VmRSS", 0),
                            report["rss_loaded_mib"].get("VmRSS", 0),
                            report["rss_end_mib"].get("VmRSS", 0),
                            report["rss_end_mib"].get("VmHWM", 0)),
        "  controller RSS at each round's end: " + ", ".join(
            f"{m.get('VmRSS', 0):.0f}" for m in report["rounds_mem"]) + " MiB; CPU seconds: "
        f"to ready {report['cpu_idle_s']:.1f}, setup {report['cpu_loaded_s']:.1f}, each round "
        + ", ".join(f"{b['cpu_s'] - a:.1f}" for a, b in zip(
            [report["cpu_loaded_s"]] + [m["cpu_s"] for m in report["rounds_mem"]],
            report["rounds_mem"], strict=False)),
        heap_line(recs),
        "  machine: {} cores, load average {} at start, {} at end".format(
            os.cpu_count(), " ".join(f"{x:.2f}" for x in report["load_start"]),
            " ".join(f"{x:.2f}" for x in report["load_end"])),
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({
            **{k: v for k, v in report.items() if k != "metrics"},
            "samples": [s.__dict__ for s in samples], "reconciles": recs}, indent=1))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--factory", choices=sorted(DEFAULTS), default="large")
    p.add_argument("--workloads", type=int, help="default: 2000 (large), 40 (small)")
    p.add_argument("--shed-kw", type=float, help="kW each event sheds (default 500 / 20)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--namespaces", type=int, default=8)
    p.add_argument("--parallel", type=int, default=8, help="concurrent Job creations")
    p.add_argument("--resync-seconds", type=float, default=10.0)
    p.add_argument("--min-reconcile-interval", type=float, default=0.25,
                   help="the controller's, as m2g run's (default 0.25; 0: a reconcile as "
                        "soon as the last one ends, the pacing before 2026-12-07)")
    p.add_argument("--ramp-kw-per-second", type=float, default=100_000.0)
    p.add_argument("--max-step-kw", type=float, help="default: twice --shed-kw")
    p.add_argument("--setup-timeout", type=float, default=1800.0)
    p.add_argument("--run-dir", help="M2G_RUN of the control plane (default: $M2G_BENCH_RUN, "
                   "else ~/.cache/m2g/run-bench-<factory>; never $M2G_RUN, which --down "
                   "would stop)")
    p.add_argument("--up", action="store_true", help="start the control plane first")
    p.add_argument("--down", action="store_true", help="stop the control plane at the end")
    p.add_argument("--no-trim", action="store_true",
                   help="the controller does not trim its C heap (m2g run does, every 10 s)")
    p.add_argument("--json", help="also write the figures and every reconcile here")
    args = p.parse_args(argv)
    workloads, shed = DEFAULTS[args.factory]
    args.workloads = args.workloads or workloads
    args.shed_kw = args.shed_kw or shed
    args.max_step_kw = args.max_step_kw or 2 * args.shed_kw
    args.run_dir = args.run_dir or os.environ.get("M2G_BENCH_RUN") or str(
        Path.home() / ".cache" / "m2g" / f"run-bench-{args.factory}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return asyncio.run(run(parse(argv)))
    except BenchTimeout as e:
        print(f"bench-controller: {e} (load average {os.getloadavg()[0]:.1f}; the bench "
              "wants a quiet machine)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
