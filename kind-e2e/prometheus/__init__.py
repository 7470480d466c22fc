"""Local Prometheus for tests, the local control plane and the demo (Debian's ``prometheus``).

``server`` starts/stops a ``prometheus`` process on 127.0.0.1 from ``prometheus.yml.tmpl``;
``h200`` turns the recorded H200 telemetry (data/h200-telemetry) into OpenMetrics
with DCGM exporter names and backfills it into a TSDB with ``promtool``. See docs/signals.md.
"""


class PrometheusUnavailable(Exception):
    """The ``prometheus`` / ``promtool`` binaries are not installed (apt-get install prometheus)."""


class PrometheusFailed(Exception):
    """Prometheus or promtool did not do what was asked; the message is one line plus a log tail."""
