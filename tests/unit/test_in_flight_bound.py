"""Work admitted and not drawing yet is never counted above what the racks can still draw: a
rack draws at most its cap (``Rack.cap_kw``), so the kW in flight are bounded by the sum of
the racks' caps less their readings (m2g.planner.shedding.in_flight_kw). A twin's warm start
read more kW in flight than the whole factory could add and held new work for it."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot, Node, PowerDomain, Rack, Reading
from m2g.model.inputs import WorkloadView
from m2g.planner.config import PlannerConfig
from m2g.planner.headroom import Headroom
from m2g.planner.shedding import in_flight_kw

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
CFG = PlannerConfig(check_name="m2g")


def factory(readings: tuple[float | None, ...], cap_kw: float = 132.0) -> FactorySnapshot:
    racks = tuple(Rack(f"r{i}", "b0", "pd-0", power_kw=Reading(kw, 1.0 if kw is not None
                                                                else math.inf), cap_kw=cap_kw)
                  for i, kw in enumerate(readings))
    return FactorySnapshot(now=NOW, site_budget_kw=3200.0, power_domains=(PowerDomain("pd-0"),),
                           racks=racks, nodes=tuple(Node(f"n{i}", r.name)
                                                    for i, r in enumerate(racks)))


def admitted(n: int, kw: float = 20.0) -> tuple[WorkloadState, ...]:
    """``n`` workloads admitted 10 s ago whose pods m2g does not see yet (not drawing)."""
    return tuple(WorkloadState(
        "t", f"w{i}", WorkloadView(name=f"w{i}", namespace="t", gpus=16, estimated_kw=kw),
        Phase.ADMITTED, admitted_at=NOW - timedelta(seconds=10)) for i in range(n))


def snap(f: FactorySnapshot, ws: tuple[WorkloadState, ...],
         live: dict[str, LivePods] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(f, ws, live_pods={} if live is None else live)


def test_in_flight_is_bounded_by_the_room_under_the_racks_caps() -> None:
    ws = admitted(10)  # 200 kW by their estimates
    # four racks at 110 of 132 kW: at most 88 kW more can show in the meter
    assert in_flight_kw(snap(factory((110.0,) * 4), ws), CFG) == 88.0
    # room enough under the caps: the estimates stand
    assert in_flight_kw(snap(factory((20.0,) * 4), ws), CFG) == 200.0
    # a rack over its cap (a misconfigured cap) adds nothing, never less than 0
    assert in_flight_kw(snap(factory((140.0, 110.0, 110.0, 110.0)), ws), CFG) == 66.0


def test_no_bound_without_caps_and_a_stale_rack_adds_nothing() -> None:
    ws = admitted(10)
    assert in_flight_kw(snap(factory((110.0,) * 4, cap_kw=0.0), ws), CFG) == 200.0
    # a rack without a fresh reading is counted at its cap by the draw's bound already
    assert in_flight_kw(snap(factory((110.0, 110.0, 110.0, None)), ws), CFG) == 66.0


def test_new_work_is_admitted_into_the_room_the_racks_really_have() -> None:
    """The warm start's shape: the racks near their caps, far under the site's limit, with
    more kW "in flight" than the racks could add. The headroom is the limit less the
    reading less what the racks can still draw, not less the estimates."""
    f = factory((110.0,) * 16)  # 1,760 kW read, caps 2,112 kW, limit 3,200 kW
    head = Headroom.of(snap(f, admitted(80)), CFG)  # 1,600 kW by the estimates
    assert head is not None
    assert head.in_flight == 352.0
    assert head.room == 3200.0 * (1 - CFG.restore_margin) - 1760.0 - 352.0 > 0
    # the pods seen running long ago: nothing in flight at all
    live = {w.key: LivePods(2, started_at=NOW - timedelta(minutes=5)) for w in admitted(80)}
    assert Headroom.of(snap(f, admitted(80), live), CFG).in_flight == 0.0  # type: ignore[union-attr]
    assert replace(f, racks=()).room_under_rack_caps_kw() == math.inf
