"""What the chaos tests share: `m2g run` replicas as processes of their own (to be killed with
SIGKILL), rack power for them from a Prometheus stand-in that follows the pods, a recorder of
every change to the namespace's Workloads (from a watch, so no flip is missed between two
polls), and a fresh controller's decisions to compare a survivor's with.

The rack power is the model of m2g.testing.kit (idle kW + 1.3 kW per GPU of the pods bound to
the rack; with ``caps``, on a node whose GPUPowerLimit the node agent reports in force, times
the pre-training curve's power at that cap), computed here from the API server and served as
the facility PDU series m2g reads by default, so the processes need no power reader of the
tests'.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from e2e_helpers import Cluster, Obj
from fake_prometheus import fake_prometheus
from kubernetes import watch
from manifests_helpers import _free_port, http_get

from m2g.k8s.annotations import POWER_CAP, POWER_CAP_AT, RESTORED_AT, SHED_AT
from m2g.k8s.convert import allocated_gpus
from m2g.model.inputs import WorkloadKind
from m2g.model.plan import Plan
from m2g.model.powerlimit import node_limit_state
from m2g.planner.curves import kind_curve
from m2g.testing.kit import IDLE_KW, KW_PER_GPU

RACK_LABEL = "network.topology.nvidia.com/accelerator"


def chaos_seed() -> random.Random:
    """A seeded random for the fault schedule: ``$M2G_CHAOS_SEED`` replays a failure, else a
    fresh seed; printed (pytest shows it with the failure)."""
    seed = int(os.environ.get("M2G_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed: M2G_CHAOS_SEED={seed}")
    return random.Random(seed)


# ---- rack power from the pods ---------------------------------------------------------------

def applied_caps(cluster: Cluster) -> dict[str, float]:
    """Node → the fraction of the default limit its agent reports in force (capped nodes)."""
    items = cluster.custom.list_cluster_custom_object("m2g.io", "v1alpha1",
                                                      "gpupowerlimits")["items"]
    return {s.node: s.applied_fraction for o in items
            if (s := node_limit_state(o)) is not None and s.applied_fraction is not None
            and s.applied_fraction < 1.0}


def _rack_watts(cluster: Cluster, rack_of: dict[str, str], caps: bool = False
                ) -> dict[str, float]:
    pods = cluster.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
    raw = [cluster.api.sanitize_for_serialization(p) for p in pods.items]
    kw = dict.fromkeys(set(rack_of.values()), IDLE_KW)
    capped = applied_caps(cluster) if caps else {}
    power = kind_curve(WorkloadKind.TRAINING).power
    for node, gpus in allocated_gpus(raw).items():
        if node in rack_of:
            kw[rack_of[node]] += gpus * KW_PER_GPU * (power(capped[node]) if node in capped
                                                      else 1.0)
    return {rack: v * 1000.0 for rack, v in kw.items()}


@contextlib.contextmanager
def pod_power_prometheus(cluster: Cluster, rack_of: dict[str, str],
                         period: float = 0.5, caps: bool = False) -> Iterator[str]:
    """A Prometheus stand-in whose PDU series follow the pods (refreshed every ``period``)
    and, with ``caps``, the GPU power limits the node agent reports in force."""
    series: dict[str, dict[str, float]] = {
        "facility_pdu_power_watts": _rack_watts(cluster, rack_of, caps),
        "facility_rack_inlet_temperature_celsius": dict.fromkeys(set(rack_of.values()), 24.0)}
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(period):
            with contextlib.suppress(Exception):  # an API hiccup keeps the last reading
                series["facility_pdu_power_watts"] = _rack_watts(cluster, rack_of, caps)

    thread = threading.Thread(target=refresh, daemon=True)
    thread.start()
    try:
        with fake_prometheus(series) as url:
            yield url
    finally:
        stop.set()
        thread.join(5)


# ---- m2g run as a process -------------------------------------------------------------------

@dataclass
class Replica:
    """One ``m2g run --leader-elect`` process."""

    identity: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> tuple[int, str]:
        return http_get(f"{self.url}/readyz")

    def metric(self, name: str) -> float | None:
        for line in http_get(f"{self.url}/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Fleet:
    """Replicas of one controller: the same site file, policies and Lease."""

    kubeconfig: Path
    site: Path
    policies: Path
    namespace: str
    lease: str
    logs: Path
    prometheus: str
    replicas: dict[str, Replica] = field(default_factory=dict)

    def start(self, identity: str) -> Replica:
        port = _free_port()
        log = self.logs / f"{identity}.log"
        cmd = [sys.executable, "-c", "from m2g_cli.app import main; main()", "run",
               "--config", str(self.site), "--kubeconfig", str(self.kubeconfig),
               "--leader-elect", "--lease-namespace", self.namespace, "--lease-name",
               self.lease, "--identity", identity, "--policies", str(self.policies),
               "--prometheus", self.prometheus, "--resync-seconds", "2",
               "--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        rep = Replica(identity, proc, f"http://127.0.0.1:{port}", log)
        self.replicas[identity] = rep
        return rep

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.alive()]

    def stop_all(self) -> None:
        for rep in self.replicas.values():
            rep.stop()

    def tails(self) -> str:
        return "\n".join(f"--- {r.identity}\n" + r.log.read_text(errors="replace")[-1500:]
                         for r in self.replicas.values())


def site_file(path: Path, check: str, planner: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "m2g.io/v1alpha1", "kind": "SiteConfig",
        "admissionChecks": {"name": check}, "planner": planner}))
    return path


def lease_holder(cluster: Cluster, namespace: str, name: str) -> str:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    try:
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(name, namespace)
    except ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


# ---- every change of the namespace's Workloads ------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """One version of a Workload as the watch delivered it."""

    at: float  # monotonic
    active: bool
    shed_at: str
    check: str
    cap: str = ""  # m2g.io/power-cap (the fraction), "" when none
    restored_at: str = ""  # m2g.io/restored-at (a pause's restore)
    cap_at: str = ""  # m2g.io/power-cap-at (a cap's or, with no cap, its lift's time)


def _job_of(wl: Obj) -> str:
    owners = (wl.get("metadata") or {}).get("ownerReferences") or []
    return str(owners[0].get("name")) if owners else str(wl["metadata"]["name"])


class WorkloadRecorder:
    """Every version of every Workload of ``namespace`` (keyed by its Job's name), from a
    watch resumed at its last resourceVersion (a 410 relists: then a version may be missed,
    and ``relists`` says so)."""

    def __init__(self, cluster: Cluster, namespace: str, check: str) -> None:
        self.cluster, self.namespace, self.check = cluster, namespace, check
        self.seen: dict[str, list[Seen]] = {}
        self.relists = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _note(self, wl: Obj) -> None:
        notes = (wl.get("metadata") or {}).get("annotations") or {}
        entry = next((e for e in (wl.get("status") or {}).get("admissionChecks") or []
                      if e.get("name") == self.check), {})
        self.seen.setdefault(_job_of(wl), []).append(Seen(
            time.monotonic(), (wl.get("spec") or {}).get("active", True) is not False,
            str(notes.get(SHED_AT) or ""), str(entry.get("state") or ""),
            str(notes.get(POWER_CAP) or ""), str(notes.get(RESTORED_AT) or ""),
            str(notes.get(POWER_CAP_AT) or "")))

    def _run(self) -> None:
        custom = self.cluster.custom
        args = ("kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = custom.list_namespaced_custom_object(*args)
                    for wl in listed["items"]:
                        self._note(wl)
                    rv = listed["metadata"]["resourceVersion"]
                w = watch.Watch()
                for ev in w.stream(custom.list_namespaced_custom_object, *args,
                                   resource_version=rv, timeout_seconds=5):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = ""
                        self.relists += 1
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._note(obj)
                    if self._stop.is_set():
                        w.stop()
            except Exception:  # the API server restarting: resume (or relist) shortly
                time.sleep(0.5)

    def __enter__(self) -> WorkloadRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def flips(self, job: str) -> list[bool]:
        """The job's spec.active over time, repeats collapsed: [True, False, True] is one shed
        and one restore."""
        out: list[bool] = []
        for s in self.seen.get(job, []):
            if not out or out[-1] != s.active:
                out.append(s.active)
        return out

    def turned(self, job: str, active: bool) -> float | None:
        """When the job's spec.active last changed to ``active`` (monotonic), if it did."""
        at = None
        seen = self.seen.get(job, [])
        for before, after in itertools.pairwise(seen):
            if before.active != active and after.active == active:
                at = after.at
        return at

    def caps(self, job: str) -> list[str]:
        """The job's ``m2g.io/power-cap`` over time, repeats collapsed: ["", "0.75", ""] is
        one cap and one lift."""
        out: list[str] = []
        for s in self.seen.get(job, []):
            if not out or out[-1] != s.cap:
                out.append(s.cap)
        return out

    def lifted(self, job: str) -> float | None:
        """When the job's cap was last removed (monotonic), if it was."""
        at = None
        for before, after in itertools.pairwise(self.seen.get(job, [])):
            if before.cap and not after.cap:
                at = after.at
        return at

    def restored_stamps(self, job: str) -> set[str]:
        return {s.restored_at for s in self.seen.get(job, []) if s.restored_at}

    def lift_stamps(self, job: str) -> set[str]:
        """The lift times recorded (``m2g.io/power-cap-at`` on a version with no cap)."""
        return {s.cap_at for s in self.seen.get(job, []) if s.cap_at and not s.cap}

    def stamps(self, job: str) -> set[str]:
        return {s.shed_at for s in self.seen.get(job, []) if s.shed_at}

    def ready_between(self, job: str, start: float, end: float) -> list[Seen]:
        return [s for s in self.seen.get(job, []) if start <= s.at <= end
                and s.check == "Ready"]


# ---- would a fresh controller do anything? ----------------------------------------------------

def _live_quota(cluster: Cluster, cq: str, flavor: str, resource: str) -> int | None:
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", cq)
    for group in obj["spec"]["resourceGroups"]:
        for fl in group["flavors"]:
            for res in fl["resources"] if fl["name"] == flavor else []:
                if res["name"] == resource:
                    return int(res["nominalQuota"])
    return None


def undone(cluster: Cluster, namespace: str, plan: Plan) -> list[str]:
    """What ``plan`` (a fresh controller's) would still write in ``namespace`` and its queues:
    empty when the cluster already is what a controller that was never disturbed decides."""
    out = []
    for q in plan.quotas:
        live = _live_quota(cluster, q.cluster_queue, q.flavor, q.resource)
        if live != q.nominal:
            out.append(f"quota {q.cluster_queue}/{q.flavor}: {live} -> {q.nominal}")
    wls = {w["metadata"]["name"]: w for w in cluster.workloads(namespace)}
    for a in plan.sheds:
        wl = wls.get(a.name) if a.namespace == namespace else None
        if wl is None:
            continue
        active = wl["spec"].get("active", True) is not False
        stamped = SHED_AT in (wl["metadata"].get("annotations") or {})
        if (a.active and stamped) or (not a.active and (active or not stamped)):
            out.append(f"{'restore' if a.active else 'shed'} {a.name}")
    for c in plan.checks:
        wl = wls.get(c.name) if c.namespace == namespace else None
        entry = next((e for e in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                      if e.get("name") == c.check), None)
        if wl is not None and (entry or {}).get("state") != str(c.state):
            out.append(f"check {c.name}: {(entry or {}).get('state')} -> {c.state}")
    return out
