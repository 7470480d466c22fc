"""TenantPolicy: a tenant's own Admission policy can only tighten the admissions of its own
namespace's workloads (docs/policy-format.md, "Tenant policies")."""

from __future__ import annotations

from typing import Any

import pytest

from m2g.model.inputs import PodSetView, PolicyInput, WorkloadView
from m2g.policy import make_runtime
from m2g.policy.spec import Decision
from m2g_controllers.policies import PolicyStore


def platform(when: str = "workload.gpus > 512") -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "Policy", "metadata": {"name": "size"},
            "spec": {"stage": "Admission", "rules": [
                {"name": "huge", "when": when, "decision": "Reject", "message": "too big"}]}}


def tenant(ns: str, name: str = "cap", *, decision: str = "Reject", stage: str = "Admission",
           when: str = "workload.gpus > 8", extra: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    rule = {"name": "cap", "when": when, "decision": decision, "message": "team cap",
            **(extra or {})}
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "TenantPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"stage": stage, "rules": [rule]}}


def decide(store: PolicyStore, ns: str, gpus: int) -> Decision:
    assert store.evaluator is not None
    wl = WorkloadView(name="j", namespace=ns, pod_sets=(PodSetView(name="m", count=1,
                                                                   gpus_per_pod=gpus),))
    return Decision(store.evaluator.admission(PolicyInput(workload=wl)).decision)


@pytest.fixture
def store() -> PolicyStore:
    return PolicyStore(make_runtime("cel-expr-python"))


def test_a_tenant_policy_tightens_its_own_namespace_only(store: PolicyStore) -> None:
    result = store.load_objects([platform(), tenant("team-a")])
    assert result.accepted and not result.problems
    assert decide(store, "team-a", 16) is Decision.REJECT
    assert decide(store, "team-a", 8) is Decision.ADMIT
    assert decide(store, "team-b", 16) is Decision.ADMIT  # another tenant is untouched
    assert decide(store, "team-b", 1024) is Decision.REJECT  # the platform's policy holds


def test_a_tenant_policy_that_says_true_for_everyone_still_binds_only_its_namespace(
        store: PolicyStore) -> None:
    """The tenant writes its own matchConditions; m2g's namespace condition comes first."""
    t = tenant("team-a", when="true")
    t["spec"]["matchConditions"] = [{"name": "all", "expression": "true"}]
    assert store.load_objects([platform(), t]).accepted
    assert decide(store, "team-a", 1) is Decision.REJECT
    assert decide(store, "team-b", 1) is Decision.ADMIT
    assert decide(store, "default", 1) is Decision.ADMIT


@pytest.mark.parametrize(("bad", "needle"), [
    (tenant("team-a", decision="Admit"), "may only Defer or Reject"),
    (tenant("team-a", stage="Capacity", extra={"quota": "0"}), "stage Capacity"),
    ({**tenant("team-a"), "spec": {"stage": "Fairness", "rules": [
        {"name": "cap", "weight": "100.0"}]}}, "only use stage Admission"),
    (tenant("team-a", stage="Preemption", extra={"eligible": "true", "score": "1.0"}),
     "Preemption"),
    (tenant("Not_A_Namespace"), "DNS-label namespace"),
    ({**tenant("team-a"), "spec": "all"}, "TenantPolicy/team-a/cap"),
])
def test_a_tenant_policy_that_could_do_more_is_left_out(store: PolicyStore, bad: dict[str, Any],
                                                        needle: str) -> None:
    result = store.load_objects([platform(), tenant("team-b", "ok"), bad])
    assert result.accepted  # the rest of the set is in force
    assert {p.file for p in result.problems} == {
        f"TenantPolicy/{bad['metadata']['namespace']}/cap"}
    assert any(needle in p.render() for p in result.problems), result.summary()
    assert decide(store, "team-a", 1) is Decision.ADMIT
    assert decide(store, "team-b", 16) is Decision.REJECT  # the good tenant policy works


def test_tenant_policies_alone_are_not_a_policy_set(store: PolicyStore) -> None:
    result = store.load_objects([tenant("team-a")])
    assert not result.accepted and "no platform Policy" in result.summary()
    assert store.evaluator is None


def test_a_tenant_policy_runtime_error_defers_only_its_namespace(store: PolicyStore) -> None:
    """failurePolicy Fail turns an evaluation error into Defer — of its own workloads."""
    t = tenant("team-a", when="workload.labels['missing'] == 'x'")
    assert store.load_objects([platform(), t]).accepted
    assert decide(store, "team-a", 1) is Decision.DEFER
    assert decide(store, "team-b", 1) is Decision.ADMIT


def test_the_policy_set_version_changes_with_a_tenant_policy(store: PolicyStore) -> None:
    store.load_objects([platform()])
    before = store.version
    store.load_objects([platform(), tenant("team-a")])
    assert store.version != before
