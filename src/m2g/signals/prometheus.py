"""Async Prometheus HTTP API client: instant queries, parsed samples, classified errors.

The ``httpx.AsyncClient`` and the clock are injected (tests pass a ``MockTransport`` or point at a
real server). Errors form a small hierarchy so callers can decide without string matching:

* ``RetryableError`` — connection refused / DNS / reset, timeouts, HTTP 5xx (incl. Prometheus's
  503 query timeout) and 429 (rate limited): retried at once, ``retries`` times with exponential
  backoff and jitter (honouring a short ``Retry-After``; a timeout is not retried, it has taken
  its time already), then again next cycle, meanwhile the signal ages and turns stale;
* ``PermanentError`` — HTTP 4xx (400 ``bad_data`` = bad PromQL, 422 execution error), a response
  that is not the Prometheus API, or a result type a signal cannot use: retrying will not help,
  fix the configuration.

Every message is one line that names the server and, for query errors, the PromQL. An answer
that is not what the API documents is never an exception out of ``fetch_signals``: an element
that cannot be told apart from the others (not a map, a metric that is not a map of strings)
is a ``PermanentError`` for that signal; a series whose ``value`` is not what Prometheus writes
(a JSON list ``[time, "number"]``: a JSON number, then a string in Go's float syntax) reads as
a NaN sample for that series alone — INVALID in the readings (m2g.signals.sanity), counted in
``m2g_signal_series{freshness="invalid"}``, the fail-safe of missing — and the other series of
the answer are used as they are. (Unpacked as any pair, ``"value": "12"`` read as 2 kW at
time 1, and one malformed series made the whole signal missing.)

An answer is bounded twice while it downloads, and read no further past either bound: in bytes
(``max_response_bytes``, ``prometheus.maxResponseBytes``) and in series (``max_series``,
``prometheus.maxSeries``). Both raise an ``AnswerRefusedError`` for that signal alone (it reads
as missing: the fail-safe). The series are counted before any decoding, by the answer's JSON
objects: every series of a vector is two (the element and its ``metric``), so an answer of more
than ``2 × max_series + 2`` ``{`` bytes holds more than ``max_series`` series or is not what
Prometheus writes (a ``{`` inside a string only raises the count; no escape hides an object).
1.8 million tiny series within the 64 MiB byte bound took 28 s of CPU and 1.6 GiB to decode and
read (past m2g run's 10 s bound on a read: every signal missing); refused at the default bound,
that signal costs its download up to the bound (bench/signal_series.py).

A third bound counts the answer's JSON values the same way (``max_values_per_series``,
``prometheus.maxValuesPerSeries``): every value after the first of its array or object follows
a ``,`` and every container's first one its ``{`` or ``[``, so the ``,``, ``{`` and ``[`` bytes
are at least the values; an answer may hold ``max_values_per_series`` of them for each pair of
``{`` (a series: its element and its ``metric``), a ``TooManyValuesError`` past that. One series
whose ``value`` is an array of 16 million numbers (61 MiB, one series, within both other
bounds) cost seconds of CPU and ~700 MiB to decode; it is refused after its first chunk. (A
``,`` inside a label value makes the bound stricter; a ``{`` inside one loosens it by at most
half a series' allowance, never past ``max_series`` series' allowance.)

The bounds multiply: ~150,000 tiny series leave room for ~9.6 M values in one array, which
cost 5.5-10 s of CPU and +509 MiB to read. A fourth bound counts the same values for the answer as
a whole (``max_values``, ``prometheus.maxValues``, 4,000,000), a ``TooManyAnswerValuesError``
past it, so that what one answer costs to decode and read is bounded by its values and bytes,
not by the product of the other bounds.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from m2g.errors import M2gError
from m2g.errors import PermanentError as PermanentError  # re-exported: one family
from m2g.errors import RetryableError as RetryableError
from m2g.signals.config import (
    MAX_SERIES,
    MAX_VALUES,
    MAX_VALUES_PER_SERIES,
    SignalConfig,
    SignalName,
    redact_url,
)
from m2g.signals.sample import Sample
from m2g.signals.sanity import MAX_FUTURE_SECONDS

Clock = Callable[[], float]
T = TypeVar("T")

#: Series handled between two yields to the event loop: an answer of many series is read in
#: steps of this many (~10 ms of CPU each), so it never holds the lease renewal, the admission
#: answers or the watches for the whole read, and a read cancelled by its caller's bound (the
#: controller's 10 s) stops at the next step instead of running to the end.
PARSE_CHUNK = 500


async def _chunked(items: Iterable[T]) -> list[T]:
    """``list(items)``, yielding to the event loop every ``PARSE_CHUNK`` items (``items`` is
    lazy: the work of each item is done here, between the yields)."""
    out: list[T] = []
    for item in items:
        out.append(item)
        if len(out) % PARSE_CHUNK == 0:
            await asyncio.sleep(0)
    return out


#: The errors of this client are m2g's one family (m2g.errors): retryable (unreachable, timed
#: out, a 5xx) or permanent (bad PromQL, a 4xx, not a Prometheus API at all).
PrometheusError = M2gError


class BadQueryError(PermanentError):
    """Prometheus rejected the PromQL (HTTP 400 ``bad_data`` or 422 ``execution``)."""


class RateLimitedError(RetryableError):
    """HTTP 429; ``retry_after`` is the server's Retry-After in seconds, when it gave one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AnswerRefusedError(PermanentError):
    """An answer over one of the client's bounds, read no further; ``bound`` names it
    (``maxResponseBytes`` or ``maxSeries``, as in the site configuration)."""

    bound = "maxResponseBytes"


