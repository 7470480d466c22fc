"""One call for a controller's cycle: fetch every signal at ``now`` and project to readings.

``read_signals`` never raises for Prometheus trouble: a failed signal is MISSING in the result
(with its one-line error in ``status``), so the fail-safe rule takes over (docs/signals.md).
Even an unexpected failure while projecting the samples makes every signal MISSING with that
error, rather than an exception out of the reader.

The answers are read in steps with the event loop free in between (m2g.signals.prometheus
``PARSE_CHUNK``) and the readings are built in a worker thread, so a read of many series never
holds the lease renewal, the admission answers or the watches for its whole length.

``failed`` (optional) is told each signal whose query failed and the error itself (its kind:
an ``AnswerRefusedError`` over a bound, a timeout, bad PromQL), for a caller's log and metrics;
it must not raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from m2g.signals.config import SignalConfig, SignalName
from m2g.signals.prometheus import PrometheusClient, PrometheusError, fetch_signals
from m2g.signals.readings import Expected, Readings, build_readings


async def read_signals(client: PrometheusClient, config: SignalConfig,
                       expected: Expected | None = None, now: float | None = None,
                       failed: Callable[[SignalName, PrometheusError], None] | None = None
                       ) -> Readings:
    """Readings at ``now`` (default: the client's clock)."""
    at = client.clock() if now is None else now
    fetched = await fetch_signals(client, config, at)
    for name, f in fetched.items():
        if f.error is not None and failed is not None:
            failed(name, f.error)
    errors = {n: str(f.error) for n, f in fetched.items() if f.error}
    try:  # in a worker thread: ~1 s of CPU at 20,000 series a signal, the event loop runs on
        return await asyncio.to_thread(
            build_readings, {n: f.samples for n, f in fetched.items() if f.ok}, at, config,
            expected, errors)
    except Exception as exc:
        why = f"cannot use the answers: {type(exc).__name__}: {' '.join(str(exc).split())}"
        return build_readings({}, at, config, expected, {n: why for n in config.signals})
