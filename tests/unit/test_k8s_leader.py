"""m2g.k8s.leader with a fake Lease store and an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from m2g.k8s.client import LEASES, RetryableError
from m2g.k8s.leader import LeaderElector
from m2g.testing.kube import FakeKube

T0 = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def pair() -> tuple[FakeKube, Clock, LeaderElector, LeaderElector]:
    kube, clock = FakeKube(), Clock()
    a, b = (LeaderElector(kube, "m2g", "m2g-system", ident, lease_duration=15,
                          renew_deadline=10, retry_period=2, clock=clock) for ident in "ab")
    return kube, clock, a, b


def lease(kube: FakeKube) -> dict[str, object]:
    spec: dict[str, object] = kube.stored(LEASES, "m2g", "m2g-system")["spec"]
    return spec


async def test_only_one_leads_and_the_other_takes_over_after_expiry() -> None:
    kube, clock, a, b = pair()
    assert await a.step() and not await b.step()
    assert lease(kube)["holderIdentity"] == "a" and lease(kube)["leaseTransitions"] == 0
    for _ in range(10):  # a renews; b keeps following
        clock.advance(2)
        assert await a.step() and not await b.step()
    renewed = lease(kube)["renewTime"]
    clock.advance(14)  # a stops renewing; not yet expired for b
    assert not await b.step()
    clock.advance(2)
    assert await b.step()
    assert lease(kube)["holderIdentity"] == "b" and lease(kube)["leaseTransitions"] == 1
    assert lease(kube)["renewTime"] != renewed
    assert not await a.step()  # a sees another holder: it stops leading at once
    assert not a.is_leader and b.is_leader


async def test_leader_keeps_leading_through_short_errors_but_not_past_the_deadline() -> None:
    kube, clock, a, _ = pair()
    assert await a.step()
    kube.fail_next = [RetryableError("connection refused")] * 10
    clock.advance(8)
    assert await a.step()  # 8 s since the last renew < 10 s deadline
    clock.advance(3)
    assert not await a.step()
    assert isinstance(a.last_error, RetryableError)


async def test_release_lets_a_successor_in_at_once() -> None:
    kube, clock, a, b = pair()
    assert await a.step()
    assert not await b.step()
    await a.release()
    assert lease(kube)["holderIdentity"] == ""
    clock.advance(1)
    assert await b.step()
    assert lease(kube)["leaseTransitions"] == 1


async def test_concurrent_takeover_only_one_wins() -> None:
    kube, clock, a, b = pair()
    c = LeaderElector(kube, "m2g", "m2g-system", "c", clock=clock)
    assert await a.step()
    assert not await b.step() and not await c.step()
    clock.advance(20)
    # b and c both read the expired lease; b writes first, c's write conflicts
    stale = kube.stored(LEASES, "m2g", "m2g-system")
    assert await b.step()
    original_get = kube.get_or_none

    async def stale_get(*args: object, **kwargs: object) -> dict[str, object]:
        return dict(stale)

    kube.get_or_none = stale_get  # type: ignore[method-assign]
    assert not await c.step()
    kube.get_or_none = original_get  # type: ignore[method-assign]
    assert lease(kube)["holderIdentity"] == "b"


def test_timings_are_checked() -> None:
    with pytest.raises(ValueError):
        LeaderElector(FakeKube(), "x", "y", "z", lease_duration=5, renew_deadline=10)