class TooManySeriesError(AnswerRefusedError):
    """An answer of more than ``max_series`` series (counted before decoding)."""

    bound = "maxSeries"


class TooManyValuesError(AnswerRefusedError):
    """An answer of more than ``max_values_per_series`` JSON values a series (counted before
    decoding)."""

    bound = "maxValuesPerSeries"


class TooManyAnswerValuesError(AnswerRefusedError):
    """An answer of more than ``max_values`` JSON values in all (counted before decoding)."""

    bound = "maxValues"


def value_allowance(objects: int, per_series: int) -> int:
    """The most JSON values an answer of ``objects`` ``{`` bytes so far may hold: ``per_series``
    for each pair of objects (a series' element and its ``metric``; the answer and its ``data``
    count as one), at least ``per_series``."""
    return per_series * max(1, objects // 2)


def object_bound(max_series: int) -> int:
    """The most ``{`` bytes an answer of ``max_series`` series has when no label holds one:
    two a series (the element, its ``metric``), the answer's and its ``data``."""
    return 2 * max_series + 2


class _TimedOut(RetryableError):
    """A timeout: retryable next cycle, not at once (it has used its time)."""


@dataclass(frozen=True)
class SignalFetch:
    """The outcome of reading one signal: its samples, or the error that prevented it."""

    name: SignalName
    samples: tuple[Sample, ...] = ()
    error: PrometheusError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


#: A number as Prometheus writes one (Go's strconv.FormatFloat, and its "+Inf", "-Inf",
#: "NaN"): ASCII only. Python's float() also reads "5_000", " 5" and Arabic-Indic digits
#: ("\u0665\u0660" was 50 kW), which no Prometheus sends: garbage, not a reading.
_GO_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|NaN)",
                       re.ASCII)


def _number(text: Any) -> float:
    if isinstance(text, bool) or not isinstance(text, str | int | float) or (
            isinstance(text, str) and not _GO_FLOAT.fullmatch(text)):
        raise PermanentError(f"not a number in the Prometheus response: {str(text)[:60]!r}")
    try:
        return float(text)  # Prometheus sends "NaN", "+Inf", "-Inf" as strings too
    except (TypeError, ValueError, OverflowError):
        raise PermanentError(f"not a number in the Prometheus response: {str(text)[:60]!r}") \
            from None


#: The head of a range query's answer: its samples are many values a series, so the values
#: bound refuses it before it is decoded; the reason is then this, not the bound.
_MATRIX = re.compile(rb'"resultType"\s*:\s*"matrix"')


