"""Isolation of bad objects (docs/reliability.md): a malformed GridEvent, MaintenanceWindow,
PowerDomain, Node or Workload is left out of the snapshot and reported, and everything else
keeps being decided — before, one of them raised out of every reconcile."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from m2g.k8s import build as kb
from m2g.k8s.isolate import Isolator, sane_time
from m2g.planner.plan import make_plan
from m2g.policy import Evaluator, load_dir
from tests.unit.policy_helpers import policy, write
from tests.unit.test_k8s_convert import NOW, kwok_node, load


def event(name: str, start: str, duration: str = "PT1H") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"eventID": name, "intervals": [{
        "start": start, "duration": duration,
        "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 100}}]}}


def window(name: str, start: str, end: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"start": start, "end": end, "scope": {"racks": ["rack-000"]}}}


def objects() -> dict[str, dict[str, Any]]:
    nodes = {f"n{i}": kwok_node(f"n{i}") for i in range(2)}
    return {
        "nodes": nodes,
        "grid_events": {"ok": event("ok", "2026-11-29T22:00:00Z")},
        "maintenance_windows": {"ok": window("ok", "2026-12-01T00:00:00Z",
                                             "2026-12-01T04:00:00Z")},
        "workloads": {"rec/w": load("workload_admitted")},
        "power_domains": {"pd": {"metadata": {"name": "pd-00"}, "spec": {"budgetKw": 300}}},
    }


BAD: list[tuple[str, str, Any]] = [
    ("grid_events", "GridEvent", event("far", "9999-12-31T23:00:00Z", "PT2H")),
    ("grid_events", "GridEvent", event("long", "2026-11-29T22:00:00Z", "P9999999999W")),
    ("grid_events", "GridEvent", event("early", "1601-01-01T00:00:00Z")),
    ("grid_events", "GridEvent", {"metadata": {"name": "x"}, "spec": {"intervals": "a"}}),
    ("maintenance_windows", "MaintenanceWindow",
     window("year1", "0001-01-01T00:00:00Z", "2026-12-01T00:00:00Z")),
    ("maintenance_windows", "MaintenanceWindow",
     {"metadata": {"name": "s"}, "spec": {"start": 5, "end": [], "scope": "racks"}}),
    ("power_domains", "PowerDomain", {"metadata": {"name": "p"}, "spec": "budget"}),
    # kW no site draws (thirty-first session: a 1e308 kW limit was an active grid event the
    # shipped grid policy deferred every new flexible job for, on the real API server)
    ("grid_events", "GridEvent", {"metadata": {"name": "huge"}, "spec": {"intervals": [{
        "start": "2026-11-29T22:00:00Z", "duration": "PT1H",
        "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 1e308}}]}}),
    ("grid_events", "GridEvent", {"metadata": {"name": "gw"}, "spec": {"intervals": [{
        "start": "2026-11-29T22:00:00Z", "duration": "PT1H",
        "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 10_000_001}}]}}),
    ("power_domains", "PowerDomain", {"metadata": {"name": "budget"},
                                      "spec": {"budgetKw": 1e308}}),
    ("power_domains", "PowerDomain", {"metadata": {"name": "cap"},
                                      "spec": {"budgetKw": 300, "rackCapKw": 2e7}}),
]


def bad_node(change: str) -> dict[str, Any]:
    n = kwok_node("bad")
    if change == "conditions":
        n["status"]["conditions"] = [1]
    elif change == "taints":
        n["spec"] = {"taints": [None]}
    elif change == "labels":
        n["metadata"]["labels"] = "gpu"
    elif change == "allocatable":
        n["status"]["allocatable"] = ["nvidia.com/gpu"]
    return n


def bad_workload(change: str) -> dict[str, Any]:
    w = copy.deepcopy(load("workload_admitted"))
    w["metadata"]["name"] = "bad"
    if change == "labels":
        w["metadata"]["labels"] = "x"
    elif change == "podSets":
        w["spec"]["podSets"] = [None, 3]
    elif change == "conditions":
        w["status"]["conditions"] = [1, None]
    elif change == "admissionChecks":
        w["status"]["admissionChecks"] = "m2g"
    return w


CASES = [(field, kind, obj) for field, kind, obj in BAD] + [
    ("nodes", "Node", bad_node(c)) for c in ("conditions", "taints", "labels", "allocatable")
] + [("workloads", "Workload", bad_workload(c))
     for c in ("labels", "podSets")]


@pytest.mark.parametrize(("field", "kind", "bad"), CASES,
                         ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(CASES)])
def test_a_bad_object_is_left_out_and_reported(field: str, kind: str, bad: Any) -> None:
    good = objects()
    snap_good = kb.build_snapshot(kb.ClusterObjects(**good), None, NOW)
    objs = copy.deepcopy(good)
    objs[field] = {**objs[field], "zz-bad": bad}
    snap = kb.build_snapshot(kb.ClusterObjects(**objs), None, NOW)
    assert [(r.kind, r.name.split("/")[-1]) for r in snap.rejected] == \
        [(kind, bad["metadata"]["name"])]
    assert "\n" not in snap.rejected[0].reason
    # everything else is as it was without the bad object
    assert [n.name for n in snap.factory.nodes] == [n.name for n in snap_good.factory.nodes]
    assert [w.key for w in snap.workloads] == [w.key for w in snap_good.workloads]
    assert [e.id for e in snap.factory.grid_events] == ["ok"]
    assert [w.name for w in snap.factory.maintenance] == ["ok"]
    assert [p.name for p in snap.factory.power_domains] == ["pd-00"]


def test_decisions_go_on(tmp_path: Any) -> None:
    ev = Evaluator(load_dir(write(tmp_path, {"p.yaml": policy("p", "Admission", """
        - {name: big, when: "workload.gpus > 1000", decision: Reject, message: too big}
    """)}), "cel-expr-python"))
    objs = objects()
    for i, (field, _, bad) in enumerate(CASES):
        bad = copy.deepcopy(bad)
        bad["metadata"]["name"] = f"bad-{i}"
        objs[field] = {**objs[field], f"bad-{i}": bad}
    snap = kb.build_snapshot(kb.ClusterObjects(**objs), None, NOW)
    assert len(snap.rejected) == len(CASES)
    assert [w.key for w in snap.workloads] == ["rec/job-rec-a255b"]
    make_plan(snap, ev)  # decides: no exception out of the planner


def test_sane_time_and_isolator() -> None:
    from datetime import UTC, datetime

    assert sane_time(NOW, "t") == NOW
    with pytest.raises(ValueError, match="outside 1970-2200"):
        sane_time(datetime(9999, 1, 1, tzinfo=UTC), "start")
    iso = Isolator()
    assert iso.one("Node", {"metadata": {"name": "n"}}, lambda o: 1 / 0) is None
    assert [(r.kind, r.name) for r in iso.rejected] == [("Node", "n")]
    assert iso.rejected[0].reason.startswith("ZeroDivisionError")


def test_the_kw_bound_is_the_site_configurations() -> None:
    from m2g.config.site import MAX_SITE_KW
    from m2g.k8s.isolate import MAX_KW, sane_kw
    assert MAX_KW == MAX_SITE_KW
    assert sane_kw(MAX_KW, "x") == MAX_KW  # a 10 GW limit is still one
    with pytest.raises(ValueError, match="above 1e\\+07 kW"):
        sane_kw(MAX_KW * 1.000001, "x")


def test_two_site_power_domains_the_smallest_budget_holds_the_other_is_reported() -> None:
    """Thirtieth session probe: with two PowerDomains of level Site the first by name was the
    site, so a copy named before the real one (``a-site-copy``, 1,900 kW) lifted the site's
    400 kW budget in silence and every workload the real budget held back was admitted. Now
    the smallest budget is used and the other one is left out and reported; 0 ("no budget")
    counts only when every Site says it."""
    def site(name: str, kw: float) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"level": "Site", "budgetKw": kw}}

    objs = objects()
    objs["power_domains"] = {**objs["power_domains"], "a": site("a-site-copy", 1900),
                             "z": site("site", 400), "b": site("b-none", 0)}
    snap = kb.build_snapshot(kb.ClusterObjects(**objs), None, NOW)
    assert (snap.factory.site, snap.factory.site_budget_kw) == ("site", 400)
    assert sorted(r.name for r in snap.rejected if r.kind == "PowerDomain") == \
        ["a-site-copy", "b-none"]
    assert all("smallest budget, site's 400 kW" in r.reason and "\n" not in r.reason
               for r in snap.rejected)
    assert [p.name for p in snap.factory.power_domains] == ["pd-00"]  # the others as before
    objs["power_domains"] = {"a": site("a", 0), "b": site("b", 0)}
    snap = kb.build_snapshot(kb.ClusterObjects(**objs), None, NOW)
    assert (snap.factory.site, snap.factory.site_budget_kw) == ("a", 0)
    assert [r.name for r in snap.rejected] == ["b"]
    objs["power_domains"] = {"z": site("site", 400)}  # one: as before, nothing reported
    snap = kb.build_snapshot(kb.ClusterObjects(**objs), None, NOW)
    assert (snap.factory.site_budget_kw, snap.rejected) == (400, ())
