"""m2g's node levers against real Kueue TAS: a maintenance window's racks are tainted and drained
on time, and a hot rack is tainted so new work lands elsewhere (docs/controllers.md).

The control loop runs in this process (as in test_controller_e2e.py) with compressed timings:
the window opens ~90 s after it is created and its work is drained from 60 s before.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, Cluster, Obj, condition, unique
from kubernetes.client.exceptions import ApiException
from test_controller_e2e import (
    CHECK,
    POLICIES,
    RACK_LABEL,
    THERMAL,
    factory_flavor,
    job,
    make_queue,
    modelled_power,
    running_m2g,
    until,
    workload_of,
)

from m2g.planner.config import PlannerConfig

pytestmark = pytest.mark.e2e

MAINT, HOT = "m2g.io/maintenance", "m2g.io/thermal"
PIN_RACK = {"kueue.x-k8s.io/podset-required-topology": RACK_LABEL}


def racks_of(cluster: Cluster) -> dict[str, str]:
    return {n.metadata.name: n.metadata.labels[RACK_LABEL]
            for n in cluster.core.list_node(label_selector="m2g.io/factory=small").items}


def m2g_taints(cluster: Cluster) -> dict[str, dict[str, str]]:
    """Node → {m2g taint key: value}."""
    return {n.metadata.name: {t.key: t.value or "" for t in n.spec.taints or []
                              if t.key.startswith("m2g.io/")}
            for n in cluster.core.list_node(label_selector="m2g.io/factory=small").items}


def pod_nodes(cluster: Cluster, namespace: str, job_name: str) -> list[str]:
    return [p.spec.node_name for p in cluster.core.list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}").items
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")]


def pinned_job(name: str, gpus: int, **extra: Any) -> Obj:
    body = job(name, gpus, tier=1)
    tmpl = body["spec"]["template"]["metadata"]
    tmpl["annotations"].update(PIN_RACK)
    tmpl["labels"].update(extra)
    return body


def window(cluster: Cluster, rack: str, start: datetime, end: datetime,
           drain_lead: int) -> str:
    name = unique("e2e-mw")
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", "maintenancewindows", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "MaintenanceWindow", "metadata": {"name": name},
        "spec": {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "end": end.strftime("%Y-%m-%dT%H:%M:%SZ"), "reason": "e2e",
                 "drainLeadSeconds": drain_lead, "scope": {"racks": [rack]}}})
    cluster.cleanup.append(lambda: _delete_window(cluster, name))
    return name


def _delete_window(cluster: Cluster, name: str) -> None:
    with contextlib.suppress(ApiException):
        cluster.custom.delete_cluster_custom_object("m2g.io", "v1alpha1", "maintenancewindows",
                                                    name)


def admitted_active(wl: Obj | None) -> bool:
    cond = condition(wl or {}, "Admitted")
    return bool(wl and wl["spec"].get("active", True) and cond and cond["status"] == "True")


async def test_maintenance_window_taints_and_drains_its_rack_on_time(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None, clean_taints: None) -> None:
    (tmp_path / "capacity.yaml").write_text(POLICIES["capacity.yaml"])
    (tmp_path / "maintenance.yaml").write_text(
        (REPO / "policies" / "maintenance" / "admission.yaml").read_text())
    make_queue(cluster, namespace, factory_flavor(cluster), 144)
    racks = racks_of(cluster)
    cfg = PlannerConfig(check_name=CHECK, min_shed_seconds=5.0, drain_deadline_seconds=20.0,
                        ramp_kw_per_second=1000.0)
    async with running_m2g(kubeconfig, tmp_path, config=cfg):
        # two rack-pinned jobs: TAS packs them onto one rack (32 + 32 of its 72 GPUs)
        for name in ("a", "b"):
            cluster.batch.create_namespaced_job(namespace, pinned_job(name, 32))
        await until("both jobs running", lambda: all(
            len(pod_nodes(cluster, namespace, n)) == 8 for n in ("a", "b")), timeout=90)
        used = {racks[node] for n in ("a", "b") for node in pod_nodes(cluster, namespace, n)}
        target = sorted(used)[0]
        other = next(r for r in sorted(set(racks.values())) if r != target)
        on_target = [n for n in ("a", "b")
                     if any(racks[x] == target for x in pod_nodes(cluster, namespace, n))]
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=90)
        end = start + timedelta(seconds=30)
        mw = window(cluster, target, start, end, drain_lead=60)
        target_nodes = sorted(n for n, r in racks.items() if r == target)
        await until("the window's nodes tainted", lambda: all(
            m2g_taints(cluster)[n].get(MAINT) == mw for n in target_nodes), timeout=30)
        assert not any(m2g_taints(cluster)[n] for n, r in racks.items() if r != target)
        # new work: a job larger than the clear rack (76 of the 80 GPUs of quota left) cannot
        # be placed by TAS — the tainted nodes are excluded, Kueue says so — and one that fits
        # the clear rack is admitted and lands there, not on the tainted rack
        cluster.batch.create_namespaced_job(namespace, job("big", 76, tier=0))
        held = await until("Kueue to hold the big job off the tainted rack", lambda: (
            (wl := workload_of(cluster, namespace, "big")) and (c := condition(
                wl, "QuotaReserved")) and c["status"] == "False" and MAINT in c["message"] and c))
        assert mw in held["message"]
        cluster.batch.create_namespaced_job(namespace, job("new", 8, tier=0))
        new_nodes = await until("the new job's pods bound", lambda: len(
            nodes := pod_nodes(cluster, namespace, "new")) == 2 and nodes)
        assert {racks[n] for n in new_nodes} == {other}
        # the running work on the rack is drained before the window opens ...
        drained = await until("the rack's work drained", lambda: all(
            not any(racks[x] == target for x in pod_nodes(cluster, namespace, n))
            for n in on_target) and [workload_of(cluster, namespace, n) for n in on_target],
            timeout=120)
        names = {wl["metadata"]["name"] for wl in drained}
        drains = [e for e in cluster.custom.list_namespaced_custom_object(
            "events.k8s.io", "v1", namespace, "events")["items"] if e.get("reason") == "Drained"]
        assert sorted(e["regarding"]["name"] for e in drains) == sorted(names)  # once each
        for e in drains:
            drained_at = datetime.fromisoformat(e["eventTime"].replace("Z", "+00:00"))
            assert drained_at < start
            assert mw in e["note"]
            lead, gone = start - drained_at, start - datetime.now(UTC)
            print(f"drained {e['regarding']['name']} {lead.total_seconds():.1f} s before the "
                  f"window; pods gone {gone.total_seconds():.1f} s before it at the latest")
        # ... and comes back on the other rack
        for n in on_target:
            await until(f"{n} re-admitted after the drain", lambda n=n: admitted_active(
                workload_of(cluster, namespace, n)) and len(
                    pod_nodes(cluster, namespace, n)) == 8, timeout=120)
            assert {racks[x] for x in pod_nodes(cluster, namespace, n)} == {other}
            ahead = start - datetime.now(UTC)
            print(f"{n} running again on {other}, {ahead.total_seconds():.1f} s before the "
                  "window's start (negative: after)")
        events = cluster.core.list_namespaced_event("default").items
        assert any(e.reason == "Tainted" and e.involved_object.name in target_nodes
                   for e in events)
        # after the window the taints go
        await until("the taints removed after the window", lambda: not any(
            m2g_taints(cluster)[n] for n in target_nodes), timeout=120)


async def test_thermal_alarm_taints_a_tas_rack_and_new_work_lands_elsewhere(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None, clean_taints: None) -> None:
    (tmp_path / "thermal-capacity.yaml").write_text(THERMAL["thermal-capacity.yaml"])
    racks = racks_of(cluster)
    hot = sorted(set(racks.values()))[0]
    inlet = {hot: 36.0}
    make_queue(cluster, namespace, factory_flavor(cluster), 144)  # gb200: a TAS flavor
    async with running_m2g(kubeconfig, tmp_path, modelled_power(racks, inlet)) as manager:
        hot_nodes = sorted(n for n, r in racks.items() if r == hot)
        await until("the hot rack tainted", lambda: all(
            m2g_taints(cluster)[n].get(HOT) == hot for n in hot_nodes), timeout=30)
        # the hot rack is not reported unhealthy: its quota drop is the policy's (72), once
        for i in range(3):
            cluster.batch.create_namespaced_job(namespace, job(f"j{i}", 16, tier=0))
        for i in range(3):
            nodes = await until(f"j{i} running", lambda i=i: len(
                ns := pod_nodes(cluster, namespace, f"j{i}")) == 4 and ns, timeout=60)
            assert all(racks[n] != hot for n in nodes)
        inlet[hot] = 31.5  # under the 32 °C limit but within the 1 °C margin: the taint stays
        seen = manager.state.reconciles
        await until("three more reconciles", lambda: manager.state.reconciles >= seen + 3)
        assert all(m2g_taints(cluster)[n].get(HOT) for n in hot_nodes)
        inlet[hot] = 24.0
        await until("the thermal taint removed", lambda: not any(
            m2g_taints(cluster)[n] for n in hot_nodes), timeout=30)
