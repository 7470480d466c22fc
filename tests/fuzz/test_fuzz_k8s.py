"""Fuzzing what the API server hands m2g: watch events and LIST bodies of any shape, any
kubeconfig text — skipped and counted, or one-line errors, never an exception."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from m2g.k8s import client as c
from m2g.k8s.cache import WatchCache, well_formed
from m2g.testing.kube import FakeWatchApi
from tests.fuzz.helpers import count, json_values

KEYS = st.sampled_from(["type", "object", "metadata", "name", "namespace", "resourceVersion",
                        "items", "spec", "status", "ADDED", "MODIFIED", "DELETED", "BOOKMARK",
                        "clusters", "users", "contexts", "user", "tokenFile", "cluster",
                        "server", "current-context"])
EVENTS = st.one_of(
    json_values(KEYS),
    st.fixed_dictionaries({"type": st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK",
                                                    "ERROR", "x"]),
                           "object": json_values(KEYS)}))


@given(st.lists(EVENTS, max_size=8))
def test_any_watch_events(events: list[Any]) -> None:
    count()
    cache = WatchCache(FakeWatchApi([{"items": []}], []), c.NODES)
    for e in events:
        cache.apply_event(e)
    assert all(well_formed(o) for o in cache.view().values())


@given(json_values(KEYS, leaves=30))
def test_any_list_body(body: Any) -> None:
    count()
    cache = WatchCache(FakeWatchApi([body if isinstance(body, dict) else {"items": body}], []),
                       c.NODES)

    async def go() -> None:
        try:
            await cache.relist()
        except c.PermanentError as exc:
            assert "\n" not in str(exc)
        assert all(well_formed(o) for o in cache.view().values())

    asyncio.run(go())


@given(st.one_of(st.text(max_size=300),
                 json_values(KEYS, leaves=20).map(lambda v: __import__("yaml").safe_dump(v))))
def test_any_kubeconfig(tmp_path_factory: Any, text: str) -> None:
    count()
    path = Path(tmp_path_factory.mktemp("kc")) / "config"
    path.write_text(text)
    try:
        c.check_kubeconfig(str(path))
    except c.PermanentError as exc:
        assert "\n" not in str(exc)


OBJ_KEYS = st.sampled_from(["metadata", "name", "labels", "spec", "status", "conditions",
                            "taints", "allocatable", "capacity", "podSets", "intervals",
                            "start", "end", "duration", "payload", "scope", "racks", "budgetKw",
                            "type", "value", "nodeName", "containers", "resources"])
FIELDS = ["nodes", "pods", "workloads", "grid_events", "maintenance_windows", "power_domains",
          "cluster_queues", "resource_flavors", "local_queues"]


@given(st.dictionaries(st.sampled_from(FIELDS),
                       st.lists(json_values(OBJ_KEYS, leaves=25), max_size=3), max_size=5))
def test_any_objects_build_a_snapshot(found: dict[str, list[Any]]) -> None:
    from datetime import UTC, datetime

    from m2g.k8s.build import ClusterObjects, build_snapshot

    count()
    # metadata as the watch cache lets through (m2g.k8s.cache.well_formed); the rest is anything
    objs = {field: {f"o{i}": {**(v if isinstance(v, dict) else {"spec": v}),
                               "metadata": {"name": f"o{i}", "labels": (
                                   v.get("labels") if isinstance(v, dict) else None)}}
                    for i, v in enumerate(values)}
            for field, values in found.items()}
    snap = build_snapshot(ClusterObjects(**objs), None, datetime(2026, 12, 1, tzinfo=UTC))
    assert all("\n" not in r.reason for r in snap.rejected)
