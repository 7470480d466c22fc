"""m2g's Prometheus metrics (names with units, labels bounded by policies and queues)."""

from __future__ import annotations

import platform
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

import m2g
from m2g.signals.exposition import SignalStatusCollector
from m2g.signals.readings import Readings


class Metrics:
    """All controller metrics in one registry (a fresh one per manager, so tests can run many)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "m2g_admission_decisions_total", "AdmissionCheck answers, by state and policy",
            ["state", "policy"], registry=r)
        self.reconciles = Counter(
            "m2g_reconciles_total", "Reconciles, by result", ["result"], registry=r)
        self.reconcile_seconds = Histogram(
            "m2g_reconcile_duration_seconds", "Snapshot, plan and apply, end to end",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10), registry=r)
        self.reaction_seconds = Histogram(
            "m2g_reaction_latency_seconds",
            "From a watched change (e.g. a GridEvent) to the plan that answers it being applied",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.signal_age = Gauge(
            "m2g_signal_age_seconds", "Age of the oldest reading of each signal", ["signal"],
            registry=r)
        self.signal_refused = Counter(
            "m2g_signal_answers_refused_total",
            "Prometheus answers refused over a bound (maxSeries, maxValuesPerSeries, maxValues, "
            "maxResponseBytes) and read no further: the signal read as missing",
            ["signal", "bound"], registry=r)
        #: The latest signal read (K8sCluster sets it): m2g_signal_series{signal,freshness},
        #: m2g_signal_query_failed{signal} and m2g_signal_stale{signal} (the alert
        #: M2GSignalStale) from it, at each scrape.
        self.latest_readings: Callable[[], Readings | None] = lambda: None
        r.register(SignalStatusCollector(lambda: self.latest_readings(), age=False))
        self.quota_ratio = Gauge(
            "m2g_quota_derating_ratio", "nominalQuota / base quota per ClusterQueue and flavor",
            ["cluster_queue", "flavor"], registry=r)
        self.shed_kw = Gauge(
            "m2g_shed_kilowatts", "kW of workloads m2g has shed and not yet restored", registry=r)
        self.shed_actions = Counter(
            "m2g_shed_actions_total", "Workloads shed, drained (maintenance) or restored",
            ["action"], registry=r)
        self.power_cap_actions = Counter(
            "m2g_power_cap_actions_total",
            "Per-GPU power caps decided on workloads (cap) or lifted (lift)", ["action"],
            registry=r)
        self.resize_actions = Counter(
            "m2g_resize_actions_total",
            "Elastic Jobs shrunk (shrink) or grown back (grow) under grid events", ["action"],
            registry=r)
        self.capped_gpus = Gauge(
            "m2g_capped_gpus", "GPUs of running workloads under an m2g power cap", registry=r)
        self.taint_changes = Counter(
            "m2g_node_taint_changes_total", "m2g's own node taints decided, by key and action",
            ["key", "action"], registry=r)
        self.preemption_failed = Gauge(
            "m2g_preemption_failed_workloads",
            "Drawing workloads a Preemption policy failed on while the site was over its limit "
            "(never shed or capped: part of the shortfall may stay uncovered)", registry=r)
        self.site_draw_kw = Gauge("m2g_site_draw_kilowatts", "Measured site draw", registry=r)
        self.site_limit_kw = Gauge(
            "m2g_site_limit_kilowatts", "The limit in force (grid target or budget)", registry=r)
        self.leader = Gauge("m2g_leader", "1 while this replica leads", registry=r)
        self.policies = Gauge("m2g_policies_loaded", "Policies in the set in force", registry=r)
        self.policy_errors = Counter(
            "m2g_policy_set_rejections_total", "Policy sets rejected (the last good one stays)",
            registry=r)
        self.webhook_reviews = Counter(
            "m2g_webhook_reviews_total", "Policy admission reviews answered by the webhook, "
            "by outcome (allowed, denied, error: refused as not checked in time; refused: "
            "not a review, or over the size bound)", ["outcome"], registry=r)
        self.shadow = Gauge("m2g_shadow_mode", "1 when deciding without writing", registry=r)
        self.quiet = Gauge(
            "m2g_quiet", "1 while the last reconcile found the factory quiet: pod and settled "
            "Workload changes wait up to --quiet-reconcile-interval (docs/controllers.md)",
            registry=r)
        self.lazy_changes = Counter(
            "m2g_lazy_changes_total", "Watched changes that waited for the quiet interval "
            "instead of starting a reconcile at once", registry=r)
        self.rejected = Gauge(
            "m2g_rejected_objects", "Objects left out of the snapshot as unusable, or used "
            "with an invalid part ignored, by kind",
            ["kind"], registry=r)
        self.forecast_kw = Gauge(
            "m2g_forecast_kilowatts",
            "Day-ahead forecast: mean kW in the interval starting hours_ahead from the forecast "
            "(domain: the site or a power domain; bound: central, low, high; docs/forecast.md)",
            ["domain", "hours_ahead", "bound"], registry=r)
        self.forecast_flex_kw = Gauge(
            "m2g_forecast_flexible_kilowatts",
            "Day-ahead forecast: kW of flexible work per flex tier in the interval",
            ["tier", "hours_ahead"], registry=r)
        self.ready = Gauge("m2g_ready", "1 while /readyz succeeds (see docs/controllers.md)",
                           registry=r)
        self.build_info = Gauge("m2g_build_info", "1; m2g's version and Python's as labels",
                                ["version", "python"], registry=r)
        self.build_info.labels(m2g.__version__, platform.python_version()).set(1)
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... (the
        # controller runs in 1 GiB: its memory is worth a graph)
        ProcessCollector(registry=r)
        self.kai_gpu_limit = Gauge(
            "m2g_kai_queue_gpu_limit",
            "GPU limit m2g last decided for a budgeted KAI Queue (-1 = unlimited)", ["queue"],
            registry=r)
        self.kai_topology_updates = Counter(
            "m2g_kai_topology_updates_total", "KAI Topology creations and replacements decided",
            ["action"], registry=r)
