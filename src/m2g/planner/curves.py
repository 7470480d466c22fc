"""Power and throughput of a workload under a per-GPU power cap, for the curtailment planner.

Throughput at cap ``c`` (fraction of the GPU's default limit): the workload's own curve
(``m2g.io/power-curve``, the template's ``power.capCurve``) when it has one, else its kind's
measured curve (the Emerald DVFS sweep, data/emerald-dr-2025/dvfs_sweep.csv, as the simulator
ships it: m2g.sim.power). Power at ``c``: the kind's measured draw at ``c`` over its draw
uncapped, so a workload's kW at a cap is its full-power kW × that ratio. Both are read from
the same curves the simulator draws power with, so the twin and the planner agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from m2g.model.cluster import WorkloadState
from m2g.model.inputs import WorkloadKind
from m2g.sim.power import PowerModel, interp


@cache
def power_model() -> PowerModel:
    return PowerModel()


@dataclass(frozen=True)
class CapCurve:
    """One workload's curve: throughput and relative power at each cap."""

    caps: tuple[float, ...]
    throughputs: tuple[float, ...]
    powers: tuple[float, ...]  # draw at the cap / draw uncapped
    #: cap → (throughput, power), as interpolated: the planner asks a kind's curve the same
    #: few cap levels for every cappable job (60,000 running at 1,400 racks)
    _at: dict[float, tuple[float, float]] = field(default_factory=dict, compare=False,
                                                  hash=False, repr=False)

    def _values(self, cap: float) -> tuple[float, float]:
        got = self._at.get(cap)
        if got is None:
            got = (interp(self.caps, self.throughputs, cap), interp(self.caps, self.powers, cap))
            if len(self._at) < 256:
                self._at[cap] = got
        return got

    def throughput(self, cap: float) -> float:
        return self._values(cap)[0]

    def power(self, cap: float) -> float:
        return self._values(cap)[1]


@cache
def kind_curve(kind: WorkloadKind) -> CapCurve:
    pm = power_model()
    pts = pm.curves[pm.profiles[kind].curve]
    full = pm.full_fraction(pm.profiles[kind].curve, 1.0)
    return CapCurve(tuple(p.cap for p in pts), tuple(p.throughput for p in pts),
                    tuple(p.power / full for p in pts))


def curve_of(w: WorkloadState) -> CapCurve:
    """The workload's curve (its own throughput points if it declares them)."""
    base = kind_curve(w.view.kind)
    if len(w.cap_curve) < 2:
        return base
    caps = tuple(c for c, _ in w.cap_curve)
    return CapCurve(caps, tuple(t for _, t in w.cap_curve),
                    tuple(base.power(c) for c in caps))
