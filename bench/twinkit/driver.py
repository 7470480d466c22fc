"""The twin's job driver: makes the KWOK jobs behave like the trace's jobs.

``Driver.observe`` (no I/O) takes what the cluster shows — the twin's pods and Workloads — and
the simulator's faults, advances every job's ``Progress`` by the wall time since the last look
(× the time scale) and returns what to write:

* pods of a job whose work is done get ``m2g.io/sim-duration: 0s`` (KWOK's completion stage
  then makes them Succeeded), and a job whose pods all succeeded is deleted (its Workload goes
  with it, like a TTL-after-finished);
* a job that checkpointed gets ``m2g.io/last-checkpoint-time`` (RFC 3339, wall time) on its
  Workload, where m2g reads it (docs/twin.md "How a job reports its checkpoint").

A job runs when all its pods are Running on nodes; it stops without finishing (Kueue evicted
it, m2g shed it) when they no longer are: ``progress.evict``. Work on a failed tray (XID fault)
stalls; a power-capped node runs at the throughput of its cap. ``run`` is the I/O loop.
"""

from __future__ import annotations

import argparse
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

from m2g.sim.power import PowerModel
from twinkit.kube import Kube, condition, job_of
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

    def record(self, name: str) -> JobRecord:
        if name not in self.records:
            j = self.jobs[name]
            self.records[name] = JobRecord(j.name, j.namespace, j.gpus, j.tier, j.kind,
                                           j.topology, j.prefill, work=j.work)
            self.progress[name] = Progress(j.work, j.gpus, j.checkpoint_s)
        return self.records[name]

    def observe(self, now: float, pods: Iterable[Obj], workloads: Iterable[Obj],
                faults: Iterable[Obj] = ()) -> Writes:
        """One look at the cluster at wall epoch ``now``."""
        t = now - self.t0
        dt = 0.0 if self.last is None else max(0.0, now - self.last) * self.time_scale
        self.last = now
        caps, failed = _fault_maps(faults)
        by_job = _pods_by_job(pods, self.jobs)
        wl_by_job = {job_of(w): w for w in workloads if job_of(w) in self.jobs}
        out = Writes()
        for name, wl in wl_by_job.items():
            rec = self.record(name)
            created = _epoch((wl.get("metadata") or {}).get("creationTimestamp"))
            if rec.submitted is None and created is not None:
                rec.submitted = created - self.t0
            adm = condition(wl, "Admitted")
            if rec.admitted is None and adm is not None:
                at = _epoch(adm.get("lastTransitionTime"))
                rec.admitted = (at if at is not None else now) - self.t0
        busy_nodes: dict[str, int] = {}
        for name, plist in by_job.items():
            self._job(name, plist, wl_by_job.get(name), t, dt, caps, failed, out, busy_nodes)
        for name in list(self.running):
            if name not in by_job and self.running[name]:
                self._stopped(name)
        self._event_marks(t)
        self._sample(t, busy_nodes)
        return out

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
            if node and _phase(p) in ("Running", "Pending"):
                busy[str(node)] = busy.get(str(node), 0) + job.gpus_per_pod
        phases = [_phase(p) for p in plist]
        if phases and all(ph == "Succeeded" for ph in phases) and len(phases) >= job.pods:
            if rec.finished is None:
                rec.finished = t
            self.running[name] = False
            out.delete_jobs.append((job.namespace, name))
            return
        up = [p for p in plist if _phase(p) == "Running" and (p.get("spec") or {}).get("nodeName")]
        nodes = [str(p["spec"]["nodeName"]) for p in up]
        uids = frozenset(str(p["metadata"].get("uid", "")) for p in up)
        now_running = len(nodes) >= job.pods
        was = self.running.get(name, False)
        if was and now_running and uids.isdisjoint(self.run_pods.get(name, uids)):
            self._stopped(name)  # evicted and re-admitted between two looks
            was = False
        self.run_pods[name] = uids
        if now_running and not was:
            if rec.runs:
                rec.restarts += 1
            rec.runs.append(sorted(nodes))
        elif was and not now_running and name not in self.completing:
            self._stopped(name)
        self.running[name] = now_running
        if not (now_running and was):  # progress counts between two looks that saw it run
            return
        prog = self.progress[name]
        stalled = any(n in failed for n in nodes)
        cap = min((min(caps.get(n, 1.0), caps.get(f"rack:{self.node_rack.get(n)}", 1.0))
                   for n in nodes), default=1.0)
        rate = 0.0 if stalled else throughput(self.model, job.kind, cap)
        prog, taken = advance(prog, dt, rate)
        self.progress[name] = prog
        rec.checkpoints = prog.checkpoints
        if taken and wl is not None:
            stamp = datetime.fromtimestamp(self.t0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.checkpoints.append((job.namespace, str(wl["metadata"]["name"]), stamp))
        if prog.finished and name not in self.completing:
            self.completing.add(name)
            out.complete_pods += [(job.namespace, str(p["metadata"]["name"])) for p in plist]

    def _stopped(self, name: str) -> None:
        self.running[name] = False
        if name in self.completing:
            return
        prog = evict(self.progress[name])
        self.progress[name] = prog
        rec = self.records[name]
        rec.evictions, rec.lost = prog.evictions, prog.lost

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
                "bindings": self.bindings, "samples": self.samples}


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

def _faults(sim: str) -> list[Obj]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{sim}/faults", timeout=2) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def run(driver: Driver, kube: Kube, sim: str, out: Path, every: float = 1.0) -> None:
    """Look, write, repeat until SIGTERM; then write the records to ``out``."""
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    for n in kube.nodes():
        labels = n["metadata"].get("labels") or {}
        rack = labels.get("m2g.io/rack", "")
        driver.node_rack[n["metadata"]["name"]] = rack
        driver.rack_trays[rack] = driver.rack_trays.get(rack, 0) + 1
    while not stop["now"]:
        began = time.time()
        try:
            writes = driver.observe(time.time(), kube.pods(), kube.workloads(), _faults(sim))
        except Exception as exc:  # the API server is busy or going away: look again
            print(f"driver: look failed ({type(exc).__name__}: {str(exc)[:160]})",
                  file=sys.stderr, flush=True)
            time.sleep(every)
            continue
        for ns, pod in writes.complete_pods:
            kube.annotate_pod(ns, pod, {SIM_DURATION: "0s"})
        for ns, wl, stamp in writes.checkpoints:
            kube.annotate_workload(ns, wl, {LAST_CHECKPOINT: stamp})
        for ns, job in writes.delete_jobs:
            kube.delete_job(ns, job)
        time.sleep(max(0.05, every - (time.time() - began)))
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
    kube = Kube(args.kubeconfig)
    try:
        run(driver, kube, args.sim, args.out)
    finally:
        kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
