"""Physical bounds per signal: a sample outside them is INVALID, not a value (docs/signals.md).

A sensor or exporter can say anything: ``+Inf`` or ``1e300`` kW for a rack would shed all
flexible work, ``-500`` kW would add headroom and admit past the budget, a timestamp from the
future would read as age 0. A reading is therefore invalid when its value is not finite, is
below ``low`` or above ``high`` (well beyond anything rated: a bound, not a threshold), or its
timestamp is more than ``MAX_FUTURE_SECONDS`` ahead of the reader's clock. An invalid reading
has no value, so it takes the same fail-safe as a missing one, and it is counted apart in the
status and the ``m2g_signal_series{freshness="invalid"}`` metric.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from m2g.signals.config import SignalName

#: A scrape this far ahead of the reader's clock is clock skew; further, the sample is invalid.
MAX_FUTURE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """The physically possible range of one signal's values (after its ``scale``)."""

    low: float
    high: float

    def why_invalid(self, value: float, age_seconds: float) -> str | None:
        """Why a sample cannot be a reading, or None when it can."""
        if not math.isfinite(value):
            return f"value {value} is not finite"
        if value < self.low or value > self.high:
            return f"value {value:g} outside [{self.low:g}, {self.high:g}]"
        if math.isnan(age_seconds) or age_seconds < -MAX_FUTURE_SECONDS:
            return f"timestamp {-age_seconds:.0f}s in the future"
        return None


#: GB300 GPUs are rated ~1.4 kW and throttle near 90 °C; an NVL72 rack draws ~130-140 kW and the
#: densest announced racks ~600 kW; XID codes are small non-negative integers. Each bound leaves
#: a wide margin so that no real reading is ever refused.
DEFAULT_BOUNDS: dict[SignalName, Bounds] = {
    SignalName.GPU_POWER_W: Bounds(0.0, 5_000.0),
    SignalName.GPU_TEMP_C: Bounds(-40.0, 200.0),
    SignalName.GPU_XID: Bounds(0.0, 100_000.0),
    SignalName.RACK_POWER_KW: Bounds(0.0, 2_000.0),
    SignalName.RACK_INLET_C: Bounds(-40.0, 100.0),
    SignalName.COOLANT_TEMP_C: Bounds(-40.0, 120.0),
    SignalName.DOMAIN_POWER_KW: Bounds(0.0, 2_000_000.0),
}


def bounds_of(name: SignalName) -> Bounds:
    return DEFAULT_BOUNDS.get(name, Bounds(-math.inf, math.inf))
