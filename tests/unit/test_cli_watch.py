"""m2g workloads|queues -w (m2g_cli.watch_cmd): which rows are printed again, coalescing, the
watch re-opened when the server ends it, a permanent error ending the command, several watches
in one loop, and the commands end to end over a fake API server (-o table|json|yaml)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from m2g.k8s.build import ClusterObjects
from m2g.model.cluster import CheckState, Phase
from m2g_cli.app import app
from m2g_cli.cluster import ClusterView
from m2g_cli.watch_cmd import Rows, Stream, changed, follow, keyed, queue_key
from tests.unit.goldens import golden
from tests.unit.test_views import cluster, raws


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
    """Watches that say "changed" over and over; records what was watched."""

    def __init__(self) -> None:
        self.watched: set[tuple[str, str | None]] = set()
        self.closed = False

    async def watch(self, res: Any, rv: str, *, namespace: str | None = None
                    ) -> AsyncIterator[dict[str, Any]]:
        self.watched.add((res.kind, namespace))
        while True:
            yield {"type": "MODIFIED"}
            await asyncio.sleep(0)

    async def close(self) -> None:
        self.closed = True


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
    return kube


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
    assert lines[0].startswith("NAMESPACE") and len(lines) == 5
    assert lines[4].split()[1:7] == ["sweep-17", "sweep", "research", "research", "Admitted",
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


def _m2g_over(views: list[ClusterView], *args: str) -> str:
    """``m2g ARGS`` reading ``views`` one after the other (then Ctrl-C)."""

    async def read(*_: Any, **__: Any) -> ClusterView:
        if not views:
            raise KeyboardInterrupt
        return views.pop(0)

    from m2g_cli import cluster as cli_cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_cluster, "read", read)
        return _m2g(*args)


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
