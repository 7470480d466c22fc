"""Fuzzing ``m2g policy eval``'s input side: any bytes, any JSON in the input's places — one
output line per input, a decision only for a valid and finite input, never an exception."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from m2g.policy import Evaluator, Stage, load_dir
from m2g.policy.jsonin import records
from m2g_cli.policy_eval import evaluate_stream
from tests.fuzz.helpers import count, json_values

POLICIES = Path(__file__).resolve().parents[2] / "policies"
EVALUATOR = Evaluator(load_dir(POLICIES, "cel-expr-python"))

KEYS = st.sampled_from(["workload", "site", "grid", "queue", "domains", "flavor", "domain",
                        "now", "gpus", "flexTier", "estimatedKw", "power", "budgetKw",
                        "drawKw", "headroomKw", "event", "active", "podSets", "count",
                        "gpusPerPod", "labels", "kind", "thermal", "limitC", "nominalGpus"])


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


@given(st.binary(max_size=600))
def test_any_bytes(data: bytes) -> None:
    count()
    for rec in records(io.BytesIO(data)):
        assert (rec.error is None) or ("\n" not in rec.error)


@given(st.lists(json_values(KEYS), min_size=1, max_size=5),
       st.sampled_from(list(Stage)))
def test_any_json_inputs(values: list[Any], stage: Stage) -> None:
    count()
    text = "".join(json.dumps(v) + "\n" for v in values)  # NaN/Infinity as JSON writes them
    out: list[str] = []
    total, bad = evaluate_stream(EVALUATOR, stage, io.BytesIO(text.encode()), "fuzz",
                                 out.append, lambda s: None)
    assert total == len(values) == len(out)
    for value, line in zip(values, out, strict=True):
        row = json.loads(line)
        if _has_non_finite(value):
            assert "error" in row, (value, row)
        assert ("error" in row) or isinstance(value, dict)
    assert bad == sum("error" in json.loads(x) for x in out)


@given(st.dictionaries(st.sampled_from(["gpus", "flexTier", "estimatedKw", "priority",
                                        "kind", "waitSeconds", "labels"]),
                       json_values(leaves=4), max_size=5),
       st.floats(allow_nan=True, allow_infinity=True))
def test_workload_fields(workload: dict[str, Any], headroom: float) -> None:
    count()
    value = {"workload": workload, "site": {"power": {"budgetKw": 100.0,
                                                      "headroomKw": headroom}}}
    text = json.dumps(value) + "\n"
    out: list[str] = []
    evaluate_stream(EVALUATOR, Stage.ADMISSION, io.BytesIO(text.encode()), "fuzz", out.append,
                    lambda s: None)
    row = json.loads(out[0])
    if not math.isfinite(headroom):
        assert "error" in row
