"""Samples + ``now`` → per-node, per-rack and per-power-domain readings with their age.

Pure: no I/O, no clock of its own. Every reading carries ``age_seconds`` (``inf`` when missing)
and is one of FRESH / STALE / MISSING. A stale or missing reading has ``value=None`` so that no
caller can use it by accident; ``last_value`` keeps what was last seen, for status only.

The fail-safe rule (docs/signals.md), applied by the helpers at the end of this module:

* power (GPU, rack, power domain) stale or missing → **no headroom for new admissions**, and
  **never a reason to shed, cap or preempt** running work;
* temperature stale or missing → **at the limit** for new admissions, never a reason to shed;
* XID stale or missing → **no health verdict**: it neither marks a GPU bad nor clears it.

An INVALID reading (m2g.signals.sanity: not finite, outside the signal's physical bounds, or
stamped in the future) has no value either, so the same rules apply to it as to a missing one.

A node's power/temperature is stale if *any* of its GPUs is (a partial sum would under-report).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from m2g.signals.config import Aggregate, SignalConfig, SignalName, SignalScope
from m2g.signals.sample import Sample
from m2g.signals.sanity import MAX_FUTURE_SECONDS, Bounds, bounds_of

INF = math.inf
XID_OK = 0.0  # DCGM_FI_DEV_XID_ERRORS holds the last XID code; 0 = none


class Freshness(StrEnum):
    """Whether a reading may be used."""

    FRESH = "fresh"
    STALE = "stale"  # present but older than max_age_seconds
    MISSING = "missing"  # no series at all (or the query failed)
    INVALID = "invalid"  # a value no sensor can read (m2g.signals.sanity): used as missing


@dataclass(frozen=True, slots=True)
class SignalReading:
    """One value with its age; ``value`` is None unless the reading is fresh."""

    value: float | None
    age_seconds: float
    max_age_seconds: float
    freshness: Freshness
    last_value: float | None = None

    @property
    def stale(self) -> bool:
        """True when the value must not be used (stale or missing)."""
        return self.freshness is not Freshness.FRESH

    @classmethod
    def missing(cls, max_age_seconds: float) -> SignalReading:
        return cls(None, INF, max_age_seconds, Freshness.MISSING)

    @classmethod
    def invalid(cls, max_age_seconds: float) -> SignalReading:
        return cls(None, INF, max_age_seconds, Freshness.INVALID)

    @classmethod
    def of(cls, value: float, age_seconds: float, max_age_seconds: float,
           bounds: Bounds | None = None) -> SignalReading:
        """A reading of ``value`` scraped ``age_seconds`` ago; INVALID when ``value`` or its
        timestamp is impossible (non-finite always; ``bounds`` when given)."""
        bad = (bounds or _ANY).why_invalid(value, age_seconds)
        if bad is not None:
            return cls.invalid(max_age_seconds)
        age = max(0.0, age_seconds)  # a scrape slightly "from the future" (clock skew) is new
        if age > max_age_seconds:
            return cls(None, age, max_age_seconds, Freshness.STALE, value)
        return cls(value, age, max_age_seconds, Freshness.FRESH, value)


_ANY = Bounds(-INF, INF)


@dataclass(frozen=True, slots=True)
class NodeReadings:
    """Signals of one node (tray), aggregated over its GPUs."""

    name: str
    power_w: SignalReading  # sum over GPUs
    gpu_temp_max_c: SignalReading
    xid: SignalReading  # the largest last-XID code over its GPUs; 0 = none
    gpu_power_w: Mapping[str, SignalReading] = field(default_factory=dict)
    gpu_temp_c: Mapping[str, SignalReading] = field(default_factory=dict)
    xid_gpus: tuple[str, ...] = ()  # GPUs whose fresh XID code is non-zero


@dataclass(frozen=True, slots=True)
class RackReadings:
    name: str
    power_kw: SignalReading
    inlet_c: SignalReading
    coolant_c: SignalReading


@dataclass(frozen=True, slots=True)
class DomainReadings:
    name: str
    power_kw: SignalReading


@dataclass(frozen=True, slots=True)
class SignalStatus:
    """Per signal: how many series are fresh / stale / missing, the oldest age, the error."""

    name: SignalName
    fresh: int
    stale: int
    missing: int
    max_age_seconds: float  # the oldest reading's age (inf if any is missing or invalid)
    error: str = ""
    invalid: int = 0  # readings refused by m2g.signals.sanity (counted apart from missing)


@dataclass(frozen=True, slots=True)
class Expected:
    """What should report: a node/rack/domain listed here without a series reads MISSING."""

    nodes: tuple[str, ...] = ()
    racks: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    gpus_per_node: int = 0  # 0 = do not check how many GPUs report


@dataclass(frozen=True, slots=True)
class Readings:
    """Everything read at ``now``."""

    now: float
    nodes: Mapping[str, NodeReadings]
    racks: Mapping[str, RackReadings]
    domains: Mapping[str, DomainReadings]
    status: Mapping[SignalName, SignalStatus]

    @property
    def stale_signals(self) -> tuple[SignalName, ...]:
        return tuple(n for n, s in self.status.items()
                     if s.stale or s.missing or s.invalid or s.error)


def _latest(samples: Iterable[Sample], key: tuple[str, ...]) -> dict[tuple[str, ...], Sample]:
    """The newest sample per key (label values); samples lacking a key label are skipped."""
    out: dict[tuple[str, ...], Sample] = {}
    for s in samples:
        if any(k not in s.labels for k in key):
            continue
        k = tuple(s.labels[name] for name in key)
        if k not in out or s.timestamp > out[k].timestamp:
            out[k] = s
    return out


def _keyed(samples: Sequence[Sample] | None, label: str, now: float, max_age: float,
           expected: Iterable[str], aggregate: Aggregate = Aggregate.NEWEST,
           bounds: Bounds | None = None) -> dict[str, SignalReading]:
    if aggregate is Aggregate.NEWEST:
        out = {k[0]: SignalReading.of(s.value, now - s.timestamp, max_age, bounds)
               for k, s in _latest(_plausible(samples, now), (label,)).items()}
    else:  # every distinct series of a key is one part (a PDU of the rack, a sensor)
        parts: dict[str, list[SignalReading]] = {}
        newest: dict[tuple[tuple[str, str], ...], Sample] = {}
        for s in _plausible(samples, now):  # a series twice (federation, replay): newest counts
            if label in s.labels and (s.identity() not in newest
                                      or s.timestamp > newest[s.identity()].timestamp):
                newest[s.identity()] = s
        for s in newest.values():
            parts.setdefault(s.labels[label], []).append(
                SignalReading.of(s.value, now - s.timestamp, max_age, bounds))
        how = "sum" if aggregate is Aggregate.SUM else "max"
        out = {key: _combine(p, how, max_age) for key, p in parts.items()}
    for name in expected:
        out.setdefault(name, SignalReading.missing(max_age))
    return out


def _combine(parts: Sequence[SignalReading], how: str, max_age: float) -> SignalReading:
    """Sum or max of GPU readings; stale if any part is (oldest part's age)."""
    if not parts:
        return SignalReading.missing(max_age)
    age = max(p.age_seconds for p in parts)
    lasts = [p.last_value for p in parts if p.last_value is not None]
    last = (sum(lasts) if how == "sum" else max(lasts)) if lasts else None
    if any(p.freshness is Freshness.INVALID for p in parts):
        return SignalReading(None, INF, max_age, Freshness.INVALID, last)
    if any(p.freshness is Freshness.MISSING for p in parts):
        return SignalReading(None, INF, max_age, Freshness.MISSING, last)
    if any(p.stale for p in parts):
        return SignalReading(None, age, max_age, Freshness.STALE, last)
    values = [p.value for p in parts if p.value is not None]
    return SignalReading(sum(values) if how == "sum" else max(values), age, max_age,
                         Freshness.FRESH, last)


def _per_gpu(samples: Sequence[Sample] | None, host_label: str, gpu_label: str, now: float,
             max_age: float, bounds: Bounds | None = None
             ) -> dict[str, dict[str, SignalReading]]:
    out: dict[str, dict[str, SignalReading]] = {}
    for (host, gpu), s in _latest(_plausible(samples, now), (host_label, gpu_label)).items():
        out.setdefault(host, {})[gpu] = SignalReading.of(s.value, now - s.timestamp, max_age,
                                                         bounds)
    return out


def _plausible(samples: Sequence[Sample] | None, now: float) -> Sequence[Sample]:
    """The samples, those stamped in the future (or not finite) turned into NaN at ``-inf``:
    "newest wins" must not let a bad stamp hide a good sample of the same series, and when no
    good one exists the NaN makes the reading INVALID."""
    out = []
    for s in samples or ():
        ts = s.timestamp
        if not math.isfinite(ts) or ts - now > MAX_FUTURE_SECONDS:
            s = Sample(s.labels, math.nan, -INF)
        out.append(s)
    return out


def _pad(gpus: dict[str, SignalReading], count: int, max_age: float) -> list[SignalReading]:
    parts = list(gpus.values())
    return parts + [SignalReading.missing(max_age)] * max(0, count - len(parts))


def build_readings(samples: Mapping[SignalName, Sequence[Sample]], now: float,
                   config: SignalConfig | None = None, expected: Expected | None = None,
                   errors: Mapping[SignalName, str] | None = None) -> Readings:
    """Project the samples of each signal (absent = query failed or never ran) into readings.

    ``now`` is the reading time (Unix seconds); ages are ``now - sample.timestamp``.
    """
    cfg = config or SignalConfig()
    exp = expected or Expected()
    errs = dict(errors or {})
    spec = cfg.signals

    def gpu_signal(name: SignalName) -> dict[str, dict[str, SignalReading]]:
        s = spec[name]
        if s.scope is not SignalScope.GPU:
            raise ValueError(f"signal {name} must have scope gpu")
        return _per_gpu(samples.get(name), s.key_label, s.gpu_label, now, s.max_age_seconds,
                        bounds_of(name))

    power, temp, xid = (gpu_signal(n) for n in
                        (SignalName.GPU_POWER_W, SignalName.GPU_TEMP_C, SignalName.GPU_XID))
    nodes: dict[str, NodeReadings] = {}
    for node in sorted(set(exp.nodes) | set(power) | set(temp) | set(xid)):
        p, t, x = power.get(node, {}), temp.get(node, {}), xid.get(node, {})
        n = exp.gpus_per_node
        nodes[node] = NodeReadings(
            name=node,
            power_w=_combine(_pad(p, n, spec[SignalName.GPU_POWER_W].max_age_seconds), "sum",
                             spec[SignalName.GPU_POWER_W].max_age_seconds),
            gpu_temp_max_c=_combine(_pad(t, n, spec[SignalName.GPU_TEMP_C].max_age_seconds),
                                    "max", spec[SignalName.GPU_TEMP_C].max_age_seconds),
            xid=_combine(_pad(x, n, spec[SignalName.GPU_XID].max_age_seconds), "max",
                         spec[SignalName.GPU_XID].max_age_seconds),
            gpu_power_w=dict(sorted(p.items())),
            gpu_temp_c=dict(sorted(t.items())),
            xid_gpus=tuple(sorted(g for g, r in x.items()
                                  if r.value is not None and r.value != XID_OK)),
        )

    def facility(name: SignalName, expected_keys: Iterable[str]) -> dict[str, SignalReading]:
        s = spec[name]
        return _keyed(samples.get(name), s.key_label, now, s.max_age_seconds, expected_keys,
                      s.aggregate, bounds_of(name))

    rp = facility(SignalName.RACK_POWER_KW, exp.racks)
    ri = facility(SignalName.RACK_INLET_C, exp.racks)
    rc = facility(SignalName.COOLANT_TEMP_C, exp.racks)
    def get(d: dict[str, SignalReading], rack: str, name: SignalName) -> SignalReading:
        return d.get(rack) or SignalReading.missing(spec[name].max_age_seconds)

    racks = {rack: RackReadings(rack, get(rp, rack, SignalName.RACK_POWER_KW),
                                get(ri, rack, SignalName.RACK_INLET_C),
                                get(rc, rack, SignalName.COOLANT_TEMP_C))
             for rack in sorted(set(rp) | set(ri) | set(rc))}
    dp = facility(SignalName.DOMAIN_POWER_KW, exp.domains)
    domains = {d: DomainReadings(d, r) for d, r in sorted(dp.items())}

    per_signal: dict[SignalName, list[SignalReading]] = {
        SignalName.GPU_POWER_W: [r for n in nodes.values() for r in
                                 _pad(dict(n.gpu_power_w), exp.gpus_per_node,
                                      spec[SignalName.GPU_POWER_W].max_age_seconds)],
        SignalName.GPU_TEMP_C: [r for n in nodes.values() for r in
                                _pad(dict(n.gpu_temp_c), exp.gpus_per_node,
                                     spec[SignalName.GPU_TEMP_C].max_age_seconds)],
        SignalName.GPU_XID: [r for g in xid.values() for r in g.values()]
        + [n.xid for n in nodes.values() if n.name not in xid],
        SignalName.RACK_POWER_KW: [r.power_kw for r in racks.values()],
        SignalName.RACK_INLET_C: [r.inlet_c for r in racks.values()],
        SignalName.COOLANT_TEMP_C: [r.coolant_c for r in racks.values()],
        SignalName.DOMAIN_POWER_KW: [d.power_kw for d in domains.values()],
    }
    status = {name: _status(name, per_signal.get(name, []), errs.get(name, ""))
              for name in SignalName}
    return Readings(now, nodes, racks, domains, status)


def _status(name: SignalName, readings: Sequence[SignalReading], error: str) -> SignalStatus:
    fresh = sum(r.freshness is Freshness.FRESH for r in readings)
    stale = sum(r.freshness is Freshness.STALE for r in readings)
    missing = sum(r.freshness is Freshness.MISSING for r in readings)
    invalid = sum(r.freshness is Freshness.INVALID for r in readings)
    if not readings:
        missing = 1  # a signal with no series at all is missing, not "all fresh"
    oldest = max((r.age_seconds for r in readings), default=INF)
    return SignalStatus(name, fresh, stale, missing, oldest, error, invalid)


# ---- the fail-safe rule -------------------------------------------------------------------


def admission_headroom(draw: SignalReading, cap: float) -> float:
    """Power (or any budget) headroom for *new* admissions: zero unless the draw is fresh."""
    if draw.value is None:
        return 0.0
    return max(0.0, cap - draw.value)


def thermal_headroom(temp: SignalReading, limit_c: float) -> float:
    """Degrees below the limit for new admissions: zero (at the limit) unless fresh."""
    if temp.value is None:
        return 0.0
    return max(0.0, limit_c - temp.value)


def may_shed(draw: SignalReading, cap: float) -> bool:
    """Whether running work may be shed/capped for exceeding ``cap``: only on fresh data."""
    return draw.value is not None and draw.value > cap


def gpu_failed(xid: SignalReading) -> bool | None:
    """True/False from a fresh XID reading; None (no verdict) when stale or missing."""
    if xid.value is None:
        return None
    return xid.value != XID_OK
