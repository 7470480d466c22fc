"""The control loop: level-triggered reconciles of the whole factory, one at a time.

Every reconcile takes a fresh snapshot (from watch caches and signal readers, behind the
``Cluster`` protocol), asks the pure planner for a plan and applies it — only while this replica
leads; in shadow mode it decides and records (metrics, Events) but writes nothing else.
Reconciles run when a watched object changes (coalesced: many changes, one reconcile, and at
most one every ``min_interval_seconds``) and at least every ``resync_seconds`` (time alone
moves grid events and maintenance windows). While the factory is *quiet* (``quiet``: no grid
event in force or near, nothing m2g curtails, every check answered Ready), a change of a pod
or of a Workload that awaits no admission check starts a reconcile only
``quiet_interval_seconds`` after it (``Manager.changed``): a busy factory changes pods and
Workloads many times a second, and each such change started a whole reconcile that decided
nothing new (docs/controllers.md "Pacing").
Failures back off exponentially and retry; the loop itself never dies on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from m2g.config.checks import CheckConfig, CheckSetup, resolve_checks
from m2g.model.cluster import ClusterSnapshot, Rejected
from m2g.model.plan import Plan
from m2g.planner.config import PlannerConfig
from m2g.planner.forecast import ForecastConfig, NewWork, forecast
from m2g.planner.memo import PlanMemo
from m2g.planner.plan import make_plan
from m2g.planner.shedding import workload_kw
from m2g_controllers.collector import CollectorFreezer, HeapTrimmer
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import LoadResult, PolicyStore

if TYPE_CHECKING:  # pyarrow (~40 MiB resident) is loaded only with a decision log (run.py)
    from m2g_controllers.decisionlog import DecisionLog

log = logging.getLogger("m2g.manager")
Clock = Callable[[], datetime]


#: Reconciles failing this long make /readyz fail (a transient API error lasts less).
UNREADY_FAILING_SECONDS = 120.0
#: With a signal source configured: no fresh power reading this long makes /readyz fail.
UNREADY_STALE_SECONDS = 300.0
#: A grid event or maintenance window starting within this is near: the factory is not quiet.
QUIET_HORIZON = timedelta(seconds=300)
#: The watched kinds (m2g.k8s.snapshot.WATCHED names) whose changes may wait while quiet.
LAZY_KINDS = frozenset({"pods", "workloads"})


def _condition(status: Mapping[str, Any], kind: str) -> bool:
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping) and c.get("type") == kind and c.get("status") == "True"
        for c in conditions)


def awaits_check(obj: Mapping[str, Any] | None) -> bool:
    """A Workload Kueue holds quota for, not admitted yet, with an admission check still
    Pending: some check controller (m2g's, or one m2g does not know) has to answer before
    Kueue admits it. (Kueue lists a ClusterQueue's checks, Pending, on every Workload queued
    there, quota or not; m2g answers only once the quota is reserved.)"""
    status = (obj or {}).get("status")
    if not isinstance(status, Mapping) or not _condition(status, "QuotaReserved") \
            or _condition(status, "Admitted"):
        return False
    checks = status.get("admissionChecks")
    return isinstance(checks, list) and any(
        isinstance(c, Mapping) and c.get("state") == "Pending" for c in checks)


def lazy_change(kind: str, obj: Mapping[str, Any] | None) -> bool:
    """A change that can wait while quiet: a pod's, or a Workload's that awaits no check (an
    admission waits on m2g's answer: that change is never lazy)."""
    if kind not in LAZY_KINDS:
        return False
    return kind == "pods" or not awaits_check(obj)


def quiet(snap: ClusterSnapshot, plan: Plan) -> bool:
    """Nothing of this reconcile depends on pods or on Workloads' progress: no grid event or
    maintenance window in force or starting within ``QUIET_HORIZON``, no workload m2g has
    shed, capped or shrunk, no node GPU limit below its default, and a plan that curtails,
    defers or holds nothing (every check answer Ready, no quota, stop, preemption, taint or
    power change)."""
    now = snap.now
    horizon = now + QUIET_HORIZON
    if any(e.start <= horizon and e.end > now for e in snap.factory.grid_events):
        return False
    if any(w.start <= horizon and w.end > now for w in snap.factory.maintenance):
        return False
    if (plan.quotas or plan.stops or plan.preemptions or plan.sheds or plan.taints
            or plan.caps or plan.node_limits or plan.resizes):
        return False
    if any(c.state.value != "Ready" for c in plan.checks):
        return False
    if any(w.shed_by_m2g or w.power_cap < 1.0 or w.resized_at is not None or w.drained_for
           for w in snap.workloads):
        return False
    return not any(s.spec is not None and (s.spec.fraction < 1.0 or s.spec.watts is not None)
                   for s in snap.node_limits.values())


def utcnow() -> datetime:
    return datetime.now(UTC)


def clock_from(start: datetime, monotonic: Callable[[], float] = time.monotonic) -> Clock:
    """A clock that reads ``start`` now and then advances with real (monotonic) time: the
    controller's clock under ``m2g run --clock-start`` (tests, replays of a given hour; the
    policies' ``now``, grid events and maintenance windows then see that time)."""
    if start.tzinfo is None:
        raise ValueError(f"clock start {start.isoformat()} has no time zone")
    t0 = monotonic()
    return lambda: start + timedelta(seconds=monotonic() - t0)


class Cluster(Protocol):
    """What the loop needs from the cluster (m2g_controllers.wiring implements it on m2g.k8s)."""

    async def snapshot(self, now: datetime) -> ClusterSnapshot: ...

    def policy_objects(self) -> list[dict[str, Any]]: ...

    async def apply(self, plan: Plan, *, shadow: bool) -> list[str]: ...

    async def policy_status(self, result: LoadResult) -> None: ...

    def m2g_checks(self) -> dict[str, dict[str, Any] | None]:
        """The AdmissionChecks with controllerName m2g.io/policy: name → spec.parameters."""
        ...

    async def ensure_checks(self, setups: Mapping[str, CheckSetup]) -> None:
        """Each check's Active condition as its setup says (the default check created)."""
        ...

    async def report_rejected(self, rejected: Sequence[Rejected]) -> None:
        """A Warning Event on each object newly left out of the snapshot (leader only)."""
        ...

    async def mark_rejected(self, rejected: Sequence[Rejected]) -> None:
        """The status condition on m2g's own objects: False on those left out (``rejected``:
        all of them), True again once fixed; unchanged ones not written (leader only)."""
        ...


#: The forecast metrics are recomputed this often (seconds of the manager's clock).
FORECAST_PERIOD_SECONDS = 300.0


@dataclass
class LoopState:
    """What the loop remembers between reconciles (for readiness and metrics only)."""

    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    changed_at: float | None = None  # monotonic time of the oldest unhandled change
    last_ok: datetime | None = None
    last_error: str = ""
    reconciles: int = 0
    failing_since: datetime | None = None  # the first failure since the last success
    busy_since: datetime | None = None  # the reconcile in progress began then (None: idle)
    signals_fresh_at: datetime | None = None  # the last snapshot with any fresh power reading
    started: datetime | None = None
    wake_at: datetime | None = None  # the last plan's next time boundary
    began_at: float | None = None  # time.monotonic() when the last reconcile began
    #: the last reconcile found the factory quiet (``quiet``): lazy changes may wait
    quiet: bool = False
    lazy_since: float | None = None  # monotonic time of the oldest unhandled lazy change


class Manager:
    """Runs reconciles; ``kick()`` marks the world changed (call it from watch callbacks)."""

    def __init__(self, cluster: Cluster, store: PolicyStore, metrics: Metrics, *,
                 config: PlannerConfig | None = None, shadow: bool = False,
                 is_leader: Callable[[], bool] = lambda: True, clock: Clock = utcnow,
                 resync_seconds: float = 10.0, policy_dir: Any = None,
                 decision_log: DecisionLog | None = None,
                 unready_failing_seconds: float = UNREADY_FAILING_SECONDS,
                 unready_stale_seconds: float | None = None,
                 check_configs: Mapping[str, CheckConfig] | None = None,
                 freeze_collector: bool = False, min_interval_seconds: float = 0.0,
                 quiet_interval_seconds: float = 0.0) -> None:
        self.cluster, self.store, self.metrics = cluster, store, metrics
        #: m2g run: gc.freeze() after each snapshot (m2g_controllers.collector); off in tests,
        #: which share one process
        self.collector = CollectorFreezer() if freeze_collector else None
        #: and the C heap trimmed after a reconcile, at most every 10 s (m2g_controllers.collector)
        self.trimmer = HeapTrimmer() if freeze_collector else None
        self.decision_log = decision_log  # m2g run --decision-log: the leader records
        self.config = config or PlannerConfig()
        self.check_configs = dict(check_configs or {})
        self.shadow, self.is_leader, self.clock = shadow, is_leader, clock
        self.resync_seconds = resync_seconds
        #: a reconcile starts at least this long after the last one began (changes meanwhile
        #: coalesce into it): ``m2g run --min-reconcile-interval``; 0 in tests
        self.min_interval_seconds = min_interval_seconds
        #: while quiet, a lazy change (``lazy_change``) starts a reconcile this long after it
        #: at the latest, not at once: ``m2g run --quiet-reconcile-interval``; 0: at once
        self.quiet_interval_seconds = quiet_interval_seconds
        self._lazy_timer: asyncio.TimerHandle | None = None
        self.policy_dir = policy_dir
        self.state = LoopState()
        #: what a plan keeps for the next (m2g.planner.memo: the clock-free parts of the power
        #: actions, each with the inputs it was worked out from)
        self.plan_memo = PlanMemo()
        self._rejected: dict[tuple[str, str], str] = {}
        self._reported: dict[tuple[str, str], str] = {}  # what the leader has emitted Events for
        self._policy_status_owed = False  # the policy set's status is not written yet
        self._forecast_at: datetime | None = None  # the metrics' last forecast
        self.unready_failing_seconds = unready_failing_seconds
        self.unready_stale_seconds = unready_stale_seconds
        metrics.shadow.set(1 if shadow else 0)

    def kick(self, *_: Any) -> None:
        if self.state.changed_at is None:
            self.state.changed_at = time.monotonic()
        self.state.dirty.set()

    def changed(self, event_type: str = "", key: str = "", obj: Mapping[str, Any] | None = None,
                kind: str = "") -> None:
        """A watch cache's change (``kind``: its m2g.k8s.snapshot.WATCHED name, "" for other
        caches): a reconcile at once (paced), or — while quiet, for a lazy change — within
        ``quiet_interval_seconds``."""
        if self.quiet_interval_seconds > 0 and self.state.quiet and lazy_change(kind, obj):
            self.metrics.lazy_changes.inc()
            if self.state.lazy_since is None:
                self.state.lazy_since = time.monotonic()
                self._lazy_timer = asyncio.get_running_loop().call_later(
                    self.quiet_interval_seconds, self._lazy_due)
            return
        self.kick()

    def _lazy_due(self) -> None:
        """The quiet interval of the oldest waiting lazy change is over: reconcile (not a
        reaction: ``changed_at`` stays as the changes that start one at once set it)."""
        self._lazy_timer = None
        if self.state.lazy_since is not None:
            self.state.dirty.set()

    def ready(self) -> tuple[bool, str]:
        """Ready while reconciles succeed and decide on live data (docs/controllers.md):
        not before the first success, not once reconciles have failed — or one has hung, e.g.
        on an API server whose etcd does not answer — for longer than
        ``unready_failing_seconds``, and (when ``unready_stale_seconds`` is set, i.e. a signal
        source is configured) not once no power reading has been fresh for that long."""
        ok, why = self._readiness()
        self.metrics.ready.set(1 if ok else 0)
        return ok, why

    def _readiness(self) -> tuple[bool, str]:
        st, now = self.state, self.clock()
        if self.store.evaluator is None:
            return False, "no policy set loaded yet: " + self.store.last.summary()
        if st.last_ok is None:
            return False, "no reconcile has succeeded yet: " + (st.last_error or "starting")
        if st.failing_since is not None:
            failing = (now - st.failing_since).total_seconds()
            if failing > self.unready_failing_seconds:
                return False, (f"reconciles failing for {failing:.0f}s (bound "
                               f"{self.unready_failing_seconds:g}s): {st.last_error}")
        if st.busy_since is not None:
            busy = (now - st.busy_since).total_seconds()
            if busy > self.unready_failing_seconds:
                return False, (f"a reconcile has not finished for {busy:.0f}s (bound "
                               f"{self.unready_failing_seconds:g}s): the API server or a "
                               "signal source does not answer")
        if self.unready_stale_seconds is not None:
            since = st.signals_fresh_at or st.started or st.last_ok
            stale = (now - since).total_seconds()
            if stale > self.unready_stale_seconds:
                return False, (f"no fresh power signal for {stale:.0f}s (bound "
                               f"{self.unready_stale_seconds:g}s): deciding on fail-safe "
                               "defaults only")
        return True, "ok"

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.5
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state.dirty.wait(), timeout=self._wait_seconds())
            if stop.is_set():
                return
            await self._pace(stop)
            if stop.is_set():
                return
            self.state.dirty.clear()
            self.state.lazy_since = None  # this reconcile's snapshot sees those changes
            if self._lazy_timer is not None:
                self._lazy_timer.cancel()
                self._lazy_timer = None
            started = self.state.changed_at
            self.state.changed_at = None
            self.state.busy_since = self.clock()
            self.state.began_at = time.monotonic()
            try:
                await self.reconcile()
                self.state.busy_since = None
                backoff = 0.5
                if started is not None:
                    self.metrics.reaction_seconds.observe(time.monotonic() - started)
            except Exception as exc:  # a failed reconcile is retried, never fatal
                self.state.busy_since = None
                self.state.quiet = False
                self.metrics.quiet.set(0)
                self.state.last_error = f"{type(exc).__name__}: {exc}"
                if self.state.failing_since is None:
                    self.state.failing_since = self.clock()
                self.ready()  # keeps m2g_ready current between probes
                self.metrics.reconciles.labels("error").inc()
                log.warning("reconcile failed, retrying in %.1fs: %s", backoff,
                            self.state.last_error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                self.kick()

    async def _pace(self, stop: asyncio.Event) -> None:
        """Hold the next reconcile until ``min_interval_seconds`` after the last one began:
        a busy site changes many times a second (pods binding, checks, statuses), and each
        change would otherwise start a whole reconcile of its own once the last one ends."""
        began = self.state.began_at
        if began is None or self.min_interval_seconds <= 0:
            return
        left = self.min_interval_seconds - (time.monotonic() - began)
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=left)

    def _wait_seconds(self) -> float:
        """Until the next resync, or sooner when the last plan named a time (a grid event
        starting or ending: its baseline and its sheds should not wait for the resync)."""
        wake = self.state.wake_at
        if wake is None:
            return self.resync_seconds
        left = (wake - self.clock()).total_seconds()
        return min(self.resync_seconds, max(0.05, left + 0.05))

    async def load_policies(self) -> LoadResult:
        """Load the policy set in a worker thread: compiling a large set takes seconds (a
        128-rule Policy 7.5 s), and the event loop must keep renewing the lease meanwhile."""
        if self.policy_dir is not None:
            result = await asyncio.to_thread(self.store.load_dir, self.policy_dir)
        else:
            objects = self.cluster.policy_objects()
            result = await asyncio.to_thread(self.store.load_objects, objects)
        if not result.accepted or (result.changed and result.problems):
            self.metrics.policy_errors.inc()
            log.warning(result.summary())
        # the status is owed from a change until a leader writes it: a set loaded while this
        # replica was still a follower (the first load races the Lease) is written once it
        # leads, not only at the next change
        self._policy_status_owed |= result.changed or not result.accepted
        if self._policy_status_owed and self.is_leader() and not self.shadow:
            await self.cluster.policy_status(result)
            self._policy_status_owed = not result.accepted
        if self.store.policy_set is not None:
            self.metrics.policies.set(len(self.store.policy_set.policies))
        return result

    async def reconcile(self) -> Plan | None:
        """One pass: policies, snapshot, plan, apply. Returns the plan (None: nothing to do)."""
        t0 = time.perf_counter()
        if self.state.started is None:
            self.state.started = self.clock()
        self.metrics.leader.set(1 if self.is_leader() else 0)
        await self.load_policies()
        evaluator = self.store.evaluator
        if evaluator is None:
            raise RuntimeError(self.store.last.summary())
        snap = await self.cluster.snapshot(self.clock())
        if self.collector is not None:
            self.collector.after_snapshot()
        setups = resolve_checks(self.cluster.m2g_checks(), self.config.check_name,
                                self.check_configs, evaluator.policy_set.names())
        own = {name: self.store.selection(s.policies) if s.active else None
               for name, s in setups.items() if s.policies is not None or not s.active}
        plan = make_plan(snap, evaluator, self.config, check_evaluators=own,
                         memo=self.plan_memo)
        self.state.wake_at = plan.wake_at
        # a waiting elastic job is placed before Kueue reserves it (nvlinkPreplace): its
        # arrival is never lazy
        self.state.quiet = quiet(snap, plan) and not self.config.nvlink_preplace
        self.metrics.quiet.set(1 if self.state.quiet else 0)
        self._observe(snap, plan)
        if self.is_leader():
            await self._emit_rejected(snap)
            if not self.shadow:
                await self.cluster.ensure_checks(setups)
            try:
                for line in await self.cluster.apply(plan, shadow=self.shadow):
                    log.info(line)
            finally:  # a plan that failed in part was still decided: logged either way
                self._log_decisions(snap, plan)
        self.state.last_ok, self.state.last_error = self.clock(), ""
        self.state.failing_since = None
        self.state.reconciles += 1
        self.metrics.reconciles.labels("ok").inc()
        self.metrics.reconcile_seconds.observe(time.perf_counter() - t0)
        if self.trimmer is not None:
            self.trimmer.after_reconcile()
        return plan

    def _log_decisions(self, snap: ClusterSnapshot, plan: Plan) -> None:
        if self.decision_log is None:
            return
        self.decision_log.record(snap, plan, policy_set=self.store.version,
                                 applied=not self.shadow,
                                 placements=getattr(self.cluster, "placements_of", None))

    def _report_rejected(self, snap: ClusterSnapshot) -> None:
        """Log each object newly left out of the snapshot (or used with a part of it ignored),
        once, and count them by kind."""
        seen = {(r.kind, r.name): r.reason for r in snap.rejected}
        parts = {(r.kind, r.name): r.part for r in snap.rejected}
        for (kind, name), reason in seen.items():
            if self._rejected.get((kind, name)) == reason:
                continue
            if parts[kind, name]:
                log.warning("ignored the %s of %s %s (the %s itself is used): %s",
                            parts[kind, name], kind, name, kind, reason)
            else:
                log.warning("left out of the snapshot (everything else is decided): %s %s: %s",
                            kind, name, reason)
        counts = Counter(kind for kind, _ in seen)
        for kind in set(counts) | {k for k, _ in self._rejected}:
            self.metrics.rejected.labels(kind).set(counts.get(kind, 0))
        self._rejected = seen

    async def _emit_rejected(self, snap: ClusterSnapshot) -> None:
        """One Warning Event per object left out of the snapshot, again only when its reason
        changes (an object that stays broken is not re-reported every reconcile), and the
        ``Accepted`` condition on m2g's own objects (m2g.k8s.validity); a failed Event is
        logged and retried next reconcile, never a failed reconcile."""
        try:  # the conditions: the adapter writes only what the objects do not already say
            await self.cluster.mark_rejected(snap.rejected)
        except Exception as exc:  # best effort like the Events: the decisions stand
            log.warning("conditions on objects left out not written: %s", exc)
        new = [r for r in snap.rejected if self._reported.get((r.kind, r.name)) != r.reason]
        if new:
            try:
                await self.cluster.report_rejected(new)
            except Exception as exc:  # Events are best effort: the decisions stand
                log.warning("Events for objects left out not written: %s", exc)
                return
        self._reported = {(r.kind, r.name): r.reason for r in snap.rejected}

    def _count_actions(self, plan: Plan) -> None:
        """The decision and action counters (the leader's; in shadow mode what it would do,
        as ``m2g_shadow_mode`` says)."""
        m = self.metrics
        for c in plan.checks:
            m.decisions.labels(c.state.value, c.policy or "none").inc()
        for s in plan.sheds:
            m.shed_actions.labels("restore" if s.active else ("drain" if s.drain else "shed")).inc()
        for cap in plan.caps:
            m.power_cap_actions.labels("lift" if cap.fraction >= 1.0 else "cap").inc()
        for rs in plan.resizes:
            m.resize_actions.labels("grow" if rs.parallelism >= rs.full else "shrink").inc()
        for t in plan.taints:
            m.taint_changes.labels(t.key, "add" if t.add else "remove").inc()
        for kt in plan.kai_topologies:
            m.kai_topology_updates.labels("replace" if kt.replace else "create").inc()

    def _forecast(self, snap: ClusterSnapshot) -> None:
        """The forecast metrics, at most once per FORECAST_PERIOD_SECONDS (not per reconcile:
        a forecast simulates every workload over the horizon)."""
        last = self._forecast_at
        if last is not None and (snap.now - last).total_seconds() < FORECAST_PERIOD_SECONDS:
            return
        self._forecast_at = snap.now
        fc = forecast(snap, ForecastConfig(
            default_runtime_seconds=self.config.default_runtime_seconds,
            reservation_lead_seconds=self.config.reservation_lead_seconds,
            new_work=NewWork.PERSIST, planner=self.config))
        m = self.metrics
        for h, i in enumerate(fc.intervals):
            ahead = str(h)
            for bound, kw in (("central", i.site_kw), ("low", i.low_kw), ("high", i.high_kw)):
                m.forecast_kw.labels(fc.site, ahead, bound).set(kw)
            for d, kw in i.domains.items():
                m.forecast_kw.labels(d, ahead, "central").set(kw)
            for tier, kw in i.flex_kw.items():
                m.forecast_flex_kw.labels(str(tier), ahead).set(kw)

    def _observe(self, snap: ClusterSnapshot, plan: Plan) -> None:
        m = self.metrics
        self._report_rejected(snap)
        self._forecast(snap)
        if self.is_leader():  # a follower decides too, but only what the leader does counts
            self._count_actions(plan)
        for q in plan.quotas:
            m.quota_ratio.labels(q.cluster_queue, q.flavor).set(q.nominal / q.base if q.base else 0)
        for kq in plan.kai_queues:
            m.kai_gpu_limit.labels(kq.queue).set(kq.limit)
        m.preemption_failed.set(plan.preemption_failed)
        m.capped_gpus.set(sum(w.view.gpus for w in snap.workloads
                              if w.power_cap < 1.0 and w.phase.value == "Admitted"))
        draw = snap.factory.site_draw_kw()
        if draw.value is not None:
            m.site_draw_kw.set(draw.value)
        if any(not r.power_kw.stale for r in snap.factory.racks):
            self.state.signals_fresh_at = self.clock()
        m.site_limit_kw.set(snap.factory.effective_budget_kw())
        m.shed_kw.set(sum(workload_kw(w, self.config) for w in snap.workloads if w.shed_by_m2g))
        ages = [r.power_kw.age_seconds for r in snap.factory.racks]
        if ages:
            m.signal_age.labels("rack_power").set(min(max(ages), 1e9))
