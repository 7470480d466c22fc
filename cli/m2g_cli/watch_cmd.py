"""``m2g workloads -w`` and ``m2g queues -w``: the listing, then each item whose content
changes, as ``kubectl get -w`` does.

The API server's watches (Workloads; ClusterQueues and LocalQueues) say when to look again;
each time, the CLI reads the cluster as the one-shot command does (m2g_cli.cluster.read: the
same assembler, so the columns mean the same) and prints the items whose content changed since
it last printed them. Fields that move with the clock (WAIT, AGE: ``waitSeconds``,
``ageSeconds``) are left out of the comparison. A new item is printed; a deleted one prints
nothing (as kubectl without ``--output-watch-events``).

What is printed for an item is its table row, or, with ``-o json|yaml``, the item itself as
one document (kubectl's ``-w -o json|yaml``: JSON objects one after another, YAML documents
separated by ``---``; see Stream).

* Events are coalesced: at most one read per ``interval`` seconds, so a burst of a thousand
  changes is one read.
* When the server ends a watch (its timeout, a 410 Gone, a dropped connection), it is opened
  again after ``backoff`` seconds. Nothing is lost: the next read compares every item.
* A permanent error (403, the CRD gone) or a read that fails ends the command with one line,
  exit 1. Ctrl-C ends it, exit 0.
* What changes by the clock alone — a grid event that starts or ends, a Lease that expires —
  has no watch event: ``follow``'s ``wake`` says when the next such moment is and a read
  follows it (``until``); readings no watch announces (Prometheus) are read again every
  ``every`` seconds the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from m2g.k8s.client import Resource

#: an item's key → (what is compared, the text printed for it)
Rows = dict[str, tuple[tuple[Any, ...], str]]
#: opens one watch stream (its events only say "look again")
Events = Callable[[], AsyncIterator[Any]]

#: the command's pace: at most one read a second; a watch the server ended re-opened after 2 s
INTERVAL, BACKOFF = 1.0, 2.0

#: what waits for a moment of the clock (a grid event's start): asyncio.sleep; tests replace
#: it, and ``now``, so that nothing waits on the wall clock
TIMER: Callable[[float], Awaitable[None]] = asyncio.sleep

#: a read for a moment of the clock comes this long after it (the timer may fire a little
#: early; the read must see the moment passed); and never waits longer than MAX_WAKE
#: (then it looks again: a year-9999 event is not a timer of 250 billion seconds)
CLOCK_MARGIN, MAX_WAKE = 0.5, 3600.0

#: -o json fields that change with the clock, not with the object (at any depth)
TIME_FIELDS = frozenset({"waitSeconds", "ageSeconds", "powerAgeSeconds",
                         "renewedSecondsAgo", "oldestFreshPowerSeconds"})


def now() -> datetime:
    """The wall clock (UTC), as the reads' snapshots have it."""
    return datetime.now(UTC)


