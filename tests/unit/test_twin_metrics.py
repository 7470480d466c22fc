"""The twin's report figures, as docs/twin-metrics.md defines them."""

from __future__ import annotations

import pytest
from twinkit import metrics as M
from twinkit import scenarios as S

import tests.unit.twin_path as tp


def event(target: float = 100.0, ramp: float = 10.0) -> M.GridEvent:
    return M.GridEvent(start=10.0, end=50.0, ramp=ramp, target_kw=target,
                       limit=lambda t: target)


def test_grid_figures_follow_the_definitions() -> None:
    # 150 kW until t=20, then 100.5 (within the 1 % tolerance), 105 at t=40..44, then 90
    samples = [(float(t), 150.0 if t < 20 else (105.0 if 40 <= t < 44 else
                                                (90.0 if t >= 44 else 100.5)))
               for t in range(0, 60, 2)]
    g = M.grid_figures(samples, event())
    assert g["targetKw"] == 100.0
    assert g["secondsToTarget"] == 10.0
    assert g["secondsAboveTarget"] == 14.0  # 10..20 and 40..44
    assert g["secondsAboveTargetAfterRamp"] == 4.0  # counted from 20
    assert g["kwhAboveTarget"] == pytest.approx((50 * 10 + 0.5 * 20 + 5 * 4) / 3600, abs=1e-3)
    assert g["maxRampKwPerSecond"] == pytest.approx(49.5 / 2)


def test_a_draw_that_never_gets_under_has_no_time_to_target() -> None:
    g = M.grid_figures([(0.0, 200.0), (30.0, 200.0), (60.0, 200.0)], event())
    assert g["secondsToTarget"] is None and g["secondsAboveTarget"] == 40.0


def test_no_event_no_grid_figures() -> None:
    g = M.grid_figures([(0.0, 1.0), (2.0, 3.0)], None)
    assert g["targetKw"] is None and g["maxRampKwPerSecond"] == 1.0


def test_baseline_is_the_minute_before() -> None:
    assert M.baseline_kw([(0.0, 5.0), (50.0, 10.0), (100.0, 20.0)], 101.0) == 15.0


def job(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "gpus": 8, "tier": 2, "running_at_event_start": True, "remaining_at_event_start": 1e9,
        "done_at_event_start": 0.0, "done_at_event_end": 0.0, "submitted": 0.0,
        "admitted": 1.0, "finished": None, "evictions": 0, "restarts": 0, "lost": 0.0,
        "runs": [["n1"]], "topology": ""}
    base.update(kw)
    return base


def test_weighted_performance_is_emeralds() -> None:
    window = 100.0
    jobs = [job(gpus=8, tier=0, done_at_event_end=800.0),  # full speed: 1.0
            job(gpus=24, tier=3, done_at_event_end=1200.0),  # half speed: 0.5
            job(gpus=8, tier=1, remaining_at_event_start=400.0, done_at_event_end=400.0),
            job(gpus=8, tier=2, running_at_event_start=False)]  # arrived later: not counted
    w = M.workload_figures(jobs, 60.0, 100.0, window)
    assert w["perTier"] == {"0": 1.0, "1": 1.0, "2": None, "3": 0.5}
    assert w["weightedPerformance"] == pytest.approx((8 + 12 + 8) / 40)


def test_performance_lost_is_split_by_what_cost_it() -> None:
    window = 100.0  # each job could do gpus × 100 in the window
    jobs = [job(gpus=8, tier=0, done_at_event_end=400.0,  # preempted by Kueue: lost 0.5
                event_stops=["Preempted/InClusterQueue", "Deactivated"]),
            job(gpus=8, tier=0, done_at_event_end=600.0, event_capped_s=50.0),  # capped: 0.25
            job(gpus=16, tier=0, done_at_event_end=1600.0),  # full speed: nothing lost
            job(gpus=8, tier=2, done_at_event_end=0.0, event_stalled_s=100.0),  # stalled: all
            job(gpus=8, tier=3, done_at_event_end=200.0)]  # ran late: slow, 0.75 lost
    w = M.workload_figures(jobs, 60.0, 100.0, window)
    lost = w["performanceLostBy"]
    assert lost["0"] == {"stopped:Preempted/InClusterQueue": pytest.approx(8 * 0.5 / 32),
                         "capped": pytest.approx(8 * 0.25 / 32)}
    assert lost == {"0": lost["0"], "2": {"stalled": 1.0}, "3": {"slow": 0.75}}
    for t, by in lost.items():  # the parts add up to what the tier lost
        assert sum(by.values()) == pytest.approx(1.0 - w["perTier"][t], abs=1e-3)