def _not_a_vector(kind: Any, promql: str) -> str:
    return (f"{promql!r} returned a {kind or 'missing'} result; a signal needs an instant "
            "vector (drop any [range] selector)")


def _pair(value: Any) -> tuple[float, float] | None:
    """The (time, value) of a sample's ``value`` as Prometheus writes it — a JSON list of a
    number and a string (``[1712345678.9, "42.5"]``) — or None when it is anything else."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    ts, val = value
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(val, str):
        return None
    try:
        return _number(ts), _number(val)
    except PermanentError:
        return None


def _labels(metric: Any) -> dict[str, str] | None:
    """The label map of a vector element, or None when it is not a map of strings."""
    if not isinstance(metric, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        return None
    return metric


def _stamps(stamps: Iterable[tuple[tuple[tuple[str, str], ...], float]]
            ) -> dict[tuple[tuple[str, str], ...], float]:
    """The answer of ``timestamp(q)`` (each sample's ``identity()`` and value) by label set; a
    label set answered twice with different stamps is unknown (NaN): which one belongs to the
    value cannot be told."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for key, value in stamps:
        out[key] = value if key not in out or out[key] == value else math.nan
    return out


def _scraped_at(sample: Sample, stamps: Mapping[tuple[tuple[str, str], ...], float],
                when: float, skew: float = MAX_FUTURE_SECONDS) -> float:
    """When ``sample`` (an element of ``q`` evaluated at ``when``) was scraped, from the answer
    of ``timestamp(q)`` at the same instant; NaN when that is unknown.

    Unknown: the stamp answer lacks the series, or its stamp is not finite, or it is more than
    ``skew`` seconds after ``when`` (a scrape "from the future" is clock trouble or garbage).
    Never the evaluation time: that would read as age 0, fresh. An aggregating query is not
    affected: Prometheus stamps its result with the evaluation time under the same labels.
    """
    stamp = stamps.get(sample.identity(), math.nan)
    if not math.isfinite(stamp) or stamp > when + skew:
        return math.nan
    return stamp


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "")))
    except ValueError:
        return None  # absent, or an HTTP date: the backoff decides


