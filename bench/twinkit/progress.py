"""The job-progress model (pure; docs/twin.md "Job progress").

A job has work W = GPUs × trace runtime (GPU-seconds at full speed). While all its pods run it
progresses at GPUs × throughput(kind, power cap) per trace second — the throughput its GPUs
deliver at their power, from the Emerald DVFS sweep (``m2g.sim.power.PowerModel``, the same
curves the telemetry simulator draws power from); not at all while waiting, paused or stalled
(a failed tray). It checkpoints every ``checkpoint_s`` seconds of running (trace time); an
eviction loses the work since the last checkpoint (all of it without checkpoints; nothing for a
stateless job, ``checkpoint_s == -1``). It is done when the work is done.

An elastic job shrunk by m2g runs on fewer GPUs (``advance(..., gpus=)``): a data-parallel job
goes on at the throughput of the replicas it has — linear in their number, each at its power
cap — and loses nothing on a shrink or a grow (its replicas hold the same state; docs/twin.md
states the assumption). It needs the same work, so it finishes later.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from m2g.model.inputs import WorkloadKind
from m2g.sim.power import PowerModel

EPS = 1e-6


@dataclass(frozen=True)
class Progress:
    """One job's progress (trace time and trace GPU-seconds)."""

    work: float
    gpus: int
    checkpoint_s: int  # 0: never; -1: stateless
    done: float = 0.0
    saved: float = 0.0  # work at the last checkpoint
    since_checkpoint: float = 0.0  # trace seconds run since the last checkpoint (or start)
    checkpoints: int = 0
    evictions: int = 0
    lost: float = 0.0

    @property
    def finished(self) -> bool:
        return self.done >= self.work - EPS

    @property
    def remaining(self) -> float:
        return max(0.0, self.work - self.done)


def throughput(model: PowerModel, kind: str, cap: float = 1.0) -> float:
    """Normalised throughput of one GPU of this kind at power-cap fraction ``cap`` (an unknown
    kind is what m2g assumes of foreign GPU work: the pre-training curve)."""
    try:
        k = WorkloadKind(kind)
    except ValueError:
        k = WorkloadKind.UNSPECIFIED
    return model.throughput(k, cap)


def advance(p: Progress, dt: float, rate: float, gpus: int | None = None
            ) -> tuple[Progress, int]:
    """Run for ``dt`` trace seconds at ``rate`` (normalised throughput per GPU, 0 = stalled)
    on ``gpus`` of its GPUs (default all; fewer for a shrunk elastic job, never more); returns
    the new progress and how many checkpoints were taken in that time."""
    if p.finished or dt <= 0:
        return p, 0
    running = p.gpus if gpus is None else max(0, min(gpus, p.gpus))
    if running == 0:
        rate = 0.0
    done = min(p.work, p.done + running * rate * dt)
    if p.checkpoint_s < 0:  # stateless: everything done is kept
        return replace(p, done=done, saved=done), 0
    if p.checkpoint_s == 0 or rate <= 0:
        return replace(p, done=done, since_checkpoint=p.since_checkpoint + dt), 0
    run = p.since_checkpoint + dt
    taken = int(run // p.checkpoint_s)
    if taken == 0:
        return replace(p, done=done, since_checkpoint=run), 0
    after_last = run - taken * p.checkpoint_s  # trace seconds run since the last checkpoint
    saved = max(p.saved, done - running * rate * after_last)
    return replace(p, done=done, saved=saved, since_checkpoint=after_last,
                   checkpoints=p.checkpoints + taken), taken


def evict(p: Progress) -> Progress:
    """The job stops before it is done: it keeps only what its last checkpoint saved."""
    if p.finished:
        return p
    lost = p.done - p.saved
    return replace(p, done=p.saved, since_checkpoint=0.0, evictions=p.evictions + 1,
                   lost=p.lost + lost)
