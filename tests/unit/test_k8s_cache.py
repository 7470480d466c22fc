"""m2g.k8s.cache against a scripted LIST/WATCH fake: re-watch, relist on 410, notifications."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from m2g.k8s.cache import WatchCache, object_key
from m2g.k8s.client import NODES, PODS, ResourceMissing, RetryableError
from m2g.testing.kube import FakeWatchApi, gone


def obj(name: str, rv: int, ns: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv)}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta, **extra}


def listing(rv: int, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": str(rv)}, "items": list(items)}


async def run_until_idle(cache: WatchCache, api: FakeWatchApi) -> None:
    cache.start()
    try:
        await asyncio.wait_for(api.idle.wait(), 5)
    finally:
        await cache.stop()


async def test_list_then_watch_follows_changes() -> None:
    api = FakeWatchApi(
        [listing(10, obj("a", 5), obj("b", 6))],
        [[{"type": "MODIFIED", "object": obj("a", 11, x=1)},
          {"type": "ADDED", "object": obj("c", 12)},
          {"type": "DELETED", "object": obj("b", 13)},
          {"type": "BOOKMARK", "object": obj("", 14)}]],
    )
    cache = WatchCache(api, NODES, backoff=0.001)
    seen: list[tuple[str, str]] = []
    cache.subscribe(lambda kind, key, _o: seen.append((kind, key)))
    await run_until_idle(cache, api)
    assert sorted(cache.view()) == ["a", "c"]
    assert cache.view()["a"]["x"] == 1
    assert api.watch_versions == ["10", "14"]  # re-watch from the bookmark's version
    assert api.list_calls == 1
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("ADDED", "c"),
                    ("DELETED", "b")]
    assert cache.changed.is_set()
    assert cache.synced.is_set()


async def test_gone_relists_and_reports_the_difference() -> None:
    api = FakeWatchApi(
        [listing(10, obj("a", 5), obj("b", 6)),
         listing(30, obj("a", 25), obj("c", 26))],  # b vanished, a changed, c appeared
        [[gone()]],
    )
    cache = WatchCache(api, NODES, backoff=0.001)
    seen: list[tuple[str, str]] = []
    cache.subscribe(lambda kind, key, _o: seen.append((kind, key)))
    await run_until_idle(cache, api)
    assert api.list_calls == 2
    assert api.watch_versions == ["10", "30"]
    assert sorted(cache.view()) == ["a", "c"]
    assert seen[2:] == [("DELETED", "b"), ("MODIFIED", "a"), ("ADDED", "c")]


async def test_retryable_error_rewatches_without_relisting() -> None:
    api = FakeWatchApi([listing(10, obj("a", 5))],
                       [[{"type": "ADDED", "object": obj("b", 11)},
                         RetryableError("connection reset")], []])
    cache = WatchCache(api, NODES, backoff=0.001)
    await run_until_idle(cache, api)
    assert api.list_calls == 1
    assert api.watch_versions == ["10", "11", "11"]
    assert sorted(cache.view()) == ["a", "b"]


async def test_missing_crd_is_reported_and_retried() -> None:
    class Missing(FakeWatchApi):
        async def list(self, *a: Any, **k: Any) -> dict[str, Any]:
            self.list_calls += 1
            raise ResourceMissing("Kueue CRDs not installed")

    api = Missing([], [])
    cache = WatchCache(api, NODES, backoff=0.001, max_backoff=0.01)
    cache.start()
    await asyncio.sleep(0.1)
    await cache.stop()
    assert api.list_calls >= 2
    assert isinstance(cache.last_error, ResourceMissing)
    assert not cache.synced.is_set()


async def test_view_is_an_immutable_copy() -> None:
    api = FakeWatchApi([listing(1, obj("p", 1, ns="ns1"))], [])
    cache = WatchCache(api, PODS)
    await run_until_idle(cache, api)
    view = cache.view()
    assert list(view) == ["ns1/p"]
    with pytest.raises(TypeError):
        view["x"] = {}  # type: ignore[index]
    cache.apply_event({"type": "DELETED", "object": obj("p", 2, ns="ns1")})
    assert "ns1/p" in view and len(cache) == 0


def test_a_failing_subscriber_does_not_stop_the_cache() -> None:
    cache = WatchCache(FakeWatchApi([], []), NODES)

    def bad(*_: Any) -> None:
        raise RuntimeError("bug")

    good: list[str] = []
    cache.subscribe(bad)
    unsubscribe = cache.subscribe(lambda _k, key, _o: good.append(key))
    cache.apply_event({"type": "ADDED", "object": obj("n", 3)})
    unsubscribe()
    cache.apply_event({"type": "ADDED", "object": obj("m", 4)})
    assert good == ["n"]
    assert cache.resource_version == "4"
    assert object_key(obj("x", 1, ns="y")) == "y/x"


async def test_list_is_paginated() -> None:
    class Paged(FakeWatchApi):
        def __init__(self) -> None:
            super().__init__([], [])
            self.seen: list[dict[str, Any]] = []

        async def list(self, res: Any, namespace: str | None = None,
                       params: Any = None) -> dict[str, Any]:
            self.seen.append(dict(params or {}))
            self.list_calls += 1
            if "continue" not in (params or {}):
                return {"metadata": {"resourceVersion": "7", "continue": "page2"},
                        "items": [obj("a", 1), obj("b", 2)]}
            return {"metadata": {"resourceVersion": "7"}, "items": [obj("c", 3)]}

    api = Paged()
    cache = WatchCache(api, NODES, page_size=2, params={"labelSelector": "x"})
    await cache.relist()
    assert sorted(cache.view()) == ["a", "b", "c"] and cache.lists == 1
    assert cache.resource_version == "7"
    assert api.seen == [{"labelSelector": "x", "limit": 2},
                        {"labelSelector": "x", "limit": 2, "continue": "page2"}]


async def test_cached_objects_carry_no_managed_fields() -> None:
    managed = [{"manager": "kueue", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    listed = obj("a", 5)
    listed["metadata"]["managedFields"] = managed
    changed = obj("b", 6)
    changed["metadata"]["managedFields"] = managed
    api = FakeWatchApi([listing(10, listed)], [[{"type": "ADDED", "object": changed}]])
    cache = WatchCache(api, NODES, backoff=0.001)
    await run_until_idle(cache, api)
    assert sorted(cache.view()) == ["a", "b"]
    assert all("managedFields" not in o["metadata"] for o in cache.view().values())
    assert cache.view()["b"]["metadata"]["resourceVersion"] == "6"


async def test_a_watch_cut_after_it_worked_is_reopened_soon_a_failing_one_backs_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections reset every 2 s: each watch delivers, then is cut. The backoff used to
    double on every cut and reach max_backoff (30 s), and the cache lagged that long; now a
    watch that delivered is re-opened after the first step, and only failures back off."""
    import m2g.k8s.cache as cache_mod
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(cache_mod.asyncio, "sleep", sleep)
    cut = RetryableError("connection reset")
    worked = [[{"type": "MODIFIED", "object": obj("a", 11 + i)}, cut] for i in range(4)]
    failing: list[list[Any]] = [[cut] for _ in range(4)]
    api = FakeWatchApi([listing(10, obj("a", 5))], [*worked, *failing, []])
    monkeypatch.setattr(cache_mod, "WORKED_SECONDS", 3600.0)  # only delivery counts here
    cache = WatchCache(api, NODES, backoff=0.5, max_backoff=30.0)
    await run_until_idle(cache, api)
    slept = [s for s in slept if s]  # the fake's own sleep(0) between events
    assert slept[:4] == [0.5, 0.5, 0.5, 0.5]  # each worked before the cut
    assert slept[4:8] == [1.0, 2.0, 4.0, 8.0]  # nothing delivered: backing off


