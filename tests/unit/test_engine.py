"""The policy engine's combination rules, on both CEL runtimes (a differential test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2g.model.inputs import PolicyInput
from m2g.policy import Decision, StopPolicy
from tests.unit.policy_helpers import evaluator, policy

ENGINES = ["cel-expr-python", "cel-python"]

FLEX_INPUT = PolicyInput.model_validate({
    "workload": {"name": "w", "flexTier": 2, "gpus": 8, "kind": "training"},
    "site": {"power": {"budgetKw": 1000, "drawKw": 900}},
    "grid": {"event": {"active": True, "id": "dr-7", "targetKw": 700, "endsInSeconds": 1800}},
})


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_reject_beats_defer_beats_admit(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", """
            - {name: ok, when: "true", decision: Admit}
            - {name: wait, when: "true", decision: Defer, requeueAfter: "60"}
        """),
        "b.yaml": policy("b", "Admission", """
            - {name: no, when: "workload.gpus > 4", decision: Reject, message: too big}
        """),
    })
    res = ev.admission(FLEX_INPUT)
    assert res.decision is Decision.REJECT
    assert res.requeue_after_seconds is None
    assert [r.ref for r in res.reasons] == ["a/ok", "a/wait", "b/no"]
    assert res.reasons[-1].message == "too big"


def test_defer_takes_largest_requeue_and_default_300(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", """
            - {name: short, when: "true", decision: Defer, requeueAfter: "60"}
            - {name: plain, when: "true", decision: Defer}
            - {name: long, when: "grid.event.active", decision: Defer,
               requeueAfter: "grid.event.endsInSeconds"}
        """),
    })
    res = ev.admission(FLEX_INPUT)
    assert res.decision is Decision.DEFER
    assert res.requeue_after_seconds == 1800
    res2 = ev.admission(PolicyInput())
    assert res2.requeue_after_seconds == 300  # 'plain' has none: 300 s; 'long' did not fire


def test_nothing_fired_admits(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", """
            - {name: never, when: "workload.gpus > 1000", decision: Reject}
        """),
    })
    res = ev.admission(FLEX_INPUT)
    assert res.decision is Decision.ADMIT and res.reasons == ()
    assert res.to_json() == {"decision": "Admit", "requeueAfterSeconds": None, "reasons": [],
                             "podSetUpdates": []}


def test_match_conditions_and_variables(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "dr.yaml": policy("dr", "Admission", """
            - name: defer-during-dr
              when: "grid.event.active && variables.short"
              decision: Defer
              messageExpression: "'variables.short is ' + string(variables.short) + ' for ' + grid.event.id"
        """, extra="""
            matchConditions:
              - {name: deferrable, expression: "workload.flexTier >= 2"}
            variables:
              - {name: draw, expression: "site.power.drawKw"}
              - {name: short, expression: "variables.draw > grid.event.targetKw"}
        """),
    })
    res = ev.admission(FLEX_INPUT)
    assert res.decision is Decision.DEFER
    assert res.reasons[0].message == "variables.short is true for dr-7"
    tier0 = FLEX_INPUT.model_copy(update={"workload": FLEX_INPUT.workload.model_copy(
        update={"flex_tier": 0})})
    assert ev.admission(tier0).decision is Decision.ADMIT


def test_pod_set_updates_merge_and_conflict(tmp_path: Path, engine: str) -> None:
    rules = """
        - name: pin
          when: "true"
          decision: Admit
          podSetUpdates:
            nodeSelector: {"network.topology.nvidia.com/accelerator": "'rack-' + string(workload.gpus)"}
            tolerations: [{key: "'m2g.io/hot'", operator: "'Exists'", effect: "'NoSchedule'"}]
    """
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", rules),
        "b.yaml": policy("b", "Admission", """
            - name: label
              when: "true"
              decision: Admit
              podSetUpdates: {podSets: [worker], labels: {"m2g.io/tier": "string(workload.flexTier)"}}
        """),
    })
    inp = PolicyInput.model_validate({"workload": {"flexTier": 2, "gpus": 8, "podSets": [
        {"name": "launcher", "count": 1}, {"name": "worker", "count": 2, "gpusPerPod": 4}]}})
    res = ev.admission(inp)
    assert res.decision is Decision.ADMIT
    toleration = [{"key": "m2g.io/hot", "operator": "Exists", "effect": "NoSchedule"}]
    assert [u.to_json() for u in res.pod_set_updates] == [
        {"name": "launcher", "nodeSelector": {"network.topology.nvidia.com/accelerator": "rack-8"},
         "tolerations": toleration},
        {"name": "worker", "labels": {"m2g.io/tier": "2"},
         "nodeSelector": {"network.topology.nvidia.com/accelerator": "rack-8"}, "tolerations": toleration},
    ]
    clash = evaluator(tmp_path / "clash", engine, {
        "a.yaml": policy("a", "Admission", rules),
        "c.yaml": policy("c", "Admission", """
            - name: other
              when: "true"
              decision: Admit
              podSetUpdates: {nodeSelector: {"network.topology.nvidia.com/accelerator": "'rack-9'"}}
        """),
    })
    res = clash.admission(FLEX_INPUT)
    assert res.decision is Decision.DEFER and res.pod_set_updates == ()
    assert "a/pin" in res.reasons[-1].message and "c/other" in res.reasons[-1].message


@pytest.mark.parametrize(("failure_policy", "decision", "errors"),
                         [("Fail", Decision.DEFER, 0), ("Ignore", Decision.ADMIT, 1)])
def test_failure_policy(tmp_path: Path, engine: str, failure_policy: str, decision: Decision,
                        errors: int) -> None:
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", """
            - {name: lookup, when: "workload.labels['team'] == 'x'", decision: Reject}
        """, extra=f"failurePolicy: {failure_policy}"),
    })
    res = ev.admission(FLEX_INPUT)  # no 'team' label: a runtime error
    assert res.decision is decision
    assert len(res.errors) == errors
    if decision is Decision.DEFER:
        assert res.requeue_after_seconds == 300
        assert res.reasons[0].message.startswith("evaluation error:")


def test_capacity_min_quota_and_strongest_stop(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "c.yaml": policy("c", "Capacity", """
            - {name: healthy, when: "true", quota: "flavor.healthyGpus"}
            - {name: hot, when: "domain.thermal.headroomC < 3.0", quota: "flavor.healthyGpus / 2"}
            - {name: soon, when: "domain.maintenance.startsInSeconds > 0", stopPolicy: Hold}
            - {name: now, when: "domain.maintenance.active", stopPolicy: HoldAndDrain}
        """),
    })
    base = {"flavor": {"name": "f", "healthyGpus": 68, "totalGpus": 72},
            "domain": {"thermal": {"inletC": 33.0, "limitC": 35.0},
                       "maintenance": {"startsInSeconds": 600}}}
    res = ev.capacity(PolicyInput.model_validate(base))
    assert res.quota == 34 and res.stop_policy is StopPolicy.HOLD
    base["domain"] = {"maintenance": {"active": True}, "thermal": {"limitC": 35.0}}
    res = ev.capacity(PolicyInput.model_validate(base))
    assert res.quota == 68 and res.stop_policy is StopPolicy.HOLD_AND_DRAIN


def test_preemption_veto_and_score_sum(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "p.yaml": policy("p", "Preemption", """
            - {name: flexible, when: "workload.flexTier >= 1", score: "double(workload.flexTier)"}
            - {name: fresh, when: "workload.checkpoint.lastAgeSeconds < 600", score: 2}
            - {name: protect, when: "workload.priority >= 1000", eligible: "false"}
        """),
    })
    inp = {"workload": {"flexTier": 2, "checkpoint": {"lastAgeSeconds": 100}}}
    res = ev.preemption(PolicyInput.model_validate(inp))
    assert res.eligible and res.score == pytest.approx(4.0)
    inp["workload"]["priority"] = 5000  # type: ignore[index]
    assert not ev.preemption(PolicyInput.model_validate(inp)).eligible
    stale = {"workload": {"flexTier": 0, "checkpoint": {"lastAgeSeconds": 7200}}}
    assert not ev.preemption(PolicyInput.model_validate(stale)).eligible  # nothing fired


def test_fairness_first_fired_weight(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "f.yaml": policy("f", "Fairness", """
            - {name: night, when: "now.getHours() < 6", weight: "3.0"}
            - {name: default, when: "true", weight: 1}
        """),
    })
    night = ev.fairness(PolicyInput.model_validate({"now": "2026-11-29T02:00:00Z"}))
    day = ev.fairness(PolicyInput.model_validate({"now": "2026-11-29T14:00:00Z"}))
    assert (night.weight, day.weight) == (3.0, 1.0)


def test_placement_merges_into_admission(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "p.yaml": policy("place", "Placement", """
            - name: clique
              when: "workload.gpus <= 72"
              topologyLevel: "'nvidia.com/gpu.clique'"
              podSetUpdates:
                annotations: {"kai.scheduler/topology-required-placement": "'nvidia.com/gpu.clique'"}
            - {name: block, when: "workload.gpus > 72", topologyLevel: "'network.topology.nvidia.com/block'"}
        """),
    })
    res = ev.admission(FLEX_INPUT)
    assert res.decision is Decision.ADMIT
    assert res.placement is not None and res.placement.topology_level == "nvidia.com/gpu.clique"
    assert res.to_json()["podSetUpdates"] == [{"name": "main", "annotations": {
        "kai.scheduler/topology-required-placement": "nvidia.com/gpu.clique"}}]
    big = PolicyInput.model_validate({"workload": {"gpus": 144}})
    assert ev.placement(big).topology_level == "network.topology.nvidia.com/block"


def test_message_expression_error_falls_back(tmp_path: Path, engine: str) -> None:
    ev = evaluator(tmp_path, engine, {
        "a.yaml": policy("a", "Admission", """
            - {name: r, when: "true", decision: Defer, message: "static text",
               messageExpression: "workload.labels['missing']"}
        """),
    })
    msg = ev.admission(PolicyInput()).reasons[0].message
    assert msg.startswith("static text (messageExpression failed:")
