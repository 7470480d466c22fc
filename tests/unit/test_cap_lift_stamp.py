"""A cap lift's time is the cap's own stamp (``m2g.io/power-cap-at`` with no cap), not the
pause-restore stamp ``m2g.io/restored-at``: the ramp still counts from the lift, but a job
whose cap was lifted is not read as restored work (in flight when Kueue preempts it) nor as
one that flapped when it is paused soon after."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta

from m2g.k8s import convert as kc
from m2g.k8s.annotations import POWER_CAP, POWER_CAP_AT
from m2g.k8s.caps import cap_annotations
from m2g.k8s.parse import format_time
from m2g.model.cluster import ClusterSnapshot, Phase
from m2g.model.factory import FactorySnapshot
from m2g.model.plan import CapAction
from m2g.planner.config import PlannerConfig
from m2g.planner.shedding import flapped, restoring
from tests.unit.test_k8s_convert import NOW, load

CFG = PlannerConfig(check_name="m2g")


def lifted_workload() -> dict[str, object]:
    """An admitted Workload whose 0.75 cap m2g lifted 5 s before ``NOW``, annotated as the
    applier writes it."""
    wl = copy.deepcopy(load("workload_admitted"))
    capped = {POWER_CAP: "0.75", POWER_CAP_AT: format_time(NOW - timedelta(minutes=5))}
    lift = cap_annotations(CapAction("ns", "w", 1.0, -5.0, "event over", 30.0), capped,
                           format_time(NOW - timedelta(seconds=5)))
    wl["metadata"]["annotations"] = {k: v for k, v in {**capped, **lift}.items()
                                     if v is not None}
    return wl


def test_a_lift_is_read_as_the_last_power_change_not_as_a_restore() -> None:
    ws = kc.workload(lifted_workload(), NOW)
    assert ws.power_cap == 1.0 and not ws.view.power_cap.capped
    assert ws.power_cap_at == NOW - timedelta(seconds=5)  # the ramp counts from the lift
    assert ws.restored_at is None


def test_a_job_preempted_or_paused_soon_after_its_lift_is_neither_restoring_nor_flapped(
        ) -> None:
    ws = kc.workload(lifted_workload(), NOW)
    preempted = replace(ws, phase=Phase.PENDING)  # Kueue evicted it 5 s after the lift
    snap = ClusterSnapshot(FactorySnapshot(NOW), (preempted,))
    assert not restoring(preempted, snap, CFG)  # not m2g's restored work in flight
    paused = replace(ws, shed_by_m2g=True, shed_at=NOW)
    assert not flapped(paused, CFG)  # a pause 5 s after a lift is not a flap
    # a real restore 5 s before the pause still is one
    assert flapped(replace(paused, restored_at=NOW - timedelta(seconds=5)), CFG)
