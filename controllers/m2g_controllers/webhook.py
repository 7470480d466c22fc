"""The validating admission webhook of Policy and TenantPolicy objects (``m2g run
--webhook-port``): m2g's own policy compiler — the code of ``m2g policy lint`` and of the
controller's loader — decides at ``kubectl apply`` time, so a Policy with bad CEL syntax, types
or cost, or over the allocation bound, is refused before it is stored (docs/reliability.md,
"Admission-time guards").

* AdmissionReview ``admission.k8s.io/v1`` in and out, on ``POST /validate-policy`` over HTTPS
  (the serving pair ``tls.crt``/``tls.key`` of a mounted Secret, read again when the files
  change: cert-manager's renewals need no restart).
* The object is checked alone, exactly as the loader checks it among the others; a problem of
  the object's own is a denial with one line (the loader's, as the ``Accepted=False``
  condition says it); a problem of the set as a whole (a TenantPolicy without any platform
  Policy beside it) is not the object's and is not judged here.
* Compiling runs in a child process (spawn), one object at a time, killed past
  ``timeout_seconds`` (then the request is denied: fail closed): a 128-rule Policy compiled
  for 7.5 s, and the controller's event loop and memory stay its own.
* A request body over ``MAX_BODY_BYTES`` is refused (413) before it is read; a malformed
  review is a 400 with one line, never a traceback.
* An update that leaves ``spec`` as it was (a label, a finalizer) is allowed: an object stored
  before the webhook existed can still be relabelled or deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from m2g.policy import PolicySetError, build, make_runtime, read_texts
from m2g.policy.objects import narrow_tenants, policy_texts
from m2g.policy.runtime import Runtime

log = logging.getLogger("m2g.webhook")

PATH = "/validate-policy"
#: Two objects (the update's new and old) of etcd's default 1.5 MiB limit, JSON-escaped, and
#: the review around them.
MAX_BODY_BYTES = 6 * 1024 * 1024
#: The compile bound: below the ValidatingWebhookConfiguration's timeoutSeconds (15).
COMPILE_TIMEOUT_SECONDS = 12.0
#: A denial's message is one line of at most this many characters.
MAX_MESSAGE = 1500
KINDS = frozenset({"Policy", "TenantPolicy"})
GROUP = "m2g.io"
_HEADER_LIMIT = 16 * 1024
_READ_TIMEOUT = 10.0


class ReviewError(ValueError):
    """A request that is not an AdmissionReview v1 m2g can answer (HTTP 400)."""


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def object_problems(obj: dict[str, Any], runtime: Runtime) -> list[str]:
    """The problems m2g's loader finds in this Policy or TenantPolicy object of its own
    (rendered as the loader renders them); [] when it compiles."""
    texts = policy_texts([obj])
    try:
        build(narrow_tenants(read_texts(texts)), runtime)
    except PolicySetError as exc:
        return [p.render() for p in exc.problems if p.file in texts]
    return []


# --- the compile worker (a child process) ---------------------------------------------------


def _serve_compiles(conn: Connection, engine: str | None) -> None:
    """The child's loop: one JSON object in, its problems out, until the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C of a terminal is the parent's to handle
    runtime = make_runtime(engine)
    conn.send(("ready", []))
    while True:
        try:
            text = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", object_problems(json.loads(text), runtime)))
        except Exception as exc:  # an unexpected failure of the compiler: denied, said once
            conn.send(("error", [f"{type(exc).__name__}: {exc}"]))


class CompileTimeout(Exception):
    """The compile did not end within the bound (the worker was killed)."""


