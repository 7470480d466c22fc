"""Chaos under the API server: etcd paused (SIGSTOP for 15 s, then SIGCONT), and etcd killed
with SIGKILL and restarted 10 s later, while m2g runs (the real control loop, in this
process) and a grid event begins during the outage — so m2g has writes to make that cannot be
made.

Invariants: ``/readyz`` is honest both ways — it fails once m2g has been unable to reconcile
for longer than its bound (5 s here; 120 s by default, docs/controllers.md), never before,
and is ok again soon after etcd is back; afterwards the event is shed exactly to its target
(two paced pauses, no third, each with one stamp), as if nothing had happened.

Both restart the local control plane's etcd, so they run only there (kind-e2e/localcp).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Cluster, unique
from test_chaos_e2e import SLOW, _local_control_plane, four_flexible_jobs, shed_two_and_no_more
from test_controller_e2e import (
    _delete,
    factory_flavor,
    make_queue,
    modelled_power,
    running_m2g,
    site_with_budget,
    until,
)

from m2g.testing import kit
from m2g_controllers.manager import Manager
from m2g_controllers.wiring import K8sCluster

pytestmark = pytest.mark.e2e

BOUND = 5.0  # seconds of not reconciling before /readyz fails (UNREADY_FAILING_SECONDS here)



class Readiness:
    """``manager.ready()`` every 0.25 s: (monotonic time, ok, why)."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.samples: list[tuple[float, bool, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            ok, why = self.manager.ready()
            self.samples.append((time.monotonic(), ok, why))
            await asyncio.sleep(0.25)

    def __enter__(self) -> Readiness:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def unready(self, start: float, end: float) -> list[tuple[float, bool, str]]:
        return [s for s in self.samples if start <= s[0] <= end and not s[1]]


def event_starting_soon(cluster: Cluster, seconds: float, target_kw: float) -> str:
    """A grid event that begins ``seconds`` from now (during the outage to come)."""
    name = unique("e2e-dr")
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds)
    cluster.custom.create_cluster_custom_object(
        "m2g.io", "v1alpha1", "gridevents", kit.grid_event(name, start, 60, target_kw))
    cluster.cleanup.append(lambda: _delete(cluster, "gridevents", name))
    return name


def _pause_etcd(run: Any, seconds: float) -> None:
    from localcp import procs
    pid = procs.read_pid(run, "etcd")
    assert pid, "etcd is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def _kill_and_restart_etcd(run: Any, state: dict[str, Any], down_seconds: float) -> None:
    from localcp import controlplane, procs
    comps = controlplane.components(run, state["ports"])
    pid = procs.read_pid(run, "etcd")
    assert pid, "etcd is not running"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while procs.read_pid(run, "etcd") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(down_seconds)
    procs.start(run, comps["etcd"])
    procs.wait_ready(run, comps["etcd"])


async def _outage_mid_event(kubeconfig: Path, cluster: Cluster, namespace: str,
                            policy_dir: Path, outage: Callable[[], None], seconds: float) -> None:
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = site_with_budget(cluster, 1000.0)
    async with running_m2g(kubeconfig, policy_dir, modelled_power(racks), SLOW,
                           unready_failing_seconds=BOUND) as manager:
        names = await four_flexible_jobs(cluster, namespace)
        await until("m2g ready", lambda: manager.ready()[0], timeout=30)
        # 123.2 kW against 85: two paced sheds, to be written while etcd is out
        event_starting_soon(cluster, 3.0, target_kw=85.0)
        with Readiness(manager) as readiness:
            down = time.monotonic()
            await asyncio.to_thread(outage)
            back = time.monotonic()
            assert back - down >= seconds
            await until("/readyz ok again after etcd is back", lambda: manager.ready()[0],
                        timeout=60)
        unready = readiness.unready(down, back + 60)
        assert unready, f"/readyz said ok all through {seconds:.0f} s without etcd"
        first = unready[0]
        assert first[0] - down >= BOUND, f"unready {first[0] - down:.1f}s in: {first[2]}"
        assert first[0] <= back + BOUND, "unready only long after etcd was back"
        m2g = manager.cluster
        assert isinstance(m2g, K8sCluster)
        await shed_two_and_no_more(cluster, namespace, names, m2g)
        assert manager.ready()[0], manager.ready()[1]


async def test_etcd_paused_for_15_s_while_a_grid_event_begins(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    run, _ = _local_control_plane()
    await _outage_mid_event(kubeconfig, cluster, namespace, policy_dir,
                            lambda: _pause_etcd(run, 15.0), 15.0)


async def test_etcd_killed_and_restarted_while_a_grid_event_begins(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path,
        m2g_crds: None) -> None:
    run, state = _local_control_plane()
    await _outage_mid_event(kubeconfig, cluster, namespace, policy_dir,
                            lambda: _kill_and_restart_etcd(run, state, 10.0), 10.0)
