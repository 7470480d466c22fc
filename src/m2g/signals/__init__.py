"""Signals: facility and GPU telemetry read from Prometheus, turned into readings with an age.

``config`` says which PromQL feeds which signal and how old a value may be; ``prometheus`` is the
async HTTP client (instant queries, classified errors); ``readings`` is the pure projection of
samples into per-node / per-rack / per-power-domain readings with the fail-safe staleness rule
applied (docs/signals.md). Nothing here talks to Kubernetes.
"""

from m2g.signals.config import SignalConfig, SignalName, SignalScope, SignalSpec
from m2g.signals.prometheus import (
    PermanentError,
    PrometheusClient,
    PrometheusError,
    RetryableError,
)
from m2g.signals.readings import Readings, SignalReading, build_readings
from m2g.signals.sample import Sample

__all__ = [
    "PermanentError",
    "PrometheusClient",
    "PrometheusError",
    "Readings",
    "RetryableError",
    "Sample",
    "SignalConfig",
    "SignalName",
    "SignalReading",
    "SignalScope",
    "SignalSpec",
    "build_readings",
]
