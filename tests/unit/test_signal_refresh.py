"""m2g run reads its signals in the background: a snapshot never waits for Prometheus (but
the first), and Prometheus is asked once per refresh period, not once per reconcile."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from m2g.testing.kube import FakeKube
from m2g_controllers.wiring import K8sCluster

ANSWER = {"status": "success", "data": {"resultType": "vector", "result": []}}


def _prometheus(delay: float, seen: list[float]) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        await asyncio.sleep(delay)
        return httpx.Response(200, content=json.dumps(ANSWER).encode())

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_snapshots_take_the_background_reading() -> None:
    seen: list[float] = []

    async def go() -> tuple[float, int, int]:
        cluster = K8sCluster(FakeKube(), prometheus="http://prom:9090",  # type: ignore[arg-type]
                             http=_prometheus(0.3, seen), signal_refresh_seconds=1.0)
        first = await cluster._readings()  # the very first waits for one read
        assert first is not None
        per_read = len(seen)
        t = time.monotonic()
        for _ in range(20):  # 20 reconciles in a burst: none waits, none reads again
            assert await cluster._readings() is first
        waited = time.monotonic() - t
        await asyncio.sleep(1.5)  # one refresh period later: a newer reading
        newer = await cluster._readings()
        assert newer is not None and newer is not first
        reads = len(seen) // per_read
        await cluster.stop()
        return waited, reads, per_read

    waited, reads, per_read = asyncio.run(go())
    assert per_read >= 1
    assert waited < 0.25  # one read takes 0.3 s: twenty reconciles did not wait for any
    assert 2 <= reads <= 4  # per refresh period, not per reconcile (20 + 1 calls)


def test_refresh_zero_reads_on_every_snapshot() -> None:
    seen: list[float] = []

    async def go() -> int:
        cluster = K8sCluster(FakeKube(), prometheus="http://prom:9090",  # type: ignore[arg-type]
                             http=_prometheus(0.0, seen), signal_refresh_seconds=0)
        await cluster._readings()
        per_read = len(seen)
        for _ in range(3):
            await cluster._readings()
        await cluster.stop()
        return len(seen) // per_read

    assert asyncio.run(go()) == 4