def _workload(rv: int, active: bool, **annotations: str) -> dict[str, Any]:
    return obj("w", rv, "ns", spec={"active": active},
               **({"metadata": {"name": "w", "namespace": "ns", "resourceVersion": str(rv),
                                "annotations": annotations}} if annotations else {}))


def test_a_write_is_seen_at_once_and_an_older_event_does_not_undo_it() -> None:
    """m2g shed w (rv 20) while its watch still had rv 10; the watch then delivers rv 15 (a
    change before the shed), then the shed itself (rv 20), then a later change (rv 21)."""
    cache = WatchCache(FakeWatchApi([], []), PODS)
    cache.apply_event({"type": "ADDED", "object": _workload(10, True)})
    seen: list[str] = []
    cache.subscribe(lambda kind, key, o: seen.append(f"{kind} {o['metadata']['resourceVersion']}"))
    assert cache.observe(_workload(20, False, **{"m2g.io/shed-at": "t"}))
    assert cache.get("ns/w")["spec"]["active"] is False
    cache.apply_event({"type": "MODIFIED", "object": _workload(15, True)})
    assert cache.get("ns/w")["spec"]["active"] is False, "an older event undid m2g's write"
    cache.apply_event({"type": "MODIFIED", "object": _workload(20, False)})
    cache.apply_event({"type": "MODIFIED", "object": _workload(21, True)})
    assert cache.get("ns/w")["spec"]["active"] is True  # a newer change is taken
    assert seen == ["MODIFIED 20", "MODIFIED 21"]  # the write once; its echo is no change
    assert cache.resource_version == "21"


