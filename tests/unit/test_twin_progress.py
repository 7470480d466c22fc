"""The twin's job-progress model: rate from the DVFS curves, checkpoints, evictions."""

from __future__ import annotations

import pytest
from twinkit.progress import Progress, advance, evict, throughput

from m2g.sim.power import PowerModel


def test_full_speed_work_finishes_in_its_runtime() -> None:
    p = Progress(work=8 * 100, gpus=8, checkpoint_s=0)
    p, _ = advance(p, 60, 1.0)
    assert not p.finished and p.remaining == pytest.approx(320)
    p, _ = advance(p, 40, 1.0)
    assert p.finished


def test_capped_power_slows_progress_as_the_sweep_says() -> None:
    model = PowerModel()
    assert throughput(model, "training", 1.0) == pytest.approx(1.0)
    half = throughput(model, "training", 0.5)
    assert 0.5 < half < 0.8  # pre-training at a 200 W of 400 W cap: 0.62–0.64 measured
    assert throughput(model, "inference", 0.5) > half  # inference keeps more
    assert throughput(model, "", 0.5) == half  # a foreign job: the pre-training curve


def test_eviction_loses_the_work_since_the_last_checkpoint() -> None:
    p = Progress(work=1e6, gpus=4, checkpoint_s=100)
    p, taken = advance(p, 250, 1.0)
    assert taken == 2 and p.saved == pytest.approx(4 * 200)
    p = evict(p)
    assert p.done == pytest.approx(800) and p.lost == pytest.approx(200) and p.evictions == 1
    p, taken = advance(p, 90, 1.0)  # the checkpoint clock restarts with the run
    assert taken == 0


def test_without_checkpoints_an_eviction_loses_everything() -> None:
    p, _ = advance(Progress(work=1e6, gpus=4, checkpoint_s=0), 500, 1.0)
    p = evict(p)
    assert p.done == 0 and p.lost == pytest.approx(2000)


def test_stateless_jobs_lose_nothing() -> None:
    p, _ = advance(Progress(work=1e6, gpus=4, checkpoint_s=-1), 500, 1.0)
    assert evict(p).lost == 0 and evict(p).done == pytest.approx(2000)


def test_no_progress_while_stalled_or_paused() -> None:
    p = Progress(work=100, gpus=1, checkpoint_s=10)
    q, taken = advance(p, 50, 0.0)
    assert q.done == 0 and taken == 0
    assert advance(p, 0, 1.0)[0] == p


def test_a_finished_job_is_not_evicted() -> None:
    p, _ = advance(Progress(work=10, gpus=1, checkpoint_s=0), 20, 1.0)
    assert evict(p) == p
