"""Per-GPU power from the workload kind, the power-cap fraction and the duty cycle.

Model (docs/signals.md has the numbers and the fit):

* ``full(kind, cap)`` — power of a GPU running the kind's workload flat out under a power cap
  of ``cap`` × TDP: the Emerald DVFS sweep's family curve (fractions of TDP, interpolated
  linearly, caps clamped to the sweep's 0.25–1.0), or for ``benchmark`` the H200 bf16 matmul,
  which sits on its cap (690 W of 700 W: ``0.986 × cap``);
* ``idle`` — the H200's idle/TDP ratio (121 W / 700 W = 0.173);
* duty — a workload busy a fraction ``d`` of the time draws ``idle + (full − idle) × g(d)``,
  with ``g`` interpolated through the H200's duty phases (0 → 0, ¼ → 0.40, ½ → 0.68, 1 → 1);
* scaled to a GB300 GPU: TDP 1,400 W (NVIDIA's GB300 NVL72 figure; ≈130 kW a rack with the
  trays' CPUs, NICs and switches, which ``node_overhead_kw`` stands for).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from m2g.model.inputs import WorkloadKind
from m2g.sim.data import CurvePoint, Curves, load_curves

GB300_TDP_W = 1400.0
H200_TDP_W = 700.0
H200_IDLE_W = 121.0
H200_FULL_W = 690.0
# mean power of the H200 in each duty phase of the recording (load-phases.json), W
H200_DUTY_W: tuple[tuple[float, float], ...] = (
    (0.0, 121.0), (0.25, 340.0), (0.5, 510.0), (1.0, 690.0))
MATMUL = "matmul"  # the H200 recording's own curve: power sits on the cap


@dataclass(frozen=True)
class KindProfile:
    """How a workload kind loads a GPU: which measured curve, and how busy it is."""

    curve: str
    duty: float = 1.0


# Assumptions, documented: the three measured families map to their kinds; the others borrow.
DEFAULT_PROFILES: Mapping[WorkloadKind, KindProfile] = {
    WorkloadKind.TRAINING: KindProfile("pre-training"),
    WorkloadKind.FINE_TUNING: KindProfile("fine-tuning"),
    WorkloadKind.INFERENCE: KindProfile("inference"),
    WorkloadKind.BATCH: KindProfile("pre-training"),
    WorkloadKind.BENCHMARK: KindProfile(MATMUL),
    WorkloadKind.AGENTIC: KindProfile("inference", duty=0.5),
    WorkloadKind.DATA_PROCESSING: KindProfile("inference", duty=0.25),
    WorkloadKind.UNSPECIFIED: KindProfile("pre-training"),  # unknown GPU work: assume heavy
}


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x) - 1
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _matmul_curve(curves: Curves) -> tuple[CurvePoint, ...]:
    """The H200 matmul sits on its cap (power = 0.986 × cap); its throughput under a cap was
    not measured, so it borrows the pre-training curve's."""
    full = H200_FULL_W / H200_TDP_W
    return tuple(CurvePoint(p.cap, full * p.cap, p.throughput) for p in curves["pre-training"])


def _default_curves() -> Curves:
    _, curves = load_curves()
    return {**curves, MATMUL: _matmul_curve(curves)}


@dataclass(frozen=True)
class PowerModel:
    """Per-GPU watts; every number is a fraction of ``tdp_w`` until the last multiplication."""

    tdp_w: float = GB300_TDP_W
    idle_fraction: float = H200_IDLE_W / H200_TDP_W
    curves: Curves = field(default_factory=_default_curves)
    profiles: Mapping[WorkloadKind, KindProfile] = field(
        default_factory=lambda: dict(DEFAULT_PROFILES))
    duty_points: tuple[tuple[float, float], ...] = H200_DUTY_W

    @property
    def min_cap(self) -> float:
        return min(p.cap for pts in self.curves.values() for p in pts)

    @property
    def idle_w(self) -> float:
        return self.idle_fraction * self.tdp_w

    def duty_gain(self, duty: float) -> float:
        """g(d): the fraction of (full − idle) drawn at duty ``d`` (H200 recording)."""
        idle, full = self.duty_points[0][1], self.duty_points[-1][1]
        return interp([d for d, _ in self.duty_points],
                      [(w - idle) / (full - idle) for _, w in self.duty_points], duty)

    def full_fraction(self, curve: str, cap: float) -> float:
        pts = self.curves[curve]
        return interp([p.cap for p in pts], [p.power for p in pts], cap)

    def throughput(self, kind: WorkloadKind, cap: float) -> float:
        """Normalised throughput at ``cap`` (1.0 uncapped), from the same sweep."""
        pts = self.curves[self.profiles[kind].curve]
        return interp([p.cap for p in pts], [p.throughput for p in pts], cap)

    def gpu_watts(self, kind: WorkloadKind | None, cap: float = 1.0,
                  duty: float | None = None) -> float:
        """Power of one GPU; ``kind`` None = idle. ``cap`` is clamped to [min_cap, 1]."""
        if kind is None:
            return self.idle_w
        cap = min(1.0, max(self.min_cap, cap))
        profile = self.profiles[kind]
        d = profile.duty if duty is None else min(1.0, max(0.0, duty))
        full = self.full_fraction(profile.curve, cap)
        frac = self.idle_fraction + (full - self.idle_fraction) * self.duty_gain(d)
        return frac * self.tdp_w  # may exceed the cap by ≤2%, as measured at the 100 W cap
