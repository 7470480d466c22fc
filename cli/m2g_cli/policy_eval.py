"""``m2g policy eval``'s input side: a stream of JSON inputs evaluated in chunks, in order.

Constant memory: inputs are read a line at a time (m2g.policy.jsonin) and evaluated ``CHUNK``
at a time through the batch evaluator — or fewer when the input is a pipe, a FIFO, a socket or
a terminal and the next line has not arrived yet (PipeReader.ready): a writer that sends one
input at a time gets each decision as soon as it is made, not after 255 more inputs. stdout
is flushed after each chunk. Inputs that share their factory part (everything but
``workload`` and ``queue``, compared by content: dict equality, in C) share one validated base,
so the evaluator converts that part into CEL values once, as the controller does for one
snapshot. Each input
gives one line on stdout, in order: its decision, or ``{"line": N, "error": "..."}`` (also on
stderr as ``error: FILE:N: ...``).
"""

from __future__ import annotations

import json
import os
import select
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from m2g.model.inputs import PolicyInput, QueueView, WorkloadView
from m2g.policy import Evaluator, Stage
from m2g.policy.jsonin import MAX_LINE_BYTES, LineSource, Record, non_finite, records
from m2g.policy.results import StageResult
from m2g.policy.testing import input_error_text

#: Inputs per batch evaluation.
CHUNK = 256
#: Seconds a named FIFO given as the input may go without a writer ($M2G_INPUT_WAIT): its open
#: blocks until one opens it, and a FIFO nobody writes to held ``m2g policy eval`` forever.
INPUT_WAIT = 30.0
#: Distinct factory parts kept (each a validated PolicyInput without workload and queue).
BASES = 16
_ITEM_KEYS = ("workload", "queue")


class InputUnusable(Exception):
    """The input as a whole cannot be read (one line)."""


class PipeReader:
    """Lines read straight from a descriptor (a pipe, FIFO, socket or terminal), knowing
    whether the next one has arrived (``ready``), which a buffered file object cannot say
    without waiting for it. Holds at most MAX_LINE_BYTES + one read."""

    READ = 1 << 16

    def __init__(self, fd: int) -> None:
        self._fd, self._buf, self._pos, self._eof = fd, bytearray(), 0, False

    def _fill(self) -> None:
        if self._pos > len(self._buf) // 2:
            del self._buf[:self._pos]
            self._pos = 0
        data = os.read(self._fd, self.READ)
        if data:
            self._buf += data
        else:
            self._eof = True

    def _complete(self, limit: int) -> bool:
        """A line (or ``limit`` bytes of one, or the end) is in the buffer."""
        return (self._eof or self._buf.find(b"\n", self._pos) >= 0
                or len(self._buf) - self._pos >= limit)

    def readline(self, size: int = -1, /) -> bytes:
        limit = size if size > 0 else MAX_LINE_BYTES + 1
        while not self._complete(limit):
            self._fill()
        end = self._buf.find(b"\n", self._pos, self._pos + limit)
        stop = min(len(self._buf), self._pos + limit) if end < 0 else end + 1
        line = bytes(self._buf[self._pos:stop])
        self._pos = stop
        return line

    def ready(self) -> bool:
        """Whether the next line (or the end of the input) can be read without waiting for
        the writer: it is buffered, or the descriptor has it now."""
        while not self._complete(MAX_LINE_BYTES + 1):
            if not select.select([self._fd], [], [], 0)[0]:
                return False
            self._fill()
        return True


@contextmanager
def open_input(source: str) -> Iterator[LineSource]:
    """The input: stdin for ``-``, else a regular file (a binary file object) or a pipe,
    FIFO, socket or terminal (a PipeReader). A directory or a device (``/dev/zero``,
    ``/dev/urandom``) is refused before reading."""
    try:
        if source == "-":
            fd = _stdin_fd()
            if fd is not None and _is_stream(os.fstat(fd).st_mode, os.isatty(fd)):
                yield PipeReader(fd)
            else:
                yield sys.stdin.buffer
            return
        mode = Path(source).stat().st_mode
        if _is_stream(mode, False):
            fd = _open_fifo(source, _input_wait())  # a FIFO: waits for a writer, bounded
            try:
                yield PipeReader(fd)
            finally:
                os.close(fd)
            return
        with Path(source).open("rb") as fh:
            yield fh
    except OSError as exc:
        raise InputUnusable(f"cannot read input {source}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputUnusable(f"cannot read input {source}: {exc}") from None


def _input_wait() -> float:
    try:
        wait = float(os.environ.get("M2G_INPUT_WAIT", INPUT_WAIT))
    except ValueError:
        return INPUT_WAIT
    return wait if 0 < wait < 86_400 else INPUT_WAIT


def _open_fifo(path: str, wait: float) -> int:
    """Open a FIFO for reading once a writer opens it (as ``cat`` does), but give up after
    ``wait`` seconds: the blocking open runs in a thread, which a non-blocking open of the
    write end (it succeeds: a reader is waiting) then releases. Raises OSError."""
    found: list[int] = []
    failed: list[OSError] = []

    def opener() -> None:
        try:
            found.append(os.open(path, os.O_RDONLY))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=opener, daemon=True, name="m2g-fifo-open")
    thread.start()
    thread.join(wait)
    if thread.is_alive():
        with suppress(OSError):  # release the blocked open; then close what it opened
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(1.0)
        for fd in found:
            os.close(fd)
        raise OSError(f"no writer opened the FIFO within {wait:g} s ($M2G_INPUT_WAIT)")
    if failed:
        raise failed[0]
    return found[0]


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno()
    except (OSError, ValueError):  # not a real file (a test runner's): nothing to check
        return None


