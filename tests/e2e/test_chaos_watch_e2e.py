"""Chaos: a watch 410 storm without an API-server restart (docs/reliability.md).

m2g's watches are cut again and again (every connection through a proxy reset every 2 s) while
the test churns the kinds m2g watches (annotation patches on the namespace's Workloads and on
the factory's Nodes) and compacts etcd every 5 s. Then m2g is shut out entirely while the churn
goes on, until the API server refuses a watch resumed at m2g's resourceVersion with 410 Gone
(the test probes that itself), and let back in: its caches' resumes get 410 and relist.

What the kube-apiserver does here (k8s.io/apiserver storage/cacher): watches are served from
its watch cache, not from etcd, so an etcd compaction ends no watch and fails no resume; the
cache keeps at least the last 75 s of each kind's events (``eventFreshDuration``: 60 s
bookmarks + 15 s), growing to up to 102,400 of them. A watch resumed at a resourceVersion
younger than that never gets 410 however often it is cut, and m2g's bookmarks keep its
resourceVersion that young. The first part of this test measures that (410s while cut every
2 s); only a watch that stays away for longer than the window while enough events go by is
refused, which the second part does.

Invariants: every cache that got 410 relisted; a grid event that began while m2g was shut
out is shed exactly (two workloads, each once, each with one shed-at stamp; nothing more) and
restored exactly (each once) when it ends; a job created while m2g was shut out is answered
(Ready, or Retry while the work m2g paused comes back first) and admitted by the event's end;
no m2g log record carries a traceback and no reconcile failed with a programming error; m2g is
ready at the end. Runs only on the local control plane (it compacts its etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import test_controller_e2e as ctl
from chaos_helpers import WorkloadRecorder
from e2e_helpers import Cluster
from kubernetes.client.exceptions import ApiException
from test_chaos_e2e import (
    SLOW,
    FlappingProxy,
    _api_port,
    _compact_etcd,
    _kubeconfig_via,
    _local_control_plane,
    admitted_jobs,
    four_flexible_jobs,
    shed,
    shed_stamps,
    shed_story,
)

from m2g_controllers.wiring import K8sCluster

pytestmark = pytest.mark.e2e

CHURN = "chaos.m2g.io/churn"
#: How long the test keeps m2g shut out at most waiting for the API server's 410.
MAX_SHUT_OUT_SECONDS = 150.0
PROGRAMMING_ERRORS = ("TypeError", "KeyError", "AttributeError", "ValueError", "IndexError",
                      "AssertionError", "OverflowError", "ZeroDivisionError")


class GatedProxy(FlappingProxy):
    """The flapping proxy, which can also shut its client out (every connection reset, new
    ones reset at once) and let it back in."""

    shut = False

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.shut:
            w.transport.abort()
            return
        await super()._handle(r, w)

    def shut_out(self) -> None:
        self.shut = True
        for w in list(self.conns):
            w.transport.abort()


class Churn:
    """Annotation patches on the namespace's Workloads (~5 a second) and the factory's Nodes
    (~2 a second), and an etcd compaction every 5 s, in a thread."""

    def __init__(self, cluster: Cluster, namespace: str, nodes: list[str], etcd: str) -> None:
        self.cluster, self.namespace, self.nodes, self.etcd = cluster, namespace, nodes, etcd
        self.patches: Counter[str] = Counter()
        self.compactions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _workloads(self) -> list[str]:
        return [w["metadata"]["name"] for w in self.cluster.workloads(self.namespace)]

    def _run(self) -> None:
        names, listed, compacted, i = self._workloads(), time.monotonic(), time.monotonic(), 0
        body = {"metadata": {"annotations": {CHURN: ""}}}
        while not self._stop.wait(0.2):
            i += 1
            body["metadata"]["annotations"][CHURN] = str(i)
            with contextlib.suppress(ApiException):
                if names:
                    self.cluster.custom.patch_namespaced_custom_object(
                        "kueue.x-k8s.io", "v1beta2", self.namespace, "workloads",
                        names[i % len(names)], body)
                    self.patches["workloads"] += 1
                if i % 2 == 0 and self.nodes:
                    self.cluster.core.patch_node(self.nodes[i % len(self.nodes)], body)
                    self.patches["nodes"] += 1
            now = time.monotonic()
            if now - listed > 5:
                names, listed = self._workloads(), now
            if now - compacted > 5:
                with contextlib.suppress(Exception):  # etcd busy: the next one
                    _compact_etcd(self.etcd)
                    self.compactions += 1
                compacted = now

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for node in self.nodes:
            with contextlib.suppress(ApiException):
                self.cluster.core.patch_node(node, {"metadata": {"annotations": {CHURN: None}}})


def gone(cluster: Cluster, plural: str, rv: str) -> bool:
    """Does the API server refuse a watch of ``plural`` resumed at ``rv`` with 410?"""
    kw: dict[str, Any] = {"watch": True, "resource_version": rv, "timeout_seconds": 1,
                          "_preload_content": False}
    if plural == "nodes":
        resp = cluster.core.list_node(**kw)
    else:
        resp = cluster.custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural,
                                                         **kw)
    for line in resp.read().decode().splitlines():
        event = json.loads(line)
        if event.get("type") == "ERROR" and (event.get("object") or {}).get("code") == 410:
            return True
    return False


class Records(logging.Handler):
    """Every log record of m2g's loggers (the proxy's own teardown errors are not m2g's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("m2g"):
            self.records.append(record)

    def relists(self, since: float) -> Counter[str]:
        """410s per kind that m2g's caches met after ``since`` (time.time())."""
        return Counter(r.getMessage().split(":")[0] for r in self.records
                       if r.name == "m2g.k8s.cache" and r.created >= since
                       and r.getMessage().endswith("relisting"))


