"""m2g workloads|queues|status|signals -w (m2g_cli.watch_cmd): which rows are printed again,
coalescing, the watch re-opened when the server ends it, a permanent error ending the command,
several watches in one loop, a read at a moment of the clock (a grid event's start, a Lease's
expiry) with no watch event, and the commands end to end over a fake API server
(-o table|json|yaml). Nothing waits on the wall clock: the timer and the clock are replaced."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from m2g.k8s.build import ClusterObjects
from m2g.model.cluster import CheckState, Phase
from m2g_cli.app import app
from m2g_cli.cluster import ClusterView
from m2g_cli.watch_cmd import (
    CLOCK_MARGIN,
    MAX_WAKE,
    Rows,
    Stream,
    changed,
    follow,
    keyed,
    queue_key,
    signature,
    until,
)
from tests.unit.goldens import golden
from tests.unit.test_views import NOW, cluster, raws


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
    """A burst of 50 events (arriving at once), the server ending the watch twice: a read
    for the burst and one per end at most, never one per event; and the ended watch is
    opened again. (No clock in the assertions: the burst comes in one go.)"""
    reads = [_rows(_row("a", "Admitted")), _rows(_row("a", "Admitted"), _row("b"))]
    printed: list[str] = []
    opened = count = 0
    third, both_printed = asyncio.Event(), asyncio.Event()

    async def read() -> Rows:
        nonlocal count
        count += 1
        return reads.pop(0) if len(reads) > 1 else reads[0]

    def echo(text: str) -> None:
        printed.append(text)
        if len(printed) == 2:
            both_printed.set()

    async def events() -> AsyncIterator[Any]:
        nonlocal opened
        opened += 1
        for _ in range(50 if opened == 1 else 0):  # a burst, then the server ends the watch
            yield {"type": "MODIFIED"}
        if opened == 3:
            third.set()
            await asyncio.Event().wait()  # the third stays open
        await asyncio.sleep(0)

    task = asyncio.create_task(follow(read, [events], echo, _rows(_row("a")),
                                      interval=0.01, backoff=0.01))
    await asyncio.wait_for(asyncio.gather(third.wait(), both_printed.wait()), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert printed == ["a Admitted 5.0", "b Pending 5.0"]
    assert opened == 3  # the watch the server ended was opened again, twice
    assert 2 <= count <= 3  # 50 events and two ends: a read for the burst, one per end


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
        await asyncio.wait_for(follow(read, [events], print, _rows(_row("a")), interval=0,
                                      backoff=0.01, retryable=(Retryable,)), 5)
    assert calls == ["open", "open"]


async def test_an_event_of_any_watch_is_a_read() -> None:
    """m2g queues -w watches ClusterQueues and LocalQueues in the same loop: a change to
    either is looked at; the other stream staying quiet does not hold it up."""
    reads = [_rows(_row("a", "Admitted"))]
    printed: list[str] = []
    done = asyncio.Event()

    async def quiet() -> AsyncIterator[Any]:
        await asyncio.Event().wait()  # never an event, never ends
        yield  # pragma: no cover

    async def one() -> AsyncIterator[Any]:
        yield {"type": "MODIFIED"}
        await asyncio.Event().wait()

    async def read() -> Rows:
        done.set()
        return reads[0]

    task = asyncio.create_task(follow(read, [quiet, one], printed.append, _rows(_row("a")),
                                      interval=0, backoff=0))
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert printed == ["a Admitted 5.0"]


def test_stream_writes_lines_or_documents_yaml_ones_separated_as_kubectl() -> None:
    out: list[str] = []
    lines = Stream(out.append)
    lines("a")
    lines("b")
    yaml_docs = Stream(out.append, documents=True, separator="---\n")
    yaml_docs("x: 1\n")
    yaml_docs("x: 2\n")
    json_docs = Stream(out.append, documents=True)
    json_docs("{}\n")
    json_docs("{}\n")
    assert out == ["a\n", "b\n", "x: 1\n", "---\nx: 2\n", "{}\n", "{}\n"]


def test_queue_rows_are_keyed_by_cluster_queue_and_flavor() -> None:
    rows = [{"clusterQueue": "research", "flavor": "gb300", "usedGpus": 8},
            {"clusterQueue": "research", "flavor": "gb200", "usedGpus": 0}]
    assert list(keyed(rows, ["1", "2"], queue_key)) == ["research/gb300", "research/gb200"]


# ---- the commands, over a fake API server ------------------------------------------------

def _views() -> list[ClusterView]:
    """What successive reads of the cluster return: cluster() of test_views, then sweep-17
    admitted (its check Ready) and research's used GPUs up by 16, then that again."""
    snap = cluster()
    wls = tuple(dataclasses.replace(w, phase=Phase.ADMITTED, check_state=CheckState.READY)
                if w.name == "sweep-17" else w for w in snap.workloads)
    qs = tuple(dataclasses.replace(q, used_gpus=q.used_gpus + 16) if q.name == "research"
               else q for q in snap.queues)
    later = dataclasses.replace(snap, workloads=wls, queues=qs)
    objects = ClusterObjects(workloads=raws())
    return [ClusterView(snap, objects, namespace="ml")] + [
        ClusterView(later, objects, namespace="ml") for _ in range(2)]


