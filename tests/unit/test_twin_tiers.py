"""The twin counts each job in the flex tier m2g holds it to: its own, raised to its
ClusterQueue's ``m2g.io/min-flex-tier`` (docs/twin.md, "Flex tiers"), read off the shipped
kueue-config as m2g reads it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import yaml
from twinkit import harness as H
from twinkit import trace as T

BASE = Path(__file__).resolve().parents[2] / "kueue-config" / "base"


def shipped_docs() -> list[dict[str, object]]:
    docs: list[dict[str, object]] = []
    for name in ("cluster-queues.yaml", "tenants.yaml"):
        docs += [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]
    return docs


def job(name: str, ns: str, tier: int, foreign: bool = False) -> T.TraceJob:
    return T.TraceJob(name, name, 0.0, 600.0, 8, "" if foreign else "batch", tier, ns, "", 0,
                      foreign, "", False)


def test_the_floors_are_the_shipped_cluster_queues_by_namespace() -> None:
    floors = H.tier_floors(shipped_docs())
    assert floors == {"prod-training": 0, "research": 2, "inference": 0}


def test_a_queue_without_a_valid_floor_allows_every_tier() -> None:
    docs = shipped_docs()
    for d in docs:
        if d.get("kind") == "ClusterQueue":
            d["metadata"]["annotations"] = {"m2g.io/min-flex-tier": "high"}  # type: ignore[index]
    assert set(H.tier_floors(docs).values()) == {0}


def test_the_plan_raises_each_job_to_its_floor_and_never_lowers_it(tmp_path: Path) -> None:
    jobs = (job("foreign", "research", 0, foreign=True), job("batch", "research", 3),
            job("train", "prod-training", 0), job("serve", "inference", 1))
    cfg = SimpleNamespace(plan=SimpleNamespace(jobs=jobs), time_scale=60.0,
                          timeline=SimpleNamespace(start_s=10.0, end_s=20.0))
    out = tmp_path / "plan.json"
    H.write_plan(cfg, 0.0, out, H.tier_floors(shipped_docs()))
    got = {j["name"]: j["tier"] for j in json.loads(out.read_text())["jobs"]}
    assert got == {"foreign": 2, "batch": 3, "train": 0, "serve": 1}
    H.write_plan(cfg, 0.0, out)
    assert [j["tier"] for j in json.loads(out.read_text())["jobs"]] == [0, 3, 0, 1]
