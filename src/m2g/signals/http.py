"""The HTTP client for a site's Prometheus: bearer token from a file, CA bundle, extra headers.

``make_http_client(settings)`` checks the files it needs at once (a bearer token file that is
missing or empty is a ``PrometheusSetupError`` at startup, never a silent anonymous client) and
returns an ``httpx.AsyncClient`` for ``PrometheusClient``. The token is re-read whenever the
file's modification time changes, so a rotated ServiceAccount token is picked up without a
restart; a token that becomes unreadable later fails the signals of that cycle (they age into
the fail-safe) with one line naming the file.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Generator
from pathlib import Path

import httpx

from m2g.signals.config import PrometheusSettings
from m2g.signals.prometheus import RetryableError


class PrometheusSetupError(Exception):
    """The Prometheus settings cannot be used (a file missing or unreadable); one line."""


def _read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise PrometheusSetupError(f"bearer token file {path}: {reason}") from None
    if not token:
        raise PrometheusSetupError(f"bearer token file {path} is empty")
    return token


class BearerTokenFile(httpx.Auth):
    """``Authorization: Bearer <token>`` from a file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = _read_token(path)
        self._mtime = self._stat()

    def _stat(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return -1.0

    def token(self) -> str:
        mtime = self._stat()
        if mtime != self._mtime:
            try:
                self._token = _read_token(self.path)
            except PrometheusSetupError as exc:
                raise RetryableError(str(exc)) from None
            self._mtime = mtime
        return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        yield request


def tls_verify(settings: PrometheusSettings) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: the CA file, the system store, or nothing."""
    if settings.insecure_skip_verify:
        return False
    if settings.ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(settings.ca_file))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise PrometheusSetupError(f"CA file {settings.ca_file}: {reason}") from None


def make_http_client(settings: PrometheusSettings,
                     transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """An AsyncClient carrying the site's auth, TLS trust and headers (see module docstring);
    ``transport`` replaces the network (tests)."""
    auth = BearerTokenFile(settings.bearer_token_file) if settings.bearer_token_file else None
    return httpx.AsyncClient(auth=auth, verify=tls_verify(settings), transport=transport,
                             headers=dict(settings.headers), follow_redirects=False)
