"""The recipes' power numbers agree with the measured DVFS sweep they cite
(Emerald AI / EPRI / SRP demonstration, dvfs_sweep.csv; docs/templates.md#power)."""

from __future__ import annotations

import csv
import re

import pytest

from m2g.templates import WorkloadTemplate
from m2g.testing.scenarios import DATA
from tests.unit.templates_helpers import shipped

SWEEP = DATA / "emerald-dr-2025" / "dvfs_sweep.csv"
GB300_GPU_KW = 1.4  # GPU power limit used to scale the sweep (docs/templates.md#power)
UNCAPPED_W = 400  # the sweep's highest cap (A100 limit)


def rows_for(template: WorkloadTemplate) -> list[dict[str, str]]:
    match = re.search(r"\((\w+)\*\)", template.spec.power.source)
    assert match, f"{template.name}: power.source must name the sweep rows, e.g. (pt_mpt_*)"
    with SWEEP.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["Workload"].startswith(match.group(1))]
    assert rows, f"{template.name}: no sweep rows start with {match.group(1)}"
    return rows


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("name", sorted(shipped()))
def test_cap_curve_is_the_mean_of_the_cited_rows(name: str) -> None:
    t = shipped()[name]
    rows = rows_for(t)
    assert len(t.spec.power.cap_curve) >= 5
    for point in t.spec.power.cap_curve:
        cap_w = round(point.cap * UNCAPPED_W)
        measured = [float(r["normalized throughput"]) for r in rows
                    if int(r["GPU power cap"]) == cap_w]
        assert measured, f"{name}: no rows at {cap_w} W"
        assert point.throughput == pytest.approx(mean(measured), abs=0.0015), cap_w


@pytest.mark.parametrize("name", [n for n, t in sorted(shipped().items())
                                  if t.spec.shape.value != "serving"])
def test_kw_per_gpu_scales_the_measured_draw_at_the_uncapped_limit(name: str) -> None:
    """Saturated work draws what the sweep measured as a share of its cap (0.86-0.96)."""
    t = shipped()[name]
    draw = mean([float(r["power per GPU"]) for r in rows_for(t)
                 if int(r["GPU power cap"]) == UNCAPPED_W])
    assert t.spec.power.kw_per_gpu == pytest.approx(GB300_GPU_KW * draw / UNCAPPED_W, abs=0.006)


def test_services_draw_less_than_saturated_inference() -> None:
    for name in ("vllm-llama31-405b", "agentic-coder"):
        t = shipped()[name]
        draw = mean([float(r["power per GPU"]) for r in rows_for(t)
                     if int(r["GPU power cap"]) == UNCAPPED_W])
        assert t.spec.power.kw_per_gpu < GB300_GPU_KW * draw / UNCAPPED_W
