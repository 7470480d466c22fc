"""Hostile objects the CRDs and the API server accept, beside ordinary work, with ``m2g run``
running as the Deployment runs it (a process reading rack power from a Prometheus stand-in that
follows the pods): m2g keeps answering admission checks and shedding for everything else, and
reports each object it cannot use — a Warning Event and an ``Accepted=False`` condition on the
object, one log line, ``m2g_rejected_objects`` — while ``/readyz`` stays 200.

tests/fuzz/test_hostile_objects.py builds such objects in-process (through ``build_snapshot``,
``make_plan`` and the views); this file sends them through the real API server and the watch
caches, where their JSON is what the API server stores (1e308 as a number, a zero-length
duration, 96 intervals, a node label of 20 digits), and checks the controller, not a function.
docs/reliability.md, "Thirty-first session", lists what is created and what is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import test_controller_e2e as ctl
from chaos_helpers import Fleet, pod_power_prometheus, site_file
from e2e_helpers import Cluster, Obj, unique
from kubernetes.client.exceptions import ApiException

from m2g.k8s.parse import format_time

pytestmark = pytest.mark.e2e

GROUP, VERSION = "m2g.io", "v1alpha1"
SHED_AT = "m2g.io/shed-at"
#: As test_chaos_e2e's SLOW: two paced pauses for the 85 kW event; no node agent here.
PLANNER = {"rampKwPerSecond": 5.0, "maxStepKw": 25.0, "settleSeconds": 30.0,
           "shedSavingFraction": 1.0, "powerCaps": False}


def _create(cluster: Cluster, plural: str, obj: Obj) -> str:
    name = str(obj["metadata"]["name"])
    cluster.custom.create_cluster_custom_object(GROUP, VERSION, plural, obj)

    def delete() -> None:
        with contextlib.suppress(ApiException):
            cluster.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    cluster.cleanup.append(delete)
    return name


def _event(name: str, *intervals: tuple[str, str, str, float]) -> Obj:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GridEvent", "metadata": {"name": name},
            "spec": {"eventID": name, "intervals": [
                {"start": start, "duration": duration, "payload": {"type": kind, "value": value}}
                for start, duration, kind, value in intervals]}}


def hostile_objects(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Create the hostile m2g objects; returns a label → (plural, name) of each."""
    now = datetime.now(UTC)
    past = format_time(now - timedelta(minutes=1))
    made = {
        # its end (2199 + 9,999 weeks) lies past 2200: left out and reported
        "far": ("gridevents", _create(cluster, "gridevents", _event(
            unique("m2g-e2e-far"), ("2199-12-01T00:00:00Z", "P9999W", "IMPORT_CAPACITY_LIMIT",
                                    100.0)))),
        # active now with a limit of 1e308 kW (the CRD has no maximum): above the 10 GW no
        # site draws, left out and reported — used, it was an active grid event for which the
        # shipped grid policy deferred every new flexible job (found by this test)
        "huge": ("gridevents", _create(cluster, "gridevents", _event(
            unique("m2g-e2e-huge"), (past, "PT2H", "IMPORT_CAPACITY_LIMIT", 1e308)))),
        # zero-length intervals, now
        "empty": ("gridevents", _create(cluster, "gridevents", _event(
            unique("m2g-e2e-empty"), (past, "PT0S", "IMPORT_CAPACITY_LIMIT", 1.0),
            (past, "P0D", "SIMPLE", 3.0)))),
        # the CRD's most intervals, each one second, all over
        "many": ("gridevents", _create(cluster, "gridevents", _event(
            unique("m2g-e2e-many"), *[(format_time(now - timedelta(hours=2, seconds=i)),
                                       "PT1S", "IMPORT_CAPACITY_LIMIT", 0.5) for i in range(96)]))),
        # the CRD's widest window, on a rack that does not exist
        "epoch": ("maintenancewindows", _create(cluster, "maintenancewindows", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "MaintenanceWindow",
            "metadata": {"name": unique("m2g-e2e-epoch")},
            "spec": {"start": "1970-01-01T00:00:00Z", "end": "2200-01-01T00:00:00Z",
                     "scope": {"racks": ["no-such-rack"]}}})),
        # a second Site domain with a budget no site has: left out and reported, the real
        # 1,000 kW is the site's
        "site-copy": ("powerdomains", _create(cluster, "powerdomains", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PowerDomain",
            "metadata": {"name": unique("m2g-e2e-a-site")},
            "spec": {"level": "Site", "budgetKw": 1e308}})),
        # a feed of 0 kW, rack caps of 0 and an inlet limit of 0 °C for a rack that is not there
        "nothing": ("powerdomains", _create(cluster, "powerdomains", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PowerDomain",
            "metadata": {"name": unique("m2g-e2e-nothing")},
            "spec": {"budgetKw": 0, "racks": ["no-such-rack"], "rackCapKw": 0,
                     "inletLimitC": 0}})),
    }
    return made