def test_stop_cause_reads_kueues_conditions() -> None:
    from twinkit.driver import stop_cause

    def wl(*conds: dict[str, str], active: bool = True) -> dict[str, object]:
        return {"spec": {"active": active}, "status": {"conditions": list(conds)}}
    evicted = {"type": "Evicted", "status": "True", "reason": "Preempted"}
    assert stop_cause(wl(evicted, {"type": "Preempted", "status": "True",
                                   "reason": "InCohortReclamation"})) \
        == "Preempted/InCohortReclamation"
    assert stop_cause(wl({**evicted, "reason": "Deactivated"})) == "Deactivated"
    assert stop_cause(wl({**evicted, "status": "False"}, active=False)) == "inactive"
    assert stop_cause(wl()) == "pods-stopped" and stop_cause(None) == "workload-gone"


def test_waits_and_jct_are_in_trace_seconds() -> None:
    jobs = [job(submitted=0.0, admitted=2.0, finished=10.0),
            job(submitted=5.0, admitted=None)]  # never admitted: waits until the run's end
    w = M.workload_figures(jobs, 60.0, 20.0, None)
    assert w["queueWaitSeconds"]["p50"] == 120.0 and w["queueWaitSeconds"]["p99"] == 900.0
    assert w["jctSeconds"] == {"p50": 600.0, "p95": 600.0}
    assert w["completed"] == 1 and w["weightedPerformance"] is None


def test_fragmentation_counts_free_gpus_a_task_cannot_use() -> None:
    sizes = {8: 0.5, 64: 0.5}
    # rack a: 16 free (8 fits, 64 does not → 16 × 0.5); rack b: 72 free (both fit)
    assert M.fragmentation({"a": 16, "b": 72}, sizes) == pytest.approx(8.0)
    assert M.fragmentation({"a": 4}, {8: 1.0, 144: 5.0}) == pytest.approx(4.0)  # >72 ignored


def test_placement_figures() -> None:
    rack = {"n1": "r1", "n2": "r1", "n3": "r2"}
    block = {"n1": "b1", "n2": "b1", "n3": "b2"}
    jobs = [job(runs=[["n1", "n2"]]), job(runs=[["n1", "n3"]]),
            job(gpus=144, topology="required-block", runs=[["n1", "n3"]])]
    p = M.placement_figures(jobs, rack, block, 2, [1.0, 3.0])
    assert p == {"inOneNvlinkDomainPct": 50.0, "onAlarmedRacks": 2, "fragmentation": 2.0,
                 "topologyViolations": 1}
    # a required clique broken by a run over two racks is a violation; a preferred one is not
    jobs += [job(topology="required-clique", runs=[["n1", "n2"], ["n2", "n3"]]),
             job(topology="preferred-rack", runs=[["n1", "n3"]])]
    p = M.placement_figures(jobs, rack, block, 0, [])
    assert p["topologyViolations"] == 2 and p["inOneNvlinkDomainPct"] == 25.0


def test_allocation_outside_the_event_and_its_tail() -> None:
    samples = [(0.0, 50.0, 0.0), (100.0, 10.0, 0.0), (250.0, 10.0, 0.0), (400.0, 100.0, 0.0)]
    assert M.allocation_outside(samples, 100, 90.0, 200.0) == 75.0


def test_controller_figures_from_the_exposition() -> None:
    text = "\n".join([
        'm2g_admission_decisions_total{state="Ready",policy="none"} 7.0',
        'm2g_admission_decisions_total{state="Retry",policy="grid"} 3.0',
        'm2g_shed_actions_total{action="shed"} 2.0',
        'm2g_shed_actions_total{action="restore"} 1.0',
        'm2g_power_cap_actions_total{action="cap"} 5.0',
        'm2g_power_cap_actions_total{action="lift"} 4.0',
        'm2g_resize_actions_total{action="shrink"} 6.0',
        'm2g_resize_actions_total{action="grow"} 2.0',
        'm2g_reaction_latency_seconds_bucket{le="0.5"} 50.0',
        'm2g_reaction_latency_seconds_bucket{le="1.0"} 100.0',
        'm2g_reaction_latency_seconds_bucket{le="+Inf"} 100.0'])
    m = M.parse_prometheus(text)
    assert M.actions_from_metrics(m, 4) == {"admits": 7, "defers": 3, "sheds": 2,
                                            "restores": 1, "drains": 0, "powerCaps": 5,
                                            "capLifts": 4, "resizes": 6, "resizeGrows": 2,
                                            "quotaChanges": 4}
    r = M.reaction(m)
    assert r["reactionSecondsP50"] == 0.5 and r["reactionSecondsP99"] == pytest.approx(0.99)