def test_observe_never_goes_back_nor_brings_back_the_deleted() -> None:
    cache = WatchCache(FakeWatchApi([], []), PODS)
    cache.apply_event({"type": "ADDED", "object": _workload(30, True)})
    assert not cache.observe(_workload(25, False))  # the cache has newer
    assert not cache.observe(_workload(30, False))  # the same version
    assert not cache.observe({"metadata": {}})  # malformed
    assert not cache.observe(obj("other", 40, "ns"))  # not cached (a deletion seen first)
    assert cache.get("ns/w")["spec"]["active"] is True
    assert cache.observe(_workload(31, False))
    cache.apply_event({"type": "DELETED", "object": _workload(29, False)})
    assert cache.get("ns/w") is None  # a deletion is always taken


async def test_a_relist_replaces_what_was_observed() -> None:
    api = FakeWatchApi([listing(10, _workload(5, True)), listing(40, _workload(12, True))],
                       [[gone()]])
    cache = WatchCache(api, PODS, backoff=0.001)
    await cache.relist()
    assert cache.observe(_workload(8, False))
    await cache.relist()  # the LIST is authoritative
    assert cache.get("ns/w")["metadata"]["resourceVersion"] == "12"
    cache.apply_event({"type": "MODIFIED", "object": _workload(11, False)})
    assert cache.get("ns/w")["metadata"]["resourceVersion"] == "11"  # nothing held back


async def test_one_cache_reaching_the_server_wakes_the_others_from_their_backoff() -> None:
    """After an outage a cache whose backoff grew to 30 s retries as soon as another cache
    of the same API server gets an answer (not 30 s later)."""
    from m2g.k8s.cache import Reachability
    reach = Reachability()
    waiting = asyncio.create_task(reach.pause(30.0, 0.01))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    t0 = asyncio.get_running_loop().time()
    reach.seen()
    await asyncio.wait_for(waiting, 2)
    assert asyncio.get_running_loop().time() - t0 < 1.0
    # alone, the backoff is slept in full; the floor holds even when the server answers
    alone = asyncio.create_task(reach.pause(0.2, 0.1))
    reach.seen()
    await asyncio.sleep(0.05)
    assert not alone.done()
    await asyncio.wait_for(alone, 2)


async def test_a_relist_tells_the_other_caches_the_server_is_back() -> None:
    from m2g.k8s.cache import Reachability
    reach = Reachability()
    woke = asyncio.create_task(reach.pause(30.0, 0.0))
    await asyncio.sleep(0)
    cache = WatchCache(FakeWatchApi([listing(10, obj("a", 5))], []), NODES,
                       reachability=reach)
    await cache.relist()
    await asyncio.wait_for(woke, 2)


