"""m2g's bookkeeping on a Workload is read from where only m2g writes it: a tenant's pod
template carrying ``m2g.io/shed-at`` does not make its workload count as shed by m2g."""

from __future__ import annotations

import copy
from datetime import timedelta

from m2g.k8s import convert as kc
from tests.unit.test_k8s_convert import NOW, load


def test_shed_at_on_a_pod_template_is_ignored() -> None:
    wl = copy.deepcopy(load("workload_admitted"))
    tmpl = wl["spec"]["podSets"][0].setdefault("template", {}).setdefault("metadata", {})
    tmpl["annotations"] = {"m2g.io/shed-at": "2099-01-01T00:00:00Z",
                           "m2g.io/drained-for": "mw-1"}
    ws = kc.workload(wl, NOW)
    assert not ws.shed_by_m2g and ws.shed_at is None and ws.drained_for == ""


def test_restored_at_is_read_and_never_lies_in_the_future() -> None:
    wl = copy.deepcopy(load("workload_admitted"))
    wl["metadata"]["annotations"] = {"m2g.io/restored-at": "2099-01-01T00:00:00Z"}
    assert kc.workload(wl, NOW).restored_at == NOW
    ago = NOW - timedelta(seconds=3)
    wl["metadata"]["annotations"] = {"m2g.io/restored-at": ago.isoformat().replace("+00:00", "Z")}
    ws = kc.workload(wl, NOW)
    assert ws.restored_at == ago and not ws.shed_by_m2g


def test_shed_at_on_the_workload_counts_and_never_lies_in_the_future() -> None:
    wl = copy.deepcopy(load("workload_admitted"))
    wl["metadata"]["annotations"] = {"m2g.io/shed-at": "2099-01-01T00:00:00Z"}
    ws = kc.workload(wl, NOW)
    assert ws.shed_by_m2g and ws.shed_at == NOW
    wl["metadata"]["annotations"] = {
        "m2g.io/shed-at": (NOW - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")}
    assert kc.workload(wl, NOW).shed_at == NOW - timedelta(minutes=5)
