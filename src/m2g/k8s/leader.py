"""Lease-based leader election (coordination.k8s.io/v1 Lease), as client-go does it.

One ``step()`` reads the Lease and then:

* creates it when missing, holding it;
* renews it (``renewTime``) when we hold it;
* takes it over (``holderIdentity`` = us, ``leaseTransitions`` + 1) when it is released (no
  holder) or expired: the record has not changed for ``lease_duration`` by *our* clock (the
  holder's timestamps are never compared with our clock, so clock skew does not matter);
* otherwise follows.

Writes carry the Lease's resourceVersion, so of two candidates only one wins. A leader that
cannot renew for ``renew_deadline`` (API errors, conflicts) stops leading, and one that finds
another holder stops at once. ``run()`` calls ``step()`` every ``retry_period``; ``leading`` is
an ``asyncio.Event``. ``release()`` gives the Lease up on shutdown. The clock and the sleep are
injected for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from m2g.k8s.client import LEASES, Conflict, KubeError, Obj, Resource

log = logging.getLogger(__name__)


class LeaseApi(Protocol):
    """The part of ``client.Kube`` the elector uses."""

    async def get_or_none(self, res: Resource, name: str,
                          namespace: str | None = None) -> Obj | None: ...

    async def create(self, res: Resource, body: Obj, namespace: str | None = None,
                     dry_run: bool = False) -> Obj: ...

    async def replace(self, res: Resource, name: str, body: Obj,
                      namespace: str | None = None, subresource: str | None = None) -> Obj: ...


def _micro(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaign for one Lease as ``identity``."""

    def __init__(self, api: LeaseApi, name: str, namespace: str, identity: str, *,
                 lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.sleep = sleep
        self.leading = asyncio.Event()
        self.holder = ""  # the holder as last seen
        self.last_error: KubeError | None = None
        self._last_renew: datetime | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at: datetime | None = None

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    def _spec(self, now: datetime, transitions: int, acquire: datetime) -> Obj:
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.lease_duration)),
                "acquireTime": _micro(acquire), "renewTime": _micro(now),
                "leaseTransitions": transitions}

    def _expired(self, spec: Mapping[str, Any], now: datetime) -> bool:
        """Unchanged for the lease's duration, as observed by our own clock."""
        record = (spec.get("holderIdentity"), spec.get("renewTime"),
                  spec.get("leaseTransitions"))
        if record != self._observed or self._observed_at is None:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return now >= self._observed_at + timedelta(seconds=duration)

    async def _try(self, now: datetime) -> bool:
        lease = await self.api.get_or_none(LEASES, self.name, self.namespace)
        if lease is None:
            await self.api.create(LEASES, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, 0, now)}, namespace=self.namespace)
            self.holder = self.identity
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquired = spec.get("acquireTime")
            new_spec = self._spec(now, transitions, now)
            if acquired:
                new_spec["acquireTime"] = acquired
        elif not holder or self._expired(spec, now):
            new_spec = self._spec(now, transitions + 1, now)
        else:
            return False
        body = {**lease, "spec": new_spec}
        await self.api.replace(LEASES, self.name, body, namespace=self.namespace)
        self.holder = self.identity
        return True

    async def step(self) -> bool:
        """One round of acquire-or-renew; returns whether we lead afterwards."""
        now = self.clock()
        try:
            held = await self._try(now)
            self.last_error = None
        except Conflict as exc:  # someone else wrote first
            held, self.last_error = False, exc
        except KubeError as exc:
            held, self.last_error = False, exc
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
        if held:
            self._last_renew = now
            if not self.is_leader:
                log.info("%s leads %s/%s", self.identity, self.namespace, self.name)
            self.leading.set()
        elif self.is_leader:
            other = bool(self.holder) and self.holder != self.identity \
                and self.last_error is None
            late = self._last_renew is None or \
                now - self._last_renew > timedelta(seconds=self.renew_deadline)
            if other or late:
                log.warning("%s lost %s/%s", self.identity, self.namespace, self.name)
                self.leading.clear()
        return self.is_leader

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Campaign and renew until ``stop`` is set (or cancelled)."""
        stopping = stop or asyncio.Event()
        while not stopping.is_set():
            await self.step()
            if self.sleep is asyncio.sleep:  # wake at once when asked to stop
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.retry_period)
            else:
                await self.sleep(self.retry_period)

    async def release(self) -> None:
        """Give the Lease up (empty holder), so a successor need not wait for expiry."""
        if not self.is_leader:
            return
        self.leading.clear()
        try:
            lease = await self.api.get_or_none(LEASES, self.name, self.namespace)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**(lease.get("spec") or {}), "holderIdentity": "",
                        "renewTime": _micro(self.clock())}
                await self.api.replace(LEASES, self.name, {**lease, "spec": spec},
                                       namespace=self.namespace)
        except KubeError as exc:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, exc)
