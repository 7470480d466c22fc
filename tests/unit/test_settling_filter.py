"""settling_kw looks the pods up only for the workloads m2g shed (issue 14, 2026-12-03): the
same kW as asking ``settling`` of every workload, on a snapshot whose workloads vary in what
it reads (shed or not, shed_at age, quota held, phase, pods read or not)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from m2g.k8s.build import build_snapshot
from m2g.model.cluster import ClusterSnapshot, Phase
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import settling_cap_kw
from m2g.planner.shedding import _settles, saving_kw, settling_kw
from m2g.testing.scale import LABELS, NOW, generate


def _varied(snap: ClusterSnapshot) -> ClusterSnapshot:
    out = []
    for n, w in enumerate(snap.workloads):
        if n % 3:
            w = dataclasses.replace(
                w, shed_by_m2g=n % 5 != 1,
                shed_at=None if n % 7 == 2 else NOW - timedelta(seconds=(n * 37) % 900),
                holds_quota=n % 2 == 0,
                phase=Phase.INACTIVE if n % 4 else w.phase)
        out.append(w)
    return dataclasses.replace(snap, workloads=tuple(out))


@pytest.mark.parametrize("pods", [True, False])
def test_the_filter_settles_what_asking_every_workload_settles(pods: bool) -> None:
    objs, readings = generate(6, 240)
    snap = _varied(build_snapshot(objs, readings, NOW, labels=LABELS))
    if not pods:
        snap = dataclasses.replace(snap, live_pods=None)
    config = PlannerConfig()
    want = sum(saving_kw(w, config) for w in snap.workloads if _settles(w, snap, config)) \
        + settling_cap_kw(snap, config)
    assert want > 0  # some shed work settles in this snapshot
    assert settling_kw(snap, config) == pytest.approx(want, rel=0, abs=0)
