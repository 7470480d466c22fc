"""The Cluster of the control loop, on m2g.k8s: watch caches in, a plan's writes out.

Thin by design: caches are m2g.k8s.cache.WatchCache of the kinds of m2g.k8s.snapshot.WATCHED
(and KAI's, m2g.k8s.kai.KaiSync), the snapshot is m2g.k8s.snapshot.assemble's (the CLI's too),
the writes and their Events are m2g.k8s.writer.apply_plan's. This module only connects them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx

from m2g.config.checks import CheckSetup
from m2g.k8s import client as k
from m2g.k8s.apply import Applier
from m2g.k8s.build import ClusterObjects, SnapshotMemo
from m2g.k8s.cache import Reachability, WatchCache
from m2g.k8s.convert import placements
from m2g.k8s.kai import KaiSync
from m2g.k8s.parse import format_time
from m2g.k8s.snapshot import WATCHED, DrawHistory, assemble, params
from m2g.k8s.validity import CONDITIONED, condition_updates
from m2g.k8s.writer import apply_plan
from m2g.model.cluster import CHECK_CONTROLLER, ClusterSnapshot, Rejected
from m2g.model.labels import DEFAULT_TOPOLOGY_LABELS, TopologyLabels
from m2g.model.plan import Plan
from m2g.signals.config import SignalConfig, SignalName
from m2g.signals.prometheus import AnswerRefusedError, PrometheusClient, PrometheusError
from m2g.signals.reader import read_signals
from m2g.signals.readings import Readings, build_readings
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import LoadResult

log = logging.getLogger("m2g.wiring")

#: Signals are read in the background this often (wall seconds) and each snapshot takes the
#: latest reading, so a reconcile never waits for Prometheus (docs/controllers.md "Signals").
SIGNAL_REFRESH_SECONDS = 2.0

class ApplyFailed(Exception):
    """Some writes of a plan failed; the next reconcile retries (level-triggered)."""


class K8sCluster:
    """Watch caches + signal reader + applier behind the manager's Cluster protocol."""

    def __init__(self, kube: k.Kube, *, prometheus: str | None = None,
                 signal_config: SignalConfig | None = None, instance: str = "m2g",
                 http: httpx.AsyncClient | None = None,
                 topology_labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS,
                 readings: Callable[[K8sCluster], Awaitable[Readings | None]] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 signal_refresh_seconds: float = SIGNAL_REFRESH_SECONDS,
                 metrics: Metrics | None = None) -> None:
        self.kube = kube
        self.metrics = metrics  # the signals' status is exported there (m2g run's registry)
        self._signals_seen: Readings | None = None  # the last read, for the metrics
        if metrics is not None:
            metrics.latest_readings = lambda: self._signals_seen
        self.reachability = Reachability()  # one cache back after an outage wakes the rest
        self.caches = {name: WatchCache(kube, res, params=params(name),
                                        reachability=self.reachability)
                       for name, res in WATCHED.items()}
        self.policies = WatchCache(kube, k.POLICIES)
        self.tenant_policies = WatchCache(kube, k.TENANT_POLICIES)  # tenants' own, namespaced
        # the manager's clock: what m2g writes (shed-at, condition times) matches what it reads
        self.applier = Applier(kube, instance=instance, background_events=True, clock=clock)
        self.applier.observe = self._observe  # the next reconcile sees m2g's own writes
        self.kai = KaiSync(kube)  # KAI Scheduler's caches, only when its CRDs are served
        self._prometheus = prometheus
        self._signal_config = signal_config or SignalConfig()
        self._http = http  # the site's auth, CA and headers (m2g.signals.http); closed by stop
        self._read_override = readings  # another signal source (tests, replay); else Prometheus
        self._memo = SnapshotMemo()  # unchanged nodes and workloads are not converted again
        self.draw_history = DrawHistory()  # site-draw samples: percentage events' baselines
        self._refresh = signal_refresh_seconds  # 0: read on every snapshot
        self._latest: Readings | None = None
        self._read_once: asyncio.Event | None = None
        self._signal_failures: dict[SignalName, str] = {}  # signal → its last failure's kind
        self._poller: asyncio.Task[None] | None = None
        self.topology_labels = topology_labels  # the site's node labels for clique, rack, ...
        #: read the placements while an elastic workload waits (``nvlink_preplace``: m2g run)
        self.elastic_placements = False
        self._clock = clock
        self._condition_errors: dict[str, str] = {}  # key → the last failed condition write
        self._conditions_seen: tuple[tuple[int, ...], frozenset[tuple[str, str, str]]] | None \
            = None  # the caches' generations and left-out set of the last complete pass

    def _observe(self, res: k.Resource, answer: k.Obj) -> None:
        """Fold a write's answer into the watch cache of its kind (only caches that watch the
        whole kind: an object outside a selector is not theirs)."""
        self.reachability.seen()  # a write went through: the API server answers
        for cache in self.caches.values():
            if cache.resource == res and not cache.params:
                cache.observe(answer)

    def all_caches(self) -> list[WatchCache]:
        return [*self.caches.values(), self.policies, self.tenant_policies, *self.kai.caches()]

    async def start(self, on_change: Callable[..., None], timeout: float = 60.0) -> None:
        """Start the caches; ``on_change(type, key, obj)`` on every change, with a fourth
        argument for the WATCHED kinds: their name (``Manager.changed`` lets some wait)."""
        named = {id(c): name for name, c in self.caches.items()}
        for cache in self.all_caches():
            name = named.get(id(cache))
            cache.subscribe(on_change if name is None else partial(_with_kind, on_change, name))
            cache.start()
        pending = [c.wait_synced(timeout) for c in self.all_caches()
                   if c.resource.group in ("", "kueue.x-k8s.io")]
        await asyncio.gather(*pending)  # m2g's own CRDs may be missing: they sync later
        await self.kai.probe(on_change)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self.applier.drain(timeout=10)
        for cache in self.all_caches():
            await cache.stop()
        if self._http is not None:
            await self._http.aclose()

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        objs = ClusterObjects(**{name: c.view() for name, c in self.caches.items()})
        readings = await self._readings()
        await self.kai.probe()  # KAI installed later is picked up (one discovery call a minute)
        return assemble(objs, readings, now, kai=self.kai.state(self.caches["nodes"]),
                        memo=self._memo, history=self.draw_history,
                        labels=self.topology_labels,
                        elastic_placements=self.elastic_placements)

    async def _readings(self) -> Readings | None:
        """The latest signal readings. With a refresh period, a background task reads every
        ``signal_refresh_seconds`` and a snapshot takes the newest (waiting only for the very
        first): reading Prometheus took ~2 s a reconcile on a loaded 16-rack twin, and every
        reconcile — each new workload's admission check — waited for it. Readings then are up
        to one period older than the snapshot (their freshness is judged when they were read)."""
        if self._read_override is not None:
            return await self._read_override(self)
        if not self._prometheus:
            return None
        if self._refresh <= 0:
            return await self._read_now()
        if self._poller is None or self._poller.done():
            self._read_once = self._read_once or asyncio.Event()
            self._poller = asyncio.create_task(self._poll(), name="m2g-signals")
        if self._latest is None and self._read_once is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read_once.wait(), 12)
        return self._latest

    async def _poll(self) -> None:
        while True:
            self._latest = await self._read_now()
            if self._read_once is not None:
                self._read_once.set()
            await asyncio.sleep(self._refresh)

    async def _read_now(self) -> Readings | None:
        if not self._prometheus:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient()
        cfg = self._signal_config
        failed: dict[SignalName, PrometheusError] = {}
        try:  # a failed read is stale data (fail-safe rules), never a failed reconcile
            readings = await asyncio.wait_for(read_signals(
                PrometheusClient(self._prometheus, self._http, cfg.timeout_seconds,
                                 max_response_bytes=cfg.max_response_bytes,
                                 max_series=cfg.max_series,
                                 max_values_per_series=cfg.max_values_per_series,
                                 max_values=cfg.max_values),
                cfg, failed=failed.__setitem__), 10)
        except Exception as exc:
            log.warning("signals unavailable, treated as stale: %s", exc)
            why = f"the read failed: {type(exc).__name__}: {exc}"
            self._signals_seen = build_readings({}, self._clock().timestamp(), cfg,
                                                errors={n: why for n in cfg.signals})
            return None
        self._report_signals(failed)
        self._signals_seen = readings
        return readings

    def _report_signals(self, failed: Mapping[SignalName, PrometheusError]) -> None:
        """One log line when a signal starts failing (or fails another way), one when it reads
        again — not one every read; each answer refused over a bound counted by signal and
        bound (``m2g_signal_answers_refused_total``)."""
        for name, exc in failed.items():
            if self._signal_failures.get(name) != type(exc).__name__:
                log.warning("signal %s reads as missing (the fail-safe rules apply): %s",
                            name, exc)
            if isinstance(exc, AnswerRefusedError) and self.metrics is not None:
                self.metrics.signal_refused.labels(str(name), exc.bound).inc()
        for name in sorted(set(self._signal_failures) - set(failed)):
            log.info("signal %s reads again", name)
        self._signal_failures = {n: type(e).__name__ for n, e in failed.items()}

    def placements_of(self, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Workload "ns/name" → the nodes its pods are bound to (or Kueue TAS assigned), for
        these workloads only (the decision log's "placed" records)."""
        wanted = set(keys)
        workloads = [o for key, o in self.caches["workloads"].view().items() if key in wanted]
        if not workloads:
            return {}
        return placements(self.caches["pods"].view().values(), workloads)

    def policy_objects(self) -> list[dict[str, Any]]:
        tenants = [{**o, "kind": k.TENANT_POLICIES.kind}
                   for o in self.tenant_policies.view().values()]
        return [*self.policies.view().values(), *tenants]

    async def apply(self, plan: Plan, *, shadow: bool) -> list[str]:
        self.applier.dry_run = shadow
        workloads = self.caches["workloads"]
        result = await apply_plan(self.applier, plan,
                                  known=lambda ns, name: workloads.get(f"{ns}/{name}"))
        lines = [f"{'would ' if not r.written else ''}{r.action} {r.target}: {r.detail}"
                 for r in result.records]
        if result.errors:
            first_what, first = result.errors[0]
            raise ApplyFailed(f"{len(result.errors)} write(s) failed; first: {first_what}: "
                              f"{first}")
        return lines

    async def policy_status(self, result: LoadResult) -> None:
        bad = {p.file for p in result.problems}
        message = result.summary()
        for obj in self.policy_objects():
            meta = obj.get("metadata") or {}
            name, ns = str(meta.get("name", "")), meta.get("namespace")
            tenant = obj.get("kind") == k.TENANT_POLICIES.kind
            source = f"TenantPolicy/{ns}/{name}" if tenant else f"Policy/{name}"
            mine = [p.render() for p in result.problems if p.file == source]
            ok = result.accepted and source not in bad
            reason = "Accepted" if ok else ("Invalid" if source in bad else "SetRejected")
            text = "; ".join(mine) if mine else message
            if mine and result.accepted:
                text += " (this object's last good version stays in force, if it had one)"
            try:
                await self.applier.set_policy_status(
                    name, accepted=source not in bad, ready=ok, reason=reason, message=text,
                    namespace=str(ns) if tenant and ns else None)
                if source in bad:
                    await self.applier.emit_event(obj, "PolicyRejected", text, "Warning",
                                                  action="LoadPolicies")
            except k.KubeError as exc:
                log.warning("status of Policy %s not written: %s", name, exc)

    async def report_rejected(self, rejected: Sequence[Rejected]) -> None:
        """A Warning Event ``LeftOut`` on each object m2g cannot use (reason ``Rejected.reason``),
        or ``Ignored`` on one it uses without an invalid part (``Rejected.part``), so ``kubectl
        describe`` on it says what m2g ignores and why; objects already gone get none."""
        kinds = {res.kind: (name, res) for name, res in WATCHED.items()}
        for r in rejected:
            cache_name, res = kinds.get(r.kind, ("", None))
            obj = self.caches[cache_name].get(r.name) if res is not None else None
            if res is None or obj is None:
                continue
            meta = obj.get("metadata") or {}
            involved = {"apiVersion": res.api_version, "kind": res.kind, "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid") if isinstance(meta.get(k), str)}}
            text = (f"m2g ignores the {r.part} of this {r.kind} (the rest of it is used): "
                    f"{r.reason}" if r.part else
                    f"m2g cannot use this {r.kind} and decides without it "
                    f"(everything else is decided as usual): {r.reason}")
            try:
                await self.applier.emit_event(
                    involved, "Ignored" if r.part else "LeftOut", text, "Warning",
                    action="Snapshot")
            except k.KubeError as exc:
                log.warning("Event on %s %s not written: %s", r.kind, r.name, exc)

    async def mark_rejected(self, rejected: Sequence[Rejected]) -> None:
        """The ``Accepted`` condition on m2g's own objects (m2g.k8s.validity): False on those
        left out (``rejected``: all of this snapshot's), True again once fixed; only the
        conditions the watch cache does not already show are written. A failed write is
        logged once per object and reason and retried next reconcile, never a failed
        reconcile. Nothing is looked at while neither those caches nor ``rejected`` changed
        since a pass that wrote everything it had to (one pass per change, not per reconcile:
        a large site has a GPUPowerLimit per capped node)."""
        seen = (tuple(self.caches[name].generation for name, _ in CONDITIONED.values()),
                frozenset((r.kind, r.name, r.reason) for r in rejected))
        if seen == self._conditions_seen:
            return
        views = {name: self.caches[name].view() for name, _ in CONDITIONED.values()}
        done = True
        for u in condition_updates(views, rejected, format_time(self._clock())):
            try:
                await self.applier.apply_condition(u)
                self._condition_errors.pop(u.key, None)
            except k.KubeError as exc:
                done = False
                text = f"{u.condition['reason']}: {exc}"
                if self._condition_errors.get(u.key) != text:
                    log.warning("condition Accepted on %s %s not written: %s", u.kind, u.key,
                                exc)
                self._condition_errors[u.key] = text
        # a write shows in the cache (a new generation: one more pass finds nothing to write)
        self._conditions_seen = seen if done else None

    def m2g_checks(self) -> dict[str, dict[str, Any] | None]:
        return {str(name): (ac.get("spec") or {}).get("parameters")
                for name, ac in self.caches["admission_checks"].view().items()
                if (ac.get("spec") or {}).get("controllerName") == CHECK_CONTROLLER}

    async def ensure_checks(self, setups: Mapping[str, CheckSetup]) -> None:
        """Every check of m2g's with the Active condition its setup says (the default one
        created if lost); the watch cache says whether it is in place, so a check in the right
        state costs no request."""
        for name, setup in setups.items():
            cached = self.caches["admission_checks"].get(name)
            if cached is None and setup.reason != "Active":
                continue  # only the default check is created, and it is never broken
            if _condition_is(cached, setup):
                continue
            try:
                await self.applier.ensure_admission_check_active(
                    name, active=setup.active, reason=setup.reason, message=setup.message)
            except k.PermanentError as exc:  # one check's trouble stops no other check
                log.warning("AdmissionCheck %s: %s", name, exc)
            if not setup.active:
                log.warning("AdmissionCheck %s is not Active: %s", name, setup.message)


def _with_kind(on_change: Callable[..., None], kind: str, event_type: str, key: str,
               obj: k.Obj) -> None:
    on_change(event_type, key, obj, kind)


def _condition_is(check: dict[str, Any] | None, setup: CheckSetup) -> bool:
    """An AdmissionCheck of m2g's whose Active condition is the setup's for its current
    generation."""
    if check is None or (check.get("spec") or {}).get("controllerName") != CHECK_CONTROLLER:
        return False
    generation = (check.get("metadata") or {}).get("generation", 1)
    want = "True" if setup.active else "False"
    return any(c.get("type") == "Active" and c.get("status") == want
               and c.get("observedGeneration") == generation
               and (setup.active or c.get("message") == setup.message)
               for c in (check.get("status") or {}).get("conditions") or [])