def hostile_node_labels(cluster: Cluster, node: str) -> None:
    """Labels a node may carry that say nonsense: a 20-digit GPU count, a power domain that
    does not exist, a clique that is not ``<cluster>.<clique>``; removed afterwards."""
    labels = {"nvidia.com/gpu.count": "9" * 20, "m2g.io/power-domain": "no-such-domain",
              "nvidia.com/gpu.clique": "not-a-clique"}
    before = cluster.core.read_node(node).metadata.labels or {}
    cluster.core.patch_node(node, {"metadata": {"labels": labels}})
    restore = {k: before.get(k) for k in labels}  # None removes one that was not there
    cluster.cleanup.append(lambda: cluster.core.patch_node(node, {"metadata": {
        "labels": restore}}))


def tenant_pending_job(cluster: Cluster, namespace: str) -> str:
    """A job too large for its queue (it stays pending) whose template carries m2g's
    bookkeeping and a tenant's claims: ``shed-at`` in 2099, 0.01 kW for 200 GPUs, flex tier 0.
    Returns the job's name."""
    body = ctl.job("greedy", 200, tier=0)
    tmpl = body["spec"]["template"]["metadata"]
    tmpl["annotations"] = {SHED_AT: "2099-01-01T00:00:00Z", "m2g.io/estimated-kw": "0.01",
                           "m2g.io/drained-for": "no-such-window"}
    cluster.batch.create_namespaced_job(namespace, body)
    return "greedy"


def _events_on(cluster: Cluster, name: str) -> list[Any]:
    from kubernetes import client
    got = client.EventsV1Api(cluster.api).list_namespaced_event(
        "default", field_selector=f"regarding.name={name}").items
    return [e for e in got if e.reason == "LeftOut"]


def _accepted(cluster: Cluster, plural: str, name: str) -> dict[str, Any]:
    obj = cluster.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "Accepted"), {})


def _shed(cluster: Cluster, namespace: str, names: list[str]) -> list[str]:
    return sorted(n for n in names if (wl := ctl.workload_of(cluster, namespace, n))
                  and wl["spec"].get("active") is False)


def _stamped(cluster: Cluster, namespace: str, names: list[str]) -> list[str]:
    return sorted(n for n in names if SHED_AT in (((ctl.workload_of(
        cluster, namespace, n) or {}).get("metadata") or {}).get("annotations") or {}))


async def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    return await ctl.until(what, check, timeout=timeout)


