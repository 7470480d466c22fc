"""An elastic job of ≤ one NVLink domain's GPUs is placed in one domain before Kueue reserves.

Kueue v0.19 refuses a topology request on an elastic Job (``kueue.x-k8s.io/elastic-job``: its
job webhook allows only unconstrained), so on the factory's TAS flavor Kueue places one
*unconstrained* at quota reservation: with ``TASProfileMixed`` (beta, on by default in v0.19)
that is "least free capacity" at the host level — the fullest hosts first, anywhere — and a
16-rack twin run (2026-12-07, run D) split 130 of the 192 placements of its elastic jobs over
racks. m2g's check is asked only after that assignment, and a ``podSetUpdates`` nodeSelector
given then conflicts with it (the pods would be ungated onto hosts outside the selector).

But Kueue's TAS reads the ``nodeSelector`` of the ``podSetUpdates`` of every check that is
**Ready when it assigns** (``pkg/scheduler/flavorassigner/tas_flavorassigner.go``,
``podSetTopologyRequest``; ``pkg/cache/scheduler/tas_flavor_snapshot.go`` filters the hosts by
it), Kueue lets a check be Ready before the reservation (``pkg/workload/admissionchecks.go``,
``SyncAdmittedCondition``: admitted = reserved and every check Ready), and merges the Ready
checks' ``podSetUpdates`` into the Job's pod template at admission
(``pkg/controller/jobframework/reconciler.go``, ``getPodSetsInfoFromStatus``) — where a grow's
new workload slice takes its template from.

So for a workload that waits for quota (no reservation yet), is an elastic Job's first slice
(not a ``kueue.x-k8s.io/workload-slice-replacement-for`` slice, whose pods run already), has
one pod set and fits one domain, m2g decides at once as if Kueue had reserved it — the same
policies, reservations and the site headroom gate (``m2g.planner.admission.check_updates``
includes it; ``m2g.planner.headroom`` ranks it after the reserved work of its class) — and
when the decision is Admit and one NVLink domain (the site's clique label,
``site.labels.clique``) has the pods free, answers Ready with the nodeSelector of that domain
added to the pod set's ``podSetUpdates`` (rule ``nvlink-preplace``). Kueue then reserves it in
that domain only, and admits it at once. A decision that is not Admit, or no domain with room,
leaves the check Pending (no update): Kueue reserves it where it can and m2g answers then, as
before (a Retry would not help: Kueue's next unconstrained assignment is made the same way).

Kept level-triggered: each reconcile decides again every such workload, the ones already
answered first (they keep their domain while it still has room: the message names it). An
answer that no longer holds — the decision is no longer Admit (a grid event started), or the
domain filled — goes back to Pending (Kueue's webhook refuses a change of a Ready check's
``podSetUpdates``; the next reconcile places it again). Until then Kueue may still reserve it
on the older answer: one reconcile's lag.

The room is the snapshot's: per NVLink domain, the GPUs free on its healthy nodes that carry
no m2g taint, outside racks in thermal alarm (never an alarmed or unhealthy rack), and no more
than Kueue's TAS sees free there — the GPUs of every workload holding quota counted on its
hosts, bound or only assigned (the snapshot reads the placements while such a workload waits:
m2g.k8s.build) — worked out once per snapshot (``Room``); the pods one placement takes are
taken from it, so two workloads placed in one reconcile never count the same GPUs. A workload
given a domain Kueue sees full fits nowhere in Kueue's eyes and waits at the head of its
queue. With Kueue's view counted, a 16-rack twin run (2026-12-07) withdrew 254 answers against
611 with the pods' view alone. Every job still waited longer for quota with the setting on
(submitted → reserved ~1 s p50 off, 45–61 s on), against a run at another time. A pair in one
invocation (thirtieth session) found most of the wait between admission and Kueue's job
reconciler unsuspending the Job, in the m2g run too. The local Kueue runs one worker per
controller, and this rule's status writes add Job reconciles (+17 %). The setting stays off by
default until a pair at ordinary log level decides (docs/benchmarks.md, "Thirtieth session —
Issue 15 NVLink"). Among the domains with room, the
fullest that fits (best fit: whole domains stay free for the gangs that require one), then the
most power headroom (rack cap less its draw), then the name. Per workload: a lookup in a
per-pod-size index (``bisect``) and one domain's nodes updated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from m2g.model.cluster import CheckState, ClusterSnapshot, Phase, WorkloadState
from m2g.model.factory import Rack
from m2g.model.plan import CheckUpdate
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig

POLICY, RULE = "nvlink-placement", "nvlink-preplace"
#: Kueue's annotation on a workload slice that replaces (grows) an admitted one.
REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
#: How an m2g answer names its domain: the message starts with it, then the domain, then ":".
MARK = "placed in NVLink domain "
#: The states of m2g's check on a waiting workload that m2g answers ahead of the reservation
#: (Ready: answered before, by m2g: Kueue resets every check to Pending when it evicts).
ASKED = frozenset({CheckState.PENDING, None, CheckState.READY})


def candidate(w: WorkloadState) -> bool:
    """Is ``w`` a workload m2g places ahead of the reservation (before the room test)?"""
    if w.phase is not Phase.PENDING or not w.check or w.check_state not in ASKED \
            or (w.check_state is CheckState.READY and not pinned(w)):
        return False
    v = w.view
    return w.kueue_elastic and REPLACEMENT_FOR not in v.annotations \
        and len(v.pod_sets) == 1 and v.gpus > 0


def pinned(w: WorkloadState) -> str:
    """The domain m2g's Ready answer placed ``w`` in ("" when it has none)."""
    if w.check_state is not CheckState.READY or not w.check_message.startswith(MARK):
        return ""
    return w.check_message[len(MARK):].split(":", 1)[0]