def _is_stream(mode: int, tty: bool) -> bool:
    """True for a pipe, FIFO, socket or terminal, False for a regular file; raises
    ValueError for anything else."""
    if stat.S_ISREG(mode):
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or tty:
        return True
    raise ValueError("not a regular file or a pipe")


class Inputs:
    """Builds PolicyInputs from JSON values, sharing a base per distinct factory part."""

    def __init__(self) -> None:
        self._bases: list[tuple[dict[str, Any], PolicyInput | str]] = []  # most recent first

    def _base(self, shared: dict[str, Any]) -> PolicyInput | str:
        for i, (raw, base) in enumerate(self._bases):
            if raw == shared:
                if i:
                    self._bases.insert(0, self._bases.pop(i))
                return base
        made: PolicyInput | str
        try:
            made = PolicyInput.model_validate(shared)
            bad = non_finite(made)
            if bad:
                made = f"bad input: {bad}"
        except ValidationError as exc:
            made = f"bad input: {input_error_text(exc)}"
        self._bases.insert(0, (shared, made))
        del self._bases[BASES:]
        return made

    def build(self, value: Any) -> PolicyInput | str:
        """The input, or a one-line reason it is not one."""
        if not isinstance(value, dict):
            return "an input must be a JSON object"
        base = self._base({k: v for k, v in value.items() if k not in _ITEM_KEYS})
        if isinstance(base, str):
            return base
        update: dict[str, Any] = {}
        for key, model in (("workload", WorkloadView), ("queue", QueueView)):
            if key not in value:
                continue
            try:
                update[key] = model.model_validate(value[key])
            except ValidationError as exc:
                return f"bad input: {key}.{input_error_text(exc)}"
            bad = non_finite(update[key])
            if bad:
                return f"bad input: {key}.{bad}"
        return base.model_copy(update=update) if update else base


def _many(evaluator: Evaluator, stage: Stage) -> Callable[[Sequence[PolicyInput]],
                                                          Sequence[StageResult]]:
    if stage is Stage.ADMISSION:
        return evaluator.admission_many
    if stage is Stage.CAPACITY:
        return evaluator.capacity_many
    if stage is Stage.PREEMPTION:
        return evaluator.preemption_many
    if stage is Stage.FAIRNESS:
        return evaluator.fairness_many
    return lambda items: [evaluator.placement(i) for i in items]


def _chunks(stream: Iterator[Record], ready: Callable[[], bool] | None = None
            ) -> Iterator[list[Record]]:
    """CHUNK records at a time; fewer when ``ready()`` says the next has not arrived."""
    chunk: list[Record] = []
    for rec in stream:
        chunk.append(rec)
        if len(chunk) >= CHUNK or rec.fatal or (ready is not None and not ready()):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def evaluate_stream(evaluator: Evaluator, stage: Stage, stream: LineSource, name: str,
                    out: Callable[[str], None], err: Callable[[str], None]) -> tuple[int, int]:
    """Evaluate every input of ``stream``; returns (inputs, bad inputs). From a PipeReader,
    a chunk ends where the writer paused: what has arrived is evaluated and printed."""
    many = _many(evaluator, stage)
    builder = Inputs()
    total = bad = 0
    ready = stream.ready if isinstance(stream, PipeReader) else None
    for chunk in _chunks(records(stream), ready):
        built: list[PolicyInput | str] = [
            rec.error if rec.error is not None else builder.build(rec.value) for rec in chunk]
        good = [b for b in built if not isinstance(b, str)]
        results = iter(many(good))
        for rec, item in zip(chunk, built, strict=True):
            total += 1
            if isinstance(item, str):
                bad += 1
                out(json.dumps({"line": rec.line, "error": item}, separators=(",", ":")))
                err(f"error: {name}:{rec.line}: {item}")
            else:
                out(json.dumps(next(results).to_json(), separators=(",", ":")))
    return total, bad
