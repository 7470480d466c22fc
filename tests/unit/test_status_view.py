"""``m2g status``: the Lease read as leading or expired, policies and checks not in force
named, power ages — golden for each output."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest

from m2g.model.cluster import Rejected
from m2g_cli.status_cmd import leader_data, render_status, status_data
from m2g_cli.views import Listing, Output, SortKeyError
from tests.unit.goldens import golden
from tests.unit.test_views import NOW, cluster


def _lease(holder: str, renewed_ago: float, duration: int = 15) -> dict[str, Any]:
    at = (NOW - timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"spec": {"holderIdentity": holder, "renewTime": at,
                     "leaseDurationSeconds": duration}}


def _policy(name: str, ready: bool, reason: str = "Accepted", message: str = "") -> dict[str, Any]:
    status = "True" if ready else "False"
    return {"metadata": {"name": name}, "spec": {"stage": "Admission"},
            "status": {"conditions": [{"type": "Accepted", "status": "True"},
                                      {"type": "Ready", "status": status, "reason": reason,
                                       "message": message}]}}


def _check(name: str, active: bool, reason: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"controllerName": "m2g.io/policy"},
            "status": {"conditions": [{"type": "Active", "status": str(active),
                                       "reason": reason}]}}


def test_a_lease_renewed_within_its_duration_leads_and_an_older_one_has_expired() -> None:
    at = ("m2g-system", "m2g-controller")
    assert leader_data(_lease("m2g-0", 3.0), *at, NOW)["state"] == "Leading"
    assert leader_data(_lease("m2g-0", 16.0), *at, NOW)["state"] == "Expired"
    assert leader_data(_lease("", 1.0), *at, NOW)["state"] == "Expired"  # released
    assert leader_data(None, *at, NOW) == {"lease": "m2g-system/m2g-controller",
                                           "holder": None, "state": "NoLease"}
    assert leader_data({"spec": {"holderIdentity": "x", "renewTime": "garbage"}}, *at,
                       NOW)["state"] == "Expired"


def _data() -> dict[str, Any]:
    rejected = (Rejected("GridEvent", "far", "ValueError: start 9999-12-31T23:00:00+00:00 is "
                         "outside 1970-2200"),
                Rejected("ClusterQueue", "research", "annotation m2g.io/min-flex-tier '9' is "
                         "not 0-3: ignored, every flex tier is allowed in this queue",
                         part="annotation m2g.io/min-flex-tier"))
    return status_data(dataclasses.replace(cluster(), rejected=rejected), [
        _policy("grid-demand-response", True),
        _policy("thermal-admission", False, "Invalid", "Policy/thermal-admission: rule x: "
                "undeclared reference to 'foo'")],
        {"m2g-policy": _check("m2g-policy", True, "Active"),
         "other": {"metadata": {"name": "other"}, "spec": {"controllerName": "else"}},
         "m2g-strict": _check("m2g-strict", False, "NoPolicies")},
        _lease("m2g-7d9f-0", 2.5), ("m2g-system", "m2g-controller"))


@pytest.mark.parametrize("out", [Output.TABLE, Output.WIDE, Output.JSON])
def test_status(out: Output) -> None:
    golden(f"status_{out.value}.txt", render_status(_data(), out))


def test_status_sorted_without_headers() -> None:
    """--sort-by sorts both tables by a field each has (a field only one has sorts that
    one); --no-headers drops the two tables' header lines and nothing else."""
    full = render_status(_data(), Output.WIDE)
    text = render_status(_data(), Output.WIDE, Listing(True, ".active"))
    golden("status_wide_no_headers_sort_active.txt", text)
    lines = text.splitlines()
    assert not any(x.startswith(("ADMISSIONCHECK", "POLICY")) for x in lines)
    assert [x.split()[0] for x in lines if x.startswith("m2g-")] == ["m2g-strict", "m2g-policy"]
    assert [x.split()[0] for x in lines if x.startswith(("grid-", "thermal-"))] == [
        "grid-demand-response", "thermal-admission"]  # policies have no .active: as they are
    assert lines[:4] == full.splitlines()[:4]
    data = json.loads(render_status(_data(), Output.JSON, Listing(sort_by=".message")))
    assert [c["name"] for c in data["admissionChecks"]] == ["m2g-policy", "m2g-strict"]
    assert [p["name"] for p in data["policies"]] == ["thermal-admission",
                                                     "grid-demand-response"]  # "" last
    with pytest.raises(SortKeyError, match=r"no such field.*\.name, \.stage"):
        render_status(_data(), Output.TABLE, Listing(sort_by=".nope"))