class FakeKube:
    """Watches that say "changed" over and over (``quiet``: never, and after 20 s a 403 ends
    the command, so a test that waits for a read no event triggers fails instead of hanging);
    records what was watched (kind, namespace) and the field selectors."""

    def __init__(self) -> None:
        self.watched: set[tuple[str, str | None]] = set()
        self.fields: dict[str, str] = {}
        self.closed = False
        self.quiet = False

    async def watch(self, res: Any, rv: str, *, namespace: str | None = None,
                    params: dict[str, str] | None = None) -> AsyncIterator[dict[str, Any]]:
        from m2g.k8s import client as k

        self.watched.add((res.kind, namespace))
        if params:
            self.fields[res.kind] = params["fieldSelector"]
        if self.quiet:
            await asyncio.sleep(20)  # only if the test is broken: no event must come
            raise k.PermanentError("no read came without an event")
        while True:
            yield {"type": "MODIFIED"}
            await asyncio.sleep(0)


    async def close(self) -> None:
        self.closed = True


async def _never(_seconds: float) -> None:
    await asyncio.Event().wait()


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    """m2g_cli.cluster.read returns _views() one after another, then Ctrl-C (the user ends
    the watch); the watches are FakeKube's."""
    from m2g.k8s import client as k
    from m2g_cli import cluster as cli_cluster
    from m2g_cli import watch_cmd

    views, kube = _views(), FakeKube()

    async def read(*_: Any, **__: Any) -> ClusterView:
        if not views:
            raise KeyboardInterrupt
        return views.pop(0)

    async def connect(*_: Any) -> FakeKube:
        return kube

    monkeypatch.setattr(cli_cluster, "read", read)
    monkeypatch.setattr(k, "connect", connect)
    monkeypatch.setattr(watch_cmd, "INTERVAL", 0.0)
    monkeypatch.setattr(watch_cmd, "BACKOFF", 0.0)
    monkeypatch.setattr(watch_cmd, "TIMER", _never)  # no moment of the clock comes
    return kube


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, fake_cluster: FakeKube) -> list[float]:
    """The watches stay quiet, the clock says NOW, and the timer returns at once: the delays
    it was asked for, in order (reads then come only from the clock)."""
    from m2g_cli import watch_cmd

    delays: list[float] = []

    async def timer(seconds: float) -> None:
        delays.append(seconds)

    fake_cluster.quiet = True
    monkeypatch.setattr(watch_cmd, "TIMER", timer)
    monkeypatch.setattr(watch_cmd, "now", lambda: NOW)
    return delays


