"""A tiny HTTP server for /metrics, /healthz and /readyz (asyncio streams, no framework)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HealthServer:
    """Serves the registry's metrics; /healthz is the process, /readyz the caller's check."""

    def __init__(self, registry: CollectorRegistry, ready: Callable[[], tuple[bool, str]],
                 host: str = "0.0.0.0", port: int = 8080) -> None:
        self._registry = registry
        self._ready = ready
        self.host, self.port = host, port
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self.port = int(sock[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 5)).decode(errors="replace")
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(" ")[1] if line.count(" ") >= 2 else "/"
            status, ctype, body = self._route(path.split("?")[0])
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ok, why = self._ready()
            return ("200 OK" if ok else "503 Service Unavailable", "text/plain",
                    (why or "ok").encode() + b"\n")
        return "404 Not Found", "text/plain", b"not found\n"
