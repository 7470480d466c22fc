"""Signal freshness for status and metrics: what the controllers show about their inputs.

``SignalStatusCollector`` exposes, per signal, the oldest reading's age, how many series are
fresh / stale / missing / invalid and whether the last query failed; ``status_lines`` is the
same as text for ``m2g status``-style output. Both read a ``Readings`` through a callable at
collect time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from m2g.signals.readings import Readings


class SignalStatusCollector(Collector):
    """``m2g_signal_*`` metrics for the latest ``Readings`` (nothing before the first)."""

    def __init__(self, get_readings: Callable[[], Readings | None], *, age: bool = True
                 ) -> None:
        self._get = get_readings
        self._age = age  # False: the registry has its own m2g_signal_age_seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        readings = self._get()
        if readings is None:
            return
        age = GaugeMetricFamily("m2g_signal_age_seconds",
                                "Age of the oldest reading of the signal (+Inf if missing).",
                                labels=("signal",))
        series = GaugeMetricFamily("m2g_signal_series",
                                   "Readings of the signal by freshness.",
                                   labels=("signal", "freshness"))
        failed = GaugeMetricFamily("m2g_signal_query_failed",
                                   "1 if the last query for the signal failed.",
                                   labels=("signal",))
        stale = GaugeMetricFamily("m2g_signal_stale",
                                  "1 if any reading of the signal is stale or missing (the "
                                  "fail-safe rule is in force for it).", labels=("signal",))
        for name, st in readings.status.items():
            age.add_metric([str(name)], st.max_age_seconds)
            for fresh, count in (("fresh", st.fresh), ("stale", st.stale),
                                 ("missing", st.missing), ("invalid", st.invalid)):
                series.add_metric([str(name), fresh], float(count))
            failed.add_metric([str(name)], 1.0 if st.error else 0.0)
            stale.add_metric([str(name)], 1.0 if name in readings.stale_signals else 0.0)
        yield from (age, series, failed, stale) if self._age else (series, failed, stale)


def status_lines(readings: Readings) -> list[str]:
    """One line per signal: ``gpu_power_w  fresh 144  stale 0  missing 0  oldest 4.2s``."""
    out = []
    for name, st in readings.status.items():
        oldest = "∞" if math.isinf(st.max_age_seconds) else f"{st.max_age_seconds:.1f}s"
        line = (f"{name:<16} fresh {st.fresh:<5} stale {st.stale:<5} missing {st.missing:<5} "
                f"oldest {oldest}")
        if st.invalid:
            line += f"  invalid {st.invalid}"
        if name in readings.stale_signals:
            line += "  FAIL-SAFE"
        if st.error:
            line += f"  error: {st.error}"
        out.append(line)
    return out