def _at(view: ClusterView, seconds: float, **changes: Any) -> ClusterView:
    """``view`` read ``seconds`` after NOW (its snapshot's clock moved, nothing else), with
    ``changes`` to the ClusterView."""
    snap = view.snapshot
    later = NOW + timedelta(seconds=seconds)
    snap = dataclasses.replace(snap, factory=dataclasses.replace(snap.factory, now=later))
    return dataclasses.replace(view, snapshot=snap, **changes)


def _m2g(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def _json_stream(text: str) -> list[dict[str, Any]]:
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(text):
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
        at += len(text[at:]) - len(text[at:].lstrip())
    return docs


def test_workloads_w_json_streams_the_objects_then_each_change(fake_cluster: FakeKube
                                                               ) -> None:
    out = _m2g("workloads", "-n", "ml", "-w", "-o", "json")
    docs = _json_stream(out)
    assert [(d["name"], d["phase"]) for d in docs] == [
        ("llama-8b-ft", "Admitted"), ("sweep-17", "Reserved"), ("pretrain-405b", "Inactive"),
        ("sweep-17", "Admitted")]  # the third read is the same as the second: nothing
    assert all("kind" not in d or d["kind"] != "List" for d in docs)  # objects, not a List
    assert fake_cluster.watched == {("Workload", "ml")} and fake_cluster.closed
    golden("workloads_watch_json.txt", out)


def test_workloads_w_yaml_is_documents_separated_by_dashes(fake_cluster: FakeKube) -> None:
    out = _m2g("workloads", "-n", "ml", "-w", "-o", "yaml", "--sort-by", ".gpus")
    assert not out.startswith("---") and out.count("---\n") == 3
    docs = list(yaml.safe_load_all(out))
    assert [(d["name"], d["m2gCheck"]) for d in docs] == [
        ("llama-8b-ft", "Ready"), ("sweep-17", "Pending"), ("pretrain-405b", "Ready"),
        ("sweep-17", "Ready")]
    golden("workloads_watch_yaml.txt", out)


def test_workloads_w_table_prints_the_table_then_changed_rows(fake_cluster: FakeKube) -> None:
    out = _m2g("workloads", "-n", "ml", "-w")
    lines = out.splitlines()
    assert lines[0].startswith("NAME ") and len(lines) == 5  # -n: no NAMESPACE, as kubectl
    assert lines[4].split()[:6] == ["sweep-17", "sweep", "research", "research", "Admitted",
                                    "Ready"]


def test_queues_w_watches_cluster_and_local_queues(fake_cluster: FakeKube) -> None:
    out = _m2g("queues", "-w", "-o", "wide")
    golden("queues_watch_wide.txt", out)
    assert out.splitlines()[-1].split()[:5] == ["research", "gb300", "30/48", "(62%)", "24"]
    assert fake_cluster.watched == {("ClusterQueue", None), ("LocalQueue", None),
                                    ("GridEvent", None)}
    docs = _json_stream(_m2g_again("queues", "-w", "-o", "json", "--no-headers"))
    assert [(d["clusterQueue"], d["usedGpus"]) for d in docs] == [
        ("prod", 40), ("research", 8), ("research", 24)]


def _invoke_over(views: list[ClusterView], *args: str) -> Any:
    """``m2g ARGS`` reading ``views`` one after the other (then Ctrl-C): the result."""

    async def read(*_: Any, **__: Any) -> ClusterView:
        if not views:
            raise KeyboardInterrupt
        return views.pop(0)

    from m2g_cli import cluster as cli_cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_cluster, "read", read)
        return CliRunner().invoke(app, list(args))