def _without_time(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((k, _without_time(v)) for k, v in sorted(value.items())
                     if k not in TIME_FIELDS)
    if isinstance(value, list | tuple):
        return tuple(_without_time(v) for v in value)
    return repr(value)


def signature(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What decides whether a row changed: every field but the clock's (nested ones too)."""
    out: tuple[Any, ...] = _without_time(row)
    return out


def until(seen: datetime, clock: datetime, moments: Iterable[datetime],
          every: float | None = None) -> float | None:
    """Seconds from ``clock`` until a read should follow a read made at ``seen``: the first
    of ``moments`` after ``seen`` (what the read showed changes then by the clock alone; one
    already passed is due at once), or ``every`` seconds after ``seen``; None: no moment and
    no ``every``. CLOCK_MARGIN is added, MAX_WAKE is the most."""
    due = [m for m in moments if m > seen]
    if every is not None:
        due.append(seen + timedelta(seconds=every))
    if not due:
        return None
    return min(max(0.0, (min(due) - clock).total_seconds()) + CLOCK_MARGIN, MAX_WAKE)


def workload_key(row: Mapping[str, Any]) -> str:
    """A workload item's key: NS/NAME."""
    return f"{row['namespace']}/{row['name']}"


def queue_key(row: Mapping[str, Any]) -> str:
    """A queue item's key: one row per ClusterQueue and flavor."""
    return f"{row['clusterQueue']}/{row['flavor']}"


def keyed(rows: Sequence[Mapping[str, Any]], texts: Sequence[str],
          key: Callable[[Mapping[str, Any]], str] = workload_key) -> Rows:
    """Each row's key → (its signature, its text: a table line or a document)."""
    return {key(r): (signature(r), text) for r, text in zip(rows, texts, strict=True)}


def changed(before: Rows, now: Rows) -> list[str]:
    """The texts of the rows that are new or differ from ``before``, in ``now``'s order."""
    return [text for key, (sig, text) in now.items()
            if key not in before or before[key][0] != sig]


class Stream:
    """Writes what the watch prints: table lines (``documents`` False) or documents, YAML
    ones separated by ``---`` (``separator``) as kubectl does (the first has none)."""

    def __init__(self, write: Callable[[str], None], *, documents: bool = False,
                 separator: str = "") -> None:
        self.write, self.documents, self.separator, self.count = (write, documents,
                                                                  separator, 0)

    def __call__(self, text: str) -> None:
        if self.documents:
            self.write((self.separator if self.count and self.separator else "") + text)
        else:
            self.write(text + "\n")
        self.count += 1


async def _watching(events: Events, dirty: asyncio.Event, backoff: float,
                    retryable: tuple[type[BaseException], ...]) -> None:
    """Set ``dirty`` on every event and whenever the stream ends; re-open it after
    ``backoff``. Errors not in ``retryable`` end it (and the command)."""
    while True:
        try:
            async for _ in events():
                dirty.set()
        except retryable:
            pass
        dirty.set()  # whatever ended the stream, look again: a missed event is not lost
        await asyncio.sleep(backoff)


async def follow(read: Callable[[], Awaitable[Rows]], streams: Sequence[Events],
                 echo: Callable[[str], None], shown: Rows, *, interval: float = 1.0,
                 backoff: float = 2.0,
                 retryable: tuple[type[BaseException], ...] = (),
                 wake: Callable[[], float | None] | None = None,
                 timer: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Print the changed rows after each event of any of ``streams`` (coalesced to one read
    per ``interval``), and ``wake()`` seconds after each read (None: not; what the last read
    showed changes then by the clock alone), waiting with ``timer``; until cancelled or until
    a watch fails for good (its error is raised)."""
    dirty = asyncio.Event()
    watchers = {asyncio.create_task(_watching(s, dirty, backoff, retryable)) for s in streams}
    try:
        while True:
            delay = wake() if wake is not None else None
            wakers: set[asyncio.Future[Any]] = {asyncio.ensure_future(dirty.wait())}
            if delay is not None:
                wakers.add(asyncio.ensure_future(timer(delay)))
            done, _ = await asyncio.wait({*wakers, *watchers},
                                         return_when=asyncio.FIRST_COMPLETED)
            for waker in wakers:
                waker.cancel()
            for task in done & watchers:
                task.result()  # raises the watch's permanent error
            dirty.clear()
            now = await read()
            for text in changed(shown, now):
                echo(text)
            shown = now
            await asyncio.sleep(interval)
    finally:
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def follow_cluster(kubeconfig: str | None, context: str | None,
                         watched: Sequence[tuple[Resource, str | None, str | None]], what: str,
                         read: Callable[[], Awaitable[Rows]], shown: Rows,
                         echo: Callable[[str], None],
                         wake: Callable[[], float | None] | None = None) -> None:
    """``follow`` on the cluster's watches of ``watched`` (each a resource, its namespace —
    None: every namespace, or cluster-scoped — and a field selector or None), waking as
    ``wake`` says too; failures as m2g_cli.cluster.CliError (one line naming ``what``)."""
    from m2g.k8s import client as k
    from m2g_cli.cluster import CliError

    try:
        kube = await k.connect(kubeconfig, context)
    except k.KubeError as exc:
        raise CliError(f"cannot watch {what}: {exc}") from None

    def stream(res: Resource, namespace: str | None, fields: str | None) -> Events:
        params = {"fieldSelector": fields} if fields else None
        if res.group != k.M2G:
            return lambda: kube.watch(res, "", namespace=namespace, params=params)

        async def optional() -> AsyncIterator[Any]:
            """m2g's own CRDs are optional (the read warns): not served, nothing to watch."""
            try:
                async for event in kube.watch(res, "", namespace=namespace, params=params):
                    yield event
            except k.ResourceMissing:
                await asyncio.Event().wait()
        return optional

    try:
        await follow(read, [stream(*w) for w in watched], echo, shown, interval=INTERVAL,
                     backoff=BACKOFF, retryable=(k.RetryableError,), wake=wake, timer=TIMER)
    except k.KubeError as exc:
        raise CliError(f"watching {what}: {exc}") from None
    finally:
        await kube.close()
