"""The m2g CRDs refuse the objects that m2g cannot reason about (docs/reliability.md), on the
real API server: a GridEvent interval starting in year 9999 or lasting P9999999999W, a
MaintenanceWindow starting in year 1 — while ordinary ones are accepted (server dry-run, so
nothing is left behind)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, unique, wait_until
from manifests_helpers import Applied, apply_crds, controller, http_get, kubectl

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def crds(kubeconfig: Path) -> Iterator[Path]:
    applied = Applied(kubeconfig)
    apply_crds(applied)
    yield kubeconfig  # CRDs that were not there before are removed again
    applied.delete()


def grid_event(start: str, duration: str) -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
            "metadata": {"name": "bounds"},
            "spec": {"eventID": "e", "intervals": [{
                "start": start, "duration": duration,
                "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 100}}]}}


def window(start: str, end: str) -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "MaintenanceWindow",
            "metadata": {"name": "bounds"},
            "spec": {"start": start, "end": end, "scope": {"racks": ["rack-0"]}}}


def reservation(start: str, end: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "bounds"},
            "spec": {"start": start, "end": end, "tenant": {"namespace": "team-a"}, **spec}}


def plan(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "CapacityPlan",
            "metadata": {"name": "bounds"}, "spec": {"start": "2026-12-01T00:00:00Z", **spec}}


def dry_run(kubeconfig: Path, obj: dict[str, Any]) -> tuple[int, str]:
    out = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj),
                  check=False)
    return out.returncode, out.stderr


@pytest.mark.parametrize(("obj", "needle"), [
    (grid_event("9999-01-01T00:00:00Z", "PT1H"), "between 1970 and 2200"),
    (grid_event("1969-12-31T00:00:00Z", "PT1H"), "between 1970 and 2200"),
    (grid_event("2026-12-01T10:00:00Z", "P9999999999W"), "should match"),
    (grid_event("2026-12-01T10:00:00Z", "PT99999999H"), "should match"),
    (window("0001-01-01T00:00:00Z", "2026-12-01T00:00:00Z"), "between 1970 and 2200"),
    (window("2026-12-01T00:00:00Z", "9999-12-31T00:00:00Z"), "between 1970 and 2200"),
    (reservation("2026-12-01T02:00:00Z", "2026-12-01T01:00:00Z", gpus=8), "end must be after"),
    (reservation("2026-12-01T00:00:00Z", "9999-12-01T01:00:00Z", gpus=8), "between 1970"),
    (reservation("2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"), "asks for gpus or cliques"),
    (reservation("2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z", gpus=10**9), "less than or"),
    (plan(gpus=[8], kw=[100]), "exactly one of gpus or kw"),
    (plan(gpus=[]), "should have at least 1"),
    (plan(kw=[-5]), "greater than or equal to -1"),
])
def test_unusable_objects_are_refused(crds: Path, obj: dict[str, Any], needle: str) -> None:
    code, err = dry_run(crds, obj)
    assert code != 0 and needle in err, err


@pytest.mark.parametrize("obj", [
    grid_event("2026-12-01T10:00:00Z", "PT1H30M"),
    grid_event("2026-12-01T10:00:00Z", "P2DT12H"),
    grid_event("2199-12-31T00:00:00Z", "P9999W"),
    window("2026-12-01T00:00:00Z", "2026-12-01T06:00:00Z"),
    reservation("2026-12-01T00:00:00Z", "2026-12-01T06:00:00Z", cliques=1),
    plan(gpus=[72, 72, 36, -1]),
    plan(kw=[120.5] * 24, domain="pd-a"),
])
def test_ordinary_objects_are_accepted(crds: Path, obj: dict[str, Any]) -> None:
    code, err = dry_run(crds, obj)
    assert code == 0, err


def test_an_object_the_crd_admits_but_m2g_cannot_use_gets_an_event_and_a_condition(
        crds: Path, tmp_path: Path) -> None:
    """A GridEvent the CRD accepts whose end m2g cannot reason about (2199 + 9,999 weeks, past
    2200) is left out of the snapshot: ``m2g run`` stays ready, decides on, and says why on the
    object itself — one Warning Event ``LeftOut`` (kubectl describe shows it), not one per
    reconcile, and the condition ``Accepted=False`` (written once: the object's
    resourceVersion stays put across resyncs). Fixed, the condition turns True and stays True
    beside the status the planner then writes (two field managers)."""
    obj = grid_event("2199-12-01T00:00:00Z", "P9999W")
    obj["metadata"]["name"] = name = unique("m2g-e2e-leftout")
    kubectl(crds, "create", "-f", "-", stdin=json.dumps(obj))
    made_ns = kubectl(crds, "create", "namespace", "m2g-system", check=False).returncode == 0

    def events() -> list[dict[str, Any]]:
        out = kubectl(crds, "get", "events.events.k8s.io", "-n", "default", "-o", "json",
                      "--field-selector", f"regarding.name={name}").stdout
        return [e for e in json.loads(out)["items"] if e.get("reason") == "LeftOut"]

    def current() -> dict[str, Any]:
        return dict(json.loads(kubectl(crds, "get", "gridevent", name, "-o", "json").stdout))

    def accepted() -> dict[str, Any]:
        conds = (current().get("status") or {}).get("conditions") or []
        return next((c for c in conds if c.get("type") == "Accepted"), {})

    try:
        with controller(crds, tmp_path / "m2g.log", "--identity", "e2e-leftout",
                        "--check-name", unique("m2g-leftout"),
                        "--policies", str(REPO / "policies")) as url:
            wait_until("the LeftOut Event", lambda: bool(events()), timeout=60)
            wait_until("the object to be counted", lambda: 'm2g_rejected_objects{kind="GridEvent"}'
                       ' 1.0' in http_get(f"{url}/metrics")[1], timeout=30)
            wait_until("the Accepted=False condition",
                       lambda: accepted().get("status") == "False", timeout=30)
            rv = current()["metadata"]["resourceVersion"]
            time.sleep(12)  # past one resync: the object stays broken, no second Event
            (event,) = events()
            assert event["type"] == "Warning" and event["regarding"]["kind"] == "GridEvent"
            assert "outside 1970-2200" in event["note"], event["note"]
            assert http_get(f"{url}/readyz")[0] == 200
            cond = accepted()
            assert (cond["reason"], cond["observedGeneration"]) == ("LeftOut", 1), cond
            assert "outside 1970-2200" in cond["message"], cond
            assert current()["metadata"]["resourceVersion"] == rv  # not written again

            patch = {"spec": {"intervals": [{"start": "2026-12-01T10:00:00Z",
                                             "duration": "PT1H", "payload": {
                                                 "type": "IMPORT_CAPACITY_LIMIT",
                                                 "value": 100}}]}}
            kubectl(crds, "patch", "gridevent", name, "--type=merge", "-p", json.dumps(patch))
            wait_until("the Accepted=True condition",
                       lambda: accepted().get("status") == "True", timeout=30)
            wait_until("the planner's phase", lambda: bool(
                (current().get("status") or {}).get("phase")), timeout=30)
            time.sleep(12)  # past one resync: both writers' fields stay
            fixed = current()
            types = {c["type"]: c for c in fixed["status"]["conditions"]}
            assert types["Accepted"]["status"] == "True", types
            assert types["Accepted"]["observedGeneration"] == 2, types
            assert {"Accepted", "Active"} <= set(types), types
            wait_until("the count to drop", lambda: 'm2g_rejected_objects{kind="GridEvent"}'
                       ' 0.0' in http_get(f"{url}/metrics")[1], timeout=30)
    finally:
        kubectl(crds, "delete", "gridevent", name, "--ignore-not-found", check=False)
        if made_ns:
            kubectl(crds, "delete", "namespace", "m2g-system", "--wait=false", check=False)
