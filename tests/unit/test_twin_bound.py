"""The twin's performance bound (bench/twinkit/bound.py): the LP relaxation over each job's
convex hull of (kW saved, loss), per slice of the event, from the simulator's power model."""

from __future__ import annotations

from typing import Any

import pytest
from twinkit.bound import firm_arrivals, hull_segments, options, performance_bound

from m2g.model.inputs import WorkloadKind
from m2g.sim.power import PowerModel

PM = PowerModel()
E = 3600.0  # the event, trace seconds


def job(tier: int, gpus: int = 16, hours: float = 10.0, kind: str = "training") -> dict[str, Any]:
    return {"tier": tier, "gpus": gpus, "kind": kind, "running_at_event_start": True,
            "remaining_at_event_start": gpus * hours * 3600.0, "done_at_event_start": 0.0,
            "done_at_event_end": 1.0}


def gpu_kw(kind: WorkloadKind = WorkloadKind.TRAINING) -> float:
    return (PM.gpu_watts(kind, 1.0) - PM.idle_w) / 1000.0


def test_hull_segments_are_convex_and_sum_to_the_pause() -> None:
    pts = options(WorkloadKind.TRAINING, 16, PM, (0.875, 0.75, 0.625, 0.5))
    segs = hull_segments(pts)
    slopes = [loss / kw for kw, loss in segs]
    assert slopes == sorted(slopes) and all(kw > 0 for kw, _ in segs)
    assert sum(kw for kw, _ in segs) == pytest.approx(16 * gpu_kw())
    assert sum(loss for _, loss in segs) == pytest.approx(16.0)  # paused: all throughput


def test_nothing_asked_keeps_everything_and_firm_work_is_never_touched() -> None:
    jobs = [job(0), job(2)]
    assert performance_bound(jobs, 0.0, E)["weightedPerformance"] == 1.0  # type: ignore[index]
    # asking more than the flexible job can give: no controller meets it with this work
    got = performance_bound(jobs, 16 * gpu_kw() + 1.0, E)
    assert got is not None and got["weightedPerformance"] is None
    assert got["flexibleKw"] == pytest.approx(16 * gpu_kw(), abs=0.1)


def test_pausing_one_of_two_equal_jobs_halves_the_weighted_performance() -> None:
    got = performance_bound([job(3), job(3)], 16 * gpu_kw(), E, slices=10)
    assert got is not None
    # the cheapest kW are the first cap steps of both, so the bound beats pausing one (0.5)
    assert 0.5 < got["weightedPerformance"] < 1.0


def test_jobs_that_finish_free_their_kw_and_the_grace_is_free() -> None:
    ask = 16 * gpu_kw()
    short = [job(0, hours=0.25), job(3)]  # the firm job ends a quarter into the event
    stays = [job(0), job(3)]
    a = performance_bound(short, ask, E, slices=20)["weightedPerformance"]  # type: ignore[index]
    b = performance_bound(stays, ask, E, slices=20)["weightedPerformance"]  # type: ignore[index]
    assert a > b
    g = performance_bound(stays, ask, E, slices=20, grace_s_trace=E / 2)
    assert g is not None and g["weightedPerformance"] > b
    assert performance_bound(stays, ask, None) is None


def test_firm_work_started_inside_the_event_is_asked_of_the_flexible_jobs() -> None:
    jobs = [job(3), job(3)]
    alone = performance_bound(jobs, 4 * gpu_kw(), E, slices=10)
    late = firm_arrivals([{"tier": 0, "gpus": 8, "kind": "training", "bound": 110.0,
                           "finished": 130.0},
                          {"tier": 0, "gpus": 8, "kind": "training", "bound": 90.0},  # before
                          {"tier": 2, "gpus": 8, "kind": "training", "bound": 110.0},
                          {"tier": 0, "gpus": 8, "kind": "training", "bound": 120.0}],
                         100.0, 160.0, 60.0, PM)
    # wall 110-130 and 120-160 (the event's end) → trace seconds after its start
    assert [(a, b) for a, b, _ in late] == [(600.0, 1800.0), (1200.0, 3600.0)]
    assert late[0][2] == pytest.approx(8 * gpu_kw())
    both = performance_bound(jobs, 4 * gpu_kw(), E, slices=10, firm_new=late)
    assert alone is not None and both is not None
    assert both["weightedPerformance"] < alone["weightedPerformance"]
