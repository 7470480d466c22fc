"""The ``Accepted`` condition on m2g's own objects left out of the snapshot (m2g.k8s.validity,
docs/reliability.md): False with the reason while an object is left out, True again once it is
fixed, written by the leader's adapter with its own field manager, and not written again while
the object already says it."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from m2g.k8s import client as k
from m2g.k8s.apply import Applier
from m2g.k8s.validity import FIELD_MANAGER, condition_updates
from m2g.model.cluster import Rejected
from m2g.model.status import same_status
from m2g.testing.kube import FakeKube
from m2g_controllers.wiring import K8sCluster

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"
REASON = "ValueError: end 2391-07-01T00:00:00+00:00 is outside 1970-2200"


def grid_event(name: str = "far", generation: int = 1, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                           "metadata": {"name": name, "generation": generation},
                           "spec": {"eventID": name}}
    if status:
        obj["status"] = status
    return obj


def left_out(name: str = "far", reason: str = REASON) -> tuple[Rejected, ...]:
    return (Rejected("GridEvent", name, reason),)


def with_condition(obj: dict[str, Any], cond: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    status = out.setdefault("status", {})
    status["conditions"] = [c for c in status.get("conditions", [])
                            if c.get("type") != cond["type"]] + [cond]
    return out


def test_an_object_left_out_gets_accepted_false_with_the_reason() -> None:
    (u,) = condition_updates({"grid_events": {"far": grid_event(generation=3)}}, left_out(), T0)
    assert (u.kind, u.key, u.resource) == ("GridEvent", "far", k.GRID_EVENTS)
    assert u.condition == {
        "type": "Accepted", "status": "False", "reason": "LeftOut",
        "message": f"m2g cannot use this GridEvent and decides without it: {REASON}",
        "lastTransitionTime": T0, "observedGeneration": 3}
    assert u.body() == {"apiVersion": "m2g.io/v1alpha1", "kind": "GridEvent",
                        "metadata": {"name": "far"}, "status": {"conditions": [u.condition]}}


def test_an_object_that_already_says_it_is_not_written_again() -> None:
    obj = grid_event()
    (u,) = condition_updates({"grid_events": {"far": obj}}, left_out(), T0)
    marked = with_condition(obj, u.condition)
    assert condition_updates({"grid_events": {"far": marked}}, left_out(), T1) == []


def test_a_new_reason_or_generation_is_written_and_keeps_the_transition_time() -> None:
    obj = grid_event()
    (u,) = condition_updates({"grid_events": {"far": obj}}, left_out(), T0)
    marked = with_condition(obj, u.condition)
    (again,) = condition_updates({"grid_events": {"far": marked}},
                                 left_out(reason="ValueError: other"), T1)
    assert again.condition["message"].endswith("ValueError: other")
    assert again.condition["lastTransitionTime"] == T0  # still False: no transition
    marked["metadata"]["generation"] = 2  # edited, still broken the same way
    (edited,) = condition_updates({"grid_events": {"far": marked}}, left_out(), T1)
    assert edited.condition["observedGeneration"] == 2


def test_a_fixed_object_is_cleared_to_true_and_then_left_alone() -> None:
    obj = grid_event()
    (u,) = condition_updates({"grid_events": {"far": obj}}, left_out(), T0)
    marked = with_condition(obj, u.condition)
    marked["metadata"]["generation"] = 2
    (cleared,) = condition_updates({"grid_events": {"far": marked}}, (), T1)
    assert cleared.accepted
    assert {f: cleared.condition[f] for f in ("status", "reason", "lastTransitionTime",
                                               "observedGeneration")} == {
        "status": "True", "reason": "Accepted", "lastTransitionTime": T1,
        "observedGeneration": 2}
    assert condition_updates({"grid_events": {"far": with_condition(marked, cleared.condition)}},
                             (), T1) == []


def test_objects_never_left_out_and_kinds_not_m2gs_get_no_condition() -> None:
    objects = {"grid_events": {"ok": grid_event("ok")},
               "nodes": {"n0": {"metadata": {"name": "n0"}}}}
    rejected = (Rejected("Node", "n0", "TypeError: labels"),
                Rejected("Workload", "t/w", "TypeError: x"))
    assert condition_updates(objects, rejected, T0) == []


@pytest.mark.parametrize("status", [5, "x", {"conditions": "x"}, {"conditions": [1, None]},
                                    {"conditions": [{"type": "Accepted", "status": 7}]}])
def test_a_malformed_status_is_overwritten_never_an_exception(status: Any) -> None:
    obj = grid_event()
    obj["status"] = status
    obj["metadata"]["generation"] = "7"  # not an int: no observedGeneration
    (u,) = condition_updates({"grid_events": {"far": obj}}, left_out(), T0)
    assert u.condition["status"] == "False" and "observedGeneration" not in u.condition


@pytest.mark.parametrize(("kind", "field"), [
    ("PowerDomain", "power_domains"), ("MaintenanceWindow", "maintenance_windows"),
    ("GPUPowerLimit", "gpu_power_limits"), ("Reservation", "reservations"),
    ("CapacityPlan", "capacity_plans")])
def test_every_m2g_kind_with_a_status_gets_it(kind: str, field: str) -> None:
    obj = {"metadata": {"name": "x", "generation": 1}}
    (u,) = condition_updates({field: {"x": obj}}, (Rejected(kind, "x", "bad"),), T0)
    assert u.resource.kind == kind and u.condition["reason"] == "LeftOut"


def test_the_planners_status_comparison_ignores_the_accepted_condition() -> None:
    """The planner writes a GridEvent's Active condition, this module its Accepted: neither
    makes the other's writer write again every reconcile."""
    active = {"type": "Active", "status": "True", "reason": "InProgress"}
    accepted = {"type": "Accepted", "status": "True", "reason": "Accepted"}
    current = {"phase": "Active", "conditions": [accepted, active]}
    assert same_status(current, {"phase": "Active", "conditions": [active]})
    assert not same_status(current, {"phase": "Active",
                                     "conditions": [{**active, "status": "False"}]})
    assert not same_status({"phase": "Active"}, {"conditions": [active]})


