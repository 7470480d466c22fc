"""Apply a ``Plan`` to the cluster, idempotently: each change reads the object first (a shed
may take it from the caller's watch cache) and writes only what differs, so applying the same
plan twice writes nothing the second time.

* ``CheckUpdate`` → server-side apply on ``workloads/status`` (field manager ``m2g``, force) of
  m2g's entry alone in ``status.admissionChecks`` (a listType=map keyed by name, so Kueue's and
  other controllers' entries are untouched). ``lastTransitionTime`` moves only when the state
  changes; the message is cut to Kueue's 32 KiB.
* ``QuotaUpdate`` → a JSON merge patch of the ClusterQueue's whole ``spec.resourceGroups``
  (merge patches replace lists) with a ``metadata.resourceVersion`` precondition, retried on
  409. A derate records the platform's value in ``m2g.io/base-quota.<flavor>`` and what m2g
  wrote in ``m2g.io/quota-set.<flavor>``; a live quota that differs from the latter was changed
  by someone else (a GitOps sync) and becomes the new base. A restore to the base removes both
  (m2g then owns nothing). ``m2g.io/quota-changed-at`` records when m2g last changed a quota.
* ``GridEventStatusUpdate`` → server-side apply on ``gridevents/status`` (phase, baseline,
  target, conditions, message; field manager ``m2g``), only when it differs.
* ``StopUpdate`` → merge patch ``spec.stopPolicy``; ``WeightUpdate`` → ``spec.fairSharing.weight``.
* ``PreemptionUpdate`` → merge patch ``spec.preemption.withinClusterQueue`` with the site's
  value recorded in ``m2g.io/base-within-preemption`` (removed when it is written back), with
  a ``metadata.resourceVersion`` precondition, retried on 409.
* ``ShedAction`` → merge patch ``spec.active`` with ``m2g.io/shed-at``/``m2g.io/shed-reason``
  (and ``m2g.io/drained-for`` for a maintenance drain; all removed on restore, which stamps
  ``m2g.io/restored-at`` for the ramp). A restore only touches workloads m2g shed.
* ``NodeTaintUpdate`` → a JSON merge patch of the Node's whole ``spec.taints`` (merge patches
  replace lists) built from the Node as read, with only m2g's entry added, changed or removed,
  and a ``metadata.resourceVersion`` precondition, retried on 409 — so taints others set
  meanwhile are never lost. One Event on the Node per change (``Tainted``/``Untainted``).

In ``dry_run`` (shadow) mode nothing is written except Events; ``records`` says what would have
been. Errors of one change do not stop the others; they are returned in ``ApplyResult.errors``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from m2g.k8s.annotations import (
    BASE_WITHIN_PREEMPTION,
    DRAINED_FOR,
    RESTORED_AT,
    SHED_AT,
    SHED_REASON,
    STOP_POLICY_SET,
    owned_quota,
    quota_base,
)
from m2g.k8s.client import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    EVENTS,
    FIELD_MANAGER,
    GRID_EVENTS,
    NODES,
    POLICIES,
    RESERVATIONS,
    TENANT_POLICIES,
    WORKLOADS,
    Conflict,
    Kube,
    KubeError,
    NotFound,
    Obj,
    PermanentError,
    Resource,
)
from m2g.k8s.parse import format_time, quantity
from m2g.k8s.validity import FIELD_MANAGER as VALIDITY_MANAGER
from m2g.k8s.validity import ConditionUpdate
from m2g.model.cluster import CHECK_CONTROLLER
from m2g.model.plan import (
    CheckUpdate,
    NodeTaintUpdate,
    Plan,
    PreemptionUpdate,
    QuotaUpdate,
    ShedAction,
    StopUpdate,
    WeightUpdate,
)
from m2g.model.status import same_status

log = logging.getLogger(__name__)

MAX_CHECK_MESSAGE = 32 * 1024
MAX_EVENT_NOTE = 1024
CONFLICT_RETRIES = 5
CHECK_MEMO_MAX = 100_000  # (workload, check) entries the applier remembers its writes for
#: The applier keeps its latest records (``Applier.records``) up to twice this many, then
#: drops the oldest down to this many: a controller applies a plan every reconcile, forever.
RECORDS_KEPT = 5_000
SHED_RETRY = timedelta(minutes=10)  # a failed shed's retry within this keeps its shed-at


async def retry_on_conflict(once: Callable[[], Awaitable[bool]]) -> bool:
    """Run a read-modify-write ``once``; on a 409 (someone wrote in between) read and try again,
    at most ``CONFLICT_RETRIES`` times, then let the Conflict out (a retryable error)."""
    for attempt in range(CONFLICT_RETRIES):
        try:
            return await once()
        except Conflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise
    return False  # pragma: no cover


@dataclass(frozen=True)
class Record:
    """One change: what, on which object, and whether it was written (False: dry run or no-op)."""

    action: str
    target: str
    detail: str
    written: bool


@dataclass
class ApplyResult:
    records: list[Record] = field(default_factory=list)
    errors: list[tuple[str, KubeError]] = field(default_factory=list)

    @property
    def written(self) -> int:
        return sum(r.written for r in self.records)


def _cut(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[: limit - 3].decode(errors="ignore") + "..."


def _weight_text(weight: float) -> str:
    text = f"{weight:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def _pruned(value: Any) -> Any:
    """Drop empty maps/lists (the API server does too), so comparisons with it are exact."""
    if isinstance(value, Mapping):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list | tuple):
        return [_pruned(v) for v in value]
    return value


def _check_entry(wl: Obj, check: str) -> tuple[str, str] | None:
    """(state, message) of ``check``'s entry on a Workload (None: no entry)."""
    e = next((e for e in (wl.get("status") or {}).get("admissionChecks") or []
              if e.get("name") == check), None)
    return None if e is None else (str(e.get("state", "")), str(e.get("message", "")))