def test_cached_objects_share_their_keys_and_short_strings() -> None:
    """The watch stream decodes every object with its own strings; the cache keeps one string
    object for each key and short value that repeats (memory), and the object equal to what
    was decoded, less metadata.managedFields."""
    import json

    from m2g.k8s.cache import INTERN_MAX_LEN
    long_text = "x" * (INTERN_MAX_LEN + 1)

    def pod(name: str) -> dict[str, Any]:
        return json.loads(json.dumps({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7",
                         "managedFields": [{"manager": "kubelet"}],
                         "labels": {"m2g.io/flex-tier": "2"}},
            "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {
                "nvidia.com/gpu": "4"}}, "args": [long_text]}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready",
                                                          "status": "True"}]}}))

    cache = WatchCache(FakeWatchApi([listing(1)], []), PODS)
    decoded = [pod("a"), pod("b")]
    seen: list[dict[str, Any]] = []
    cache.subscribe(lambda kind, key, o: seen.append(o))
    for o in decoded:
        cache.apply_event({"type": "ADDED", "object": o})
    a, b = cache.get("ns/a"), cache.get("ns/b")
    assert a is not None and b is not None
    want = json.loads(json.dumps(decoded[0]))
    del want["metadata"]["managedFields"]
    assert a == want and seen[0] is a  # subscribers get what the cache keeps
    ka = next(k for k in a["spec"]["containers"][0]["resources"]["requests"])
    kb = next(k for k in b["spec"]["containers"][0]["resources"]["requests"])
    assert ka is kb  # one "nvidia.com/gpu" key
    assert next(iter(a["metadata"]["labels"])) is next(iter(b["metadata"]["labels"]))
    assert a["status"]["phase"] is b["status"]["phase"]
    assert a["spec"]["nodeName"] is b["spec"]["nodeName"]
    assert a["spec"]["containers"][0]["args"][0] is not b["spec"]["containers"][0]["args"][0]
    assert decoded[0]["metadata"]["managedFields"]  # the decoded object is left as it was


async def test_a_write_during_a_relist_is_not_lost_to_the_older_list() -> None:
    """m2g shed w (its write answered rv 31) while the cache's LIST after a 410 was in flight,
    served at rv 30 (from before the write). The relist must keep the write: replacing it with
    the LIST's older w (active, no stamp) let the reconcile its notifications kick decide on
    w unshed, and shed it again or a third workload (tests/e2e/test_chaos_e2e.py, the API
    server restarted with etcd compacted). The watch from rv 30 then delivers the write (no
    change) and later changes as usual."""
    cache: WatchCache

    class Slow(FakeWatchApi):
        async def list(self, res: Any, namespace: str | None = None,
                       params: Any = None) -> dict[str, Any]:
            data = await super().list(res, namespace, params)
            if self.list_calls == 2:  # the relist: m2g's write lands while it is in flight
                assert cache.observe(_workload(31, False, **{"m2g.io/shed-at": "t"}))
            return data

    api = Slow([listing(20, _workload(10, True)), listing(30, _workload(25, True))],
               [[gone()], [{"type": "MODIFIED", "object": _workload(31, False)},
                           {"type": "MODIFIED", "object": _workload(32, True)}]])
    cache = WatchCache(api, PODS, backoff=0.001)
    states: list[tuple[str, bool]] = []
    cache.subscribe(lambda _k, _key, o: states.append(
        (o["metadata"]["resourceVersion"], o["spec"]["active"])))
    task = cache.start()
    try:
        await asyncio.wait_for(api.idle.wait(), 5)
    finally:
        await cache.stop()
    assert task.done()
    assert ("25", True) not in states, f"the relist undid m2g's write: {states}"
    assert states == [("10", True), ("31", False), ("32", True)], states
    assert cache.get("ns/w")["metadata"]["resourceVersion"] == "32"
