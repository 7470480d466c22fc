"""First-order thermal model: every temperature relaxes towards its steady state.

``relax(x, target, dt, tau) = target + (x − target)·exp(−dt/τ)`` is exact for a target held
constant over the step, so the result does not depend on how the time is cut into steps.

Steady states (docs/signals.md):

* coolant supply (CDU) = ``coolant_c`` + the rack's cooling-degraded delta;   τ = 120 s
* rack air inlet = ``inlet_c`` + ``inlet_rise_per_kw`` × rack kW + the delta;  τ = 60 s
* GPU = coolant + ``gpu_offset_c`` + ``gpu_rise_c`` × P/TDP, fit to the H200 recording
  (T = 35.1 °C + 27.8 °C × P/TDP at 30 °C coolant-equivalent; its die time constant is below
  the 250 ms sampling, so ``gpu_tau_s`` is 0.3 s, i.e. GPUs track power within one step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def relax(x: float, target: float, dt: float, tau: float) -> float:
    """Advance a first-order lag by ``dt`` seconds towards ``target``."""
    if dt <= 0:
        return x
    if tau <= 0:
        return target
    return target + (x - target) * math.exp(-dt / tau)


@dataclass(frozen=True)
class ThermalModel:
    coolant_c: float = 30.0  # facility water / CDU supply, °C (assumption)
    coolant_tau_s: float = 120.0
    inlet_c: float = 25.0  # cold-aisle air, °C (assumption)
    inlet_rise_per_kw: float = 0.02  # recirculation: °C per rack kW (assumption)
    inlet_tau_s: float = 60.0
    gpu_offset_c: float = 5.1  # fit: 35.1 °C at zero power with 30 °C coolant-equivalent
    gpu_rise_c: float = 27.8  # fit: °C per TDP of power (H200: 0.0397 °C/W × 700 W)
    gpu_tau_s: float = 0.3

    def coolant_target(self, delta_c: float) -> float:
        return self.coolant_c + delta_c

    def inlet_target(self, rack_kw: float, delta_c: float) -> float:
        return self.inlet_c + self.inlet_rise_per_kw * rack_kw + delta_c

    def gpu_target(self, coolant_c: float, power_fraction: float) -> float:
        return coolant_c + self.gpu_offset_c + self.gpu_rise_c * power_fraction