def _micro_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Applier:
    """Writes plans (or, with ``dry_run``, only records them)."""

    def __init__(self, kube: Kube, *, dry_run: bool = False,
                 field_manager: str = FIELD_MANAGER, instance: str = "m2g",
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 parallel: int = 16, background_events: bool = False) -> None:
        self.kube = kube
        self.parallel = parallel  # Workload writes in flight at once
        self.dry_run = dry_run
        self.field_manager = field_manager
        self.instance = instance
        self.clock = clock
        #: The latest changes noted, oldest first (at most ``2 * RECORDS_KEPT``: every plan
        #: appends, so a list of them all grew with every reconcile for the process's life)
        self.records: list[Record] = []
        #: Write the Events that explain changes after ``apply_core`` returns (the controller:
        #: an Event never holds up the next reconcile; ``drain`` at shutdown).
        self.background_events = background_events
        self._tasks: set[asyncio.Task[None]] = set()
        self._gate: asyncio.Semaphore | None = None
        #: (workload, check) → (state, message) of m2g's last answer written there
        self._check_written: dict[tuple[str, str], tuple[str, str] | None] = {}
        #: In dry-run (shadow) mode, the answer last recorded per (workload, check): nothing is
        #: written, so the Workload never shows it and every reconcile decided it again — one
        #: Event per pending workload per reconcile (~200 a second at 2,000 pending).
        self._shadow_said: dict[tuple[str, str], tuple[str, str]] = {}
        #: workload → shed-at of a shed whose write failed: its retry writes the same stamp
        #: (the API server may have applied a write whose answer was lost)
        self._shed_tried: dict[str, datetime] = {}
        #: Called with (kind, the object a write answered with): the controller folds it into
        #: its watch cache, so the next reconcile sees m2g's own writes (m2g.k8s.cache).
        self.observe: Callable[[Resource, Obj], object] | None = None

    def _seen(self, res: Resource, answer: object) -> None:
        if self.observe is not None and isinstance(answer, dict):
            self.observe(res, answer)

    def in_background(self, make: Callable[[], Awaitable[object]]) -> None:
        """Run ``make()`` without waiting for it, at most ``parallel`` such at once in all
        (best-effort writes: Events). A failure is logged."""
        async def run() -> None:
            if self._gate is None:
                self._gate = asyncio.Semaphore(max(1, self.parallel))
            async with self._gate:
                try:
                    await make()
                except Exception as exc:  # best effort: never an unretrieved task error
                    log.warning("background write failed: %s", exc)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the background writes; cancel those still running after ``timeout``."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()

    def _record(self, result: ApplyResult | None, action: str, target: str, detail: str,
                write: bool) -> bool:
        """Note a change; True when it should really be written."""
        rec = Record(action, target, detail, write and not self.dry_run)
        self.records.append(rec)
        if len(self.records) > 2 * RECORDS_KEPT:
            del self.records[:-RECORDS_KEPT]
        if result is not None:
            result.records.append(rec)
        return rec.written

    async def apply_core(self, plan: Plan,
                         known: Callable[[str, str], Obj | None] | None = None) -> ApplyResult:
        """The Kueue and Node writes of ``plan`` (the whole plan: m2g.k8s.writer.apply_plan,
        which adds the KAI writes and the check Events): taints first (a drained workload that
        comes back, or a new admission, must find its nodes tainted); then, at once, the
        admission-check answers (up to ``parallel`` in flight: an answer holds Kueue's
        admission, so it waits for no quota or shed write) beside quotas and stops (one at a
        time: several may touch one ClusterQueue) followed by the sheds (up to ``parallel``:
        after the quota derates, so Kueue cannot re-admit into what a shed frees); then
        weights and statuses. ``known(namespace, name)``: the Workload as the caller's watch
        cache has it, which saves a GET per shed and per check."""
        result = ApplyResult()

        async def step(what: str, change: Awaitable[bool]) -> None:
            try:
                await change
            except KubeError as exc:
                result.errors.append((what, exc))

        def cached(namespace: str, name: str) -> Obj | None:
            return known(namespace, name) if known is not None else None

        await self._bounded(step, [(f"taint {t.node}", partial(self.apply_taint, t, result))
                                   for t in plan.taints])
        events: list[tuple[Obj, ShedAction]] = []  # shed Events wait until every shed is made

        async def capacity_then_sheds() -> None:
            for q in plan.quotas:
                await step(f"quota {q.cluster_queue}", self.apply_quota(q, result))
            for s in plan.stops:
                await step(f"stop {s.cluster_queue}", self.apply_stop(s, result))
            for p in plan.preemptions:
                await step(f"preemption {p.cluster_queue}", self.apply_preemption(p, result))
            await self._bounded(step, [(f"shed {a.namespace}/{a.name}", partial(
                self.apply_shed, a, result, events, cached(a.namespace, a.name)))
                for a in plan.sheds])

        await asyncio.gather(capacity_then_sheds(), self._bounded(step, [
            (f"check {c.namespace}/{c.name}",
             partial(self.apply_check, c, result, cached(c.namespace, c.name)))
            for c in plan.checks]))
        shed_events: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
            (f"event {a.namespace}/{a.name}", partial(self._shed_event, wl, a))
            for wl, a in events]
        if self.background_events:
            for _, make in shed_events:
                self.in_background(make)
        else:
            await self._bounded(step, shed_events)
        for w in plan.weights:
            await step(f"weight {w.cluster_queue}", self.apply_weight(w, result))
        for e in plan.event_statuses:
            await step(f"status gridevent {e.name}",
                       self.apply_status(GRID_EVENTS, e.name, e.status, result=result))
        for r in plan.reservation_statuses:
            await step(f"status reservation {r.name}",
                       self.apply_status(RESERVATIONS, r.name, r.status, result=result))
        return result

    async def _bounded(self, step: Callable[[str, Awaitable[bool]], Awaitable[None]],
                       changes: list[tuple[str, Callable[[], Awaitable[bool]]]]) -> None:
        """Run ``changes`` in order with at most ``parallel`` in flight. A grid event on a
        100-rack factory sheds ~100 Workloads, and each write passes Kueue's webhooks: one
        after the other they took seconds (docs/benchmarks.md, "Controller latency")."""
        queue = iter(changes)

        async def worker() -> None:
            for what, make in queue:  # a shared iterator: each change is taken once
                await step(what, make())

        await asyncio.gather(*(worker() for _ in range(max(1, min(self.parallel,
                                                                    len(changes))))))

    async def bounded_recorded(self, result: ApplyResult,
                               changes: list[tuple[str, Callable[[], Awaitable[bool]]]]
                               ) -> None:
        """``_bounded`` with each failure recorded in ``result`` (one failure never stops
        the others)."""
        async def step(what: str, change: Awaitable[bool]) -> None:
            try:
                await change
            except KubeError as exc:
                result.errors.append((what, exc))

        await self._bounded(step, changes)

    # ---- admission checks ------------------------------------------------------------

    async def apply_check(self, u: CheckUpdate, result: ApplyResult | None = None,
                          cached: Obj | None = None) -> bool:
        """Set m2g's check entry on a Workload; False when it already says the same.
        ``cached``: the Workload as the caller's watch cache has it, which saves the GET
        before each answer (part of every admission's round trip: docs/controllers.md). The
        server's copy is read instead when there is none, or when m2g answered this check
        before and the cached copy does not show that answer (the cache lags behind m2g's
        write, or Kueue reset the check): so a lagging cache never makes m2g repeat an answer
        or move its ``lastTransitionTime``."""
        target = f"{u.namespace}/{u.name}"
        key = (target, u.check)
        wl = cached
        if wl is None or (key in self._check_written
                          and _check_entry(wl, u.check) != self._check_written[key]):
            wl = await self.kube.get(WORKLOADS, u.name, u.namespace)
        current = next((e for e in (wl.get("status") or {}).get("admissionChecks") or []
                        if e.get("name") == u.check), None)
        message = _cut(u.message, MAX_CHECK_MESSAGE)
        entry: Obj = {"name": u.check, "state": str(u.state), "message": message}
        if u.requeue_after_seconds is not None:
            entry["requeueAfterSeconds"] = int(u.requeue_after_seconds)
        updates = [_pruned(dict(p)) for p in u.pod_set_updates]
        if updates:
            entry["podSetUpdates"] = updates
        same = current is not None and all(current.get(k) == v for k, v in entry.items()) \
            and ("requeueAfterSeconds" in entry or "requeueAfterSeconds" not in current) \
            and ("podSetUpdates" in entry or not current.get("podSetUpdates"))
        detail = f"{u.check}={u.state}: {message[:120]}"
        if self.dry_run:
            said = (str(u.state), message)
            if same or self._shadow_said.get(key) == said:
                return False  # shown or said before in shadow mode: no record, no Event
            if len(self._shadow_said) > CHECK_MEMO_MAX:
                self._shadow_said.clear()  # a bound; a lost entry only costs one Event
            self._shadow_said[key] = said
        if not self._record(result, "check", target, detail, not same):
            return False
        keep_time = current is not None and current.get("state") == str(u.state) \
            and current.get("lastTransitionTime")
        entry["lastTransitionTime"] = keep_time or format_time(self.clock())
        body = {"apiVersion": WORKLOADS.api_version, "kind": WORKLOADS.kind,
                "metadata": {"name": u.name, "namespace": u.namespace},
                "status": {"admissionChecks": [entry]}}
        if len(self._check_written) > CHECK_MEMO_MAX:
            self._check_written.clear()  # a bound; a cleared entry only costs one GET
        self._check_written[key] = (entry["state"], entry["message"])
        self._seen(WORKLOADS, await self.kube.apply(
            WORKLOADS, u.name, body, namespace=u.namespace, subresource="status",
            field_manager=self.field_manager))
        return True

    async def ensure_admission_check_active(
            self, name: str, controller: str = CHECK_CONTROLLER, *, active: bool = True,
            reason: str = "Active", message: str = "m2g answers this admission check") -> bool:
        """Create the AdmissionCheck if missing (only to make it Active) and keep its ``Active``
        condition as asked: True, or False with ``reason`` (e.g. ``BadParametersRef``)."""
        ac = await self.kube.get_or_none(ADMISSION_CHECKS, name)
        if ac is None:
            if not active or not self._record(None, "admissioncheck", name, "create", True):
                return False
            ac = await self.kube.create(ADMISSION_CHECKS, {
                "apiVersion": ADMISSION_CHECKS.api_version, "kind": ADMISSION_CHECKS.kind,
                "metadata": {"name": name}, "spec": {"controllerName": controller}})
        owner = (ac.get("spec") or {}).get("controllerName")
        if owner != controller:
            raise PermanentError(f"AdmissionCheck {name} belongs to controller {owner!r}, "
                                 f"not {controller}")
        generation = int((ac.get("metadata") or {}).get("generation", 1))
        status = "True" if active else "False"
        now = next((c for c in (ac.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Active"), None)
        if now and now.get("status") == status and now.get("observedGeneration") == generation \
                and (active or now.get("message") == message):
            return False
        if not self._record(None, "admissioncheck", name, f"Active={status}", True):
            return False
        cond = {"type": "Active", "status": status, "reason": reason, "message": message,
                "lastTransitionTime": format_time(self.clock()),
                "observedGeneration": generation}
        await self.kube.apply(ADMISSION_CHECKS, name, {
            "apiVersion": ADMISSION_CHECKS.api_version, "kind": ADMISSION_CHECKS.kind,
            "metadata": {"name": name}, "status": {"conditions": [cond]}},
            subresource="status", field_manager=self.field_manager)
        return True

    # ---- ClusterQueues ---------------------------------------------------------------

    async def apply_quota(self, u: QuotaUpdate, result: ApplyResult | None = None) -> bool:
        """Set one flavor's nominalQuota; re-read and retry on a conflict."""
        return await retry_on_conflict(partial(self._apply_quota_once, u, result))

    async def _apply_quota_once(self, u: QuotaUpdate, result: ApplyResult | None) -> bool:
        cq = await self.kube.get(CLUSTER_QUEUES, u.cluster_queue)
        meta = cq.get("metadata") or {}
        groups = copy.deepcopy((cq.get("spec") or {}).get("resourceGroups") or [])
        found = None
        for group in groups:
            for flavor in group.get("flavors") or []:
                if flavor.get("name") != u.flavor:
                    continue
                for res in flavor.get("resources") or []:
                    if res.get("name") == u.resource:
                        found = res
        if found is None:
            raise PermanentError(f"ClusterQueue {u.cluster_queue} has no quota for "
                                 f"{u.resource} in flavor {u.flavor}")
        current = int(quantity(found.get("nominalQuota")))
        annotations = meta.get("annotations") or {}
        owned = owned_quota(u.flavor)
        base = quota_base(annotations, u.flavor, current)
        changes = owned.changes(annotations, str(base), str(u.nominal))
        if current == u.nominal and not changes:
            self._record(result, "quota", u.cluster_queue, f"{u.flavor} {u.nominal}", False)
            return False
        detail = f"{u.flavor}/{u.resource} {current} -> {u.nominal} (base {base}): {u.reason}"
        if not self.dry_run:  # write first: a 409 here is retried, and recorded only once
            found["nominalQuota"] = str(u.nominal)
            self._seen(CLUSTER_QUEUES, await self.kube.patch(
                CLUSTER_QUEUES, u.cluster_queue, owned.patch(
                    cq, changes, self.clock(), {"resourceGroups": groups}),
                field_manager=self.field_manager))
        return self._record(result, "quota", u.cluster_queue, detail, True)

    async def apply_stop(self, u: StopUpdate, result: ApplyResult | None = None) -> bool:
        cq = await self.kube.get(CLUSTER_QUEUES, u.cluster_queue)
        current = (cq.get("spec") or {}).get("stopPolicy") or "None"
        detail = f"stopPolicy {current} -> {u.stop_policy}: {u.reason}"
        if not self._record(result, "stop", u.cluster_queue, detail, current != u.stop_policy):
            return False
        mine = None if u.stop_policy == "None" else u.stop_policy  # lifted: no longer m2g's
        self._seen(CLUSTER_QUEUES, await self.kube.patch(
            CLUSTER_QUEUES, u.cluster_queue,
            {"metadata": {"annotations": {STOP_POLICY_SET: mine}},
             "spec": {"stopPolicy": u.stop_policy}},
            field_manager=self.field_manager))
        return True

    async def apply_preemption(self, u: PreemptionUpdate,
                               result: ApplyResult | None = None) -> bool:
        return await retry_on_conflict(partial(self._apply_preemption_once, u, result))

    async def _apply_preemption_once(self, u: PreemptionUpdate,
                                     result: ApplyResult | None) -> bool:
        cq = await self.kube.get(CLUSTER_QUEUES, u.cluster_queue)
        meta = cq.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        preemption = (cq.get("spec") or {}).get("preemption")
        current = str((preemption if isinstance(preemption, dict) else {}).get(
            "withinClusterQueue") or "")
        had = annotations.get(BASE_WITHIN_PREEMPTION)
        base_change = (had is not None) if not u.base else had != u.base
        detail = f"withinClusterQueue {current or '(unset)'} -> {u.within}: {u.reason}"
        write = current != u.within or base_change
        if write and not self.dry_run:  # write first: a 409 here is retried, recorded once
            self._seen(CLUSTER_QUEUES, await self.kube.patch(
                CLUSTER_QUEUES, u.cluster_queue,
                {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {BASE_WITHIN_PREEMPTION: u.base or None}},
                 "spec": {"preemption": {"withinClusterQueue": u.within}}},
                field_manager=self.field_manager))
        return self._record(result, "preemption", u.cluster_queue, detail, write)

    async def apply_weight(self, u: WeightUpdate, result: ApplyResult | None = None) -> bool:
        cq = await self.kube.get(CLUSTER_QUEUES, u.cluster_queue)
        raw = ((cq.get("spec") or {}).get("fairSharing") or {}).get("weight")
        text = _weight_text(u.weight)
        same = raw is not None and abs(quantity(raw) - quantity(text)) < 1e-9
        if not self._record(result, "weight", u.cluster_queue, f"weight {raw} -> {text}",
                            not same):
            return False
        self._seen(CLUSTER_QUEUES, await self.kube.patch(
            CLUSTER_QUEUES, u.cluster_queue, {"spec": {"fairSharing": {"weight": text}}},
            field_manager=self.field_manager))
        return True

    # ---- workloads -------------------------------------------------------------------

    async def apply_shed(self, a: ShedAction, result: ApplyResult | None = None,
                         events: list[tuple[Obj, ShedAction]] | None = None,
                         current: Obj | None = None) -> bool:
        """Deactivate (shed) or reactivate (restore) a Workload; its Event is written at once,
        or appended to ``events`` for the caller to write later. ``current``: the Workload as
        the caller's watch cache has it (saves a GET per shed; the patch is the same either
        way, and a stale copy at worst skips a restore until the next reconcile)."""
        target = f"{a.namespace}/{a.name}"
        wl = current if current is not None else await self.kube.get(WORKLOADS, a.name,
                                                                      a.namespace)
        active = (wl.get("spec") or {}).get("active", True) is not False
        annotations = (wl.get("metadata") or {}).get("annotations") or {}
        if a.active:
            write = SHED_AT in annotations  # only bring back what m2g shed
            body: Obj = {"metadata": {"annotations": {
                SHED_AT: None, SHED_REASON: None, DRAINED_FOR: None,
                RESTORED_AT: format_time(self.clock())}}, "spec": {"active": True}}
        else:
            write = active or SHED_AT not in annotations
            marks: dict[str, Any] = {
                SHED_AT: annotations.get(SHED_AT) or self._shed_stamp(target),
                SHED_REASON: _cut(a.reason, 1024)}  # restored-at stays: early restores read it
            if a.drain:
                marks[DRAINED_FOR] = a.drain
            body = {"metadata": {"annotations": marks}, "spec": {"active": False}}
        verb = "restore" if a.active else ("drain" if a.drain else "shed")
        if not self._record(result, verb, target, f"{a.kw:.1f} kW: {a.reason}", write):
            return False
        self._seen(WORKLOADS, await self.kube.patch(WORKLOADS, a.name, body,
                                                    namespace=a.namespace,
                                                    field_manager=self.field_manager))
        self._shed_tried.pop(target, None)
        if events is not None:
            events.append((wl, a))
        else:
            await self._shed_event(wl, a)
        return True

    def _shed_stamp(self, target: str) -> str:
        """The shed-at of a new shed: now, or the stamp of this workload's shed whose write
        failed less than SHED_RETRY ago (a lost answer: the shed may be in place already)."""
        now = self.clock()
        if self.dry_run:
            return format_time(now)
        tried = self._shed_tried.get(target)
        if tried is not None and timedelta(0) <= now - tried <= SHED_RETRY:
            return format_time(tried)
        if len(self._shed_tried) > CHECK_MEMO_MAX:
            self._shed_tried.clear()  # a bound; a lost entry only costs a second stamp
        self._shed_tried[target] = now
        return format_time(now)

    async def _shed_event(self, wl: Obj, a: ShedAction) -> bool:
        try:  # the Event is best effort: the change itself is made
            reason = "Restored" if a.active else ("Drained" if a.drain else "Shed")
            await self.emit_event(wl, reason, a.reason, "Normal" if a.active else "Warning")
        except KubeError as exc:
            log.warning("event for %s %s/%s: %s", "restore" if a.active else "shed",
                        a.namespace, a.name, exc)
        return True

    # ---- nodes ------------------------------------------------------------------------

    async def apply_taint(self, u: NodeTaintUpdate, result: ApplyResult | None = None) -> bool:
        """Add, change or remove one m2g taint on a Node; re-read and retry on a conflict."""
        return await retry_on_conflict(partial(self._apply_taint_once, u, result))

    async def _apply_taint_once(self, u: NodeTaintUpdate, result: ApplyResult | None) -> bool:
        try:
            node = await self.kube.get(NODES, u.node)
        except NotFound:
            self._record(result, "taint", u.node, "node gone", False)
            return False
        meta = node.get("metadata") or {}
        taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
        kept = [t for t in taints if not (t.get("key") == u.key
                                          and t.get("effect") == str(u.effect))]
        if u.add:
            kept.append({"key": u.key, "value": u.value, "effect": str(u.effect)})
        if kept == taints:
            self._record(result, "taint", u.node, f"{u.key} unchanged", False)
            return False
        verb = "add" if u.add else "remove"
        detail = f"{verb} {u.key}={u.value}:{u.effect}: {u.reason}"
        if self.dry_run:  # shadow: recorded (and logged) only, as sheds are — no Event per
            return self._record(result, "taint", u.node, detail, True)  # node every pass
        # write first: a 409 here is retried, and recorded only once
        self._seen(NODES, await self.kube.patch(NODES, u.node, {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "spec": {"taints": kept or None}}, field_manager=self.field_manager))
        self._record(result, "taint", u.node, detail, True)
        try:  # the Event is best effort: the taint itself is in place
            await self.emit_event(
                {"apiVersion": "v1", "kind": "Node", "metadata": meta},
                "Tainted" if u.add else "Untainted",
                f"{verb} taint {u.key}={u.value}:{u.effect}: {u.reason}", action="Taint")
        except KubeError as exc:
            log.warning("event for taint on %s: %s", u.node, exc)
        return True

    # ---- events and status ------------------------------------------------------------

    async def apply_status(self, res: Resource, name: str, status: Mapping[str, Any], *,
                           namespace: str | None = None,
                           result: ApplyResult | None = None) -> bool:
        """Server-side apply ``status`` fields m2g owns on any object with a status subresource
        (e.g. GridEvent ``observedBaselineKw``/``phase``); False when they already say this."""
        obj = await self.kube.get(res, name, namespace)
        current = obj.get("status") or {}
        same = same_status(current, status)
        target = f"{namespace}/{name}" if namespace else name
        detail = str(status.get("message") or ", ".join(sorted(status)))
        if not self._record(result, f"status {res.plural}", target, detail, not same):
            return False
        meta: Obj = {"name": name, **({"namespace": namespace} if namespace else {})}
        self._seen(res, await self.kube.apply(
            res, name, {"apiVersion": res.api_version, "kind": res.kind, "metadata": meta,
                        "status": dict(status)},
            namespace=namespace, subresource="status", field_manager=self.field_manager))
        return True

    async def apply_condition(self, u: ConditionUpdate) -> bool:
        """Server-side apply one object's ``Accepted`` condition (m2g.k8s.validity: its own
        field manager, so the planner's status fields stay). Written in dry-run (shadow) mode
        too: it reports on m2g's input, it decides nothing. False when the object is gone."""
        try:
            await self.kube.apply(u.resource, u.key, u.body(), subresource="status",
                                  field_manager=VALIDITY_MANAGER)
        except NotFound:
            return False
        return True

    async def emit_event(self, involved: Mapping[str, Any], reason: str, message: str,
                         type: str = "Normal", action: str = "Reconcile") -> Obj:
        """An events.k8s.io/v1 Event about ``involved`` (written in dry-run mode too).
        Events about cluster-scoped objects go to namespace ``default``."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = self.clock()
        regarding = {"apiVersion": involved.get("apiVersion", ""),
                     "kind": involved.get("kind", ""), "name": meta.get("name", ""),
                     "uid": meta.get("uid", "")}
        if meta.get("namespace"):
            regarding["namespace"] = meta["namespace"]
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": f"{meta.get('name', 'm2g')}.{secrets.token_hex(8)}",
                             "namespace": namespace},
                "eventTime": _micro_time(now), "reportingController": CHECK_CONTROLLER,
                "reportingInstance": self.instance, "action": action, "reason": reason,
                "note": _cut(message, MAX_EVENT_NOTE), "type": type, "regarding": regarding}
        return await self.kube.create(EVENTS, body, namespace=namespace)

    async def set_policy_status(self, name: str, *, accepted: bool, ready: bool,
                                reason: str, message: str,
                                observed_generation: int | None = None,
                                namespace: str | None = None) -> bool:
        """Set a Policy CR's (with ``namespace``: a TenantPolicy's) ``Accepted`` and ``Ready``
        conditions (status SSA); False when they already say this."""
        res = TENANT_POLICIES if namespace else POLICIES
        try:
            policy = await self.kube.get(res, name, namespace=namespace)
        except NotFound:
            return False
        generation = observed_generation if observed_generation is not None else \
            int((policy.get("metadata") or {}).get("generation", 1))
        old = {c.get("type"): c for c in (policy.get("status") or {}).get("conditions") or []}
        now = format_time(self.clock())
        conds = []
        for kind, ok in (("Accepted", accepted), ("Ready", ready)):
            status = "True" if ok else "False"
            prev = old.get(kind) or {}
            conds.append({"type": kind, "status": status, "reason": reason,
                          "message": _cut(message, MAX_EVENT_NOTE * 4),
                          "observedGeneration": generation,
                          "lastTransitionTime": prev.get("lastTransitionTime", now)
                          if prev.get("status") == status else now})
        same = all({k: v for k, v in (old.get(c["type"]) or {}).items()} == c for c in conds)
        if not self._record(None, "policy-status", name, f"{reason}: {message[:120]}",
                            not same):
            return False
        meta = {"name": name, **({"namespace": namespace} if namespace else {})}
        await self.kube.apply(res, name, {
            "apiVersion": res.api_version, "kind": res.kind, "metadata": meta,
            "status": {"observedGeneration": generation, "conditions": conds}},
            namespace=namespace, subresource="status", field_manager=self.field_manager)
        return True
