"""The tenant trust boundary: a workload's declared kW (``m2g.io/estimated-kw``, the tenant's
word) cannot be lower than its GPUs × the measured draw per GPU (at most the planner's default
per GPU), so a tiny estimate cannot slip a large job into little headroom."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder, kw_floor_per_gpu, trusted_view
from m2g.planner.plan import make_plan
from m2g.policy import Evaluator, load_dir

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
POWER = Path(__file__).resolve().parents[2] / "policies" / "power-budget"


def factory(draw_kw: float, allocated: int, fresh: bool = True) -> FactorySnapshot:
    nodes = tuple(Node(f"n{i}", "rack-0", gpus_allocated=min(4, max(0, allocated - 4 * i)))
                  for i in range(18))
    rack = Rack("rack-0", "block-0", "pd-0", power_kw=Reading(draw_kw if fresh else None, 5.0),
                cap_kw=132.0)
    return FactorySnapshot(now=NOW, site_budget_kw=draw_kw + 10.0,
                           power_domains=(PowerDomain("pd-0"),), racks=(rack,), nodes=nodes)


def job(gpus: int, kw: float) -> WorkloadState:
    view = WorkloadView(name="big", namespace="t", gpus=gpus, estimated_kw=kw, cluster_queue="cq")
    return WorkloadState("t", "big", view, Phase.RESERVED, cluster_queue="cq",
                         check=PlannerConfig().check_name,
                         check_state=CheckState.PENDING)


def test_floor_is_the_measured_draw_per_gpu_capped_by_the_default() -> None:
    assert kw_floor_per_gpu(ClusterSnapshot(factory(60.0, 60)), 1.34) == pytest.approx(1.0)
    assert kw_floor_per_gpu(ClusterSnapshot(factory(600.0, 60)), 1.34) == 1.34
    assert kw_floor_per_gpu(ClusterSnapshot(factory(60.0, 60, fresh=False)), 1.34) == 1.34
    assert kw_floor_per_gpu(ClusterSnapshot(factory(60.0, 0)), 1.34) == 1.34


def test_a_declared_estimate_is_raised_never_lowered() -> None:
    low = WorkloadView(gpus=512, estimated_kw=0.01)
    assert trusted_view(low, 1.0).estimated_kw == 512.0
    high = WorkloadView(gpus=8, estimated_kw=20.0)
    assert trusted_view(high, 1.0) is high


def test_a_tiny_estimate_does_not_admit_a_512_gpu_job_into_10_kw() -> None:
    ev = Evaluator(load_dir(POWER, "cel-expr-python"))
    snap = ClusterSnapshot(factory(60.0, 60), (job(512, 0.01),))
    (check,) = make_plan(snap, ev, PlannerConfig()).checks
    assert check.state is not CheckState.READY  # 512 GPUs x 1 kW measured >> 10 kW headroom
    builder = InputBuilder(snap, PlannerConfig().default_kw_per_gpu)
    assert builder.for_workload(snap.workloads[0]).workload.estimated_kw == pytest.approx(512.0)


def test_an_honest_small_job_still_fits() -> None:
    ev = Evaluator(load_dir(POWER, "cel-expr-python"))
    snap = ClusterSnapshot(factory(60.0, 60), (job(4, 5.0),))
    (check,) = make_plan(snap, ev, PlannerConfig()).checks
    assert check.state is CheckState.READY


# -- flex tiers: the platform's word (ClusterQueue annotation), not the tenant's label -------------
def _tiered(tier: str) -> dict[str, Any]:
    from tests.unit.test_k8s_convert import load

    wl = copy.deepcopy(load("workload_admitted"))  # admitted to ClusterQueue rec-cq
    wl["metadata"]["labels"]["m2g.io/flex-tier"] = tier
    return wl


def _cq(name: str, floor: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if floor is not None:
        meta["annotations"] = {"m2g.io/min-flex-tier": floor}
    return {"metadata": meta, "spec": {}}


@pytest.mark.parametrize(("declared", "floor", "effective"), [
    ("0", "2", 2), ("1", "2", 2), ("3", "2", 3), ("0", None, 0), ("0", "0", 0),
    ("0", "9", 0), ("0", "-1", 0), ("0", "two", 0), ("garbage", "1", 1)])
def test_a_queue_floor_raises_a_declared_tier(declared: str, floor: str | None,
                                              effective: int) -> None:
    """``m2g.io/flex-tier: 0`` opted any job out of shedding; a ClusterQueue's
    ``m2g.io/min-flex-tier`` (which tenants cannot edit) now raises it. A floor that is not
    0–3 allows every tier (the queue is not restricted), never a traceback."""
    from m2g.k8s import build as kb

    objs = kb.ClusterObjects(workloads={"rec/w": _tiered(declared)},
                             cluster_queues={"rec-cq": _cq("rec-cq", floor),
                                             "other": _cq("other", "3")})
    (ws,) = kb.build_snapshot(objs, None, NOW).workloads
    assert ws.view.flex_tier == effective


def test_the_floor_follows_the_queue_across_reconciles() -> None:
    """The workload memo keys on the floors too: raising a queue's floor changes the tier of
    its unchanged workloads at the next snapshot."""
    from m2g.k8s import build as kb
    from m2g.k8s.build import SnapshotMemo

    memo = SnapshotMemo()
    wls = {"rec/w": _tiered("0")}
    first = kb.build_snapshot(kb.ClusterObjects(workloads=wls, cluster_queues={
        "rec-cq": _cq("rec-cq", None)}), None, NOW, memo=memo)
    later = kb.build_snapshot(kb.ClusterObjects(workloads=wls, cluster_queues={
        "rec-cq": _cq("rec-cq", "2")}), None, NOW, memo=memo)
    assert [w.view.flex_tier for w in (*first.workloads, *later.workloads)] == [0, 2]


@pytest.mark.parametrize("floor", ["9", "-1", "two", "", "1.5"])
def test_an_invalid_queue_floor_is_reported_not_ignored_silently(floor: str) -> None:
    """Before, a value that is not 0-3 was ignored without a word (every tier allowed). Now
    the snapshot lists it (``rejected`` with ``part``: the queue itself is used), so the
    controller logs it, counts it and puts a Warning Event ``Ignored`` on the ClusterQueue,
    and ``m2g queues`` prints a warning; a valid floor is not reported."""
    from m2g.k8s import build as kb

    objs = kb.ClusterObjects(workloads={"rec/w": _tiered("0")},
                             cluster_queues={"rec-cq": _cq("rec-cq", floor),
                                             "ok": _cq("ok", "2"), "none": _cq("none", None)})
    snap = kb.build_snapshot(objs, None, NOW)
    (r,) = snap.rejected
    assert (r.kind, r.name, r.part) == ("ClusterQueue", "rec-cq",
                                        "annotation m2g.io/min-flex-tier")
    assert f"{floor!r} is not 0-3" in r.reason and "every flex tier is allowed" in r.reason
    assert snap.workloads[0].view.flex_tier == 0  # decided as before: every tier allowed


async def test_an_invalid_queue_floor_is_worded_ignored_everywhere(
        caplog: pytest.LogCaptureFixture) -> None:
    """The queue is used, only its floor is not: ``m2g status`` lists it under ``ignored``
    (not ``leftOut``), the CLI's warning, the controller's log line and its Event say
    "ignored", and no ``Accepted=False`` condition is written for such a part."""
    import dataclasses
    import json
    import logging

    from m2g.k8s import build as kb
    from m2g.k8s.validity import condition_updates
    from m2g.model.cluster import Rejected
    from m2g.testing.kube import FakeKube
    from m2g_cli.cluster import rejected_warning
    from m2g_cli.status_cmd import render_status, status_data
    from m2g_cli.views import Output
    from m2g_controllers.wiring import K8sCluster
    from tests.unit.test_manager import RejectingCluster, manager

    cq = _cq("rec-cq", "9")
    snap = kb.build_snapshot(kb.ClusterObjects(workloads={"rec/w": _tiered("0")},
                                               cluster_queues={"rec-cq": cq}), None, NOW)
    (r,) = snap.rejected
    gone = Rejected("GridEvent", "far", "ValueError: start ...")
    data = status_data(dataclasses.replace(snap, rejected=(r, gone)), [], {}, None,
                       ("m2g-system", "m2g-controller"))
    assert data["leftOut"] == [{"kind": "GridEvent", "name": "far",
                                "reason": "ValueError: start ..."}]
    assert data["ignored"] == [{"kind": "ClusterQueue", "name": "rec-cq",
                                "part": "annotation m2g.io/min-flex-tier", "reason": r.reason}]
    assert json.loads(render_status(data, Output.JSON))["ignored"] == data["ignored"]
    text = render_status(data, Output.TABLE)
    assert "Left out:  1\nIgnored:   1 " in text
    assert ("\nignored the annotation m2g.io/min-flex-tier of ClusterQueue rec-cq: "
            "annotation m2g.io/min-flex-tier '9' is not 0-3: ignored") in text
    assert "left out ClusterQueue" not in text and "left out GridEvent far" in text
    assert rejected_warning(r).startswith(
        "ignored the annotation m2g.io/min-flex-tier of ClusterQueue rec-cq: ")
    assert rejected_warning(gone).startswith("left out GridEvent far: ")

    c = RejectingCluster()
    c.rejected = (r,)
    with caplog.at_level(logging.WARNING):
        await manager(c).reconcile()
    lines = [x.getMessage() for x in caplog.records if "rec-cq" in x.getMessage()]
    assert lines == [f"ignored the annotation m2g.io/min-flex-tier of ClusterQueue rec-cq "
                     f"(the ClusterQueue itself is used): {r.reason}"]

    cluster = K8sCluster(FakeKube())  # type: ignore[arg-type]
    cluster.caches["cluster_queues"].apply_event({"type": "ADDED", "object": cq})
    events: list[tuple[str, str]] = []

    async def emit(involved: Any, reason: str, message: str, *_: Any, **__: Any) -> Any:
        events.append((reason, message))

    cluster.applier.emit_event = emit  # type: ignore[method-assign]
    await cluster.report_rejected([r])
    assert events == [("Ignored", "m2g ignores the annotation m2g.io/min-flex-tier of this "
                                  f"ClusterQueue (the rest of it is used): {r.reason}")]
    grid = {"metadata": {"name": "far", "generation": 1}}
    assert condition_updates({"grid_events": {"far": grid}}, (dataclasses.replace(
        gone, part="annotation x"),), "2026-12-01T10:00:00Z") == []
