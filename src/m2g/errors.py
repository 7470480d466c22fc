"""The one error family of m2g's I/O adapters (the API server, Prometheus): pure, no I/O.

* ``RetryableError``: worth retrying — the network or the server is busy, a timeout, a 5xx, an
  object changed under us;
* ``PermanentError``: retrying cannot help — invalid, forbidden, not found, not served.

Both are ``M2gError``, whose message is always one line; ``status`` is the HTTP code (0 when
there was no response), ``reason``, ``api_message`` and ``details`` what the server said (a
Kubernetes Status object's fields). m2g.k8s.client (``KubeError`` and its kinds: ``Conflict``,
``Gone``, ``NotFound``, ``ResourceMissing``, ``AlreadyExists``) and m2g.signals.prometheus
(``PrometheusError``, ``BadQueryError``) raise them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class M2gError(Exception):
    """An I/O call failed; ``str(exc)`` is one line."""

    def __init__(self, message: str, status: int = 0, reason: str = "", *,
                 api_message: str = "", details: Mapping[str, Any] | None = None) -> None:
        super().__init__(" ".join(str(message).split()))  # always one line
        self.status = status
        self.reason = reason
        self.api_message = " ".join(api_message.split())
        self.details: dict[str, Any] = dict(details or {})


class RetryableError(M2gError):
    """Worth retrying: the server or the network is busy, or the object changed under us."""


class PermanentError(M2gError):
    """Retrying cannot help: invalid, forbidden, or the thing does not exist."""