def test_the_srp_event_shape_from_the_shipped_file() -> None:
    shape = S.srp_shape((tp.DATA / "emerald-dr-2025" / "SRP_total_power.csv").read_text())
    assert 0.25 <= shape.depth <= 0.32  # ≈30 % below the pre-event draw
    assert 600 <= shape.ramp_s <= 1500  # ramp of 10-20 minutes
    assert 3 * 3600 <= shape.duration_s <= 3.6 * 3600
    ivs = S.ramp_intervals(1000.0, shape.depth, 16.0, 200.0)
    assert [iv.limit_kw for iv in ivs][-1] == pytest.approx(1000 * (1 - shape.depth), abs=0.1)
    assert ivs[0].limit_kw > ivs[-1].limit_kw and sum(iv.duration_s for iv in ivs) == 200
    assert S.limit_at(ivs, 0.5) == ivs[0].limit_kw and S.limit_at(ivs, 500) is None


def test_warm_start_jobs_count_in_performance_not_in_waits() -> None:
    jobs = [job(submitted=0.0, admitted=10.0, finished=20.0, prefill=True,
                done_at_event_end=800.0),
            job(submitted=0.0, admitted=1.0, finished=2.0)]
    w = M.workload_figures(jobs, 60.0, 30.0, 100.0)
    assert w["queueWaitSeconds"]["p99"] == 60.0 and w["jctSeconds"]["p95"] == 120.0
    assert w["completed"] == 2 and w["perTier"]["2"] == pytest.approx(0.5)


def test_the_driver_reads_m2g_caps_as_the_agents_apply_them() -> None:
    from twinkit.driver import _fault_maps, agent_caps
    limits = [{"metadata": {"name": "n1"}, "spec": {"nodeName": "n1", "fraction": 0.75},
               "status": {"gpus": [{"limitWatts": 1050, "defaultWatts": 1400}] * 4}},
              {"metadata": {"name": "n2"}, "spec": {"nodeName": "n2", "fraction": 0.5}}]
    caps, failed = _fault_maps(agent_caps(limits))
    assert caps == {"n1": 0.75} and not failed  # n2: not applied yet, full speed


def test_admission_latency_per_step_outside_the_event() -> None:
    jobs = [{"namespace": "ns", "name": f"j{i}", "workload": f"w{i}", "submitted": 10.0 * i,
             "quota_reserved": 10.0 * i + 1, "check_ready": 10.0 * i + 1 + i,
             "admitted": 10.0 * i + 2 + i, "bound": 10.0 * i + 5 + i} for i in range(1, 5)]
    jobs.append({**jobs[0], "name": "warm", "prefill": True, "check_ready": 99.0})
    # submitted before the event, its quota reserved in it: only its first step counts
    jobs.append({**jobs[0], "name": "in-event", "submitted": 50.0, "quota_reserved": 61.0,
                 "check_ready": 90.0, "admitted": 91.0, "bound": 93.0})
    decided = {f"ns/w{i}": 10.0 * i + 1 + i - 0.4 for i in range(1, 5)}
    lat = M.admission_latency(jobs, decided, start=60.0, end=65.0)
    assert lat["submittedToQuotaReserved"] == {"p50": 1.0, "p95": 11.0, "n": 5}
    assert lat["quotaReservedToCheckReady"] == {"p50": 2.0, "p95": 4.0, "n": 4}
    assert lat["quotaReservedToDecided"] == {"p50": 1.6, "p95": 3.6, "n": 4}
    assert lat["decidedToCheckReady"]["p50"] == 0.4
    assert lat["checkReadyToAdmitted"] == {"p50": 1.0, "p95": 1.0, "n": 4}
    assert lat["admittedToBound"]["p50"] == 3.0
    plain = [{k: v for k, v in j.items() if k != "check_ready"} for j in jobs]
    assert set(M.admission_latency(plain)) == {"submittedToQuotaReserved",
                                               "quotaReservedToAdmitted", "admittedToBound"}
