"""Fair sharing is on wherever m2g's weights are meant to act, and the shipped Fairness policy
names the shipped ClusterQueues.

Without Kueue's ``fairSharing`` Configuration block every ``spec.fairSharing.weight`` is
ignored (Kueue v0.19.2 pkg/scheduler/preemption/fairsharing/strategy.go: enabled = the block is
present); and a policy whose queue classes miss the shipped queue names gives them all the
default weight. Either way a Fairness policy has no effect.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from m2g.model.inputs import PolicyInput, QueueView
from m2g.policy import Evaluator, load_dir

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "kueue-config" / "kueue-manager" / "controller_manager_config.yaml"
sys.path.insert(0, str(ROOT / "kind-e2e"))
from localcp import kueue  # noqa: E402


def test_the_shipped_kueue_configuration_turns_fair_sharing_on() -> None:
    cfg = yaml.safe_load(SHIPPED.read_text())
    assert (cfg["apiVersion"], cfg["kind"]) == ("config.kueue.x-k8s.io/v1beta2", "Configuration")
    # the valid v1beta2 lists (pkg/config/validation.go validStrategySets)
    assert cfg["fairSharing"]["preemptionStrategies"] in (
        ["LessThanOrEqualToFinalShare"], ["LessThanInitialShare"],
        ["LessThanOrEqualToFinalShare", "LessThanInitialShare"])
    assert "batch/job" in cfg["integrations"]["frameworks"]


def test_the_local_control_plane_runs_kueue_with_the_same_fair_sharing(tmp_path: Path) -> None:
    ports = {k: 1 for k in ("kueue_health", "kueue_metrics", "kueue_webhook",
                            "kueue_visibility")}
    local = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, ports)).read_text())
    assert local["fairSharing"] == yaml.safe_load(SHIPPED.read_text())["fairSharing"]


def shipped_queues() -> list[str]:
    docs = yaml.safe_load_all((ROOT / "kueue-config/base/cluster-queues.yaml").read_text())
    return [d["metadata"]["name"] for d in docs if d and d["kind"] == "ClusterQueue"]


@pytest.mark.parametrize("queue", shipped_queues())
def test_the_fairness_policy_classifies_every_shipped_queue(queue: str) -> None:
    ev = Evaluator(load_dir(ROOT / "deploy" / "policies", "cel-expr-python"))
    weights = set()
    for hour in range(24):  # a Monday, every hour: some hour must give it its class's weight
        now = datetime(2026, 11, 30, hour, tzinfo=UTC)
        res = ev.fairness(PolicyInput(queue=QueueView(name=queue), now=now))
        weights.add(res.weight)
        assert res.weight is not None
    assert weights != {1.0}, f"{queue}: the default weight at every hour (no class matched)"
