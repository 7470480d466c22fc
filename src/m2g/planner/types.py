"""What the planner reads (a cluster snapshot) and what it returns (a plan of changes).

Adapters (m2g.k8s) build a ``ClusterSnapshot`` from their watch caches and the signal readers,
the pure planner turns it into a ``Plan``, and the adapters apply the plan. Every field is plain
data; nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from m2g.model.factory import FactorySnapshot
from m2g.model.inputs import WorkloadView

CHECK_CONTROLLER = "m2g.io/policy"  # AdmissionCheck.spec.controllerName m2g answers for


class CheckState(StrEnum):
    """Kueue AdmissionCheckState values."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


class Phase(StrEnum):
    """Where a Kueue Workload is, as m2g needs to know it."""

    PENDING = "Pending"  # no quota reserved yet
    RESERVED = "Reserved"  # quota reserved, waiting for admission checks
    ADMITTED = "Admitted"
    FINISHED = "Finished"
    INACTIVE = "Inactive"  # spec.active=false (m2g or someone deactivated it)


@dataclass(frozen=True)
class WorkloadState:
    """A Kueue Workload: its CEL view plus the Kueue facts the planner acts on."""

    namespace: str
    name: str
    view: WorkloadView
    phase: Phase
    cluster_queue: str = ""
    check: str = ""  # the name of m2g's AdmissionCheck on this workload ("" if none)
    check_state: CheckState | None = None
    check_message: str = ""
    shed_by_m2g: bool = False  # deactivated by m2g (annotation), so m2g may bring it back
    shed_at: datetime | None = None
    #: Kueue still holds its quota (QuotaReserved): for a deactivated workload, its pods have
    #: not all stopped yet, so it still draws power.
    holds_quota: bool = False
    admitted_at: datetime | None = None
    drained_for: str = ""  # set when m2g evicted it off nodes (e.g. "maintenance/<window>")
    #: The newest checkpoint time the Workload itself reports (``m2g.io/last-checkpoint-time``);
    #: reports on its pods are merged in when the snapshot is built (``view.checkpoint``).
    checkpoint_reported_at: datetime | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class FlavorQuota:
    """One (flavor, resource) quota of a ClusterQueue: Kueue's value and m2g's base."""

    flavor: str
    resource: str
    nominal: int  # what the ClusterQueue says now
    base: int  # the platform team's value (m2g records it before it first derates)


@dataclass(frozen=True)
class QueueState:
    """A Kueue ClusterQueue."""

    name: str
    quotas: tuple[FlavorQuota, ...] = ()
    stop_policy: str = "None"
    stop_set_by_m2g: bool = False  # m2g only lifts a stopPolicy it set itself
    used_gpus: int = 0
    pending_workloads: int = 0
    cohort: str = ""
    weight: float | None = None
    last_quota_change: datetime | None = None


@dataclass(frozen=True)
class FlavorState:
    """A ResourceFlavor and the factory domain its nodes belong to ("" = the whole site)."""

    name: str
    domain: str = ""
    node_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KaiTopologyState:
    """A KAI ``Topology`` (kai.scheduler/v1alpha1) as it is in the cluster."""

    name: str
    levels: tuple[str, ...]  # spec.levels[].nodeLabel, coarse to fine
    managed_by_m2g: bool = False  # created by m2g (label), so m2g may replace it


@dataclass(frozen=True)
class KaiQueueState:
    """A KAI ``Queue`` (scheduling.run.ai/v2) that names a power budget (``m2g.io/power-domain``).

    GPU values are KAI's: fractions of a GPU, ``-1`` = unlimited."""

    name: str
    power_domain: str  # a PowerDomain's name (a Site-level one: the site budget and grid events)
    quota: float  # spec.resources.gpu.quota
    limit: float  # spec.resources.gpu.limit now (unset reads as 0, KAI's Go zero value)
    base_limit: float  # the platform team's limit (recorded by m2g before it first changes it)
    last_change: datetime | None = None


@dataclass(frozen=True)
class KaiState:
    """What m2g reads from KAI: the node label keys on GPU nodes, Topologies, budgeted Queues."""

    node_label_keys: frozenset[str] = frozenset()
    topologies: tuple[KaiTopologyState, ...] = ()
    queues: tuple[KaiQueueState, ...] = ()
    topology_served: bool = True  # False: KAI without its Topology CRD (Queues only)


@dataclass(frozen=True)
class GridEventState:
    """A GridEvent CR as a whole (the factory holds one ``GridEvent`` per interval): what its
    status needs. ``status``: the CR's status as read (m2g writes it)."""

    name: str
    event_id: str
    start: datetime | None  # the first interval's start
    end: datetime | None  # the last interval's end
    reduction_pct: float = 0.0
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def conditions(self) -> dict[str, Mapping[str, Any]]:
        return {str(c.get("type")): c for c in self.status.get("conditions") or []
                if isinstance(c, Mapping)}

    @property
    def baseline_kw(self) -> float | None:
        value = self.status.get("observedBaselineKw")
        return float(value) if isinstance(value, int | float) and value > 0 else None

    @property
    def baseline_reason(self) -> str:
        return str((self.conditions.get("BaselineObserved") or {}).get("reason", ""))

    @property
    def baseline_how(self) -> str:
        return str((self.conditions.get("BaselineObserved") or {}).get("message", ""))


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one reconcile decides on."""

    factory: FactorySnapshot
    workloads: tuple[WorkloadState, ...] = ()
    queues: tuple[QueueState, ...] = ()
    flavors: tuple[FlavorState, ...] = ()
    kai: KaiState | None = None  # None: KAI's CRDs are not served (nothing to keep in step)
    #: Workload key ("ns/name") → the nodes its unfinished pods are bound to.
    placements: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    grid_event_states: tuple[GridEventState, ...] = ()
    #: (time, site kW) of the recent fresh site-draw readings, oldest first (the controller
    #: keeps them): percentage events measure their baseline on them.
    draw_history: tuple[tuple[datetime, float], ...] = ()

    @property
    def now(self) -> datetime:
        return self.factory.now


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
class Plan:
    """The changes one reconcile wants; applying the same plan twice changes nothing more."""

    checks: tuple[CheckUpdate, ...] = ()
    quotas: tuple[QuotaUpdate, ...] = ()
    stops: tuple[StopUpdate, ...] = ()
    sheds: tuple[ShedAction, ...] = ()
    weights: tuple[WeightUpdate, ...] = ()
    notes: tuple[str, ...] = ()
    kai_topologies: tuple[KaiTopologyUpdate, ...] = ()
    kai_queues: tuple[KaiQueueUpdate, ...] = ()
    taints: tuple[NodeTaintUpdate, ...] = ()
    event_statuses: tuple[GridEventStatusUpdate, ...] = ()
    #: Reconcile again by then even if nothing changes (a grid event starts or ends).
    wake_at: datetime | None = None

    def empty(self) -> bool:
        return not (self.checks or self.quotas or self.stops or self.sheds or self.weights
                    or self.kai_topologies or self.kai_queues or self.taints
                    or self.event_statuses)
