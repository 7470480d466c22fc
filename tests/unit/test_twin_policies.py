"""The twin's m2g runs install the shipped Policy objects less those that decide by the wall
clock's hour (twinkit.harness.CLOCK_POLICIES), so that a run's figures do not depend on when it
ran; ``--clock-policies`` puts them back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from twinkit import harness as H

POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "policies"
#: CEL that reads the hour, weekday or date of ``now`` (comments are YAML's, not loaded)
CLOCK = re.compile(r"\bnow\s*\.\s*get(Hours|Minutes|DayOfWeek|DayOfMonth|DayOfYear|Date|"
                   r"Month|FullYear)\b")


def _shipped() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((POLICIES / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"]
            for doc in yaml.safe_load_all((POLICIES / name).read_text()) if doc]


def _reads_the_clock(doc: dict[str, Any]) -> bool:
    return CLOCK.search(yaml.safe_dump(doc.get("spec"))) is not None


def test_the_clock_policies_are_exactly_the_shipped_ones_that_read_the_hour() -> None:
    """A shipped policy that starts reading the hour must join CLOCK_POLICIES (or the twin's
    figures depend on the time of day again); one that stops must leave it."""
    by_clock = {d["metadata"]["name"] for d in _shipped() if _reads_the_clock(d)}
    assert by_clock == set(H.CLOCK_POLICIES)


def test_a_twin_run_leaves_them_out_unless_asked() -> None:
    docs = [*_shipped(), None]  # a `---` at the end renders as None
    names = {d["metadata"]["name"] for d in docs if d}
    kept = {d["metadata"]["name"] for d in H.twin_policies(docs, clock_policies=False)}
    assert kept == names - H.CLOCK_POLICIES and len(kept) >= 10
    everything = H.twin_policies(docs, clock_policies=True)
    assert {d["metadata"]["name"] for d in everything} == names and None not in everything
