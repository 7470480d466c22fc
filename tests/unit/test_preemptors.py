"""Held-back preemptors keep their quota while their victims wait (m2g.planner.preemptors)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.plan import CheckUpdate
from m2g.planner.headroom import POLICY, share
from m2g.planner.preemptors import RULE, hold, victims
from tests.unit.test_curtail import CFG, NOW, factory, job
from tests.unit.test_headroom import LIMIT, pending, ready


def preemptor(name: str = "big", reserved_s: float = 20.0) -> WorkloadState:
    return replace(pending(name, 2, priority=5), uid=f"uid-{name}",
                   reserved_at=NOW - timedelta(seconds=reserved_s))


def victim(name: str, of: str, phase: Phase = Phase.PENDING) -> WorkloadState:
    return replace(job(name, 0), phase=phase, admitted_at=None, preempted_by=of)


def retry(w: WorkloadState, policy: str = POLICY) -> CheckUpdate:
    return CheckUpdate(w.namespace, w.name, "m2g", CheckState.RETRY, "no room (123 kW)",
                       requeue_after_seconds=30, policy=policy, rule="shared-room")


def test_only_waiting_victims_count() -> None:
    s = ClusterSnapshot(factory(100.0), (victim("v1", "uid-a"), victim("v2", "uid-a"),
                                         victim("v3", "uid-b", Phase.ADMITTED),
                                         victim("v4", "uid-c", Phase.INACTIVE)))
    assert victims(s) == {"uid-a": 2}


def test_a_preemptor_whose_victims_wait_keeps_its_quota() -> None:
    big, other = preemptor(), replace(preemptor("other"), uid="uid-other")
    s = ClusterSnapshot(factory(100.0), (big, other, victim("v1", big.uid),
                                         victim("v2", big.uid)))
    out = hold([retry(big), retry(other)], s, CFG)
    assert [u.state for u in out] == [CheckState.PENDING, CheckState.RETRY]
    assert out[0].rule == RULE and out[0].requeue_after_seconds is None
    assert "preempted 2 workload(s)" in out[0].message
    end = (big.reserved_at + timedelta(seconds=CFG.preemptor_hold_seconds)) \
        .strftime("%Y-%m-%dT%H:%M:%SZ")
    assert end in out[0].message and out[1] == retry(other)


def test_the_hold_is_written_once_and_runs_out() -> None:
    big = preemptor()
    s = ClusterSnapshot(factory(100.0), (big, victim("v", big.uid)))
    first = hold([retry(big)], s, CFG)[0]
    again = replace(big, check_message=first.message)
    assert hold([retry(again)], replace(s, workloads=(again, *s.workloads[1:])), CFG) == []
    late = replace(big, reserved_at=NOW - timedelta(seconds=CFG.preemptor_hold_seconds))
    out = hold([retry(late)], replace(s, workloads=(late, *s.workloads[1:])), CFG)
    assert out[0].state is CheckState.RETRY  # the bound: Retry as before
    off = replace(CFG, preemptor_hold_seconds=0)
    assert hold([retry(big)], s, off)[0].state is CheckState.RETRY


def test_ready_and_reservation_answers_are_left_alone() -> None:
    big = preemptor()
    s = ClusterSnapshot(factory(100.0), (big, victim("v", big.uid)))
    assert hold([ready(big)], s, CFG) == [ready(big)]
    assert hold([retry(big, "reservation")], s, CFG)[0].state is CheckState.RETRY


def test_the_headroom_gate_then_the_hold() -> None:
    """No room: the gate's Retry for a preemptor becomes a hold; with room it is admitted."""
    big = preemptor()
    full = ClusterSnapshot(factory(LIMIT, LIMIT), (big, victim("v", big.uid)))
    gated = hold(share([ready(big)], full, CFG), full, CFG)
    assert [u.state for u in gated] == [CheckState.PENDING]
    assert gated[0].policy == POLICY
    room = ClusterSnapshot(factory(10.0, LIMIT), full.workloads)
    assert hold(share([ready(big)], room, CFG), room, CFG)[0].state is CheckState.READY
