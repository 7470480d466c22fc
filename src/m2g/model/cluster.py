"""What a reconcile decides on: a cluster snapshot (Kueue workloads and queues, flavors, KAI,
grid events).

Adapters (m2g.k8s) build a ``ClusterSnapshot`` from their watch caches and the signal readers;
the pure planner (m2g.planner) reads it and returns a ``Plan`` (m2g.model.plan). Every field is
plain data; nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from m2g.model.factory import FactorySnapshot
from m2g.model.inputs import Checkpoint, WorkloadView, aged_checkpoint, shallow_copy
from m2g.model.labels import ELASTIC_JOB
from m2g.model.powerlimit import NodeLimitState
from m2g.model.schedule import CapacityPlan, Reservation

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


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """A Kueue Workload: its CEL view plus the Kueue facts the planner acts on.

    Slotted (issue 14): the planner reads every workload's state in some fifteen passes a
    reconcile (100,000 at 1,400 racks), paced by the memory each read touches; a state is
    ~0.3 KB of slots instead of an object and its dict (~0.9 KB even built compact)."""

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
    #: When m2g last restored it (``m2g.io/restored-at``): a restore removes ``shed_at``, and
    #: the ramp counts from the last restore as from the last shed.
    restored_at: datetime | None = None
    #: Kueue still holds its quota (QuotaReserved): for a deactivated workload, its pods have
    #: not all stopped yet, so it still draws power.
    holds_quota: bool = False
    admitted_at: datetime | None = None
    drained_for: str = ""  # set when m2g evicted it off nodes (e.g. "maintenance/<window>")
    #: The newest checkpoint time the Workload itself reports (``m2g.io/last-checkpoint-time``);
    #: reports on its pods are merged in when the snapshot is built (``checkpoint_at``).
    checkpoint_reported_at: datetime | None = None
    #: The per-GPU power cap m2g set on it (fraction of each GPU's default limit; 1.0: none),
    #: since when (with no cap: when the last one was lifted — the ramp counts from it), and
    #: the throughput-seconds its earlier caps cost (Workload annotations ``m2g.io/power-cap``,
    #: ``m2g.io/power-cap-at``, ``m2g.io/flex-used-seconds``: m2g's bookkeeping of its flex
    #: allowance, docs/curtailment.md).
    power_cap: float = 1.0
    power_cap_at: datetime | None = None
    flex_used_seconds: float = 0.0
    #: Its own throughput at a cap, ((cap, throughput), …) by cap, from ``m2g.io/power-curve``
    #: (the template's ``power.capCurve``); empty: its kind's measured curve.
    cap_curve: tuple[tuple[float, float], ...] = ()
    #: The names of the objects it belongs to (its Job, JobSet...: metadata.ownerReferences).
    owners: tuple[str, ...] = ()
    uid: str = ""  # metadata.uid (Kueue names a preemptor by it)
    #: When Kueue last reserved quota for it (QuotaReserved's lastTransitionTime, while True).
    reserved_at: datetime | None = None
    #: When Kueue last released its quota (QuotaReserved's lastTransitionTime, while False):
    #: for a workload m2g shed, when Kueue saw its pods stopped (m2g.planner.shedding).
    released_at: datetime | None = None
    #: The UID of the workload Kueue preempted it for, while its Preempted condition is True
    #: ("Preempted to accommodate a workload (UID: …"; "" otherwise).
    preempted_by: str = ""
    #: Right-sizing (docs/curtailment.md): the name of its batch/v1 Job when Kueue marks it
    #: elastic (``kueue.x-k8s.io/elastic-job``) and the tenant declared a valid
    #: ``m2g.io/min-parallelism`` ("" otherwise); its replicas now (the pod set's count), the
    #: fewest allowed, the count before m2g shrank it (``m2g.io/resized-from``, else now's)
    #: and when m2g shrank it; ``resize_note``: why a declared minimum was ignored.
    elastic_job: str = ""
    parallelism: int = 0
    min_parallelism: int = 0
    full_parallelism: int = 0
    resized_at: datetime | None = None
    resize_note: str = ""
    #: The time fields, derived at use (issue 14: a snapshot reuses an unchanged workload's
    #: state as it is, instead of a copy per workload per reconcile). When set, the view's
    #: ``wait_seconds`` is 0 and the wait at a moment is counted from ``waiting_since`` (a
    #: waiting workload's creation); the view's checkpoint age is 0 and counted from
    #: ``checkpoint_since`` (a running workload's newer of its reported checkpoint and its
    #: start). Unset (a state made by hand): the view's values are the values. Read them
    #: through ``wait_seconds``, ``checkpoint_at`` and ``view_at``, never ``view``'s fields.
    waiting_since: datetime | None = None
    checkpoint_since: datetime | None = None

    #: "namespace/name", worked out once (the planner looks workloads up by it often); not an
    #: argument, and not compared (it follows from the two names).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")

    def with_view(self, view: WorkloadView, **more: Any) -> WorkloadState:
        """A copy with ``view`` and the fields in ``more`` (``dataclasses.replace`` re-runs
        ``__init__`` and its checks over every field)."""
        copied = object.__new__(WorkloadState)
        for name in _STATE_SLOTS:
            object.__setattr__(copied, name, getattr(self, name))
        object.__setattr__(copied, "view", view)
        for name, value in more.items():  # (a name not a slot: AttributeError)
            object.__setattr__(copied, name, value)
        if "namespace" in more or "name" in more:
            copied.__post_init__()
        return copied

    @property
    def kueue_elastic(self) -> bool:
        """Kueue marks it elastic (``kueue.x-k8s.io/elastic-job: "true"``; ``elastic_job``
        implies it): Kueue refuses it a topology request (m2g.planner.preplace)."""
        return bool(self.elastic_job) or self.view.annotations.get(ELASTIC_JOB) == "true"

    def wait_seconds(self, now: datetime) -> int:
        """Seconds it has waited at ``now`` (the view's ``waitSeconds`` then)."""
        since = self.waiting_since
        if since is None:
            return self.view.wait_seconds
        return max(0, int((now - since).total_seconds()))

    def checkpoint_at(self, now: datetime) -> Checkpoint:
        """Its checkpoint facts at ``now`` (the view's ``checkpoint`` then)."""
        since = self.checkpoint_since
        if since is None:
            return self.view.checkpoint
        return aged_checkpoint(self.view.checkpoint,
                               max(0, int((now - since).total_seconds())))

    def view_at(self, now: datetime, **updates: Any) -> WorkloadView:
        """Its view at ``now`` (what policies read), with the fields in ``updates`` set too:
        ``view`` itself when nothing differs, else one copy."""
        moved = self.updates_at(now, updates)
        return shallow_copy(self.view, **moved) if moved else self.view

    def updates_at(self, now: datetime, updates: dict[str, Any]) -> dict[str, Any]:
        """What differs between ``view`` and its view at ``now``: ``updates`` (filled in
        place) with the time fields that moved — ``view_at`` is ``view`` with these set. A
        batch item keeps them beside the stored view instead of a copy of it
        (m2g.model.inputs.WorkloadItem)."""
        view, waiting, since = self.view, self.waiting_since, self.checkpoint_since
        if waiting is not None:  # (``wait_seconds`` and ``checkpoint_at`` inlined: per item)
            wait = max(0, int((now - waiting).total_seconds()))
            if wait != view.wait_seconds:
                updates["wait_seconds"] = wait
        if since is not None:
            had = view.checkpoint
            ckpt = aged_checkpoint(had, max(0, int((now - since).total_seconds())))
            if ckpt is not had:
                updates["checkpoint"] = ckpt
        return updates

    def names(self) -> frozenset[str]:
        """"ns/name" of the Workload and of each owner: what a user may call it by."""
        return frozenset((self.key, *(f"{self.namespace}/{o}" for o in self.owners)))


_STATE_SLOTS: tuple[str, ...] = WorkloadState.__slots__


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
    #: ``spec.preemption.withinClusterQueue`` as written ("": unset, Kueue's default Never).
    within_preemption: str = ""
    #: The site's value m2g recorded before it set ``within_preemption`` to Never for a grid
    #: event (``m2g.io/base-within-preemption``; "": m2g has not changed it).
    within_preemption_base: str = ""
    #: ``m2g.io/min-flex-tier``: the least flexible tier its workloads count in (0: any).
    min_flex_tier: int = 0


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


@dataclass(frozen=True, slots=True)
class Rejected:
    """An object left out of the snapshot because it cannot be used (m2g.k8s.isolate) — or,
    with ``part``, an object used without that part of it (e.g. an invalid annotation)."""

    kind: str
    name: str
    reason: str
    part: str = ""


@dataclass(frozen=True, slots=True)
class LivePods:
    """A workload's bound, unfinished pods as one snapshot saw them: ``running`` of them, and
    ``stopping`` of those being deleted (``metadata.deletionTimestamp`` set: Kueue evicted it,
    its pods are terminating and still draw power until they are gone). ``started_at``: when
    the last of them started running (its containers' ``startedAt``, else the pod's
    ``startTime``; None: not known), and ``waiting``: how many of them are bound but not
    running yet (phase Pending): new work shows in the site meter only some seconds after it
    starts (m2g.planner.shedding.not_drawing_yet)."""

    running: int
    stopping: int = 0
    started_at: datetime | None = None
    waiting: int = 0


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
    #: Workload key → its bound, unfinished pods (none: not a key), read with
    #: ``placements``; None when this snapshot did not read the pods (nothing known). Unlike
    #: ``placements`` it holds no TAS-assigned hosts: a workload whose pods have all finished
    #: (or not started) draws nothing, whatever Kueue still reserves for it.
    live_pods: Mapping[str, LivePods] | None = None
    grid_event_states: tuple[GridEventState, ...] = ()
    #: (time, site kW) of the recent fresh site-draw readings, oldest first (the controller
    #: keeps them): percentage events measure their baseline on them.
    draw_history: tuple[tuple[datetime, float], ...] = ()
    #: Objects left out of this snapshot, and why (reported; everything else is decided).
    rejected: tuple[Rejected, ...] = ()
    #: Node name → its GPUPowerLimit (m2g.model.powerlimit): the caps m2g asked for and the
    #: limits the node agents report in force.
    node_limits: Mapping[str, NodeLimitState] = field(default_factory=dict)
    #: Reservations and CapacityPlans (m2g.model.schedule), by name.
    reservations: tuple[Reservation, ...] = ()
    capacity_plans: tuple[CapacityPlan, ...] = ()

    @property
    def now(self) -> datetime:
        return self.factory.now