@contextlib.contextmanager
def recording() -> Any:
    handler = Records()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def answered(cluster: Cluster, namespace: str, job: str) -> str | None:
    """The check's answer to ``job``'s Workload: Ready, or Retry for a reason m2g gives firm
    work during an event — the room it can make (hold_firm_beyond_reach) or the work it paused,
    which comes back first (restore_before_firm, m2g.planner.headroom); else None."""
    wl = ctl.workload_of(cluster, namespace, job)
    state, status = ctl.check_state(wl), str((wl or {}).get("status"))
    if state == "Ready" or (state == "Retry" and (
            "firm work waits for room m2g can make" in status
            or "comes back first: new firm work starts only in the room beyond it" in status)):
        return state
    return None


async def shut_out_until_gone(cluster: Cluster, proxy: GatedProxy, m2g: K8sCluster,
                              plurals: tuple[str, ...]) -> tuple[float, dict[str, bool]]:
    """Shut m2g out until a watch resumed at its workload cache's resourceVersion is refused
    with 410 (at most MAX_SHUT_OUT_SECONDS); returns (seconds shut out, kind → 410)."""
    proxy.shut_out()
    t0 = time.monotonic()
    await asyncio.sleep(1)  # every watch ended: the versions m2g will resume at
    rvs = {p: m2g.caches[p].resource_version for p in plurals}
    found = {p: False for p in plurals}
    while time.monotonic() - t0 < MAX_SHUT_OUT_SECONDS:
        await asyncio.sleep(5)
        found = {p: found[p] or await asyncio.to_thread(gone, cluster, p, rvs[p])
                 for p in plurals}
        if found["workloads"]:
            break
    proxy.shut = False
    return time.monotonic() - t0, found