class CompileWorker:
    """Compiles one object at a time in a spawned child process, killed past the bound and
    started again for the next request."""

    def __init__(self, engine: str | None = None,
                 timeout_seconds: float = COMPILE_TIMEOUT_SECONDS,
                 target: Callable[[Connection, str | None], None] = _serve_compiles) -> None:
        self.engine, self.timeout_seconds, self._target = engine, timeout_seconds, target
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()

    def _start(self) -> Connection:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=self._target, args=(child, self.engine), daemon=True,
                                 name="m2g-webhook-compiler")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        # the child's first word: its runtime is built (the imports take a second or two)
        if not parent.poll(60):
            self.stop()
            raise CompileTimeout("the policy compiler did not start within 60 s")
        parent.recv()
        return parent

    def _ask(self, text: str) -> tuple[str, list[str]]:
        conn = self._conn if self._proc is not None and self._proc.is_alive() else None
        if conn is None:
            conn = self._start()
        conn.send(text)
        if not conn.poll(self.timeout_seconds):
            self.stop()
            raise CompileTimeout(f"compiling took longer than {self.timeout_seconds:g} s")
        try:
            kind, lines = conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise CompileTimeout("the policy compiler ended before it answered") from None
        return str(kind), [str(x) for x in lines]

    async def start(self) -> None:
        """Start the child now (else the first review pays for its imports)."""
        async with self._lock:
            await asyncio.to_thread(self._start)

    async def problems(self, obj: dict[str, Any]) -> tuple[str, list[str]]:
        """("ok", problems) or ("error", [why]); CompileTimeout past the bound."""
        text = json.dumps(obj)
        try:  # a queue of slow objects: each waits at most the bound for its turn
            await asyncio.wait_for(self._lock.acquire(), self.timeout_seconds)
        except TimeoutError:
            raise CompileTimeout("the policy compiler is busy with other objects") from None
        try:
            return await asyncio.to_thread(self._ask, text)
        finally:
            self._lock.release()

    def stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(5)


# --- the AdmissionReview --------------------------------------------------------------------


Check = Callable[[dict[str, Any]], Awaitable[tuple[str, list[str]]]]


def parse_review(body: bytes) -> dict[str, Any]:
    """The review's ``request``; ReviewError (one line) when the body is not an
    AdmissionReview v1 with a uid."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ReviewError(f"the body is not JSON: {one_line(str(exc), 200)}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise ReviewError("the body is not an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise ReviewError(f"AdmissionReview apiVersion {str(review.get('apiVersion'))[:60]!r} "
                          "is not admission.k8s.io/v1")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) \
            or not request["uid"]:
        raise ReviewError("the AdmissionReview has no request with a uid")
    return request


def _response(uid: str, allowed: bool, message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        out["status"] = {"code": 422, "reason": "Invalid", "message": message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": out}


async def review(request: dict[str, Any], check: Check) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answering ``request`` and its outcome (allowed, denied, error)."""
    uid = str(request["uid"])
    kind = _mapping(request.get("kind"))
    what, obj = str(kind.get("kind")), request.get("object")
    if kind.get("group") != GROUP or what not in KINDS \
            or request.get("operation") not in ("CREATE", "UPDATE"):
        return _response(uid, True), "allowed"  # not m2g's to judge
    if not isinstance(obj, dict):
        return _response(uid, False, f"the {what} in the review is not an object"), "denied"
    old = request.get("oldObject")
    if request.get("operation") == "UPDATE" and isinstance(old, dict) \
            and old.get("spec") == obj.get("spec"):
        return _response(uid, True), "allowed"
    try:
        verdict, lines = await check(obj)
    except CompileTimeout as exc:
        return _response(uid, False, one_line(
            f"m2g could not check this {what} in time ({exc}); refused, as the "
            "webhook fails closed")), "error"
    if verdict != "ok":
        return _response(uid, False, one_line(
            f"m2g could not check this {what} ({'; '.join(lines)}); refused, as the "
            "webhook fails closed")), "error"
    if not lines:
        return _response(uid, True), "allowed"
    more = f" (and {len(lines) - 1} more problem(s))" if len(lines) > 1 else ""
    return _response(uid, False, one_line(
        f"m2g's policy compiler refuses this {what}: {lines[0]}{more}")), "denied"


# --- HTTPS ----------------------------------------------------------------------------------


