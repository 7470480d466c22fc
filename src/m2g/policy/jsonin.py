"""Evaluation inputs read as a stream: one JSON document, or JSON Lines, in bounded memory.

``records`` yields one ``Record`` per input (a value, or a one-line error naming its line), so
one bad line costs that line only. Bounds (docs/reliability.md): a line of at most
``MAX_LINE_BYTES`` (a longer one ends the stream: it may never end, like ``/dev/zero``), a single
pretty-printed document of at most ``MAX_DOC_BYTES``, nesting the JSON decoder can follow (deeper
is one error, not a RecursionError; the input model itself nests less than 8 deep and refuses
anything deeper where it expects a value), and only finite numbers (``NaN``, ``Infinity`` and
``1e999`` are refused: CEL would compare them as no physical quantity compares), and integers
that fit in 64 bits; a key given twice in one object is refused (which one counts depends on
the reader).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

MAX_LINE_BYTES = 1 << 20
MAX_DOC_BYTES = 16 << 20
#: CEL's int is 64 bits: a larger JSON integer is an evaluation error in one engine and an
#: OverflowError out of the other (it ended the whole stream), so it is refused as input.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Record:
    """One input: its first line, and either its value or why it has none."""

    line: int
    value: Any = None
    error: str | None = None
    #: The stream cannot go on after this record (an over-long line).
    fatal: bool = False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number m2g accepts (only finite numbers)")


def non_finite(value: Any) -> str | None:
    """Where ``value`` (JSON data or a model built from it) holds a float that is not finite
    (``1e999`` decodes to inf) or an integer outside 64 bits, or None. Iterative, so any depth
    is safe; on a model it reads only the fields (strings are skipped without a look inside)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{where or 'value'}: {item} is not a finite number"
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return f"{where or 'value'}: {str(item)[:30]} is outside CEL's 64-bit integers"
        elif isinstance(item, str):
            continue
        elif isinstance(item, BaseModel):
            stack.extend((_join(where, k), v) for k, v in item.__dict__.items()
                         if not isinstance(v, str))
        elif isinstance(item, dict):
            stack.extend((_join(where, str(k)), v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
    return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def loads(text: bytes) -> Any:
    """A JSON value with the bounds above; ValueError with a one-line reason otherwise.
    ``NaN`` and ``Infinity`` are refused here; a literal too large for a float (``1e999``) is
    left to ``non_finite``, as checking every float while decoding doubles the cost."""
    try:
        return _DECODER.decode(text.decode("utf-8") if isinstance(text, bytes) else text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not JSON m2g accepts: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise ValueError(f"not JSON m2g accepts: {exc}") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique: ``{"flexTier": 3, "flexTier": 0}`` means what the
    reader picks (Python and Go take the last, others the first), so it is refused."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key[:80]!r} appears twice in one object")
            seen.add(key)
    return obj


#: One decoder for every line (json.loads with a hook builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique)


def _record(line: int, raw: bytes) -> Record:
    try:
        return Record(line, loads(raw))
    except ValueError as exc:
        return Record(line, error=str(exc))


class LineSource(Protocol):
    """What inputs are read from: a binary file, or anything that reads a line of at most
    ``size`` bytes (b"" at the end)."""

    def readline(self, size: int = -1, /) -> bytes: ...


def _lines(stream: LineSource) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, too long) for every line; stops after a too-long line."""
    n = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        n += 1
        too_long = len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n")
        yield n, raw, too_long
        if too_long:
            return


def _json_lines(lines: Iterator[tuple[int, bytes, bool]]) -> Iterator[Record]:
    for n, raw, too_long in lines:
        if too_long:
            yield Record(n, error=f"line longer than {MAX_LINE_BYTES:,} bytes; input stops here",
                         fatal=True)
        elif raw.strip():
            yield _record(n, raw)


def records(stream: LineSource) -> Iterator[Record]:
    """Every input of ``stream``: a single JSON document (possibly over many lines), or JSON
    Lines. A first line that is JSON on its own means JSON Lines; otherwise the lines are
    gathered (up to MAX_DOC_BYTES) as one document, and read as JSON Lines if they are not one."""
    lines = _lines(stream)
    buffered: list[tuple[int, bytes, bool]] = []
    size = 0
    for item in lines:
        n, raw, too_long = item
        if not buffered and not raw.strip():
            continue
        buffered.append(item)
        size += len(raw)
        if len(buffered) == 1 and not too_long:
            first = _record(n, raw)
            if first.error is None:
                yield first
                yield from _json_lines(lines)
                return
        if too_long or size > MAX_DOC_BYTES:
            break
    else:
        if not buffered:
            return
        text = b"".join(raw for _, raw, _ in buffered)
        try:
            yield Record(buffered[0][0], loads(text))
            return
        except ValueError:
            pass
    yield from _json_lines(iter(buffered))
    yield from _json_lines(lines)
