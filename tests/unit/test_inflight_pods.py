"""The pods are read when the work admitted within the last minute could bring the site near
its limit (m2g.k8s.build._near_limit): without them the headroom gate counts all of that work
as admitted and not drawing yet (a 16-rack twin's warm start: 1,469 kW beside a 1,788 kW
reading under a 3,200 kW budget, 2026-12-07)."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta

from m2g.k8s.build import build_snapshot
from m2g.k8s.parse import format_time
from m2g.model.cluster import Phase
from m2g.planner.config import PlannerConfig
from m2g.planner.preplace import candidate
from m2g.planner.shedding import in_flight_kw, workload_kw
from m2g.testing.scale import LABELS, NOW, generate


def _site(budget_factor: float, admitted_ago_s: float | None):
    """A generated 6-rack site without its grid event, its budget ``budget_factor`` × the
    draw, and (``admitted_ago_s``) every running workload admitted that long ago, its pods
    running since then."""
    objs, readings = generate(6, 240)
    draw = sum(r.power_kw.value for r in readings.racks.values()
               if r.power_kw.value is not None)
    domains = copy.deepcopy(dict(objs.power_domains))
    domains["site"]["spec"]["budgetKw"] = draw * budget_factor
    workloads, pods = dict(objs.workloads), dict(objs.pods)
    if admitted_ago_s is not None:
        at = format_time(NOW - timedelta(seconds=admitted_ago_s))
        for key, wl in workloads.items():
            wl = copy.deepcopy(wl)
            for c in wl["status"]["conditions"]:
                if c["type"] == "Admitted":
                    c["lastTransitionTime"] = at
            workloads[key] = wl
        for key, pod in pods.items():
            pod = copy.deepcopy(pod)
            pod["status"]["startTime"] = at
            pods[key] = pod
    objs = dataclasses.replace(objs, power_domains=domains, grid_events={},
                               workloads=workloads, pods=pods)
    return build_snapshot(objs, readings, NOW, labels=LABELS), draw


def test_pods_are_read_when_recent_admissions_could_reach_the_limit() -> None:
    config = PlannerConfig()
    quiet, draw = _site(1.5, None)  # admitted long ago, 67 % of the budget: not near
    assert quiet.live_pods is None and quiet.placements == {}
    # unread, the few admitted within settle_seconds count whole: far under the limit
    assert in_flight_kw(quiet, config) == sum(
        workload_kw(w, config) for w in quiet.workloads if w.phase is Phase.ADMITTED
        and w.admitted_at is not None and w.admitted_at > NOW - timedelta(seconds=60)) < 0.05 * draw
    warm, _ = _site(1.5, 30.0)  # all admitted 30 s ago: in flight up to the limit's 90 %
    recent = sum(workload_kw(w, config) for w in warm.workloads
                 if w.phase is Phase.ADMITTED)
    assert draw + recent > 0.9 * 1.5 * draw  # the case: pods unread would count it all
    assert warm.live_pods is not None and warm.live_pods
    # running 30 s (more than meter_lag_seconds): in the reading, not in flight — only the
    # admitted workloads with no bound pod are
    unbound = sum(workload_kw(w, config) for w in warm.workloads
                  if w.phase is Phase.ADMITTED and w.key not in warm.live_pods)
    assert in_flight_kw(warm, config) == unbound < recent / 2
    unread = dataclasses.replace(warm, live_pods=None, placements={})
    # unread, all of it counts (what the gate read before), up to what the racks can still
    # add under their caps (m2g.planner.shedding.in_flight_kw)
    assert in_flight_kw(unread, config) == min(recent, unread.factory.room_under_rack_caps_kw())
    assert in_flight_kw(unread, config) > in_flight_kw(warm, config)
    # far under the limit even with all of it: still not read (no cost at a quiet site)
    roomy, _ = _site(4.0, 30.0)
    assert roomy.live_pods is None


def test_placements_are_read_while_an_elastic_workload_waits_when_asked() -> None:
    """m2g.planner.preplace reads Kueue's view of each NVLink domain from the placements:
    ``elastic_placements`` (m2g run: ``nvlinkPreplace``) has them read while an elastic
    workload waits with m2g's check; off (the default), the snapshot is as before."""
    objs, readings = generate(6, 240)
    domains = copy.deepcopy(dict(objs.power_domains))
    domains["site"]["spec"]["budgetKw"] = 1e9  # far from the limit: pods not read for it
    workloads = dict(objs.workloads)
    wl = copy.deepcopy(next(iter(workloads.values())))
    wl["metadata"].update(name="elastic", ownerReferences=[
        {"apiVersion": "batch/v1", "kind": "Job", "name": "elastic", "uid": "job-e"}])
    wl["metadata"]["annotations"] = {"kueue.x-k8s.io/elastic-job": "true",
                                     "m2g.io/min-parallelism": "1"}
    wl["status"] = {"admissionChecks": [{"name": "m2g-policy", "state": "Pending"}]}
    workloads["team-0/elastic"] = wl
    objs = dataclasses.replace(objs, power_domains=domains, grid_events={}, workloads=workloads)
    off = build_snapshot(objs, readings, NOW, labels=LABELS)
    waiting = next(w for w in off.workloads if w.name == "elastic")
    assert waiting.phase is Phase.PENDING and waiting.elastic_job and waiting.check
    assert off.placements == {}
    on = build_snapshot(objs, readings, NOW, labels=LABELS, elastic_placements=True)
    assert len(on.placements) > 100  # the admitted workloads' hosts
    # elastic in Kueue's eyes without m2g's min-parallelism: a preplace candidate too
    del wl["metadata"]["annotations"]["m2g.io/min-parallelism"]
    bare = build_snapshot(objs, readings, NOW, labels=LABELS, elastic_placements=True)
    waiting = next(w for w in bare.workloads if w.name == "elastic")
    assert not waiting.elastic_job and waiting.kueue_elastic and candidate(waiting)
    assert len(bare.placements) > 100
