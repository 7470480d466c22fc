"""``m2g policy eval``'s input side: a stream of JSON inputs evaluated in chunks, in order.

Constant memory: inputs are read a line at a time (m2g.policy.jsonin) and evaluated ``CHUNK``
at a time through the batch evaluator. Inputs that share their factory part (everything but
``workload`` and ``queue``, compared by content: dict equality, in C) share one validated base,
so the evaluator converts that part into CEL values once, as the controller does for one
snapshot. Each input
gives one line on stdout, in order: its decision, or ``{"line": N, "error": "..."}`` (also on
stderr as ``error: FILE:N: ...``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from m2g.model.inputs import PolicyInput, QueueView, WorkloadView
from m2g.policy import Evaluator, Stage
from m2g.policy.jsonin import Record, non_finite, records
from m2g.policy.results import StageResult
from m2g.policy.testing import input_error_text

#: Inputs per batch evaluation.
CHUNK = 256
#: Distinct factory parts kept (each a validated PolicyInput without workload and queue).
BASES = 16
_ITEM_KEYS = ("workload", "queue")


class InputUnusable(Exception):
    """The input as a whole cannot be read (one line)."""


@contextmanager
def open_input(source: str) -> Iterator[IO[bytes]]:
    """The input as a binary stream: stdin for ``-``, else a regular file or a pipe.
    A directory or a device (``/dev/zero``, ``/dev/urandom``) is refused before reading."""
    try:
        if source == "-":
            _check_stdin()
            yield sys.stdin.buffer
            return
        _check_mode(Path(source).stat().st_mode, False)
        with Path(source).open("rb") as fh:
            yield fh
    except OSError as exc:
        raise InputUnusable(f"cannot read input {source}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputUnusable(f"cannot read input {source}: {exc}") from None


def _check_stdin() -> None:
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):  # not a real file (a test runner's): nothing to check
        return
    _check_mode(os.fstat(fd).st_mode, os.isatty(fd))


def _check_mode(mode: int, tty: bool) -> None:
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or tty:
        return
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


def _chunks(stream: Iterator[Record]) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for rec in stream:
        chunk.append(rec)
        if len(chunk) >= CHUNK or rec.fatal:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def evaluate_stream(evaluator: Evaluator, stage: Stage, stream: IO[bytes], name: str,
                    out: Callable[[str], None], err: Callable[[str], None]) -> tuple[int, int]:
    """Evaluate every input of ``stream``; returns (inputs, bad inputs)."""
    many = _many(evaluator, stage)
    builder = Inputs()
    total = bad = 0
    for chunk in _chunks(records(stream)):
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