async def test_hostile_objects_leave_admission_and_shedding_to_the_rest(
        kubeconfig: Path, cluster: Cluster, namespace: str, policy_dir: Path, m2g_crds: None,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    ctl.make_queue(cluster, namespace, ctl.factory_flavor(cluster), 144)
    racks = ctl.site_with_budget(cluster, 1000.0)
    made = hostile_objects(cluster)
    hostile_node_labels(cluster, sorted(racks)[-1])
    out = tmp_path_factory.mktemp("hostile")  # not under the policy folder: m2g reads it all
    site = site_file(out / "site.yaml", ctl.CHECK, PLANNER)
    names = [f"flex{i}" for i in range(4)]
    with pod_power_prometheus(cluster, racks) as prom:
        fleet = Fleet(kubeconfig, site, policy_dir, namespace, unique("m2g-hostile"), out, prom)
        rep = fleet.start("m2g-0")
        try:
            await _until("m2g run ready", lambda: rep.ready()[0] == 200, timeout=90)
            greedy = tenant_pending_job(cluster, namespace)
            wl = await _until("the tenant's Workload", lambda: ctl.workload_of(
                cluster, namespace, greedy), timeout=30)
            # m2g's bookkeeping on the Workload itself, as a cluster admin (whom the
            # m2g-workload-bookkeeping guard lets through) or a cluster without the guard
            cluster.custom.patch_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", namespace, "workloads", wl["metadata"]["name"],
                {"metadata": {"annotations": {SHED_AT: "2099-01-01T00:00:00Z"}}})
            for i, name in enumerate(names):
                cluster.batch.create_namespaced_job(namespace, ctl.job(name, 16, tier=1 + i % 3))
            await _until("four workloads answered Ready", lambda: all(ctl.check_state(
                ctl.workload_of(cluster, namespace, n)) == "Ready" for n in names), timeout=90)
            await _until("the four jobs running", lambda: len(cluster.core.list_namespaced_pod(
                namespace, field_selector="status.phase=Running").items) == 16, timeout=90)
            # 40 kW idle + 64 x 1.3 kW = 123.2 kW against 85 kW: two paced pauses, no third
            ctl.grid_event(cluster, target_kw=85.0)
            both = await _until("two workloads shed", lambda: len(
                s := _shed(cluster, namespace, names)) == 2 and s, timeout=90)
            await asyncio.sleep(8)  # and nothing more: the shortfall is covered
            assert _shed(cluster, namespace, names) == both
            assert _stamped(cluster, namespace, names) == both
            # the tenant's job: still pending, never shed, never answered
            wl = ctl.workload_of(cluster, namespace, greedy) or {}
            assert wl.get("spec", {}).get("active") is not False, wl
            assert ctl.check_state(wl) in ("", "Pending"), wl
            # each object m2g cannot use: one Event, its condition, one log line, the metric
            for label in ("far", "huge", "site-copy"):
                plural, name = made[label]
                events = await _until(f"the LeftOut Event on {label}",
                                      lambda n=name: _events_on(cluster, n), timeout=30)
                assert len(events) == 1 and events[0].type == "Warning", events
                cond = await _until(f"Accepted=False on {label}", lambda p=plural, n=name: (
                    (c := _accepted(cluster, p, n)).get("status") == "False" and c), timeout=30)
                assert cond["reason"] == "LeftOut", cond
                lines = [line for line in rep.log.read_text().splitlines()
                         if "left out of the snapshot" in line and name in line]
                assert len(lines) == 1, lines
            assert rep.metric('m2g_rejected_objects{kind="GridEvent"}') == 2.0
            assert rep.metric('m2g_rejected_objects{kind="PowerDomain"}') == 1.0
            # the objects m2g can use are not reported
            for label in ("empty", "many", "epoch", "nothing"):
                plural, name = made[label]
                assert not _events_on(cluster, name), label
                assert _accepted(cluster, plural, name).get("status") != "False", label
            assert rep.ready()[0] == 200 and rep.alive()
            text = rep.log.read_text()
            assert "Traceback" not in text, text[-3000:]
            # a new job is still answered while all of them are there
            cluster.batch.create_namespaced_job(namespace, ctl.job("late", 4, tier=0))
            await _until("the job created last answered", lambda: ctl.check_state(
                ctl.workload_of(cluster, namespace, "late")) in ("Ready", "Retry"), timeout=60)
        finally:
            fleet.stop_all()
