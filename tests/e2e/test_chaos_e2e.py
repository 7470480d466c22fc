"""Chaos on the real control plane: the API server killed with etcd compacted behind it, every
connection to it reset over and over, the Lease taken by a stranger, skewed clocks.

Each test injects a fault into a running m2g (the real control loop of m2g_controllers, in this
process) and checks invariants that must hold whatever the timing: every AdmissionCheck is
answered once the API server is back; a grid shortfall is shed exactly as far as it needs, in
paced steps, never twice; nobody writes without the Lease; a skewed clock never makes a second
leader. docs/reliability.md counts the faults and invariants of this file.

The API-server test restarts the local control plane's kube-apiserver, so it runs only on the
local control plane (kind-e2e/localcp), not on an external cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_controller_e2e as ctl
import yaml
from e2e_helpers import Cluster, Obj

from m2g.k8s import client as k
from m2g.k8s.leader import LeaderElector
from m2g.planner.config import PlannerConfig
from m2g.policy import make_runtime
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

pytestmark = pytest.mark.e2e

SHED_AT = "m2g.io/shed-at"


def shed(cluster: Cluster, namespace: str, names: list[str]) -> list[str]:
    return sorted(n for n in names if (wl := ctl.workload_of(cluster, namespace, n))
                  and wl["spec"].get("active") is False)


def shed_stamps(cluster: Cluster, namespace: str, names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        wl = ctl.workload_of(cluster, namespace, n)
        stamp = ((wl or {}).get("metadata", {}).get("annotations") or {}).get(SHED_AT)
        if stamp:
            out[n] = stamp
    return out


def shed_story(cluster: Cluster, namespace: str, names: list[str],
               m2g: K8sCluster | None = None) -> str:
    """Per workload: active, m2g's stamp, Kueue's conditions with their times, its pods (node,
    deletion) — and, with ``m2g``, what m2g's pod cache holds of them — what a failed shed
    assertion needs to tell m2g's view from Kueue's pace."""
    lines = [f"now {datetime.now(UTC):%H:%M:%S.%f}"]
    pods = cluster.core.list_namespaced_pod(namespace).items
    cached = [] if m2g is None else [
        o for o in m2g.caches["pods"].view().values()
        if (o.get("metadata") or {}).get("namespace") == namespace]
    for n in names:
        wl = ctl.workload_of(cluster, namespace, n) or {}
        meta, status = wl.get("metadata", {}), wl.get("status", {})
        conds = ", ".join(f"{c['type']}={c['status']}@{c.get('lastTransitionTime', '?')}"
                          f"({c.get('reason', '')})" for c in status.get("conditions") or [])
        mine = [f"{p.spec.node_name}:{_pod_state(p)}" for p in pods
                if (p.metadata.labels or {}).get("job-name") == n]
        seen = [bool(o["metadata"].get("deletionTimestamp")) for o in cached
                if (o["metadata"].get("labels") or {}).get("job-name") == n]
        lines.append(f"{n}: active={wl.get('spec', {}).get('active')} "
                     f"shed-at={(meta.get('annotations') or {}).get(SHED_AT)} [{conds}] "
                     f"pods {mine}"
                     + ("" if m2g is None else f"; m2g's cache: {len(seen)} pods, "
                        f"{sum(seen)} deleting"))
    return "\n".join(lines)


def _pod_state(pod: Any) -> str:
    gone = pod.metadata.deletion_timestamp
    return f"deleting since {gone:%H:%M:%S}" if gone else str(pod.status.phase)


def admitted_jobs(cluster: Cluster, namespace: str, names: list[str]) -> list[str]:
    return [n for n in names if ctl.check_state(ctl.workload_of(cluster, namespace, n)) == "Ready"]


#: Pauses only (``power_caps=False``): no node agent runs here, so a cap is never reported in
#: force and its kW stop counting ``settle_seconds`` after it is set — the pauses planned for
#: the rest then grew by what the caps were to save, and a third workload was shed or not
#: depending on reconcile timing (stop 22's CI; tests/e2e/test_curtail_e2e covers caps).
#: ``settle_seconds`` 30 (the shipped default is 60): a pause counts as saved that long even
#: before Kueue starts evicting it, and past it only while its pods are being deleted. Right
#: after an outage Kueue's and the job controller's own watches are still reconnecting (their
#: backoff), so with 2 s the first pause's kW could stop counting before Kueue
#: (or m2g's pod cache) showed it being evicted, and a third workload was shed (stop 23's CI;
#: not reproduced locally, where Kueue evicted within 1 s; ``shed_story`` now says which) —
#: correct for a Kueue slow for other reasons, not what these tests are about: m2g's own
#: caches and writes across the fault.
SLOW = PlannerConfig(check_name=ctl.CHECK, ramp_kw_per_second=5.0, max_step_kw=25.0,
                     settle_seconds=30.0, shed_saving_fraction=1.0, power_caps=False)


async def four_flexible_jobs(cluster: Cluster, namespace: str) -> list[str]:
    """Four 16-GPU jobs of tiers 1-3, admitted: 40 kW idle + 64 x 1.3 kW = 123.2 kW."""
    names = [f"flex{i}" for i in range(4)]
    for i, name in enumerate(names):
        cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=1 + i % 3))
    await ctl.until("four workloads answered Ready",
                lambda: len(admitted_jobs(cluster, namespace, names)) == 4, timeout=90)
    return names


async def shed_two_and_no_more(cluster: Cluster, namespace: str, names: list[str],
                               m2g: K8sCluster | None = None) -> None:
    """A limit of 85 kW is 38.2 kW short: exactly two 20.8 kW workloads, in two paced steps."""
    both = await ctl.until("two workloads shed", lambda: len(s := shed(
        cluster, namespace, names)) == 2 and s, timeout=90)
    await asyncio.sleep(6)  # and nothing more: the shortfall is covered
    assert shed(cluster, namespace, names) == both, shed_story(cluster, namespace, names, m2g)
    stamps = shed_stamps(cluster, namespace, names)
    assert sorted(stamps) == both, f"a shed without its stamp or a stamp without a shed: {stamps}"


# ---- the API server killed, etcd compacted behind it ---------------------------------------

def _local_control_plane() -> Any:
    if os.environ.get("M2G_E2E_KUBECONFIG"):
        pytest.skip("restarts the local control plane's API server; not on an external cluster")
    from localcp import controlplane
    from localcp.paths import run_paths
    run = run_paths()
    state = controlplane.load_state(run)
    if not state:
        pytest.skip("no local control plane state")
    return run, state


def _compact_etcd(etcd: str) -> int:
    """Compact etcd at its current revision (its JSON gateway): every older resourceVersion
    is gone, so a watch resumed from one gets 410 Gone. Returns the revision."""
    key = base64.b64encode(b"/registry/").decode()
    with httpx.Client(timeout=10) as http:
        rev = int(http.post(f"{etcd}/v3/kv/range", json={
            "key": key, "count_only": True}).json()["header"]["revision"])
        http.post(f"{etcd}/v3/kv/compaction", json={"revision": rev, "physical": True}
                  ).raise_for_status()
    return rev


def _kill_and_restart_api_server(run: Any, state: dict[str, Any], down_seconds: float) -> int:
    from localcp import controlplane, procs
    comps = controlplane.components(run, state["ports"])
    pid = procs.read_pid(run, "kube-apiserver")
    assert pid, "the API server is not running"
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    deadline = time.monotonic() + 10
    while procs.read_pid(run, "kube-apiserver") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    # some writes while it is down would be lost by a cache that did not relist: etcd moves on
    rev = _compact_etcd(f"http://127.0.0.1:{state['ports']['etcd']}")
    time.sleep(down_seconds)
    procs.start(run, comps["kube-apiserver"])
    procs.wait_ready(run, comps["kube-apiserver"])
    return rev


async def test_api_server_killed_with_etcd_compacted_mid_event(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    run, state = _local_control_plane()
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    async with ctl.running_m2g(kubeconfig, policy_dir, ctl.modelled_power(racks), SLOW) as manager:
        names = await four_flexible_jobs(cluster, namespace)
        m2g = manager.cluster
        assert isinstance(m2g, K8sCluster)
        lists_before = {c.resource.plural: c.lists for c in m2g.all_caches()}
        await asyncio.to_thread(_kill_and_restart_api_server, run, state, 5.0)
        # after the outage: a grid event and a new job, both met by the same controller
        ctl.grid_event(cluster, target_kw=85.0)
        await shed_two_and_no_more(cluster, namespace, names, m2g)
        # (after the sheds: its 5.2 kW would make the shortfall three workloads — firm work
        # then waits for room m2g can make, or for the work m2g paused to come back first,
        # unless the sheds are still settling when it is answered: m2g.planner.headroom,
        # hold_firm_beyond_reach, restore_before_firm)
        cluster.batch.create_namespaced_job(namespace, ctl.job("late", 4, tier=0))
        late = await ctl.until("the job created after the restart answered", lambda: (
            (wl := ctl.workload_of(cluster, namespace, "late"))
            and ctl.check_state(wl) in ("Ready", "Retry") and wl), timeout=60)
        if ctl.check_state(late) == "Retry":  # held for room m2g can make, or for the work
            status = str(late["status"])  # it paused (restore_before_firm: that comes back first)
            assert ("firm work waits for room m2g can make" in status
                    or "comes back first: new firm work starts only in the room beyond it"
                    in status), late
        relisted = [c.resource.plural for c in m2g.all_caches()
                    if c.lists > lists_before[c.resource.plural]]
        assert "workloads" in relisted, f"the workload cache never relisted: {relisted}"
        ok, why = manager.ready()
        assert ok, why


# ---- every connection reset, again and again -----------------------------------------------

class FlappingProxy:
    """A TCP proxy in front of the API server that cuts every open connection every ``period``
    seconds (TLS passes through untouched: m2g still verifies the server)."""

    def __init__(self, upstream_port: int, period: float) -> None:
        self.upstream_port, self.period = upstream_port, period
        self.conns: set[asyncio.StreamWriter] = set()
        self.cuts = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            w.close()
            return
        self.conns |= {w, uw}
        try:
            await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w))
        finally:
            self.conns -= {w, uw}

    async def _cut(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for w in list(self.conns):
                w.transport.abort()  # a reset, not a polite close
            self.cuts += 1

    async def __aenter__(self) -> FlappingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def start_cutting(self) -> None:
        self._task = asyncio.create_task(self._cut())

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
        assert self._server is not None
        self._server.close()
        for w in list(self.conns):
            w.transport.abort()


def _kubeconfig_via(kubeconfig: Path, port: int, out: Path) -> Path:
    doc = yaml.safe_load(kubeconfig.read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(doc))
    return out


def _api_port(kubeconfig: Path) -> int:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return int(httpx.URL(server).port or 443)


async def test_connections_reset_every_two_seconds_lose_no_decision(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path: Path) -> None:
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    async with FlappingProxy(_api_port(kubeconfig), period=2.0) as proxy:
        via = _kubeconfig_via(kubeconfig, proxy.port, tmp_path / "via-proxy.yaml")
        async with ctl.running_m2g(via, policy_dir, ctl.modelled_power(racks), SLOW) as manager:
            proxy.start_cutting()
            names = await four_flexible_jobs(cluster, namespace)
            ctl.grid_event(cluster, target_kw=85.0)
            m2g = manager.cluster
            assert isinstance(m2g, K8sCluster)
            await shed_two_and_no_more(cluster, namespace, names, m2g)
            assert proxy.cuts >= 5, proxy.cuts
            watches = {c.resource.plural: c.watches for c in m2g.all_caches()}
            assert watches["workloads"] >= 3, f"the watches were never cut: {watches}"


# ---- the Lease ---------------------------------------------------------------------------

def _lease(cluster: Cluster, namespace: str, name: str) -> Obj:
    from kubernetes import client
    return client.CoordinationV1Api(cluster.api).read_namespaced_lease(name, namespace).to_dict()


def _steal(cluster: Cluster, namespace: str, name: str, holder: str) -> None:
    """Another party writes itself into the Lease, as a second m2g with the same Lease name
    (or a hostile actor with rights on Leases) would."""
    from kubernetes import client
    now = datetime.now(UTC)
    client.CoordinationV1Api(cluster.api).patch_namespaced_lease(name, namespace, {
        "spec": {"holderIdentity": holder, "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                 "leaseDurationSeconds": 4}})


@contextlib.asynccontextmanager
async def elected_m2g(kubeconfig: Path, namespace: str, policy_dir: Path, identity: str,
                      clock_skew: timedelta = timedelta(0), lease: str = "m2g-chaos"
                      ) -> AsyncIterator[tuple[LeaderElector, Manager]]:
    kube = await k.connect(kubeconfig)
    elector = LeaderElector(kube, lease, namespace, identity, lease_duration=4.0,
                            renew_deadline=3.0, retry_period=0.5,
                            clock=lambda: datetime.now(UTC) + clock_skew)
    c = K8sCluster(kube, instance=identity)
    m = Manager(c, PolicyStore(make_runtime()), Metrics(),
                config=PlannerConfig(check_name=ctl.CHECK), resync_seconds=1.0,
                policy_dir=policy_dir, is_leader=lambda: elector.is_leader)
    stop = asyncio.Event()
    await c.start(m.kick)
    tasks = [asyncio.create_task(elector.run(stop)), asyncio.create_task(m.run(stop))]
    try:
        yield elector, m
    finally:
        stop.set()
        m.kick()
        await asyncio.gather(*tasks, return_exceptions=True)
        await c.stop()
        await kube.close()


def _writes(m: Manager) -> int:
    assert isinstance(m.cluster, K8sCluster)
    return len(m.cluster.applier.records)


async def test_a_stranger_holding_the_lease_stops_every_write(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 64)
    async with elected_m2g(kubeconfig, namespace, policy_dir, "m2g-a") as (elector, m):
        await ctl.until("m2g-a to lead", lambda: elector.is_leader)
        cluster.batch.create_namespaced_job(namespace, ctl.job("before", 4, tier=0))
        await ctl.until("the leader's answer", lambda: ctl.check_state(
            ctl.workload_of(cluster, namespace, "before")) == "Ready")
        # a stranger takes the Lease and keeps renewing it for 8 s
        _steal(cluster, namespace, "m2g-chaos", "stranger")
        await ctl.until("m2g-a to step down", lambda: not elector.is_leader, timeout=10)
        writes = _writes(m)
        cluster.batch.create_namespaced_job(namespace, ctl.job("during", 4, tier=0))
        for _ in range(8):
            _steal(cluster, namespace, "m2g-chaos", "stranger")
            assert not elector.is_leader, "two holders of one Lease"
            await asyncio.sleep(1.0)
        assert _writes(m) == writes, "m2g wrote without the Lease"
        assert ctl.check_state(ctl.workload_of(cluster, namespace, "during")) in ("Pending", "")
        # the stranger stops renewing: after the lease duration m2g leads and answers again
        await ctl.until("m2g-a to lead again", lambda: elector.is_leader, timeout=15)
        await ctl.until("the answer after the stranger left", lambda: ctl.check_state(
            ctl.workload_of(cluster, namespace, "during")) == "Ready", timeout=30)
        assert _lease(cluster, namespace, "m2g-chaos")["spec"]["holder_identity"] == "m2g-a"


@pytest.mark.parametrize("skew", [timedelta(hours=1), timedelta(hours=-1)],
                         ids=["follower-1h-ahead", "follower-1h-behind"])
async def test_a_skewed_clock_never_makes_a_second_leader(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, skew: timedelta) -> None:
    """The Lease's timestamps are never compared with the reader's clock: a follower an hour
    off neither takes a live Lease nor waits an hour for a dead one."""
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 64)
    async with contextlib.AsyncExitStack() as follower:
        # (elected_m2g never releases the Lease: leaving its block is a death, not a handover)
        async with elected_m2g(kubeconfig, namespace, policy_dir, "m2g-a") as (a, _ma):
            await ctl.until("m2g-a to lead", lambda: a.is_leader)
            b, mb = await follower.enter_async_context(
                elected_m2g(kubeconfig, namespace, policy_dir, "m2g-b", skew))
            for _ in range(16):  # four lease durations
                assert a.is_leader and not b.is_leader, "a skewed clock took a live Lease"
                await asyncio.sleep(0.5)
            assert _writes(mb) == 0, "the follower wrote"
        await ctl.until("the skewed follower to take over", lambda: b.is_leader, timeout=15)
        cluster.batch.create_namespaced_job(namespace, ctl.job("after", 4, tier=0))
        await ctl.until("the skewed leader's answer", lambda: ctl.check_state(
            ctl.workload_of(cluster, namespace, "after")) == "Ready", timeout=30)