class RecordingKube(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.managers: list[tuple[str, str | None, str]] = []

    async def apply(self, res: k.Resource, name: str, body: k.Obj, *,
                    namespace: str | None = None, subresource: str | None = None,
                    field_manager: str = "m2g", force: bool = True) -> k.Obj:
        self.managers.append((name, subresource, field_manager))
        return await super().apply(res, name, body, namespace=namespace,
                                   subresource=subresource, field_manager=field_manager,
                                   force=force)


def cluster_with(kube: FakeKube, obj: dict[str, Any]) -> K8sCluster:
    cluster = K8sCluster(kube)  # type: ignore[arg-type]
    cluster.caches["grid_events"].apply_event({"type": "ADDED", "object": obj})
    return cluster


async def test_the_adapter_writes_the_condition_once_with_its_own_field_manager() -> None:
    kube = RecordingKube()
    stored = kube.put(k.GRID_EVENTS, grid_event(**{"phase": "Active", "conditions": [
        {"type": "Active", "status": "True", "reason": "InProgress"}]}))
    cluster = cluster_with(kube, stored)
    await cluster.mark_rejected(left_out())
    assert kube.managers == [("far", "status", FIELD_MANAGER)] and FIELD_MANAGER != "m2g"
    after = kube.stored(k.GRID_EVENTS, "far")
    types = [c["type"] for c in after["status"]["conditions"]]
    assert types == ["Active", "Accepted"] and after["status"]["phase"] == "Active"
    cluster.caches["grid_events"].apply_event({"type": "MODIFIED", "object": after})
    await cluster.mark_rejected(left_out())  # the cache shows it: nothing written
    assert len(kube.managers) == 1


async def test_nothing_is_looked_at_again_until_a_cache_or_the_left_out_set_changes() -> None:
    """A pass that wrote everything is not repeated while the caches and the left-out set stay
    as they were: not even before the write shows in the cache (no second write then)."""
    kube = RecordingKube()
    cluster = cluster_with(kube, kube.put(k.GRID_EVENTS, grid_event()))
    await cluster.mark_rejected(left_out())
    await cluster.mark_rejected(left_out())  # the cache does not show the write yet
    assert len(kube.managers) == 1
    await cluster.mark_rejected(left_out(reason="ValueError: other"))  # a new reason
    assert len(kube.managers) == 2


async def test_a_failed_write_is_logged_once_and_retried(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    kube = RecordingKube()
    cluster = cluster_with(kube, kube.put(k.GRID_EVENTS, grid_event()))
    kube.fail_next = [k.PermanentError("forbidden", 403, "Forbidden"),
                      k.PermanentError("forbidden", 403, "Forbidden")]
    with caplog.at_level(logging.WARNING, "m2g.wiring"):
        await cluster.mark_rejected(left_out())
        await cluster.mark_rejected(left_out())
    assert len([r for r in caplog.records if "not written" in r.message]) == 1
    await cluster.mark_rejected(left_out())  # the API lets it through now
    assert kube.stored(k.GRID_EVENTS, "far")["status"]["conditions"][0]["reason"] == "LeftOut"


async def test_the_applier_ignores_an_object_already_gone() -> None:
    (u,) = condition_updates({"grid_events": {"far": grid_event()}}, left_out(), T0)
    assert await Applier(FakeKube()).apply_condition(u) is False  # type: ignore[arg-type]
