"""What a reconcile wants changed: a ``Plan`` of updates, which the adapters (m2g.k8s) apply.

The pure planner (m2g.planner.make_plan) returns it from a ``ClusterSnapshot``
(m2g.model.cluster). Every field is plain data; applying the same plan twice changes nothing
more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from m2g.model.cluster import CheckState


def format_api_time(t: datetime) -> str:
    """RFC 3339 in whole seconds, UTC, as the API server stores condition times."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CheckUpdate:
    """Set m2g's AdmissionCheck entry on a Workload (server-side apply on status)."""

    namespace: str
    name: str
    check: str
    state: CheckState
    message: str
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[dict[str, Any], ...] = ()
    policy: str = ""  # the policy whose rule decided ("" when nothing fired)
    rule: str = ""  # that rule's name


@dataclass(frozen=True)
class QuotaUpdate:
    """Set a ClusterQueue flavor's nominalQuota for a resource."""

    cluster_queue: str
    flavor: str
    resource: str
    nominal: int
    base: int
    reason: str


@dataclass(frozen=True)
class StopUpdate:
    """Set a ClusterQueue's stopPolicy (None | Hold | HoldAndDrain)."""

    cluster_queue: str
    stop_policy: str
    reason: str


@dataclass(frozen=True)
class PreemptionUpdate:
    """Set a ClusterQueue's ``spec.preemption.withinClusterQueue`` to ``within`` and m2g's
    record of the site's value (annotation ``m2g.io/base-within-preemption``) to ``base``
    ("": remove the record; the site's value is back)."""

    cluster_queue: str
    within: str
    base: str
    reason: str


@dataclass(frozen=True)
class ShedAction:
    """Deactivate (shed) or reactivate (restore) a Workload (``spec.active``). ``drain``:
    set when the workload is evicted off nodes (a maintenance drain, e.g.
    ``maintenance/<window>``) rather than shed for power."""

    namespace: str
    name: str
    active: bool
    kw: float
    reason: str
    drain: str = ""


class TaintEffect(StrEnum):
    """The taint effects m2g uses: NoSchedule keeps new pods (and Kueue TAS) off a node and
    leaves running pods alone; m2g drains those itself, through Kueue."""

    NO_SCHEDULE = "NoSchedule"


@dataclass(frozen=True)
class NodeTaintUpdate:
    """Add (or change the value of) or remove one of m2g's own taints on a Node."""

    node: str
    key: str
    value: str
    effect: TaintEffect
    add: bool
    reason: str


@dataclass(frozen=True)
class WeightUpdate:
    """Set a ClusterQueue's fairSharing.weight."""

    cluster_queue: str
    weight: float
    reason: str


@dataclass(frozen=True)
class KaiTopologyUpdate:
    """Create a KAI Topology, or replace one m2g made (its nodeLabels are immutable in KAI)."""

    name: str
    levels: tuple[str, ...]
    replace: bool  # delete the current object first
    reason: str


@dataclass(frozen=True)
class KaiQueueUpdate:
    """Set a KAI Queue's ``spec.resources.gpu.limit`` (-1 = unlimited)."""

    queue: str
    limit: float
    base: float  # the platform team's limit; setting it back hands the field back to them
    reason: str


@dataclass(frozen=True)
class GridEventStatusUpdate:
    """Server-side apply these ``status`` fields of a GridEvent (m2g owns them)."""

    name: str
    status: Mapping[str, Any]


@dataclass(frozen=True)
class CapAction:
    """Set (or lift: ``fraction`` 1.0) the per-GPU power cap of a Workload: m2g's record on the
    Workload (annotations ``m2g.io/power-cap``, ``-at``, ``m2g.io/flex-used-seconds``); the
    nodes follow through ``NodeLimitUpdate``. ``kw``: the draw it saves (negative: adds)."""

    namespace: str
    name: str
    fraction: float
    kw: float
    reason: str
    #: Throughput-seconds its caps have cost up to now (carried into the new record).
    flex_used_seconds: float = 0.0
    throughput: float = 1.0  # its throughput at ``fraction`` (the curve's)
    #: Write the record even when it already holds ``fraction``: the cap had lapsed (the node
    #: agent restored full power when its lease ran out) and is set anew, from now.
    renew: bool = False


@dataclass(frozen=True)
class ResizeAction:
    """Shrink an elastic batch/v1 Job ``job`` (its Workload: ``name``) to ``parallelism``
    replicas, or grow it back (``parallelism`` == ``full``): a merge patch of the Job's
    ``spec.parallelism`` and m2g's record (``m2g.io/resized-from``, ``-at``) on the Workload
    and the Job. ``kw``: the draw it saves (negative: adds)."""

    namespace: str
    name: str
    job: str
    parallelism: int
    full: int
    kw: float
    reason: str


@dataclass(frozen=True)
class NodeLimitUpdate:
    """Server-side apply the spec of a node's GPUPowerLimit (``fraction`` < 1, with a lease
    until ``expires_at``), or delete it (``fraction`` None: released)."""

    node: str
    fraction: float | None
    expires_at: datetime | None
    workloads: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ReservationStatusUpdate:
    """Server-side apply these ``status`` fields of a Reservation (m2g owns them)."""

    name: str
    status: Mapping[str, Any]


@dataclass(frozen=True)
class Plan:
    """The changes one reconcile wants; applying the same plan twice changes nothing more."""

    checks: tuple[CheckUpdate, ...] = ()
    quotas: tuple[QuotaUpdate, ...] = ()
    stops: tuple[StopUpdate, ...] = ()
    #: ClusterQueues whose preemption within the queue m2g turns off for a grid event, or
    #: hands back after it (m2g.planner.eventhold).
    preemptions: tuple[PreemptionUpdate, ...] = ()
    sheds: tuple[ShedAction, ...] = ()
    weights: tuple[WeightUpdate, ...] = ()
    notes: tuple[str, ...] = ()
    kai_topologies: tuple[KaiTopologyUpdate, ...] = ()
    kai_queues: tuple[KaiQueueUpdate, ...] = ()
    taints: tuple[NodeTaintUpdate, ...] = ()
    event_statuses: tuple[GridEventStatusUpdate, ...] = ()
    reservation_statuses: tuple[ReservationStatusUpdate, ...] = ()
    #: Reconcile again by then even if nothing changes (a grid event starts or ends).
    wake_at: datetime | None = None
    caps: tuple[CapAction, ...] = ()
    node_limits: tuple[NodeLimitUpdate, ...] = ()
    resizes: tuple[ResizeAction, ...] = ()
    #: Drawing workloads a Preemption policy failed on while the site was over its limit:
    #: never shed or capped (m2g never sheds on an error), so part of the shortfall may stay
    #: uncovered (``m2g_preemption_failed_workloads``; the plan's line names the first).
    preemption_failed: int = 0

    def empty(self) -> bool:
        return not (self.checks or self.quotas or self.stops or self.preemptions
                    or self.sheds or self.weights
                    or self.kai_topologies or self.kai_queues or self.taints
                    or self.event_statuses or self.caps or self.node_limits
                    or self.reservation_statuses or self.resizes)
