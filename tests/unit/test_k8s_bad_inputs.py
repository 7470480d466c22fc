"""Kubeconfig and API answers that are not what they should be: one line, never a traceback,
never a hang (docs/reliability.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from m2g.k8s import client as c
from m2g.k8s.cache import WatchCache, well_formed
from m2g.testing.kube import FakeWatchApi

CLUSTER = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: u, user: %s}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(("text", "needle"), [
    ("", "the file is empty"),
    ("# only a comment\n", "the file is empty"),
    ("- a\n- b\n", "a kubeconfig is a mapping, this is a list"),
    ("42\n", "this is a int"),
    ("just a string\n", "this is a str"),
    ("clusters: {a: 1}\n", "clusters must be a list of mappings"),
    ("users: [1, 2]\n", "users must be a list of mappings"),
    ("a: [\n", "unreadable YAML at line"),
    ("a: \x00\n", "unreadable YAML"),
    ("[" * 5000 + "]" * 5000, "unreadable YAML"),
])
async def test_bad_kubeconfig_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(c.PermanentError) as info:
        await c.connect(path, timeout=2)
    assert needle in str(info.value) and "\n" not in str(info.value)


async def test_kubeconfig_that_is_not_a_file(tmp_path: Path) -> None:
    for path in (tmp_path, Path("/dev/zero"), tmp_path / "missing"):
        with pytest.raises(c.PermanentError) as info:
            await c.connect(path, timeout=2)
        assert "\n" not in str(info.value)


async def test_missing_token_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(CLUSTER % (1, "{tokenFile: /nonexistent/token}"))
    with pytest.raises(c.PermanentError, match="tokenFile /nonexistent/token does not exist"):
        await c.connect(path, timeout=2)


@pytest.mark.parametrize(("cluster", "user", "needle"), [
    ("certificate-authority: {fifo}", "{token: x}", "certificate-authority {fifo} is not a"),
    ("certificate-authority: {d}", "{token: x}", "certificate-authority {d} is not a"),
    ("", "{client-certificate: {fifo}, client-key: {file}}", "client-certificate {fifo} is not"),
    ("", "{client-certificate: {file}, client-key: /dev/zero}", "client-key /dev/zero is not"),
    ("", "{tokenFile: {fifo}}", "tokenFile {fifo} is not a regular file"),
])
async def test_a_file_the_kubeconfig_names_that_is_not_a_file(
        tmp_path: Path, cluster: str, user: str, needle: str) -> None:
    """Thirtieth session probe: a FIFO named as the CA or a client certificate blocked kr8s's
    open for ever (no bound applied: it blocks the event loop); a tokenFile that is a FIFO was
    said not to exist. Refused before kr8s reads them, one line."""
    import os

    fifo, file = tmp_path / "fifo", tmp_path / "file"
    os.mkfifo(fifo)
    file.write_text("x")
    subst = {"{fifo}": str(fifo), "{file}": str(file), "{d}": str(tmp_path)}
    for key, value in subst.items():
        cluster, user, needle = (s.replace(key, value) for s in (cluster, user, needle))
    text = CLUSTER % (1, user)
    if cluster:
        text = text.replace('server: "http://127.0.0.1:1"', f'server: "http://127.0.0.1:1", '
                            f"{cluster}")
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(c.PermanentError) as info:
        c.check_kubeconfig(str(path))
    assert needle in str(info.value) and "\n" not in str(info.value)


async def test_version_request_is_bounded(tmp_path: Path) -> None:
    """A server that accepts the connection and never answers: `/version` used to wait 150 s."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    path = tmp_path / "config"
    path.write_text(CLUSTER % (port, "{token: abc}"))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        with pytest.raises(c.RetryableError, match=r"no answer within 0\.5s"):
            await c.connect(path, timeout=0.5)
    finally:
        server.close()
        for w in accepted:
            w.close()
    assert loop.time() - t0 < 30  # bounded by the timeout (generous on a loaded machine)


class _Resp:
    def __init__(self, content: bytes) -> None:
        self.content = content

    async def __aenter__(self) -> _Resp:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


class _Api:
    def __init__(self, content: bytes) -> None:
        self.content = content

    def call_api(self, *args: Any, **kwargs: Any) -> _Resp:
        return _Resp(self.content)


@pytest.mark.parametrize(("body", "needle"), [
    (b"<html>proxy error</html>", "not JSON"),
    (b'{"items": [', "not JSON"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'"text"', "a JSON str"),
    (b"[" * 100_000, "not JSON"),
])
async def test_garbage_bodies_are_one_line(body: bytes, needle: str) -> None:
    with pytest.raises(c.PermanentError) as info:
        await c.Kube(_Api(body)).list(c.NODES)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("obj", [1, None, "x", [], {"metadata": "x"}, {"metadata": None},
                                 {"metadata": {"name": 5}}, {"metadata": {"name": ""}},
                                 {"metadata": {"name": "a", "namespace": ["x"]}}, {}])
def test_malformed_objects_are_not_well_formed(obj: Any) -> None:
    assert not well_formed(obj)


async def test_cache_skips_malformed_items_and_events() -> None:
    good = {"metadata": {"name": "n1", "resourceVersion": "1"}}
    api = FakeWatchApi(
        [{"items": [good, 1, None, {"metadata": "x"}, {"metadata": {"name": 7}}],
          "metadata": {"resourceVersion": "5"}}],
        [[{"type": "ADDED", "object": {"metadata": {"name": ["bad"]}}},
          {"type": "MODIFIED", "object": None}, "not an event", {"type": "ADDED"},
          {"type": "ADDED", "object": {"metadata": {"name": "n2", "resourceVersion": "6"}}}]])
    cache = WatchCache(api, c.NODES)
    task = cache.start()
    try:
        await asyncio.wait_for(api.idle.wait(), 10)
    finally:
        await cache.stop()
    assert task.done()
    assert sorted(cache.view()) == ["n1", "n2"] and cache.malformed == 8
    assert cache.resource_version == "6"


async def test_list_without_items_is_an_error_not_a_crash() -> None:
    api = FakeWatchApi([{"items": {"a": 1}}], [])
    cache = WatchCache(api, c.NODES, backoff=0.01, max_backoff=0.01)
    cache.start()
    try:
        for _ in range(200):
            if cache.last_error is not None:
                break
            await asyncio.sleep(0.01)
    finally:
        await cache.stop()
    assert cache.last_error is not None and "no list of items" in str(cache.last_error)
    assert not cache.synced.is_set()