@dataclass
class _Pair:
    cert: Path
    key: Path
    stamp: tuple[float, float] = (0.0, 0.0)
    context: ssl.SSLContext | None = None


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class TlsFiles:
    """The serving pair of ``cert_dir`` (tls.crt, tls.key: a kubernetes.io/tls Secret), read
    again at the next handshake after either file changes (a failed read keeps the last
    good pair and says why once)."""

    def __init__(self, cert_dir: Path) -> None:
        self._pair = _Pair(cert_dir / "tls.crt", cert_dir / "tls.key")
        self.context = self._load()  # raises OSError / ssl.SSLError: m2g run ends with one line

    def _stamp(self) -> tuple[float, float]:
        return (os.stat(self._pair.cert).st_mtime, os.stat(self._pair.key).st_mtime)

    def _load(self) -> ssl.SSLContext:
        try:
            stamp = self._stamp()
            ctx = _context(self._pair.cert, self._pair.key)
        except (OSError, ssl.SSLError) as exc:  # SSLError alone says "PEM lib"
            raise OSError(f"webhook serving pair {self._pair.cert}, {self._pair.key}: "
                          f"{exc}") from None
        ctx.sni_callback = self._on_hello
        self._pair.stamp, self._pair.context = stamp, ctx
        return ctx

    def _on_hello(self, sock: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        try:
            if self._stamp() != self._pair.stamp:
                self._load()
                log.info("webhook serving certificate reloaded from %s", self._pair.cert)
        except (OSError, ssl.SSLError) as exc:
            log.warning("webhook serving certificate not reloaded (the last one serves): %s",
                        exc)
        if self._pair.context is not None and sock.context is not self._pair.context:
            sock.context = self._pair.context


class WebhookServer:
    """``POST /validate-policy`` over HTTPS (or plain HTTP when ``tls`` is None: tests)."""

    def __init__(self, check: Check, tls: ssl.SSLContext | None, host: str = "0.0.0.0",
                 port: int = 9443, max_body: int = MAX_BODY_BYTES,
                 count: Callable[[str], None] = lambda _outcome: None) -> None:
        self._check, self._tls, self.host, self.port = check, tls, host, port
        self.max_body, self._count = max_body, count
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                  ssl=self._tls, limit=_HEADER_LIMIT)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await self._answer(reader)
            ctype = "application/json" if status.startswith("200") else "text/plain"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await asyncio.wait_for(writer.drain(), _READ_TIMEOUT)
        except (TimeoutError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes]:
        line = (await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)).decode("latin-1")
        parts = line.split()
        headers: dict[str, str] = {}
        for _ in range(100):
            raw = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            return "431 Request Header Fields Too Large", b"too many header fields\n"
        if len(parts) != 3:
            return "400 Bad Request", b"not an HTTP request line\n"
        method, target = parts[0], parts[1].split("?")[0]
        if target != PATH:
            return "404 Not Found", b"not found\n"
        if method != "POST":
            return "405 Method Not Allowed", b"POST an AdmissionReview\n"
        try:
            size = int(headers.get("content-length", ""))
        except ValueError:
            return "411 Length Required", b"a Content-Length is required\n"
        if size < 0:
            return "400 Bad Request", b"a negative Content-Length\n"
        if size > self.max_body:
            self._count("refused")
            return ("413 Content Too Large",
                    f"the body is over {self.max_body} bytes\n".encode())
        body = await asyncio.wait_for(reader.readexactly(size), _READ_TIMEOUT)
        try:
            request = parse_review(body)
        except ReviewError as exc:
            self._count("refused")
            return "400 Bad Request", f"{exc}\n".encode()
        answer, outcome = await review(request, self._check)
        self._count(outcome)
        if outcome != "allowed":
            log.info("webhook %s %s %s: %s", outcome, answer["response"].get("uid"),
                     _name(request), answer["response"]["status"]["message"])
        return "200 OK", json.dumps(answer).encode()


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _name(request: dict[str, Any]) -> str:
    meta = _mapping(_mapping(request.get("object")).get("metadata"))
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))
