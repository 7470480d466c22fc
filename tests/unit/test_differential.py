"""Differential tests: the example policies give the same answers on both CEL runtimes, and the
batch path (one fused evaluation per policy) gives the same answers as one input at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2g.model.inputs import PolicyInput
from m2g.policy import Evaluator, load_dir
from m2g.testing.scenarios import OPENB, inputs
from tests.unit.policy_helpers import evaluator, policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"

pytestmark = pytest.mark.skipif(not OPENB.exists(), reason=f"trace not found at {OPENB}")


@pytest.fixture(scope="module")
def sample() -> list[PolicyInput]:
    return inputs(24)  # consecutive inputs cycle through the four scenarios


def test_engines_and_batch_agree_on_example_policies(sample: list[PolicyInput]) -> None:
    fast = Evaluator(load_dir(POLICIES, "cel-expr-python"))
    slow = Evaluator(load_dir(POLICIES, "cel-python"))
    one = [fast.admission(i).to_json() for i in sample]
    assert [slow.admission(i).to_json() for i in sample] == one
    assert [r.to_json() for r in fast.admission_many(sample)] == one
    decisions = {r["decision"] for r in one}
    assert len(decisions) >= 2, f"the sample should exercise several outcomes, got {decisions}"


def test_batch_falls_back_per_item_on_errors(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {
        "a.yaml": policy("a", "Admission", """
            - {name: team, when: "workload.labels['team'] == 'x'", decision: Reject}
            - {name: big, when: "workload.gpus > 8", decision: Defer, requeueAfter: "60"}
        """, extra="failurePolicy: Ignore"),
    })
    site = PolicyInput().site
    items = [PolicyInput(workload={"gpus": g, "labels": lbl}, site=site)  # type: ignore[arg-type]
             for g, lbl in [(4, {"team": "x"}), (16, {}), (2, {"team": "y"})]]
    batched = [r.to_json() for r in ev.admission_many(items)]
    assert batched == [ev.admission(i).to_json() for i in items]
    assert [r["decision"] for r in batched] == ["Reject", "Defer", "Admit"]
    assert batched[1]["errors"][0]["rule"] == "team"  # the missing label, reported per item
