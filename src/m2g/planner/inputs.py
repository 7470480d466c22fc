"""Build the CEL inputs of every stage from one ClusterSnapshot, sharing the factory part.

The factory views (site, grid, domains) are computed once per snapshot and the same objects are
handed to every input, so the policy engine evaluates the workloads of a reconcile as one batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from m2g.model.cluster import ClusterSnapshot, FlavorState, QueueState, WorkloadState
from m2g.model.factory import domain_views, grid_view, site_view
from m2g.model.inputs import (
    DomainKind,
    DomainView,
    FlavorView,
    GridView,
    PolicyInput,
    QueueView,
    SiteView,
    WorkloadItem,
    WorkloadView,
)
from m2g.model.labels import GPU_RESOURCE
from m2g.planner.memo import PlanMemo


@dataclass(frozen=True)
class Views:
    """The snapshot-wide CEL views."""

    site: SiteView
    grid: GridView
    domains: dict[str, DomainView]


def views(snap: ClusterSnapshot) -> Views:
    return Views(site_view(snap.factory), grid_view(snap.factory), domain_views(snap.factory))


def queue_view(q: QueueState | None, name: str) -> QueueView:
    if q is None:
        return QueueView(name=name)
    nominal = sum(x.nominal for x in q.quotas if x.resource == GPU_RESOURCE)
    return QueueView(name=q.name, nominal_gpus=nominal, used_gpus=q.used_gpus,
                     pending_workloads=q.pending_workloads)


def kw_floor_per_gpu(snap: ClusterSnapshot, default_kw_per_gpu: float) -> float:
    """The least kW per GPU a workload may declare (``m2g.io/estimated-kw`` is the tenant's
    word): the snapshot's measured draw per allocated GPU when the site draw is fresh, never
    more than ``default_kw_per_gpu`` (a legitimate estimate at or above the default stays as
    declared; ``estimated-kw: 0.01`` on 512 GPUs no longer fits into 10 kW of headroom)."""
    draw = snap.factory.site_draw_kw().value
    allocated = sum(n.gpus_allocated for n in snap.factory.nodes)
    if draw is None or allocated <= 0:
        return default_kw_per_gpu
    return min(default_kw_per_gpu, max(0.0, draw) / allocated)


def _raised_kw(view: WorkloadView, floor_per_gpu: float) -> dict[str, float]:
    """``{"estimated_kw": floor}`` when ``view``'s declared kW is below GPUs × ``floor_per_gpu``,
    else nothing (what ``trusted_view`` and ``policy_view`` change)."""
    floor = view.gpus * floor_per_gpu
    return {} if view.estimated_kw >= floor else {"estimated_kw": floor}


def trusted_view(view: WorkloadView, floor_per_gpu: float) -> WorkloadView:
    """``view`` with its declared kW raised to GPUs × ``floor_per_gpu`` when below it (the
    safe value wins: for admission, a higher draw)."""
    raised = _raised_kw(view, floor_per_gpu)
    return view.model_copy(update=raised) if raised else view


def policy_view(w: WorkloadState, now: datetime, floor_per_gpu: float) -> WorkloadView:
    """What policies read of ``w`` at ``now``: its view at that moment (the time fields) and
    trusted (``trusted_view``), in one copy at most."""
    return w.view_at(now, **_raised_kw(w.view, floor_per_gpu))


class InputBuilder:
    """PolicyInputs for one snapshot; queue views are built once per ClusterQueue.

    Workload inputs are copies of one validated input that differ only in ``workload`` and
    ``queue``: validating a PolicyInput names its domains and derives ``topology`` from them
    (~0.3 ms on a 100-rack factory), which 2,000 workloads would pay 2,000 times, each holding
    its own copy. The copies share the snapshot's objects, so they also batch together."""

    def __init__(self, snap: ClusterSnapshot, default_kw_per_gpu: float = 1.34,
                 memo: PlanMemo | None = None) -> None:
        self.snap = snap
        #: what the plan before kept for this one (m2g.planner.memo; None: nothing kept)
        self.memo = memo
        self.v = views(snap)
        self.kw_floor = kw_floor_per_gpu(snap, default_kw_per_gpu)
        self._queues = {q.name: q for q in snap.queues}
        self._qviews: dict[str, QueueView] = {}
        self._base: PolicyInput | None = None
        self._racks_under: dict[str, list[str]] | None = None
        self._covered: dict[str, dict[str, DomainView]] = {}
        self._cliques_under: dict[str, list[str]] | None = None  # parent → its cliques' names
        self._position: dict[str, int] = {}  # a domain's place in ``domains``
        #: What a planner stage derives from this snapshot once per reconcile and may read
        #: again in the same plan (m2g.planner.shedding's Preemption facts: ``make_plan``
        #: plans the power actions twice when firm work is admitted beyond the room), by the
        #: stage's name; each entry checks the evaluator and config it was made with.
        self.derived: dict[str, object] = {}

    def queue(self, name: str) -> QueueView:
        if name not in self._qviews:
            self._qviews[name] = queue_view(self._queues.get(name), name)
        return self._qviews[name]

    def base(self) -> PolicyInput:
        """The snapshot's input without a workload or queue, validated once."""
        if self._base is None:
            self._base = PolicyInput(site=self.v.site, grid=self.v.grid, domains=self.v.domains,
                                     now=self.snap.now)
        return self._base

    def for_workload(self, w: WorkloadState, view: WorkloadView | None = None) -> PolicyInput:
        """``w``'s input at the snapshot's ``now``; ``view``: this view of it instead, as it
        is (time fields included)."""
        seen = (policy_view(w, self.snap.now, self.kw_floor) if view is None
                else trusted_view(view, self.kw_floor))
        return self.base().with_workload(seen, self.queue(w.cluster_queue))

    def item(self, w: WorkloadState) -> WorkloadItem:
        """``for_workload(w)`` as a batch item over ``base()`` (Evaluator.*_items): no copy of
        the input per workload."""
        return self.items((w,))[0]

    def items(self, workloads: Iterable[WorkloadState]) -> list[WorkloadItem]:
        """``item`` of each workload, in one comprehension (no method call per workload:
        40,000 waiting and 60,000 running at 1,400 racks). Each item's ``workload`` is
        ``policy_view``'s, kept as the stored view and what differs (WorkloadItem): no copy
        of a view per workload unless something reads it whole."""
        floor, queue, now = self.kw_floor, self.queue, self.snap.now
        return [WorkloadItem(w.view, queue(w.cluster_queue),
                             w.updates_at(now, _raised_kw(w.view, floor)))
                for w in workloads]

    def for_flavor(self, flavor: FlavorState, nominal: int) -> PolicyInput:
        domain_name = flavor.domain or self.snap.factory.site
        domain = self.v.domains.get(domain_name, DomainView(name=domain_name))
        fv = FlavorView(name=flavor.name, domain=domain_name, nominal_gpus=nominal,
                        total_gpus=domain.total_gpus, healthy_gpus=domain.healthy_gpus,
                        free_gpus=domain.free_gpus)
        return PolicyInput(site=self.v.site, grid=self.v.grid, domains=self.covered(domain_name),
                           flavor=fv, domain=domain, now=self.snap.now)

    def covered(self, name: str) -> dict[str, DomainView]:
        """The ``domains`` of a Capacity input for domain ``name``: that domain, the domains above
        it, the racks it covers (those in it as power domain, block or rack) with their cliques
        and the domains above them; every domain for the site. A flavor's capacity depends on
        its own part of the factory, and at 1,400 racks each of ~90 flavors converting all
        ~3,100 domains into CEL values was most of a reconcile (docs/benchmarks.md, "Scale")."""
        doms = self.v.domains
        if name == self.snap.factory.site or name not in doms:
            return doms
        if self._racks_under is None:
            self._racks_under = {}
            for r in self.snap.factory.racks:
                for key in {r.power_domain, r.block, r.name} - {""}:
                    self._racks_under.setdefault(key, []).append(r.name)
        if name not in self._covered:
            if self._cliques_under is None:  # once per snapshot, not two passes per flavor
                self._cliques_under = {}
                self._position = {}
                for i, (k, d) in enumerate(doms.items()):
                    self._position[k] = i
                    if d.kind is DomainKind.CLIQUE:
                        self._cliques_under.setdefault(d.parent, []).append(d.name)
            keep: set[str] = set()
            for start in (name, *self._racks_under.get(name, ())):
                n = start
                while n in doms and n not in keep:
                    keep.add(n)
                    n = doms[n].parent
            keep.update(*(self._cliques_under.get(k, ()) for k in list(keep)))
            position = self._position  # in the order of ``domains``, as a filter of it keeps
            self._covered[name] = {k: doms[k] for k in sorted(
                (k for k in keep if k in position), key=position.__getitem__)}
        return self._covered[name]

    def for_queue(self, q: QueueState) -> PolicyInput:
        """A copy of ``base()`` with the queue (validating an input per ClusterQueue derived
        ``topology`` and ``facts`` again: 1 s for 48 queues at 1,400 racks)."""
        return self.base().model_copy(update={"queue": self.queue(q.name)})
