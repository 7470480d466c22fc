"""``m2g workloads -w``: the table, then a line for each workload whose row changes, as
``kubectl get -w`` does.

The API server's Workload watch says when to look again; each time, the CLI reads the cluster
as the one-shot command does (m2g_cli.cluster.read: the same assembler, so the M2G column means
the same) and prints the rows whose content changed since it last printed them. WAIT and AGE
are left out of the comparison: they change with the clock, not with the object. A new workload
is a new row; a deleted one prints nothing (as kubectl without ``--output-watch-events``).

* Events are coalesced: at most one read per ``interval`` seconds, so a burst of a thousand
  changes is one read.
* When the server ends the watch (its timeout, a 410 Gone, a dropped connection), it is opened
  again after ``backoff`` seconds. Nothing is lost: the next read compares every row.
* A permanent error (403, the CRD gone) or a read that fails ends the command with one line,
  exit 1. Ctrl-C ends it, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

#: NS/NAME → (what is compared, the line printed)
Rows = dict[str, tuple[tuple[Any, ...], str]]

#: -o json fields that change with the clock, not with the object
TIME_FIELDS = frozenset({"waitSeconds", "ageSeconds"})


def signature(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What decides whether a row changed: every field but the clock's."""
    return tuple((k, repr(v)) for k, v in sorted(row.items()) if k not in TIME_FIELDS)


def keyed(rows: Sequence[Mapping[str, Any]], lines: Sequence[str]) -> Rows:
    """Each row's NS/NAME → (its signature, its line of the table)."""
    return {f"{r['namespace']}/{r['name']}": (signature(r), line)
            for r, line in zip(rows, lines, strict=True)}


def changed(before: Rows, now: Rows) -> list[str]:
    """The lines of the rows that are new or differ from ``before``, in ``now``'s order."""
    return [line for key, (sig, line) in now.items()
            if key not in before or before[key][0] != sig]


async def _watching(events: Callable[[], AsyncIterator[Any]], dirty: asyncio.Event,
                    backoff: float, retryable: tuple[type[BaseException], ...]) -> None:
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


async def follow(read: Callable[[], Awaitable[Rows]], events: Callable[[], AsyncIterator[Any]],
                 echo: Callable[[str], None], shown: Rows, *, interval: float = 1.0,
                 backoff: float = 2.0,
                 retryable: tuple[type[BaseException], ...] = ()) -> None:
    """Print the changed rows after each event (coalesced to one read per ``interval``),
    until cancelled or until the watch fails for good (its error is raised)."""
    dirty = asyncio.Event()
    watcher = asyncio.create_task(_watching(events, dirty, backoff, retryable))
    try:
        while True:
            waiting = asyncio.create_task(dirty.wait())
            done, _ = await asyncio.wait({waiting, watcher},
                                         return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                waiting.cancel()
                watcher.result()  # raises the watch's permanent error
            dirty.clear()
            now = await read()
            for line in changed(shown, now):
                echo(line)
            shown = now
            await asyncio.sleep(interval)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


async def follow_workloads(kubeconfig: str | None, context: str | None, namespace: str | None,
                           read: Callable[[], Awaitable[Rows]], shown: Rows,
                           echo: Callable[[str], None]) -> None:
    """``follow`` on the cluster's Workload watch (``namespace``; None: every namespace);
    failures as m2g_cli.cluster.CliError (one line)."""
    from m2g.k8s import client as k
    from m2g_cli.cluster import CliError

    try:
        kube = await k.connect(kubeconfig, context)
    except k.KubeError as exc:
        raise CliError(f"cannot watch Workloads: {exc}") from None
    try:
        await follow(read, lambda: kube.watch(k.WORKLOADS, "", namespace=namespace), echo,
                     shown, retryable=(k.RetryableError,))
    except k.KubeError as exc:
        raise CliError(f"watching Workloads: {exc}") from None
    finally:
        await kube.close()
