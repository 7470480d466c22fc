"""The annotations m2g writes on other controllers' objects, and the one helper for a value m2g
lowers and hands back (pure: no I/O).

On Workloads (a shed or drain): ``m2g.io/shed-at``, ``m2g.io/shed-reason``, ``m2g.io/drained-for``
(with shed-at: evicted off nodes for maintenance, not for power). All removed on restore, which
writes ``m2g.io/restored-at`` instead: the ramp counts from the last restore too, and a restore
erased its shed's time — so without it the next restore (by this replica or by a successor
after a failover) was not paced. A shed keeps ``m2g.io/restored-at`` (until 2026-12-07 it
removed it): a workload shed again within ``min_shed_seconds`` of its last restore does not
come back early (m2g.planner.shedding.settled: no flapping).
A power cap: ``m2g.io/power-cap``, ``m2g.io/power-cap-at``, ``m2g.io/flex-used-seconds``; a lift
removes the cap and keeps ``m2g.io/power-cap-at`` as the lift's time (the ramp counts from it),
not ``m2g.io/restored-at``, which says a pause was restored.
A shrunk elastic Job: ``m2g.io/resized-from``, ``m2g.io/resized-at`` (Workload and Job).

Values m2g lowers and gives back — a ClusterQueue flavor's ``nominalQuota`` (``owned_quota``)
and a KAI Queue's ``spec.resources.gpu.limit`` (``GPU_LIMIT``) — are ``Owned``: three
annotations record the platform team's value (``base``), the value m2g last wrote (``set``)
and when (``changed-at``).
A live value that differs from ``set`` was changed by someone else (a GitOps sync) and becomes
the new base; writing the base back removes ``base`` and ``set`` (m2g then owns nothing).
``Owned.patch`` is the one read-modify-write step both writers use: from the object as read, the
annotation changes and the merge patch (with a ``resourceVersion`` precondition) that go with a
new value.

KAI Topologies m2g creates carry ``app.kubernetes.io/managed-by: m2g`` (``MANAGED_BY``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from m2g.k8s.parse import format_time, quantity

Obj = Mapping[str, Any]

SHED_AT = "m2g.io/shed-at"
SHED_REASON = "m2g.io/shed-reason"
DRAINED_FOR = "m2g.io/drained-for"  # with SHED_AT: evicted off nodes (maintenance), not for power
RESTORED_AT = "m2g.io/restored-at"  # when m2g last restored it (the restore ramp counts from it)
# Graded curtailment (docs/curtailment.md): the per-GPU cap m2g set on a Workload, since when,
# and the throughput-seconds its earlier caps cost (its flex allowance spent). Lifting a cap
# removes the first two and keeps the third.
POWER_CAP = "m2g.io/power-cap"
POWER_CAP_AT = "m2g.io/power-cap-at"
FLEX_USED = "m2g.io/flex-used-seconds"
# Right-sizing: the parallelism an elastic Job had before m2g shrank it, and when (on the
# Workload, which Kueue keeps on a scale-down, and on the Job, for people); a grow back to it
# removes both (Kueue admits the larger size as a new Workload slice).
RESIZED_FROM = "m2g.io/resized-from"
RESIZED_AT = "m2g.io/resized-at"
BASE_QUOTA_PREFIX = "m2g.io/base-quota."
SET_QUOTA_PREFIX = "m2g.io/quota-set."  # the nominalQuota m2g itself last wrote
QUOTA_CHANGED_AT = "m2g.io/quota-changed-at"
BASE_GPU_LIMIT = "m2g.io/base-gpu-limit"
# A ClusterQueue's spec.preemption.withinClusterQueue before m2g set it to Never for a grid
# event (m2g.planner.eventhold); removed when the site's value is back.
BASE_WITHIN_PREEMPTION = "m2g.io/base-within-preemption"
GPU_LIMIT_SET = "m2g.io/gpu-limit-set"  # the limit m2g itself last wrote
# The ClusterQueue stopPolicy m2g itself set (Hold, HoldAndDrain); removed when m2g lifts it.
# m2g lifts only a stopPolicy it set: one that is still the value recorded here.
STOP_POLICY_SET = "m2g.io/stop-policy-set"
GPU_LIMIT_CHANGED_AT = "m2g.io/gpu-limit-changed-at"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "m2g"


def recorded_base(annotations: Mapping[str, Any], base_key: str, set_key: str,
                  live: float) -> float:
    """The platform team's value of a field m2g lowers (a quota, a KAI limit): the one recorded
    under ``base_key`` while the live value is still what m2g wrote (``set_key``); the live value
    itself when nothing is recorded or when someone else (a GitOps sync, an operator) changed it
    since — their value is the new base, with no annotation surgery. A base recorded before m2g
    tracked its own writes (no ``set_key``) is kept as it is."""
    base_raw = annotations.get(base_key)
    if base_raw is None:
        return live
    set_raw = annotations.get(set_key)
    if set_raw is not None and quantity(set_raw) != live:
        return live
    return quantity(base_raw)


def owned_annotations(annotations: Mapping[str, Any], base_key: str, set_key: str,
                      base: str, written: str) -> dict[str, Any]:
    """The annotation changes that go with m2g writing ``written``: back at ``base`` m2g owns
    nothing any more (both keys removed); otherwise both are recorded. Only changes are
    returned (an empty dict: nothing to write)."""
    if written == base:
        return {k: None for k in (base_key, set_key) if k in annotations}
    want = {base_key: base, set_key: written}
    return {k: v for k, v in want.items() if annotations.get(k) != v}


@dataclass(frozen=True)
class Owned:
    """A value m2g lowers and hands back, by the keys of its three annotations."""

    base_key: str
    set_key: str
    changed_at_key: str

    def base(self, annotations: Mapping[str, Any], live: float) -> float:
        """The platform team's value (see ``recorded_base``)."""
        return recorded_base(annotations, self.base_key, self.set_key, live)

    def changes(self, annotations: Mapping[str, Any], base: str, written: str
                ) -> dict[str, Any]:
        """The annotation changes of writing ``written`` (see ``owned_annotations``)."""
        return owned_annotations(annotations, self.base_key, self.set_key, base, written)

    def patch(self, obj: Obj, changes: Mapping[str, Any], now: datetime,
              spec: Mapping[str, Any]) -> dict[str, Any]:
        """The merge patch writing ``spec`` on ``obj`` as read: ``resourceVersion`` precondition
        (a 409 means: read again), the annotation ``changes``, the changed-at time."""
        meta = obj.get("metadata") or {}
        return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                             "annotations": {**changes,
                                             self.changed_at_key: format_time(now)}},
                "spec": dict(spec)}


def base_quota_annotation(flavor: str) -> str:
    return f"{BASE_QUOTA_PREFIX}{flavor}"


def set_quota_annotation(flavor: str) -> str:
    return f"{SET_QUOTA_PREFIX}{flavor}"


def owned_quota(flavor: str) -> Owned:
    """A ClusterQueue flavor's nominalQuota (annotations per flavor; changed-at per queue)."""
    return Owned(base_quota_annotation(flavor), set_quota_annotation(flavor), QUOTA_CHANGED_AT)


GPU_LIMIT = Owned(BASE_GPU_LIMIT, GPU_LIMIT_SET, GPU_LIMIT_CHANGED_AT)


def quota_base(annotations: Mapping[str, str], flavor: str, nominal: int) -> int:
    """The platform team's quota for ``flavor`` (see ``recorded_base``)."""
    return max(0, int(owned_quota(flavor).base(annotations, nominal)))