@dataclass
class PrometheusClient:
    """Instant queries against ``base_url`` (e.g. ``http://127.0.0.1:9090``)."""

    base_url: str
    http: httpx.AsyncClient
    timeout_seconds: float = 5.0
    clock: Clock = field(default=time.time)
    #: Immediate retries of a 429/5xx/connection failure, the first backoff (doubling, with
    #: jitter in [0.5, 1.5)), and the longest wait (also the cap of a server's Retry-After).
    retries: int = 2
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 2.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)
    jitter: Callable[[], float] = field(default=random.random)
    #: The largest answer read (bytes); a larger or endless body fails this signal.
    max_response_bytes: int = 64 << 20
    #: The most series an answer may hold (see the module docstring); more fails this signal.
    max_series: int = MAX_SERIES
    #: The most JSON values an answer may hold a series (see the module docstring).
    max_values_per_series: int = MAX_VALUES_PER_SERIES
    #: The most JSON values an answer may hold in all (see the module docstring).
    max_values: int = MAX_VALUES
    #: Held while an answer is decoded and read: the signals' answers are read one after the
    #: other, so a step of one (not one step of each) is all the event loop waits for.
    _reading: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` as an instant query at ``at`` (Unix s; default: server's now),
        retrying transient failures (see the module docstring)."""
        attempt = 0
        while True:
            try:
                return await self._query_once(promql, at)
            except _TimedOut:
                raise
            except RetryableError as exc:
                if attempt >= self.retries:
                    raise
                await self.sleep(self._backoff(attempt, exc))
                attempt += 1

    def _backoff(self, attempt: int, exc: RetryableError) -> float:
        wait = float(self.backoff_seconds * 2.0 ** attempt * (0.5 + self.jitter()))
        if isinstance(exc, RateLimitedError) and exc.retry_after is not None:
            wait = max(wait, exc.retry_after)
        return min(wait, self.max_backoff_seconds)

    async def _query_once(self, promql: str, at: float | None) -> list[Sample]:
        params: dict[str, str] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = self.base_url.rstrip("/") + "/api/v1/query"
        where = f"Prometheus at {redact_url(self.base_url)}"
        try:
            resp = await self._bounded_get(url, params, where)
        except httpx.TimeoutException:
            raise _TimedOut(
                f"{where} timed out after {self.timeout_seconds:g}s (query {promql!r})") from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise RetryableError(f"{where} is unreachable: {reason}") from None
        async with self._reading:  # one answer decoded and read at a time (see PARSE_CHUNK)
            return await self._answer(resp, where, promql)

    async def _answer(self, resp: httpx.Response, where: str, promql: str) -> list[Sample]:
        body = self._json(resp, where)  # holds the loop ~25 ms a MiB (maxResponseBytes)
        if resp.status_code >= 500:
            raise RetryableError(
                f"{where} failed with HTTP {resp.status_code}: {self._why(body, resp)}")
        if resp.status_code == 429:
            raise RateLimitedError(f"{where} is rate limiting (HTTP 429): "
                                   f"{self._why(body, resp)}", _retry_after(resp))
        if resp.status_code >= 400 or body.get("status") != "success":
            why = self._why(body, resp)
            if body.get("errorType") in ("bad_data", "execution"):
                raise BadQueryError(f"bad PromQL {promql!r}: {why}")
            if body.get("errorType") in ("timeout", "canceled", "unavailable", "internal"):
                raise RetryableError(f"{where} could not answer {promql!r}: {why}")
            raise PermanentError(f"{where} refused {promql!r} (HTTP {resp.status_code}): {why}")
        return await _chunked(self._samples(body.get("data"), promql))

    async def query_with_age(self, promql: str, at: float | None = None) -> list[Sample]:
        """``query`` plus ``timestamp(promql)`` at the same instant, so that each sample carries
        the time it was scraped (for plain selectors) rather than the evaluation time.

        A sample whose scrape time is unknown (see ``_scraped_at``) carries a NaN timestamp,
        which m2g.signals.readings makes INVALID: the fail-safe of a missing reading."""
        when = self.clock() if at is None else at
        values, stamps = await asyncio.gather(
            self.query(promql, when), self.query(f"timestamp({promql})", when))
        scraped = _stamps(await _chunked((s.identity(), s.value) for s in stamps))
        return await _chunked(Sample(s.labels, s.value, _scraped_at(s, scraped, when))
                              for s in values)

    async def _bounded_get(self, url: str, params: dict[str, str], where: str
                           ) -> httpx.Response:
        """GET, reading at most ``max_response_bytes`` of the body, ``object_bound`` JSON
        objects, ``value_allowance`` JSON values and ``max_values`` in all (an answer larger,
        or one that never ends, is an ``AnswerRefusedError`` for this signal: it reads as
        missing)."""
        async with self.http.stream("GET", url, params=params,
                                    timeout=self.timeout_seconds) as resp:
            body = bytearray()
            objects = values = 0
            async for chunk in resp.aiter_bytes():  # decoded: a gzip bomb is bounded too
                body += chunk
                opened = chunk.count(b"{")
                objects += opened
                values += opened + chunk.count(b"[") + chunk.count(b",")
                try:
                    self._within_bounds(len(body), objects, values, where)
                except (TooManyValuesError, TooManyAnswerValuesError):
                    if _MATRIX.search(bytes(body[:256])):  # a [range] selector: say so
                        raise PermanentError(_not_a_vector("matrix", params["query"])) from None
                    raise
        headers = {k: v for k, v in resp.headers.items()
                   if k.lower() not in ("content-encoding", "content-length")}
        return httpx.Response(resp.status_code, headers=headers, content=bytes(body),
                              request=resp.request)

    def _within_bounds(self, size: int, objects: int, values: int, where: str) -> None:
        """Raise the ``AnswerRefusedError`` of the first bound an answer of ``size`` bytes so far,
        ``objects`` ``{`` bytes and ``values`` JSON values (see the module docstring) is over."""
        if size > self.max_response_bytes:
            raise AnswerRefusedError(
                f"{where} answered with more than {self.max_response_bytes:,} bytes "
                "(maxResponseBytes); the signal reads as missing")
        most = object_bound(self.max_series)
        if objects > most:
            raise TooManySeriesError(
                f"{where} answered with more than {self.max_series:,} series (maxSeries; "
                f"over {most:,} JSON objects); the signal reads as missing")
        allowed = value_allowance(objects, self.max_values_per_series)
        if values > allowed:
            raise TooManyValuesError(
                f"{where} answered with more than {self.max_values_per_series:,} JSON values a "
                f"series (maxValuesPerSeries; over {allowed:,} values with {objects:,} JSON "
                "objects); the signal reads as missing")
        if values > self.max_values:
            raise TooManyAnswerValuesError(
                f"{where} answered with more than {self.max_values:,} JSON values (maxValues); "
                "the signal reads as missing")

    @staticmethod
    def _json(resp: httpx.Response, where: str) -> dict[str, Any]:
        try:
            body = resp.json()
        except ValueError:
            if resp.status_code >= 500 or resp.status_code == 429:
                return {}
            raise PermanentError(
                f"{where} did not answer with the Prometheus API (HTTP {resp.status_code}, "
                f"{resp.headers.get('content-type', 'no content type')})") from None
        if not isinstance(body, dict):
            raise PermanentError(f"{where} did not answer with the Prometheus API")
        return body

    @staticmethod
    def _why(body: dict[str, Any], resp: httpx.Response) -> str:
        text = str(body.get("error") or resp.reason_phrase or "no reason given")
        return " ".join(text.split())

    @staticmethod
    def _parse(data: Any, promql: str) -> list[Sample]:
        """The samples of an answer's ``data`` (all at once: ``query`` reads them in steps)."""
        return list(PrometheusClient._samples(data, promql))

    @staticmethod
    def _samples(data: Any, promql: str) -> Iterator[Sample]:
        """The samples of an answer's ``data``, one at a time; a ``PermanentError`` for an
        answer a signal cannot use."""
        if not isinstance(data, dict):
            raise PermanentError(f"no data in the Prometheus response to {promql!r}")
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            pair = _pair(result)
            if pair is None:
                raise PermanentError(f"malformed scalar in the answer to {promql!r}")
            yield Sample({}, pair[1], pair[0])
            return
        if kind != "vector" or not isinstance(result, list):
            raise PermanentError(_not_a_vector(kind, promql))
        for item in result:
            if not isinstance(item, dict) or "metric" not in item:
                raise PermanentError(f"malformed vector element in the answer to {promql!r}")
            labels = _labels(item["metric"])
            if labels is None:
                raise PermanentError(f"malformed labels (not a map of strings) in the answer "
                                     f"to {promql!r}")
            pair = _pair(item.get("value"))
            # a malformed value spoils its own series only: NaN reads INVALID (fail-safe)
            ts, val = pair if pair is not None else (math.nan, math.nan)
            yield Sample(labels, val, ts)


async def fetch_signals(client: PrometheusClient, config: SignalConfig,
                        at: float | None = None) -> dict[SignalName, SignalFetch]:
    """Read every configured signal at one instant; a failing signal does not hide the others."""
    when = client.clock() if at is None else at
    names = list(config.signals)

    async def one(name: SignalName) -> SignalFetch:
        spec = config.signals[name]
        try:
            samples = await client.query_with_age(spec.query, when)
        except PrometheusError as exc:
            return SignalFetch(name, error=exc)
        except Exception as exc:  # documented as never raising: one line, this signal only
            return SignalFetch(name, error=PermanentError(
                f"unexpected answer to {spec.query!r}: {type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]}"))
        if spec.scale != 1.0:
            samples = await _chunked(Sample(s.labels, s.value * spec.scale, s.timestamp)
                                     for s in samples)
        # NaN, ±Inf and out-of-range values are kept: m2g.signals.sanity makes them INVALID
        return SignalFetch(name, tuple(samples))

    results = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, results, strict=True))