async def test_a_410_storm_without_an_api_server_restart_loses_no_decision(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None, tmp_path: Path) -> None:
    _, state = _local_control_plane()
    etcd = f"http://127.0.0.1:{state['ports']['etcd']}"
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    with recording() as logs, WorkloadRecorder(cluster, namespace, ctl.CHECK) as rec:
        async with GatedProxy(_api_port(kubeconfig), period=2.0) as proxy:
            via = _kubeconfig_via(kubeconfig, proxy.port, tmp_path / "via-proxy.yaml")
            async with ctl.running_m2g(via, policy_dir, ctl.modelled_power(racks),
                                       SLOW) as manager:
                m2g = manager.cluster
                assert isinstance(m2g, K8sCluster)
                proxy.start_cutting()
                with Churn(cluster, namespace, sorted(racks), etcd) as churn:
                    # 1. cut every 2 s, churned and compacted: decisions go on
                    t_cuts = time.time()
                    names = await four_flexible_jobs(cluster, namespace)
                    await asyncio.sleep(20)
                    short = logs.relists(t_cuts)
                    cuts = proxy.cuts
                    watches = m2g.caches["workloads"].watches
                    # 2. shut out while churned, a grid event and a job arriving meanwhile
                    lists = {p: m2g.caches[p].lists for p in ("workloads", "nodes")}
                    t_shut = time.time()
                    event = ctl.grid_event(cluster, target_kw=90.0)
                    cluster.batch.create_namespaced_job(namespace, ctl.job("late", 4, tier=0))
                    away, found = await shut_out_until_gone(cluster, proxy, m2g,
                                                            ("workloads", "nodes"))
                    print(f"410 storm: {cuts} cuts, {short} relists while cut every 2 s "
                          f"({watches} workload watches); shut out {away:.0f} s until "
                          f"410 for {found}; churn {dict(churn.patches)}, "
                          f"{churn.compactions} compactions")
                    assert found["workloads"], (
                        f"no 410 for a watch resumed after {away:.0f} s and "
                        f"{churn.patches['workloads']} Workload changes")
                    t_back = time.time()
                    await ctl.until("m2g's workload cache to relist after its 410", lambda: (
                        m2g.caches["workloads"].lists > lists["workloads"]
                        and logs.relists(t_back)["workloads"] >= 1), timeout=90)
                # 3. the grid event is shed exactly, the late job answered
                both = await ctl.until("two workloads shed", lambda: len(
                    s := shed(cluster, namespace, names)) == 2 and s, timeout=120)
                late = await ctl.until("the job created while m2g was shut out answered",
                                       lambda: answered(cluster, namespace, "late"), timeout=60)
                await asyncio.sleep(6)
                assert shed(cluster, namespace, names) == both, (
                    "a third shed: " + shed_story(cluster, namespace, names, m2g))
                assert sorted(shed_stamps(cluster, namespace, names)) == both
                ctl._delete(cluster, "gridevents", event)
                await ctl.until("both restored", lambda: not shed(cluster, namespace, names),
                                timeout=120)
                if late != "Ready":  # held for the paused work: admitted once the event ends
                    await ctl.until("the late job admitted after the event", lambda: (
                        admitted_jobs(cluster, namespace, ["late"])), timeout=90)
                await asyncio.sleep(3)
                ok, why = manager.ready()
                assert ok, why
        relisted = logs.relists(t_shut)
        for job in names:
            want = [True, False, True] if job in both else [True]
            assert rec.flips(job) == want, (job, rec.flips(job))
            assert len(rec.stamps(job)) == (1 if job in both else 0), (job, rec.stamps(job))
    assert relisted["workloads"] >= 1, relisted
    traced = [r.getMessage() for r in logs.records if r.exc_info]
    assert not traced, traced
    failures = [r.getMessage() for r in logs.records if "reconcile failed" in r.getMessage()]
    wrong = [f for f in failures if any(f"s: {e}:" in f for e in PROGRAMMING_ERRORS)]
    assert not wrong, wrong
    errors = [r.getMessage() for r in logs.records
              if r.levelno >= logging.ERROR and r.name.startswith("m2g")]
    assert not errors, errors
    print(f"relists after the shut-out: {dict(relisted)}; {len(failures)} failed reconciles "
          f"while shut out; flips {[rec.flips(j) for j in names]}")
