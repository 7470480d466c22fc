"""The Policy admission webhook (m2g_controllers.webhook, ``m2g run --webhook-port``): m2g's
own compiler answers an AdmissionReview v1 — a good Policy allowed, bad CEL denied with the
loader's one line, a malformed review a 400 and an oversize body a 413 (not a traceback),
the compile in a child process killed past its bound (the request refused: fail closed),
the serving pair read over HTTPS and again once it changes."""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import yaml

from m2g.policy import make_runtime
from m2g_controllers import run, webhook

ROOT = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((ROOT / "policies" / "grid-demand-response" / "policy.yaml").read_text())
RUNTIME = make_runtime()


def bad_cel(obj: dict[str, Any] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(obj or GOOD)
    out["spec"]["rules"][0]["when"] = "grid.event.level + 'x'"
    return out


def tenant(decision: str = "Reject") -> dict[str, Any]:
    return {"apiVersion": "m2g.io/v1alpha1", "kind": "TenantPolicy",
            "metadata": {"name": "cap", "namespace": "team-a"},
            "spec": {"stage": "Admission", "rules": [
                {"name": "big", "when": "workload.gpus > 8", "decision": decision,
                 "message": "at most 8 GPUs"}]}}


def review(obj: Any, operation: str = "CREATE", old: Any = None, kind: str = "Policy",
           group: str = "m2g.io", uid: str = "u-1") -> dict[str, Any]:
    req: dict[str, Any] = {"uid": uid, "operation": operation, "object": obj,
                           "kind": {"group": group, "version": "v1alpha1", "kind": kind}}
    if old is not None:
        req["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


async def in_process(obj: dict[str, Any]) -> tuple[str, list[str]]:
    return "ok", webhook.object_problems(obj, RUNTIME)


@pytest.fixture
async def server() -> AsyncIterator[webhook.WebhookServer]:
    counted: list[str] = []
    srv = webhook.WebhookServer(in_process, None, "127.0.0.1", 0, max_body=64 * 1024,
                                count=counted.append)
    srv.counted = counted  # type: ignore[attr-defined]
    await srv.start()
    yield srv
    await srv.stop()


async def post(port: int, body: bytes, path: str = webhook.PATH, method: str = "POST",
               length: int | None = None, tls: ssl.SSLContext | None = None
               ) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                   server_hostname="127.0.0.1" if tls else None)
    size = len(body) if length is None else length
    writer.write(f"{method} {path}?timeout=15s HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
                 + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


async def answer(srv: webhook.WebhookServer, doc: dict[str, Any]) -> dict[str, Any]:
    status, body = await post(srv.port, json.dumps(doc).encode())
    assert status == 200, body
    out: dict[str, Any] = json.loads(body)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == doc["request"]["uid"]
    return out["response"]


async def test_a_good_policy_is_allowed(server: webhook.WebhookServer) -> None:
    assert (await answer(server, review(GOOD)))["allowed"] is True
    assert (await answer(server, review(tenant(), kind="TenantPolicy")))["allowed"] is True


async def test_bad_cel_is_denied_with_the_loaders_line(server: webhook.WebhookServer) -> None:
    resp = await answer(server, review(bad_cel()))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "\n" not in msg
    assert msg.startswith("m2g's policy compiler refuses this Policy: Policy/grid-demand-"
                          "response:"), msg
    assert "grid-demand-response/defer-during-dr: when:" in msg
    assert "no matching overload for '_+_' applied to '(int, string)'" in msg
    syntax = bad_cel()
    syntax["spec"]["rules"][0]["when"] = "grid.event.active &&"
    assert "Syntax error" in (await answer(server, review(syntax)))["status"]["message"]
    # a TenantPolicy that could admit: the loader's refusal of it
    resp = await answer(server, review(tenant("Admit"), kind="TenantPolicy"))
    assert resp["allowed"] is False
    assert "rule big: a TenantPolicy may only Defer or Reject" in resp["status"]["message"]
    assert server.counted == ["denied"] * 3  # type: ignore[attr-defined]


async def test_an_update_is_checked_unless_its_spec_is_unchanged(
        server: webhook.WebhookServer) -> None:
    assert not (await answer(server, review(bad_cel(), "UPDATE", GOOD)))["allowed"]
    relabelled = bad_cel()
    relabelled["metadata"]["labels"] = {"team": "x"}
    assert (await answer(server, review(relabelled, "UPDATE", bad_cel())))["allowed"]


async def test_what_is_not_m2gs_to_judge_is_allowed(server: webhook.WebhookServer) -> None:
    assert (await answer(server, review(bad_cel(), group="example.com")))["allowed"]
    assert (await answer(server, review(bad_cel(), kind="GridEvent")))["allowed"]
    assert (await answer(server, review(bad_cel(), operation="DELETE")))["allowed"]
    resp = await answer(server, review("not an object"))
    assert not resp["allowed"] and "not an object" in resp["status"]["message"]


@pytest.mark.parametrize(("body", "why"), [
    (b"{not json", b"not JSON"),
    (b"[1, 2]", b"not an AdmissionReview"),
    (json.dumps({**review(GOOD), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
     b"is not admission.k8s.io/v1"),
    (json.dumps({**review(GOOD), "request": {"uid": ""}}).encode(), b"no request with a uid"),
    (b"[" * 100_000 + b"]" * 100_000, b"not JSON"),
])
async def test_a_malformed_review_is_a_400_with_one_line(
        server: webhook.WebhookServer, body: bytes, why: bytes) -> None:
    server.max_body = len(body) + 1
    status, text = await post(server.port, body)
    assert status == 400 and why in text and text.count(b"\n") == 1, text
    assert b"Traceback" not in text


async def test_an_oversize_body_is_refused_before_it_is_read(
        server: webhook.WebhookServer) -> None:
    # only the header arrives: the answer must not wait for the 10 MB it announces
    status, text = await post(server.port, b"", length=10_000_000)
    assert status == 413 and b"over 65536 bytes" in text
    assert server.counted == ["refused"]  # type: ignore[attr-defined]


async def test_other_paths_and_methods(server: webhook.WebhookServer) -> None:
    assert (await post(server.port, b"{}", path="/other"))[0] == 404
    assert (await post(server.port, b"", method="GET"))[0] == 405


# --- the compile worker: a real child process -------------------------------------------------


def _never_answers(conn: Connection, _engine: str | None) -> None:
    conn.send(("ready", []))
    conn.recv()
    time.sleep(3600)


async def test_the_worker_compiles_in_a_child_process() -> None:
    worker = webhook.CompileWorker(timeout_seconds=60)
    try:
        await worker.start()
        assert await worker.problems(GOOD) == ("ok", [])
        verdict, lines = await worker.problems(bad_cel())
        assert verdict == "ok" and len(lines) == 1 and "no matching overload" in lines[0]
        proc = worker._proc
        assert proc is not None and proc.pid is not None
    finally:
        worker.stop()
    assert not proc.is_alive()


async def test_a_compile_past_the_bound_is_killed_and_the_object_refused() -> None:
    worker = webhook.CompileWorker(timeout_seconds=0.5, target=_never_answers)
    try:
        await worker.start()
        first = worker._proc
        with pytest.raises(webhook.CompileTimeout, match=r"longer than 0\.5 s"):
            await worker.problems(GOOD)
        assert first is not None and not first.is_alive()  # killed, not left running
        resp, outcome = await webhook.review(review(GOOD)["request"], worker.problems)
        assert outcome == "error" and resp["response"]["allowed"] is False
        assert "could not check this Policy in time" in resp["response"]["status"]["message"]
        # the next request starts a child again (here one that answers)
        worker._target, worker.timeout_seconds = webhook._serve_compiles, 60
        assert await worker.problems(GOOD) == ("ok", [])
        assert worker._proc is not None and worker._proc is not first
    finally:
        worker.stop()


# --- HTTPS ------------------------------------------------------------------------------------


def _pair(directory: Path, cn: str) -> Path:
    """A CA and a serving pair for 127.0.0.1 in ``directory`` (tls.crt, tls.key); the CA's
    PEM is returned."""
    x509 = pytest.importorskip("cryptography.x509")
    sys.path.insert(0, str(ROOT / "kind-e2e"))
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.x509.oid import ExtendedKeyUsageOID
    from localcp.pki import issue

    ca = issue(f"{cn}-ca")
    cert, key = issue(cn, ca=ca, eku=(ExtendedKeyUsageOID.SERVER_AUTH,),
                      sans=(x509.IPAddress(ipaddress.ip_address("127.0.0.1")),))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.key").write_bytes(key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    (directory / "tls.crt").write_bytes(cert.public_bytes(ser.Encoding.PEM))
    ca_file = directory.parent / f"{cn}-ca.crt"
    ca_file.write_bytes(ca[0].public_bytes(ser.Encoding.PEM))
    return ca_file


async def test_https_with_the_mounted_pair_and_its_renewal(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    first_ca = _pair(certs, "one")
    tls = webhook.TlsFiles(certs)
    srv = webhook.WebhookServer(in_process, tls.context, "127.0.0.1", 0)
    await srv.start()
    try:
        client = ssl.create_default_context(cafile=str(first_ca))
        status, body = await post(srv.port, json.dumps(review(GOOD)).encode(), tls=client)
        assert status == 200 and json.loads(body)["response"]["allowed"] is True
        # cert-manager renews the Secret: the next handshake serves the new pair
        second_ca = _pair(certs, "two")
        with pytest.raises(ssl.SSLCertVerificationError):
            await post(srv.port, b"{}", tls=client)
        renewed = ssl.create_default_context(cafile=str(second_ca))
        status, _ = await post(srv.port, json.dumps(review(GOOD)).encode(), tls=renewed)
        assert status == 200
    finally:
        await srv.stop()


def test_m2g_run_without_a_readable_pair_ends_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--webhook-port", "0", "--webhook-cert-dir", str(tmp_path),
                     "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "webhook serving pair" in err and "tls.crt" in err, err
