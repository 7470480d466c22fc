"""m2g workloads -w (m2g_cli.watch_cmd): which rows are printed again, coalescing, the watch
re-opened when the server ends it, a permanent error ending the command."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from m2g_cli.watch_cmd import Rows, changed, follow, keyed


def _row(name: str, phase: str = "Pending", wait: float = 1.0, age: float = 5.0
         ) -> dict[str, Any]:
    return {"namespace": "research", "name": name, "phase": phase, "waitSeconds": wait,
            "ageSeconds": age, "m2gCheck": "Pending"}


def _rows(*rows: dict[str, Any]) -> Rows:
    return keyed(list(rows), [f"{r['name']} {r['phase']} {r['ageSeconds']}" for r in rows])


def test_only_new_rows_and_rows_whose_object_changed_are_printed() -> None:
    before = _rows(_row("a"), _row("b"))
    now = _rows(_row("a", wait=30, age=60),  # only the clock moved: not printed
                _row("b", phase="Admitted"), _row("c"))
    assert changed(before, now) == ["b Admitted 5.0", "c Pending 5.0"]
    assert changed(now, now) == []


async def test_each_burst_of_events_is_one_read_and_prints_what_changed() -> None:
    reads = [_rows(_row("a", "Admitted")), _rows(_row("a", "Admitted"), _row("b"))]
    printed: list[str] = []
    opened = count = 0
    done = asyncio.Event()

    async def read() -> Rows:
        nonlocal count
        count += 1
        if len(reads) == 1:
            done.set()
        return reads.pop(0) if len(reads) > 1 else reads[0]

    async def events() -> AsyncIterator[Any]:
        nonlocal opened
        opened += 1
        for _ in range(50 if opened == 1 else 0):  # a burst, then the server ends the watch
            yield {"type": "MODIFIED"}
            await asyncio.sleep(0.002)
        await asyncio.sleep(0 if opened < 3 else 3600)

    task = asyncio.create_task(follow(read, events, printed.append, _rows(_row("a")),
                                      interval=0.05, backoff=0.01))
    await asyncio.wait_for(done.wait(), 5)
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert printed == ["a Admitted 5.0", "b Pending 5.0"]
    assert opened >= 2  # the watch the server ended was opened again
    assert count <= 10  # 50 events, coalesced (one read per interval at most)


class Permanent(Exception):
    pass


class Retryable(Exception):
    pass


async def test_a_retryable_end_reopens_and_a_permanent_error_ends_it() -> None:
    calls: list[str] = []

    async def events() -> AsyncIterator[Any]:
        calls.append("open")
        if len(calls) == 1:
            raise Retryable("410 Gone")
        raise Permanent("403 Forbidden")
        yield  # pragma: no cover  (an async generator)

    async def read() -> Rows:
        return _rows(_row("a"))

    with pytest.raises(Permanent, match="403"):
        await asyncio.wait_for(follow(read, events, print, _rows(_row("a")), interval=0,
                                      backoff=0.01, retryable=(Retryable,)), 5)
    assert calls == ["open", "open"]
