"""The twin's job driver: makes the KWOK jobs behave like the trace's jobs.

``Driver.observe`` (no I/O) takes what the cluster shows — the twin's pods and Workloads — and
the simulator's faults, advances every job's ``Progress`` by the wall time since the last look
(× the time scale) and returns what to write:

* pods of a job whose work is done get ``m2g.io/sim-duration: 0s`` (KWOK's completion stage
  then makes them Succeeded), and a job whose pods all succeeded is deleted once Kueue marked
  its Workload Finished (its Workload goes with it, like a TTL-after-finished);
* a job that checkpointed gets ``m2g.io/last-checkpoint-time`` (RFC 3339, wall time) on its
  Workload, where m2g reads it (docs/twin.md "How a job reports its checkpoint").

A job runs when all its pods are Running on nodes — an elastic job when at least its minimum
are, at the throughput of those it has (m2g shrank it: nothing is lost); it stops without
finishing (Kueue evicted it, m2g shed it) when they no longer are: ``progress.evict``. Work
on a failed tray (XID fault) stalls; a power-capped node runs at the throughput of its cap.
``arun`` is the I/O loop: it reads through watch-fed caches (no API call per look) and writes
concurrently.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make bench/ importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m2g.k8s.cache import WatchCache
from m2g.k8s.client import (
    GPU_POWER_LIMITS,
    NODES,
    PODS,
    WORKLOADS,
    KubeError,
    NotFound,
    Resource,
    connect,
)
from m2g.model import labels as L
from m2g.model.powerlimit import node_limit_state
from m2g.sim.power import PowerModel
from twinkit.kube import TWIN_LABEL, condition, job_of
from twinkit.metrics import fragmentation
from twinkit.progress import Progress, advance, evict, throughput
from twinkit.trace import TraceJob

Obj = dict[str, Any]
LAST_CHECKPOINT = "m2g.io/last-checkpoint-time"
SIM_DURATION = "m2g.io/sim-duration"


@dataclass
class JobRecord:
    """What the report needs of one job (wall seconds from the replay's start)."""

    name: str
    namespace: str
    gpus: int
    tier: int
    kind: str
    topology: str
    prefill: bool = False
    submitted: float | None = None
    admitted: float | None = None
    workload: str = ""  # the Workload's name (decision logs name it)
    quota_reserved: float | None = None  # Kueue's QuotaReserved condition, first admission
    check_ready: float | None = None  # the first admission check entry that turned Ready
    bound: float | None = None  # the driver's first sight of a pod on a node
    finished: float | None = None
    runs: list[list[str]] = field(default_factory=list)  # nodes of each run
    restarts: int = 0
    running_at_event_start: bool = False
    done_at_event_start: float = 0.0
    remaining_at_event_start: float = 0.0
    done_at_event_end: float | None = None
    work: float = 0.0
    lost: float = 0.0
    evictions: int = 0
    checkpoints: int = 0
    stops: list[list[Any]] = field(default_factory=list)  # [t, cause] of each stop unfinished
    event_capped_s: float = 0.0  # trace seconds run under a power cap inside the event
    event_stalled_s: float = 0.0  # trace seconds stalled (a failed tray) inside the event
    event_shrunk_s: float = 0.0  # trace seconds an elastic job ran below its size in the event
    min_pods: int = 0  # an elastic job's minimum (0: a fixed-size job)
    event_stops: list[str] = field(default_factory=list)  # causes of the stops inside it


@dataclass
class Writes:
    complete_pods: list[tuple[str, str]] = field(default_factory=list)
    checkpoints: list[tuple[str, str, str]] = field(default_factory=list)  # ns, workload, time
    delete_jobs: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Driver:
    jobs: Mapping[str, TraceJob]  # Job name → trace job
    time_scale: float
    t0: float  # wall epoch of the replay's start
    event_start: float | None = None  # wall seconds from t0
    event_end: float | None = None
    model: PowerModel = field(default_factory=PowerModel)
    node_rack: dict[str, str] = field(default_factory=dict)
    rack_trays: dict[str, int] = field(default_factory=dict)
    sizes: dict[int, float] = field(default_factory=dict)  # task-size distribution (FGD)
    progress: dict[str, Progress] = field(default_factory=dict)
    records: dict[str, JobRecord] = field(default_factory=dict)
    running: dict[str, bool] = field(default_factory=dict)
    run_pods: dict[str, frozenset[str]] = field(default_factory=dict)  # uids of the run
    completing: set[str] = field(default_factory=set)
    bindings: list[tuple[str, str, float]] = field(default_factory=list)  # job, node, t
    seen_pods: set[str] = field(default_factory=set)
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # t, GPUs, frag
    last: float | None = None
    started_event: bool = False
    ended_event: bool = False
    looks: int = 0
    watch_stats: dict[str, int] = field(default_factory=dict)

    def record(self, name: str) -> JobRecord:
        if name not in self.records:
            j = self.jobs[name]
            self.records[name] = JobRecord(j.name, j.namespace, j.gpus, j.tier, j.kind,
                                           j.topology, j.prefill, work=j.work,
                                           min_pods=j.min_pods)
            self.progress[name] = Progress(j.work, j.gpus, j.checkpoint_s)
        return self.records[name]

    def observe(self, now: float, pods: Iterable[Obj], workloads: Iterable[Obj],
                faults: Iterable[Obj] = ()) -> Writes:
        """One look at the cluster at wall epoch ``now``."""
        t = now - self.t0
        self.looks += 1
        dt = 0.0 if self.last is None else max(0.0, now - self.last) * self.time_scale
        self.last = now
        caps, failed = _fault_maps(faults)
        by_job = _pods_by_job(pods, self.jobs)
        wl_by_job = _workloads_by_job(workloads, self.jobs)
        out = Writes()
        for name, wl in wl_by_job.items():
            rec = self.record(name)
            created = _epoch((wl.get("metadata") or {}).get("creationTimestamp"))
            if rec.submitted is None and created is not None:
                rec.submitted = created - self.t0
            self._admission(rec, wl, now)
        busy_nodes: dict[str, int] = {}
        for name, plist in by_job.items():
            self._job(name, plist, wl_by_job.get(name), t, dt, caps, failed, out, busy_nodes)
        for name in list(self.running):
            if name not in by_job and self.running[name]:
                self._stopped(name, stop_cause(wl_by_job.get(name)), t)
        self._event_marks(t)
        self._sample(t, busy_nodes)
        return out

    def _admission(self, rec: JobRecord, wl: Obj, now: float) -> None:
        """The first admission's steps, from the Workload's own conditions (their
        ``lastTransitionTime``, whole seconds): quota reserved, a check Ready, admitted."""
        rec.workload = rec.workload or str((wl.get("metadata") or {}).get("name", ""))
        if rec.admitted is not None:
            return
        qr = condition(wl, "QuotaReserved")
        if rec.quota_reserved is None and qr is not None:
            at = _epoch(qr.get("lastTransitionTime"))
            rec.quota_reserved = (at if at is not None else now) - self.t0
        ready = [_epoch(e.get("lastTransitionTime")) or now
                 for e in (wl.get("status") or {}).get("admissionChecks") or []
                 if e.get("state") == "Ready"]
        if rec.check_ready is None and ready:
            rec.check_ready = max(ready) - self.t0
        adm = condition(wl, "Admitted")
        if adm is not None:
            at = _epoch(adm.get("lastTransitionTime"))
            rec.admitted = (at if at is not None else now) - self.t0

    def _job(self, name: str, plist: list[Obj], wl: Obj | None, t: float, dt: float,
             caps: dict[str, float], failed: set[str], out: Writes,
             busy: dict[str, int]) -> None:
        job, rec = self.jobs[name], self.record(name)
        for p in plist:
            node = (p.get("spec") or {}).get("nodeName")
            uid = str((p.get("metadata") or {}).get("uid", ""))
            if node and uid not in self.seen_pods:
                self.seen_pods.add(uid)
                self.bindings.append((name, str(node), t))
                if rec.bound is None:
                    rec.bound = t
            if node and _phase(p) in ("Running", "Pending"):
                busy[str(node)] = busy.get(str(node), 0) + job.gpus_per_pod
        phases = [_phase(p) for p in plist]
        if phases and all(ph == "Succeeded" for ph in phases) and len(phases) >= needed(job):
            if rec.finished is None:
                rec.finished = t
            self.running[name] = False
            if finished_by_kueue(wl) or t - rec.finished >= DELETE_GRACE_S:
                out.delete_jobs.append((job.namespace, name))
            return
        up = [p for p in plist if _phase(p) == "Running" and (p.get("spec") or {}).get("nodeName")]
        nodes = [str(p["spec"]["nodeName"]) for p in up]
        uids = frozenset(str(p["metadata"].get("uid", "")) for p in up)
        now_running = len(nodes) >= needed(job)
        was = self.running.get(name, False)
        if was and now_running and uids.isdisjoint(self.run_pods.get(name, uids)):
            self._stopped(name, stop_cause(wl), t)  # evicted and re-admitted between looks
            was = False
        self.run_pods[name] = uids
        if now_running and not was:
            if rec.runs:
                rec.restarts += 1
            rec.runs.append(sorted(nodes))
        elif now_running and not set(nodes) <= set(rec.runs[-1]):  # an elastic job grew
            rec.runs[-1] = sorted(set(rec.runs[-1]) | set(nodes))
        elif was and not now_running and name not in self.completing:
            self._stopped(name, stop_cause(wl), t)
        self.running[name] = now_running
        if not (now_running and was):  # progress counts between two looks that saw it run
            return
        prog = self.progress[name]
        stalled = any(n in failed for n in nodes)
        cap = min((min(caps.get(n, 1.0), caps.get(f"rack:{self.node_rack.get(n)}", 1.0))
                   for n in nodes), default=1.0)
        rate = 0.0 if stalled else throughput(self.model, job.kind, cap)
        replicas = min(len(nodes), job.pods)  # fewer than its pods: m2g shrank it
        if self.started_event and not self.ended_event:
            rec.event_capped_s += dt if cap < 1.0 and not stalled else 0.0
            rec.event_stalled_s += dt if stalled else 0.0
            rec.event_shrunk_s += dt if replicas < job.pods else 0.0
        prog, taken = advance(prog, dt, rate, replicas * job.gpus_per_pod)
        self.progress[name] = prog
        rec.checkpoints = prog.checkpoints
        if taken and wl is not None:
            stamp = datetime.fromtimestamp(self.t0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.checkpoints.append((job.namespace, str(wl["metadata"]["name"]), stamp))
        if prog.finished and name not in self.completing:
            self.completing.add(name)
            out.complete_pods += [(job.namespace, str(p["metadata"]["name"])) for p in plist]

    def _stopped(self, name: str, cause: str, t: float) -> None:
        self.running[name] = False
        if name in self.completing:
            return
        prog = evict(self.progress[name])
        self.progress[name] = prog
        rec = self.records[name]
        rec.evictions, rec.lost = prog.evictions, prog.lost
        rec.stops.append([round(t, 1), cause])
        if self.started_event and not self.ended_event:
            rec.event_stops.append(cause)

    def _event_marks(self, t: float) -> None:
        if self.event_start is not None and not self.started_event and t >= self.event_start:
            self.started_event = True
            for name, rec in self.records.items():
                prog = self.progress[name]
                rec.running_at_event_start = self.running.get(name, False) \
                    and rec.finished is None
                rec.done_at_event_start = prog.done
                rec.remaining_at_event_start = prog.remaining
        if self.event_end is not None and not self.ended_event and t >= self.event_end:
            self.ended_event = True
            for name, rec in self.records.items():
                rec.done_at_event_end = self.progress[name].done

    def _sample(self, t: float, busy: dict[str, int]) -> None:
        free: dict[str, int] = dict(self.rack_trays)
        for node, gpus in busy.items():
            rack = self.node_rack.get(node)
            if rack is not None and gpus > 0:
                free[rack] = free.get(rack, 0) - 1
        frag = fragmentation({r: max(0, n) * 4 for r, n in free.items()}, self.sizes)
        self.samples.append((t, sum(busy.values()), frag))

    def result(self) -> Obj:
        for name, rec in self.records.items():
            prog = self.progress[name]
            rec.lost, rec.evictions, rec.checkpoints = prog.lost, prog.evictions, \
                prog.checkpoints
            if self.ended_event and rec.done_at_event_end is None:
                rec.done_at_event_end = prog.done
        return {"jobs": [asdict(r) for r in self.records.values()],
                "bindings": self.bindings, "samples": self.samples,
                "cpuSeconds": round(time.process_time(), 2), "looks": self.looks,
                **self.watch_stats}


#: A Job whose pods all succeeded is deleted once Kueue has marked its Workload Finished
#: (the Job controller saw it complete, and Kueue gave its quota back), as a site's
#: ``ttlSecondsAfterFinished`` does; or after this many wall seconds if Kueue has not by then.
#: Deleting it before (as the twin did until 2026-12-04) leaves its Workload terminating,
#: still holding its quota, until Kueue drops its finalizer (up to 36 s seen under load).
DELETE_GRACE_S = 30.0


def needed(job: TraceJob) -> int:
    """Pods a job needs running to make progress: all of them, or an elastic job's minimum
    (m2g may have shrunk it; Kueue admits a grow back as a new slice, its new pods wait)."""
    return job.min_pods if job.elastic else job.pods


def _workloads_by_job(workloads: Iterable[Obj], jobs: Mapping[str, TraceJob]
                      ) -> dict[str, Obj]:
    """Job name → its current Workload. An elastic Job grown back has two for a while (Kueue's
    slices: the new one replaces the old, which then finishes): the one not Finished, else
    the newest."""
    out: dict[str, Obj] = {}
    for w in workloads:
        name = job_of(w)
        if name not in jobs:
            continue
        old = out.get(name)
        if old is None or _slice_rank(w) > _slice_rank(old):
            out[name] = w
    return out


def _slice_rank(wl: Obj) -> tuple[bool, str]:
    done = condition(wl, "Finished")
    return (not (done is not None and str(done.get("status")) == "True"),
            str((wl.get("metadata") or {}).get("creationTimestamp") or ""))


def finished_by_kueue(wl: Obj | None) -> bool:
    """Kueue marked the Workload Finished (or it is gone already)."""
    if wl is None:
        return True
    done = condition(wl, "Finished")
    return done is not None and str(done.get("status")) == "True"


def stop_cause(wl: Obj | None) -> str:
    """Why a job's pods stopped before it finished, from its Workload as the driver sees it
    then: the reason of Kueue's ``Evicted`` condition (``Preempted`` with the ``Preempted``
    condition's reason: ``Preempted/InClusterQueue``, ``Preempted/InCohortReclamation``...;
    ``Deactivated`` or ``InactiveWorkload`` for m2g's pauses), ``inactive`` for a Workload
    set inactive without the condition yet, else ``pods-stopped`` (nothing on the Workload
    says why: a lagging cache, a pod failure) or ``workload-gone``."""
    if wl is None:
        return "workload-gone"
    ev = condition(wl, "Evicted")
    if ev is not None:
        reason = str(ev.get("reason") or "Evicted")
        pre = condition(wl, "Preempted")
        return f"{reason}/{pre.get('reason')}" if reason == "Preempted" and pre else reason
    if (wl.get("spec") or {}).get("active") is False:
        return "inactive"
    return "pods-stopped"


def _phase(p: Obj) -> str:
    return str((p.get("status") or {}).get("phase", ""))


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _pods_by_job(pods: Iterable[Obj], jobs: Mapping[str, TraceJob]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for p in pods:
        name = job_of(p)
        if name in jobs and not (p.get("metadata") or {}).get("deletionTimestamp"):
            out.setdefault(name, []).append(p)
    return out


def _fault_maps(faults: Iterable[Obj]) -> tuple[dict[str, float], set[str]]:
    """Node → power-cap fraction (racks expanded by the caller's node names) and failed
    trays. Rack-wide caps are keyed ``rack:<name>``."""
    caps: dict[str, float] = {}
    failed: set[str] = set()
    for f in faults:
        if f.get("kind") == "tray-failed" and f.get("node"):
            failed.add(str(f["node"]))
        elif f.get("kind") == "power-cap":
            key = str(f.get("node") or "") or (f"rack:{f['rack']}" if f.get("rack") else "")
            if key:
                caps[key] = min(caps.get(key, 1.0), float(f.get("fraction", 1.0)))
    return caps, failed


# ---- the I/O loop ----------------------------------------------------------------------------
#
# The driver reads the cluster through two watch-fed caches (m2g.k8s.cache.WatchCache: one
# LIST, then WATCH from its resourceVersion, a relist only on 410 Gone), so a look costs no API
# call: the API server sends each change once. Its writes go out concurrently, at most
# ``WRITE_CONCURRENCY`` in flight, through m2g's own client (kr8s async).

JOBS = Resource("batch", "v1", "jobs", "Job", True)
WRITE_CONCURRENCY = 8
REDELETE_AFTER_S = 10.0  # a finished Job whose pods still show is deleted again after this


def agent_caps(limits: Iterable[Obj]) -> list[Obj]:
    """The GPU power limits m2g's node agents report in force, as power-cap faults: a job on a
    capped node runs at its cap's throughput, as under a simulator fault."""
    out: list[Obj] = []
    for obj in limits:
        s = node_limit_state(obj)
        if s is not None and s.applied_fraction is not None and s.applied_fraction < 1.0:
            out.append({"kind": "power-cap", "node": s.node, "fraction": s.applied_fraction})
    return out


def _faults(sim: str) -> list[Obj]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{sim}/faults", timeout=2) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


@dataclass
class Writer:
    """The driver's writes, concurrent and bounded; a failed write is logged, never raised."""

    kube: Any  # m2g.k8s.client.Kube
    limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(
        WRITE_CONCURRENCY))
    deleted: dict[tuple[str, str], float] = field(default_factory=dict)
    failures: int = 0

    async def _one(self, what: str, call: Any) -> None:
        async with self.limit:
            try:
                await call
            except NotFound:
                pass
            except KubeError as exc:
                self.failures += 1
                print(f"driver: {what} failed ({exc})"[:240], file=sys.stderr, flush=True)

    async def apply(self, writes: Writes, now: float) -> None:
        calls = [self._one(f"annotate pod {ns}/{pod}", self.kube.patch(
            PODS, pod, {"metadata": {"annotations": {SIM_DURATION: "0s"}}}, namespace=ns))
            for ns, pod in writes.complete_pods]
        calls += [self._one(f"annotate workload {ns}/{wl}", self.kube.patch(
            WORKLOADS, wl, {"metadata": {"annotations": {LAST_CHECKPOINT: stamp}}},
            namespace=ns)) for ns, wl, stamp in writes.checkpoints]
        for ns, job in writes.delete_jobs:
            if now - self.deleted.get((ns, job), -1e18) < REDELETE_AFTER_S:
                continue  # asked already; the watch has not shown the pods go yet
            self.deleted[(ns, job)] = now
            calls.append(self._one(f"delete job {ns}/{job}", self.kube.request(
                "DELETE", JOBS.path(ns, job), body={"propagationPolicy": "Background"})))
        if calls:
            await asyncio.gather(*calls)


async def arun(driver: Driver, kubeconfig: Path, sim: str, out: Path,
               every: float = 1.0) -> None:
    """Look, write, repeat until SIGTERM; then write the records to ``out``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kube = await connect(kubeconfig)
    pods = WatchCache(kube, PODS, params={"labelSelector": TWIN_LABEL})
    workloads = WatchCache(kube, WORKLOADS)
    limits = WatchCache(kube, GPU_POWER_LIMITS)  # m2g's GPU caps, as the node agent applies them
    try:
        nodes = await kube.list(NODES, params={"labelSelector": L.RACK})
        for n in nodes.get("items") or []:
            rack = (n["metadata"].get("labels") or {}).get(L.RACK, "")
            driver.node_rack[n["metadata"]["name"]] = rack
            driver.rack_trays[rack] = driver.rack_trays.get(rack, 0) + 1
        for c in (pods, workloads, limits):
            c.start()
        for c in (pods, workloads):
            await c.wait_synced(120)
        writer = Writer(kube)
        driver.watch_stats["startupCpuMs"] = round(time.process_time() * 1000)
        while not stop.is_set():
            began = time.time()
            faults = await asyncio.to_thread(_faults, sim) + agent_caps(limits.view().values())
            writes = driver.observe(time.time(), pods.view().values(),
                                    workloads.view().values(), faults)
            await writer.apply(writes, time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.05, every - (time.time() - began)))
        driver.watch_stats.update(lists=pods.lists + workloads.lists,
                                  watches=pods.watches + workloads.watches,
                                  writeFailures=writer.failures)
    finally:
        for c in (pods, workloads, limits):
            await c.stop()
        await kube.close()
        out.write_text(json.dumps(driver.result()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="twinkit.driver", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--plan", type=Path, required=True, help="plan.json written by the twin")
    p.add_argument("--sim", required=True, help="simulator URL (for its faults)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    jobs = {j["name"]: TraceJob(**j) for j in plan["jobs"]}
    sizes = {int(k): float(v) for k, v in plan["sizes"].items()}
    driver = Driver(jobs, float(plan["timeScale"]), float(plan["t0"]),
                    plan.get("eventStart"), plan.get("eventEnd"), sizes=sizes)
    asyncio.run(arun(driver, args.kubeconfig, args.sim, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
