"""m2g.k8s.caps against the in-memory FakeKube: cap records and node limits, written
concurrently, one failure stopping none of the others."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from m2g.k8s.annotations import POWER_CAP
from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.caps import apply_caps
from m2g.k8s.client import GPU_POWER_LIMITS, WORKLOADS, Kube, KubeError
from m2g.model.plan import CapAction, NodeLimitUpdate, Plan
from m2g.testing.kube import FakeKube

T0 = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)


def setup(workloads: int, nodes: int) -> tuple[FakeKube, Plan]:
    kube = FakeKube()
    for i in range(workloads):
        kube.put(WORKLOADS, {"metadata": {"name": f"w{i}", "namespace": "ns", "uid": f"u{i}"}})
    for n in range(nodes):  # FakeKube's apply needs the object; the API server would create it
        kube.put(GPU_POWER_LIMITS, {"metadata": {"name": f"n{n}"}})
    plan = Plan(
        caps=tuple(CapAction("ns", f"w{i}", 0.75, 2.0, "grid event") for i in range(workloads)),
        node_limits=tuple(NodeLimitUpdate(f"n{n}", 0.75, T0 + timedelta(seconds=120),
                                          (f"ns/w{n % workloads}",), "grid event")
                          for n in range(nodes)))
    return kube, plan


async def test_caps_and_node_limits_are_written_concurrently() -> None:
    kube, plan = setup(6, 12)
    inflight, peak = 0, 0
    patch, apply = kube.patch, kube.apply

    async def slow(call: Any, *args: Any, **kw: Any) -> Any:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        return await call(*args, **kw)

    limits: dict[str, float] = {}  # FakeKube's apply keeps only status: record the specs

    async def apply_limit(res: Any, name: str, body: Any, **kw: Any) -> Any:
        limits[name] = body["spec"]["fraction"]
        return await apply(res, name, body, **kw)

    kube.patch = lambda *a, **k: slow(patch, *a, **k)  # type: ignore[method-assign]
    kube.apply = lambda *a, **k: slow(apply_limit, *a, **k)  # type: ignore[method-assign]
    ap = Applier(cast(Kube, kube), clock=lambda: T0, parallel=4, background_events=True)
    result = ApplyResult()
    await apply_caps(ap, plan, result, known=lambda ns, name: kube.stored(WORKLOADS, name, ns))
    await ap.drain(5)
    assert not result.errors and peak == 4  # never more than ``parallel`` at once
    assert all(kube.stored(WORKLOADS, f"w{i}", "ns")["metadata"]["annotations"][POWER_CAP]
               == "0.75" for i in range(6))
    assert limits == {f"n{n}": 0.75 for n in range(12)}


async def test_one_failed_node_limit_stops_no_other() -> None:
    kube, plan = setup(1, 3)
    apply = kube.apply
    limits: list[str] = []

    async def failing(res: Any, name: str, body: Any, **kw: Any) -> Any:
        if name == "n0":
            raise KubeError("boom", 500, "InternalError")
        limits.append(name)
        return await apply(res, name, body, **kw)

    kube.apply = failing  # type: ignore[method-assign]
    ap = Applier(cast(Kube, kube), clock=lambda: T0, parallel=1)
    result = ApplyResult()
    await apply_caps(ap, plan, result)
    assert [what for what, _ in result.errors] == ["gpu-limit n0"]
    assert limits == ["n1", "n2"]
    assert kube.stored(WORKLOADS, "w0", "ns")["metadata"]["annotations"][POWER_CAP] == "0.75"


async def test_a_cap_of_a_workload_gone_is_no_failure() -> None:
    kube, plan = setup(2, 0)
    del kube.objects[("workloads", "ns", "w0")]  # the job finished: its Workload is deleted
    ap = Applier(cast(Kube, kube), clock=lambda: T0)
    result = ApplyResult()
    await apply_caps(ap, plan, result)
    assert not result.errors
    assert kube.stored(WORKLOADS, "w1", "ns")["metadata"]["annotations"][POWER_CAP] == "0.75"


def test_a_lift_stamps_its_time_so_the_next_lift_is_paced() -> None:
    """Lifting removes the cap and stamps the lift's time in ``m2g.io/power-cap-at``; without
    a stamp the ramp would count from an older action and every reconcile would lift a full
    step (as restores did). Not ``m2g.io/restored-at``: that is a pause's restore
    (tests/unit/test_cap_lift_stamp.py)."""
    from m2g.k8s.caps import cap_annotations

    capped = {POWER_CAP: "0.75", "m2g.io/power-cap-at": "2026-11-29T22:00:00Z"}
    lift = cap_annotations(CapAction("ns", "w", 1.0, -5.0, "event over", 30.0), capped,
                           "2026-11-29T23:00:00Z")
    assert lift == {POWER_CAP: None, "m2g.io/power-cap-at": "2026-11-29T23:00:00Z",
                    "m2g.io/flex-used-seconds": "30"}
    assert cap_annotations(CapAction("ns", "w", 1.0, 0.0, "none"), {}, "t") == {}


def test_a_lapsed_cap_set_anew_at_the_same_fraction_is_written_again() -> None:
    """A cap whose lease ran out (the agent restored full power) and that the plan sets again
    (``renew``) gets its record rewritten from now: its time is what the settling and the
    metering of the new cap count from. Without ``renew`` an equal record is left alone."""
    from m2g.k8s.caps import cap_annotations

    capped = {POWER_CAP: "0.75", "m2g.io/power-cap-at": "2026-11-29T22:00:00Z"}
    again = CapAction("ns", "w", 0.75, 5.0, "event", 40.0)
    assert cap_annotations(again, capped, "2026-11-29T23:00:00Z") == {}
    renewed = cap_annotations(replace(again, renew=True), capped, "2026-11-29T23:00:00Z")
    assert renewed == {POWER_CAP: "0.75", "m2g.io/power-cap-at": "2026-11-29T23:00:00Z",
                       "m2g.io/flex-used-seconds": "40"}