def _m2g_over(views: list[ClusterView], *args: str) -> str:
    """``m2g ARGS`` reading ``views`` one after the other (then Ctrl-C)."""
    result = _invoke_over(views, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    out: str = result.stdout
    return out


def _m2g_again(*args: str) -> str:
    """The same fake cluster from its start again."""
    return _m2g_over(_views(), *args)


def test_a_sort_key_no_item_has_is_exit_2_before_watching(fake_cluster: FakeKube) -> None:
    result = CliRunner().invoke(app, ["workloads", "-n", "ml", "-w", "-o", "json",
                                      "--sort-by", ".nope"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --sort-by '.nope': no such field")
    assert result.stdout == "" and not fake_cluster.watched


def test_a_watch_that_fails_for_good_is_one_line_exit_1(fake_cluster: FakeKube,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    from m2g.k8s import client as k

    async def forbidden(*_: Any, **__: Any) -> AsyncIterator[dict[str, Any]]:
        raise k.PermanentError("WATCH /apis/kueue.x-k8s.io/v1beta2/workloads: 403 Forbidden")
        yield  # pragma: no cover

    monkeypatch.setattr(fake_cluster, "watch", forbidden)
    result = CliRunner().invoke(app, ["workloads", "-n", "ml", "-w"])
    assert result.exit_code == 1, result.stdout
    assert result.stderr == ("error: watching Workloads: WATCH /apis/kueue.x-k8s.io/v1beta2/"
                             "workloads: 403 Forbidden\n")


def test_queues_w_wide_prints_a_row_whose_grid_event_note_changed(fake_cluster: FakeKube
                                                                   ) -> None:
    """The NOTE (-o wide) names the grid event in force: GridEvents are watched, and a row
    whose note changed is printed again although its quota did not change."""
    views = _views()[:1]
    snap = views[0].snapshot
    quiet = dataclasses.replace(snap, factory=dataclasses.replace(snap.factory,
                                                                  grid_events=()))
    views.append(ClusterView(quiet, views[0].objects, namespace="ml"))
    out = _m2g_over(views, "queues", "-w", "-o", "wide")
    lines = out.splitlines()
    assert len(lines) == 5, out  # header, two rows, the two rows again without the note
    assert [ln.split()[-1] for ln in lines[3:]] == ["-", "m2g"]
    docs = _json_stream(_m2g_again("queues", "-w", "-o", "json"))
    assert all("_note" not in d for d in docs)


# ---- moments of the clock ---------------------------------------------------------------

def test_until_is_the_first_moment_after_the_read_or_the_period() -> None:
    seen, at = NOW, NOW + timedelta(seconds=10)
    moments = [NOW - timedelta(hours=1), NOW + timedelta(seconds=600),
               NOW + timedelta(seconds=1200)]
    assert until(seen, at, moments) == 590 + CLOCK_MARGIN  # from the clock, not the read
    assert until(seen, at, moments, every=15.0) == 5 + CLOCK_MARGIN
    assert until(seen, at, []) is None
    # a moment after the read that the clock has already passed: a read at once
    assert until(seen, NOW + timedelta(seconds=700), moments[:2]) == CLOCK_MARGIN
    assert until(seen, at, [datetime(9999, 1, 1, tzinfo=NOW.tzinfo)]) == MAX_WAKE


def test_a_grid_event_that_starts_by_the_clock_prints_the_rows_again(
        clock: list[float], fake_cluster: FakeKube) -> None:
    """queues -w -o wide: an event 600 s ahead; no object changes and no watch event comes,
    yet the rows are printed again with the NOTE once the event has started (the read the
    timer asked for at its start), then a read at its end is asked for."""
    first = _views()[0]
    snap = first.snapshot
    event = dataclasses.replace(snap.factory.grid_events[0], start=NOW + timedelta(seconds=600),
                                end=NOW + timedelta(seconds=1200))
    first = dataclasses.replace(first, snapshot=dataclasses.replace(
        snap, factory=dataclasses.replace(snap.factory, grid_events=(event,))))
    out = _m2g_over([first, _at(first, 601)], "queues", "-w", "-o", "wide")
    lines = out.splitlines()
    assert [ln.split()[-1] for ln in lines[1:3]] == ["-", "m2g"]  # no event in force yet
    assert len(lines) == 5 and lines[3].endswith("grid event srp-dr-0529 active"), out
    assert clock[:2] == [600 + CLOCK_MARGIN, 1200 + CLOCK_MARGIN]


def test_without_a_grid_event_queues_w_has_no_moment_and_no_period() -> None:
    """No grid event: queues -w asks for no timer (it shows no readings to poll), so it reads
    on watch events only; with one, its start and end are the moments."""
    from m2g_cli import ops_cmd

    first = _views()[0]
    snap = first.snapshot
    first = dataclasses.replace(first, snapshot=dataclasses.replace(
        snap, factory=dataclasses.replace(snap.factory, grid_events=())))
    spec = ops_cmd._queues_watched(ops_cmd.Listing())
    assert list(spec.moments(first)) == [] and spec.every is None
    event = _views()[0].snapshot.factory.grid_events[0]
    assert list(spec.moments(_views()[0])) == [event.start, event.end]


# ---- m2g status -w, m2g signals -w ----------------------------------------------------------

def _lease(holder: str, renewed: float, duration: int = 15) -> dict[str, Any]:
    at = (NOW + timedelta(seconds=renewed)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"spec": {"holderIdentity": holder, "renewTime": at,
                     "leaseDurationSeconds": duration}}


def _status_views() -> list[ClusterView]:
    """m2g-0 leads; its renewal 5 s later (nothing to print); m2g-1 takes over."""
    base = _views()[0]
    return [dataclasses.replace(base, lease=_lease("m2g-0", -2)),
            _at(base, 5, lease=_lease("m2g-0", 4)),
            _at(base, 6, lease=_lease("m2g-1", 6))]


def test_status_w_json_streams_the_status_then_each_change(fake_cluster: FakeKube) -> None:
    out = _m2g_over(_status_views(), "status", "-w", "-o", "json")
    docs = _json_stream(out)
    assert [(d["leader"]["holder"], d["leader"]["state"]) for d in docs] == [
        ("m2g-0", "Leading"), ("m2g-1", "Leading")]  # the renewal alone: not printed
    assert [d["leader"]["renewedSecondsAgo"] for d in docs] == [2.0, 0.0]
    assert fake_cluster.fields == {"Lease": "metadata.name=m2g-controller"}
    assert {("Lease", "m2g-system"), ("Policy", None), ("AdmissionCheck", None),
            ("Node", None), ("GridEvent", None)} <= fake_cluster.watched
    golden("status_watch_json.txt", out)


def test_status_w_table_prints_it_whole_again_after_a_blank_line(fake_cluster: FakeKube
                                                                 ) -> None:
    out = _m2g_over(_status_views(), "status", "-w")
    blocks = out.split("\n\n")
    assert blocks[0].startswith("Leader:    m2g-0 (Leading")
    again = [b for b in blocks if b.startswith("Leader:")]
    assert len(again) == 2 and again[1].startswith("Leader:    m2g-1 (Leading"), out
    assert out.count("ADMISSIONCHECK") == 0  # the fake cluster has no AdmissionCheck
    golden("status_watch_table.txt", out)


def test_status_w_shows_the_lease_expire_by_the_clock(clock: list[float],
                                                      fake_cluster: FakeKube) -> None:
    """The leader dies: its Lease is never written again, no watch event comes; a read is
    asked for when it expires (renewed 2 s before NOW, 15 s: 13 s after NOW, before the
    readings' 15 s) and shows it Expired."""
    first = dataclasses.replace(_views()[0], lease=_lease("m2g-0", -2))
    out = _m2g_over([first, _at(first, 14)], "status", "-w", "-o", "yaml")
    docs = list(yaml.safe_load_all(out))
    assert [d["leader"]["state"] for d in docs] == ["Leading", "Expired"]
    assert clock[0] == 13 + CLOCK_MARGIN


def test_signals_w_reads_again_every_period_and_prints_what_changed(
        clock: list[float], fake_cluster: FakeKube) -> None:
    """Prometheus has no watch: signals -w reads again READINGS_EVERY s after each read;
    a rack's kW that changed prints the signals again; an age that grew does not."""
    from m2g.model.factory import Reading
    from m2g_cli.ops_cmd import READINGS_EVERY

    first = _views()[0]
    aged = _at(first, 15)
    f = aged.snapshot.factory
    r0 = dataclasses.replace(f.racks[0], power_kw=Reading(121.0, 3.0))
    hotter = dataclasses.replace(aged, snapshot=dataclasses.replace(
        aged.snapshot, factory=dataclasses.replace(f, racks=(r0, *f.racks[1:]))))
    older = dataclasses.replace(first.snapshot.factory.racks[0], power_kw=Reading(118.4, 9.0))
    only_older = dataclasses.replace(first, snapshot=dataclasses.replace(
        first.snapshot, factory=dataclasses.replace(
            first.snapshot.factory, racks=(older, *first.snapshot.factory.racks[1:]))))
    out = _m2g_over([first, only_older, hotter], "signals", "-w", "-o", "json")
    docs = _json_stream(out)
    assert [d["racks"][0]["drawKw"] for d in docs] == [118.4, 121.0]
    assert clock[0] == READINGS_EVERY + CLOCK_MARGIN
    assert {("Node", None), ("PowerDomain", None), ("GridEvent", None),
            ("MaintenanceWindow", None)} == fake_cluster.watched


def test_signals_w_table_and_yaml(fake_cluster: FakeKube) -> None:
    from m2g.model.factory import Reading

    views = _views()[:1]
    f = views[0].snapshot.factory
    r1 = dataclasses.replace(f.racks[1], power_kw=Reading(96.0, 2.0))
    views.append(dataclasses.replace(views[0], snapshot=dataclasses.replace(
        views[0].snapshot, factory=dataclasses.replace(f, racks=(f.racks[0], r1)))))
    out = _m2g_over(list(views), "signals", "-w", "--sort-by", ".name")
    golden("signals_watch_table.txt", out)
    blocks = out.split("\n\n")
    assert len(blocks) == 4 and blocks[2].startswith("Site phx-1: draw 214.4 kW"), out
    docs = list(yaml.safe_load_all(_m2g_over(list(views), "signals", "-w", "-o", "yaml")))
    assert [d["racks"][1]["drawKw"] for d in docs] == [None, 96.0]


def test_status_w_and_signals_w_sort_key_errors_are_exit_2(fake_cluster: FakeKube) -> None:
    policy = {"metadata": {"name": "p"}, "spec": {"stage": "Admission"}}
    for args in (["status", "-w", "--sort-by", ".nope"], ["signals", "-w", "--sort-by", ".x"]):
        view = dataclasses.replace(_views()[0], policies=[policy])
        result = _invoke_over([view], *args)
        assert result.exit_code == 2, (args, result.stdout)
        assert result.stderr.startswith("error: --sort-by ") and result.stdout == ""
        assert not fake_cluster.watched


def test_signature_ignores_clock_fields_at_any_depth() -> None:
    a = {"leader": {"holder": "x", "renewedSecondsAgo": 1.0}, "racks": [
        {"name": "r", "drawKw": 1.0, "powerAgeSeconds": 3.0}]}
    b = {"leader": {"holder": "x", "renewedSecondsAgo": 9.0}, "racks": [
        {"name": "r", "drawKw": 1.0, "powerAgeSeconds": 7.0}]}
    assert signature(a) == signature(b)
    assert signature(a) != signature({**b, "racks": [{"name": "r", "drawKw": 2.0}]})
