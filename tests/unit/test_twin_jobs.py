"""What a twin job carries (twinkit.jobs): ``m2g.io/estimated-kw`` means what m2g's templates
write and every m2g reader takes — the GPUs' whole draw at full power (docs/templates.md
"Power") — not the draw above idle."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from twinkit import trace as T
from twinkit.jobs import estimated_kw, manifest

from m2g.k8s import convert
from m2g.model import labels as L
from m2g.model.inputs import WorkloadKind
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import cap_saving_kw
from m2g.planner.forecast import KIND_KW_PER_GPU, ForecastConfig, job_kw
from m2g.planner.shedding import saving_kw, workload_kw
from m2g.sim.power import PowerModel

PM = PowerModel()
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def job(kind: str, gpus: int, tier: int = 0) -> T.TraceJob:
    return T.TraceJob("twin-00001", "p", 0.0, 600.0, gpus, kind, tier, "research",
                      "m2g-batch", 1800, False, T.job_topology(gpus, False), False)


def as_kueue_workload(manifest_: dict[str, object]) -> dict[str, object]:
    """The Workload Kueue makes of the Job: one pod set carrying the Job's pod template."""
    spec = manifest_["spec"]
    assert isinstance(spec, dict)
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": "job-twin-00001", "namespace": "research",
                         "creationTimestamp": "2026-12-02T11:59:00Z"},
            "spec": {"queueName": "default", "podSets": [
                {"name": "main", "count": spec["parallelism"], "template": spec["template"]}]}}


@pytest.mark.parametrize("kind", ["training", "fine-tuning", "inference", "batch"])
def test_the_estimate_is_the_whole_gpu_draw_as_a_template_writes_it(kind: str) -> None:
    # what the forecast gives the same kind when nothing is declared (m2g.sim.power's numbers,
    # the templates' kwPerGpu: 1.34 pre-train, 1.21 fine-tune, 1.29 inference)
    per_gpu = KIND_KW_PER_GPU[WorkloadKind(kind)]
    assert estimated_kw(job(kind, 16), PM) == pytest.approx(16 * per_gpu, abs=0.05)
    # not the draw above idle (0.242 kW a GPU less): the skew the twin had
    assert estimated_kw(job(kind, 16), PM) - 16 * (per_gpu - PM.idle_w / 1000) \
        == pytest.approx(16 * 0.242, abs=0.06)


def test_every_m2g_reader_takes_the_twins_annotation_as_the_whole_draw() -> None:
    j = job("training", 16, tier=2)
    m = manifest(j, 60.0, PM)
    ann = m["spec"]["template"]["metadata"]["annotations"]
    declared = float(ann[L.ESTIMATED_KW])
    w = convert.workload(as_kueue_workload(m), NOW)
    assert w.view.estimated_kw == declared and w.view.gpus == 16
    whole = 16 * PM.gpu_watts(w.view.kind) / 1000
    above_idle = 16 * (PM.gpu_watts(w.view.kind) - PM.idle_w) / 1000
    p = PlannerConfig()
    # the forecast and the headroom gate count it whole: the draw the simulator gives it
    assert job_kw(w, ForecastConfig()) == pytest.approx(whole, abs=0.05)
    assert workload_kw(w, p) == pytest.approx(whole, abs=0.05)
    # a shed saves it less its GPUs' idle: what the simulator then stops drawing
    assert saving_kw(w, p) == pytest.approx(above_idle, rel=0.01)
    # a cap takes its share of the whole draw (the curves are fractions of the full draw)
    frac = 1 - PM.full_fraction("pre-training", 0.75) / PM.full_fraction("pre-training", 1.0)
    assert cap_saving_kw(w, p, 1.0, 0.75) == pytest.approx(whole * frac, rel=0.02)
