"""A watch-fed cache of one kind: LIST once, then WATCH from the list's resourceVersion.

* The API server ends every watch after a while (``--min-request-timeout``, or the
  ``timeoutSeconds`` we ask for): the cache re-watches from the last resourceVersion it saw
  (bookmarks included), so nothing is missed and nothing is listed again.
* A 410 Gone / Expired (the version was compacted), in the stream or as the response, means
  events were lost: the cache lists again and reports the difference to its subscribers.
  (kr8s's own ``async_watch`` retries at the same version forever, and never lists; hence
  ``Kube.watch``.)
* The LIST is paginated (``limit``/``continue``); an expired continue token is a 410 too.
* Other retryable errors back off (doubling, capped) and re-watch; permanent ones (a missing
  CRD, 403) are kept in ``last_error`` and retried slowly, so a CRD installed later is picked up.

m2g reads its own writes: ``observe`` folds the object a write answered with into the cache at
once (m2g's applier does it for every write to a watched kind), and an older event of that
object the watch delivers afterwards is not let back over it. Without that, a reconcile between
a write and its watch event (connections cut, a watch re-opening) decided on the object as it
was before: it shed a workload again with a second ``shed-at`` stamp, or a third workload for a
shortfall the first two already covered (tests/e2e/test_chaos_*).

Subscribers are plain callables ``(event_type, key, obj)`` called on every change, and
``changed`` is an ``asyncio.Event`` set on every change (the consumer clears it). ``view()``
is an immutable mapping key → raw object (key ``name``, or ``namespace/name`` for namespaced
kinds), a copy taken at call time for snapshot building; do not mutate the objects. Cached
objects carry no ``metadata.managedFields`` (memory; nothing reads them), and their keys and
short strings are interned (``_slim``: one string object for each of the names and values that
repeat from object to object, about half of the caches' memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from m2g.k8s.client import Gone, KubeError, Obj, PermanentError, Resource

log = logging.getLogger(__name__)
_intern = sys.intern

#: A watch open this long (seconds) before it was cut counts as working: re-opened soon.
WORKED_SECONDS = 1.0

Subscriber = Callable[[str, str, Obj], None]


class WatchApi(Protocol):
    """What the cache needs from ``client.Kube`` (a fake implements it in unit tests)."""

    async def list(self, res: Resource, namespace: str | None = None,
                   params: Mapping[str, Any] | None = None) -> Obj: ...

    def watch(self, res: Resource, resource_version: str, *, namespace: str | None = None,
              timeout_seconds: int = 300,
              params: Mapping[str, Any] | None = None) -> AsyncIterator[Obj]: ...


def object_key(obj: Obj) -> str:
    """``namespace/name`` for namespaced objects, ``name`` otherwise."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def well_formed(obj: Any) -> bool:
    """An object the cache can key: a mapping whose ``metadata`` is a mapping with a non-empty
    string ``name`` (and a string ``namespace`` when it has one). Anything else in a LIST or
    WATCH body is skipped and counted (``WatchCache.malformed``), never an exception."""
    if not isinstance(obj, dict):
        return False
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return False
    name, ns = meta.get("name"), meta.get("namespace")
    return isinstance(name, str) and bool(name) and (ns is None or isinstance(ns, str))


#: Strings up to this long are interned in cached objects (names, labels, states, times,
#: quantities: the values that repeat from object to object).
INTERN_MAX_LEN = 64