@dataclass
class _Domain:
    name: str
    headroom: float  # kW under the rack cap (0 when unknown)
    free: list[int]  # each node's free GPUs
    keys: dict[int, tuple[int, float, str]] = field(default_factory=dict)  # g → index key
    #: the GPUs Kueue's TAS sees free (its healthy GPUs less those of the work holding quota
    #: on its hosts); None: not known (no placements in the snapshot)
    reserved_free: int | None = None

    def slots(self, g: int) -> int:
        pods = sum(f // g for f in self.free)
        return pods if self.reserved_free is None else min(pods, self.reserved_free // g)

    def take(self, g: int, pods: int) -> None:
        """Take ``pods`` pods of ``g`` GPUs, fullest nodes first (as Kueue packs a domain)."""
        if self.reserved_free is not None:
            self.reserved_free -= g * pods
        for i in sorted(range(len(self.free)), key=lambda i: (self.free[i], i)):
            n = min(pods, self.free[i] // g)
            self.free[i] -= n * g
            pods -= n
            if pods <= 0:
                return


class Room:
    """The free GPUs of each NVLink domain in one snapshot, and what this reconcile placed."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        racks = {r.name: r for r in snap.factory.racks}
        domains: dict[str, _Domain] = {}
        for n in snap.factory.nodes:
            rack = racks.get(n.rack)
            if not n.clique or (rack is not None and rack.thermal_alarm):
                continue
            d = domains.get(n.clique)
            if d is None:
                d = domains[n.clique] = _Domain(n.clique, _headroom(rack), [])
            if n.healthy and not n.m2g_taints:
                d.free.append(n.free_gpus)
        self.domains = domains
        self._index: dict[int, list[tuple[int, float, str]]] = {}
        if snap.placements:
            self._kueue_view(snap)

    def _kueue_view(self, snap: ClusterSnapshot) -> None:
        """Each domain's GPUs free in Kueue's view: its healthy GPUs less the GPUs of every
        workload holding quota (reserved or admitted), shared evenly over its hosts (the TAS
        hosts of work whose pods are not bound yet count: the pods' view misses them, and a
        workload given a domain Kueue sees full waits at the head of its queue)."""
        clique = {n.name: n.clique for n in snap.factory.nodes}
        healthy: dict[str, int] = {}
        for n in snap.factory.nodes:
            if n.clique in self.domains:
                healthy[n.clique] = healthy.get(n.clique, 0) + n.healthy_gpus
        used: dict[str, float] = {}
        held = (Phase.RESERVED, Phase.ADMITTED)
        for w in snap.workloads:
            hosts = snap.placements.get(w.key) if w.phase in held else None
            if hosts:
                share = w.view.gpus / len(hosts)
                for h in hosts:
                    if (c := clique.get(h)) is not None:
                        used[c] = used.get(c, 0.0) + share
        for name, d in self.domains.items():
            d.reserved_free = max(0, int(healthy.get(name, 0) - used.get(name, 0.0)))

    def _of(self, g: int) -> list[tuple[int, float, str]]:
        """The domains with a pod of ``g`` GPUs free, by (slots, -headroom, name)."""
        got = self._index.get(g)
        if got is None:
            got = []
            for d in self.domains.values():
                if (s := d.slots(g)) > 0:
                    got.append(key := (s, -d.headroom, d.name))
                    d.keys[g] = key
            got.sort()
            self._index[g] = got
        return got

    def place(self, g: int, pods: int, keep: str = "") -> str:
        """The domain ``pods`` pods of ``g`` GPUs go to (``keep``'s while it has them: an
        earlier answer), taken from the room; "" when no domain has them."""
        index = self._of(g)
        d = self.domains.get(keep) if keep else None
        if d is None or g not in d.keys or d.keys[g][0] < pods:
            i = bisect.bisect_left(index, (pods, float("-inf"), ""))
            if i == len(index):
                return ""
            d = self.domains[index[i][2]]
        for h, idx in self._index.items():  # the domain's keys in every size's index
            key = d.keys.pop(h, None)
            if key is not None:
                del idx[bisect.bisect_left(idx, key)]
        d.take(g, pods)
        for h, idx in self._index.items():
            if (s := d.slots(h)) > 0:
                bisect.insort(idx, key := (s, -d.headroom, d.name))
                d.keys[h] = key
        return d.name


def _headroom(rack: Rack | None) -> float:
    """kW under the rack's cap by its fresh reading (0 when either is unknown)."""
    if rack is None or rack.cap_kw <= 0 or rack.power_kw.stale or rack.power_kw.value is None:
        return 0.0
    return max(0.0, rack.cap_kw - float(rack.power_kw.value))


def preplace(updates: Sequence[CheckUpdate], snap: ClusterSnapshot,
             config: PlannerConfig) -> list[CheckUpdate]:
    """``updates`` with the answers for waiting workloads (no quota reserved: ``candidate``)
    turned into placements: Ready with a domain's nodeSelector, Pending to withdraw an earlier
    one that no longer holds, or no update; every other answer as it is, in order."""
    by_key = sparse.of(snap).by_key
    found: list[tuple[int, WorkloadState]] = []
    for i, u in enumerate(updates):
        w = by_key.get(f"{u.namespace}/{u.name}")
        if w is not None and w.phase is Phase.PENDING:
            found.append((i, w))
    if not found:
        return list(updates)
    room = Room(snap) if config.nvlink_preplace else None
    label = snap.factory.labels.clique
    out: list[CheckUpdate | None] = list(updates)
    # the workloads placed before first: they keep their domain while it has room
    for i, w in sorted(found, key=lambda iw: (not pinned(iw[1]), iw[0])):
        u, was = updates[i], pinned(w)
        ps = w.view.pod_sets[0]
        where = ""
        if room is not None and label and u.state is CheckState.READY and ps.gpus_per_pod:
            where = room.place(ps.gpus_per_pod, ps.count, was)
        if where and (not was or where == was):
            out[i] = _placed(u, w, where, label, ps.name)
        elif w.check_state is CheckState.READY:
            why = (f"its pods no longer fit in {was}" if u.state is CheckState.READY
                   else f"the decision is now {u.state}: {u.message}")
            out[i] = CheckUpdate(namespace=u.namespace, name=u.name, check=u.check,
                                 state=CheckState.PENDING,
                                 message=(f"placement withdrawn: {why}")[:1024],
                                 policy=POLICY, rule=RULE)
        else:
            out[i] = None  # left Pending: Kueue reserves it where it can, m2g answers then
    return [u for u in out if u is not None]


def _placed(u: CheckUpdate, w: WorkloadState, where: str, label: str,
            pod_set: str) -> CheckUpdate:
    updates: list[dict[str, Any]] = [dict(p) for p in u.pod_set_updates]
    mine = next((p for p in updates if p.get("name") == pod_set), None)
    if mine is None:
        updates.append(mine := {"name": pod_set})
    mine["nodeSelector"] = {**(mine.get("nodeSelector") or {}), label: where}
    why = (f"{MARK}{where}: its {w.view.gpus} GPUs fit there, and Kueue places an elastic "
           f"job without a topology request, so m2g gives it {label}={where} before Kueue "
           f"reserves quota; {u.message}")
    return replace(u, message=why[:1024], pod_set_updates=tuple(updates), policy=POLICY,
                   rule=RULE)
