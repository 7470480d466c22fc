"""The power model against the data it was built from: DVFS sweep points and H200 phases."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from m2g.model.inputs import WorkloadKind
from m2g.sim.data import PACKAGED, curves_to_json, derive_curves
from m2g.sim.power import GB300_TDP_W, PowerModel
from m2g.testing.scenarios import DATA

DVFS = DATA / "emerald-dr-2025" / "dvfs_sweep.csv"
PREFIX = {"pt_": WorkloadKind.TRAINING, "ft_": WorkloadKind.FINE_TUNING,
          "infer_": WorkloadKind.INFERENCE}


def sweep() -> dict[WorkloadKind, dict[float, list[float]]]:
    """kind → cap W → per-GPU W of each job, straight from the CSV (independent of m2g.sim)."""
    out: dict[WorkloadKind, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    with DVFS.open() as fh:
        for row in csv.DictReader(fh):
            kind = next(k for p, k in PREFIX.items() if row["Workload"].startswith(p))
            out[kind][float(row["GPU power cap"])].append(float(row["power per GPU"]))
    return out


def test_reproduces_the_dvfs_sweep_family_means_at_its_own_tdp() -> None:
    model = PowerModel(tdp_w=400.0)  # the sweep's largest cap
    for kind, by_cap in sweep().items():
        for cap_w, watts in by_cap.items():
            mean = sum(watts) / len(watts)
            assert model.gpu_watts(kind, cap_w / 400.0) == pytest.approx(mean, abs=0.5), \
                (kind, cap_w)
            # and every single job of the family within 5% of the family curve
            for w in watts:
                assert w == pytest.approx(mean, rel=0.05), (kind, cap_w)


def test_packaged_curves_match_the_csv() -> None:
    shipped = (Path(__file__).resolve().parents[2] / "src" / "m2g" / "sim" / PACKAGED).read_text()
    assert shipped == curves_to_json(*derive_curves(DVFS.read_text()))


@pytest.mark.parametrize(("duty", "watts"), [(0.0, 121), (0.25, 340), (0.5, 510), (1.0, 690)])
def test_reproduces_the_h200_duty_phases(duty: float, watts: float) -> None:
    h200 = PowerModel(tdp_w=700.0)
    assert h200.gpu_watts(WorkloadKind.BENCHMARK, 1.0, duty=duty) == pytest.approx(watts,
                                                                                    rel=0.01)
    gb300 = PowerModel()
    assert gb300.gpu_watts(WorkloadKind.BENCHMARK, 1.0, duty=duty) == pytest.approx(
        watts * GB300_TDP_W / 700.0, rel=0.01)


def test_scaled_levels_and_cap_behaviour() -> None:
    m = PowerModel()
    assert m.gpu_watts(None) == pytest.approx(242.0, abs=0.5)
    train = m.gpu_watts(WorkloadKind.TRAINING, 1.0)
    assert 1300 < train < 1380  # 0.957 × 1.4 kW
    assert m.gpu_watts(WorkloadKind.FINE_TUNING) < m.gpu_watts(WorkloadKind.INFERENCE) < train
    last = 0.0
    for cap in (0.1, 0.25, 0.4, 0.6, 0.8, 1.0, 1.5):
        w = m.gpu_watts(WorkloadKind.TRAINING, cap)
        assert w <= max(cap, m.min_cap) * m.tdp_w * 1.02  # the sweep overshoots ≤1.5%
        assert w >= last
        last = w
    assert m.gpu_watts(WorkloadKind.TRAINING, 0.1) == m.gpu_watts(WorkloadKind.TRAINING, 0.25)
    assert m.throughput(WorkloadKind.TRAINING, 0.5) == pytest.approx(0.63, abs=0.03)
    assert m.gpu_watts(WorkloadKind.AGENTIC) < m.gpu_watts(WorkloadKind.INFERENCE)


def test_matmul_benchmark_sits_on_its_cap() -> None:
    m = PowerModel()
    for cap in (0.25, 0.5, 0.75, 1.0):
        assert m.gpu_watts(WorkloadKind.BENCHMARK, cap) == pytest.approx(0.986 * cap * 1400,
                                                                          rel=0.001)
    assert m.throughput(WorkloadKind.BENCHMARK, 0.5) == m.throughput(WorkloadKind.TRAINING, 0.5)