def _compact(value: Any) -> Any:
    """``value`` with every mapping key, and every string value up to ``INTERN_MAX_LEN``
    characters, interned: the JSON decoder makes a new string for each key of each object
    (every cached pod had its own ``"terminationMessagePolicy"``, ``"nvidia.com/gpu"``,
    ``"True"``, ...). Equal to ``value``; new dicts and lists, the same numbers."""
    if isinstance(value, dict):
        return {(_intern(key) if type(key) is str else key): _compact(item)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    if type(value) is str and len(value) <= INTERN_MAX_LEN:
        return _intern(value)
    return value


def _slim(obj: Obj) -> Obj:
    """The object as the cache keeps it: without ``metadata.managedFields`` (m2g never reads
    it; on a 100-rack factory it was a large share of the caches' memory), its keys and short
    strings interned (``_compact``: the caches of the 100-rack controller bench, 1,800 nodes,
    2,000 Workloads and 2,500 pods, took ~93 MiB decoded as they came, about half of that so).
    Equal to what was decoded, less managedFields; ``obj`` itself is left as it is."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    out: Obj = _compact(obj)
    return out


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _older(rv: str, than: str) -> bool:
    """Is ``rv`` an older resourceVersion than ``than``? Kubernetes calls them opaque; etcd's
    are integers, and only two integers are compared (anything else: not known to be older)."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


class Reachability:
    """Shared by the caches of one API server: when one of them reaches it (a LIST, or a
    watch that delivers), the others waiting out a backoff retry at once. After an outage
    each cache's backoff had grown to its own point (up to ``max_backoff``), so one kind
    resumed up to 30 s after another: m2g shed on Workloads seen fresh and Pods seen 30 s
    old, and shed a third workload for a shortfall the first two already covered
    (tests/e2e/test_chaos_watch_e2e.py)."""

    def __init__(self) -> None:
        self._up: asyncio.Event | None = None

    def seen(self) -> None:
        """The API server answered."""
        if self._up is not None:
            self._up.set()
            self._up = None

    async def pause(self, seconds: float, floor: float) -> None:
        """Sleep ``seconds``, or — after at least ``floor`` (a kind that keeps failing while
        others answer does not spin) — less, once the API server is seen answering."""
        if self._up is None:
            self._up = asyncio.Event()
        up = self._up
        await asyncio.sleep(min(floor, seconds))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(up.wait(), max(0.0, seconds - floor))


class WatchCache:
    """The objects of one kind, kept current by LIST + WATCH."""

    def __init__(self, api: WatchApi, resource: Resource, *, namespace: str | None = None,
                 params: Mapping[str, Any] | None = None, watch_timeout: int = 300,
                 backoff: float = 0.5, max_backoff: float = 30.0,
                 page_size: int = 500, reachability: Reachability | None = None) -> None:
        self.api = api
        self.reachability = reachability
        self.resource = resource
        self.namespace = namespace
        self.params = dict(params or {})  # e.g. labelSelector / fieldSelector
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.page_size = page_size
        self.resource_version = ""
        self.synced = asyncio.Event()  # set after the first successful LIST
        self.changed = asyncio.Event()
        self.last_error: KubeError | None = None
        self.lists = 0  # how many LISTs (1 + relists): for status and tests
        self.watches = 0
        self.generation = 0  # bumped on every change
        self.malformed = 0  # objects and events skipped as not well formed
        self._items: dict[str, Obj] = {}
        self._subscribers: list[Subscriber] = []
        self._task: asyncio.Task[None] | None = None
        self._delivered = False  # the current watch delivered an event
        self._written: dict[str, str] = {}  # key → resourceVersion of m2g's own write seen

    # ---- reading ---------------------------------------------------------------------

    def view(self) -> Mapping[str, Obj]:
        """An immutable copy of key → object as of now."""
        return MappingProxyType(dict(self._items))

    def get(self, key: str) -> Obj | None:
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(type, key, obj)`` on every change; returns an unsubscribe."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def observe(self, obj: Any) -> bool:
        """Fold in the object a write of m2g's answered with (read your own writes) when the
        cache has an older version of it; False when it was not folded in (not cached: a
        deletion the watch delivered first is not undone; the watch brings new objects)."""
        if not well_formed(obj):
            return False
        key, rv = object_key(obj), _rv(obj)
        cached = self._items.get(key)
        if cached is None or not _older(_rv(cached), rv):
            return False
        self._items[key] = slim = _slim(obj)
        self._written[key] = rv
        self._notify("MODIFIED", key, slim)
        return True

    # ---- running ---------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"cache-{self.resource.plural}")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_synced(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(self.synced.wait(), timeout)

    async def run(self) -> None:
        """LIST, then WATCH forever (until cancelled). The backoff grows while the API server
        cannot be reached; a watch that worked before it was cut (it delivered an event, or
        stayed open for ``WORKED_SECONDS``) is re-opened after the first backoff step — under
        connections reset every 2 s the backoff used to reach 30 s, and the cache lagged that
        long behind m2g's own writes (tests/e2e/test_chaos_watch_e2e.py)."""
        delay = self.backoff
        need_list = True
        while True:
            started = time.monotonic()
            self._delivered = False
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                await self._watch_once()
                delay = self.backoff  # a watch that ended normally: re-watch at once
            except Gone as exc:
                log.info("%s: %s; relisting", self.resource.plural, exc)
                self.last_error = exc
                need_list = True
            except KubeError as exc:
                self.last_error = exc
                log.warning("%s: %s", self.resource.plural, exc)
                if not need_list and (self._delivered
                                      or time.monotonic() - started >= WORKED_SECONDS):
                    delay = self.backoff  # it worked until it was cut: not a failing server
                if isinstance(exc, PermanentError) or self.reachability is None:
                    await asyncio.sleep(self.max_backoff if isinstance(exc, PermanentError)
                                        else delay)
                else:
                    await self.reachability.pause(delay, self.backoff)
                delay = min(self.max_backoff, delay * 2)

    async def relist(self) -> None:
        """LIST and replace the contents, notifying the differences."""
        fresh: dict[str, Obj] = {}
        token = ""
        while True:  # paginated: a large factory's pods arrive in pages of ``page_size``
            params = {**self.params, "limit": self.page_size, **({"continue": token} if token
                                                                  else {})}
            data = await self.api.list(self.resource, self.namespace, params)
            items = data.get("items") if isinstance(data, dict) else None
            if not isinstance(items, list | None):
                raise PermanentError(f"LIST {self.resource.plural}: the answer has no list "
                                     "of items")
            for o in items or []:
                if well_formed(o):
                    fresh[object_key(o)] = _slim(o)
                else:
                    self._skip("LIST", o)
            meta = data.get("metadata") if isinstance(data, dict) else None
            meta = meta if isinstance(meta, dict) else {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        self.lists += 1
        old = self._items
        list_rv = str(meta.get("resourceVersion", ""))
        # A LIST is at least as new as any write before it — but not as one m2g made while
        # it was in flight (the LIST served at an older resourceVersion): that write stays,
        # or the reconcile these notifications kick decides on the object as it was before
        # the write (shed it again, or a third workload) until the watch brings it back.
        written = {key: rv for key, rv in self._written.items()
                   if key in fresh and key in old and _older(list_rv, rv)
                   and _older(_rv(fresh[key]), rv)}
        for key in written:
            fresh[key] = old[key]
        self._items = fresh
        self._written = written
        self.resource_version = list_rv
        for key, obj in old.items():
            if key not in fresh:
                self._notify("DELETED", key, obj)
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                self._notify("ADDED", key, obj)
            elif _rv(prev) != _rv(obj):
                self._notify("MODIFIED", key, obj)
        self.last_error = None
        self.synced.set()
        if self.reachability is not None:
            self.reachability.seen()

    async def _watch_once(self) -> None:
        self.watches += 1
        stream = self.api.watch(self.resource, self.resource_version, namespace=self.namespace,
                                timeout_seconds=self.watch_timeout, params=self.params or None)
        async for event in stream:
            if not self._delivered and self.reachability is not None:
                self.reachability.seen()
            self.apply_event(event)

    def _skip(self, where: str, obj: Any) -> None:
        self.malformed += 1
        log.warning("%s %s: skipped a malformed object (%s)", where, self.resource.plural,
                    " ".join(repr(obj).split())[:120])

    def apply_event(self, event: Obj) -> None:
        """Fold one watch event into the cache (a malformed one is skipped and counted)."""
        self._delivered = True
        obj = event.get("object") if isinstance(event, dict) else None
        kind = str(event.get("type", "")) if isinstance(event, dict) else ""
        if kind == "BOOKMARK" and isinstance(obj, dict):
            rv = _rv(obj) if isinstance(obj.get("metadata"), dict) else ""
            if rv:
                self.resource_version = rv
            return
        if not well_formed(obj):
            self._skip("WATCH", event)
            return
        assert isinstance(obj, dict)
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        written = self._written.pop(key, None)
        if written is not None and kind != "DELETED":
            if _older(rv, written):
                self._written[key] = written
                return  # from before m2g's own write, which the cache has
            if rv == written:
                return  # m2g's own write: the cache has it already
        if kind == "DELETED":
            if self._items.pop(key, None) is not None:
                self._notify(kind, key, obj)
        elif kind in ("ADDED", "MODIFIED"):
            self._items[key] = slim = _slim(obj)
            self._notify(kind, key, slim)

    def _notify(self, kind: str, key: str, obj: Obj) -> None:
        self.generation += 1
        self.changed.set()
        for callback in list(self._subscribers):
            try:
                callback(kind, key, obj)
            except Exception:  # a subscriber's bug must not stop the cache
                log.exception("cache subscriber failed on %s %s", kind, key)
