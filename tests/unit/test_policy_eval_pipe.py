"""``m2g policy eval`` from a pipe or a FIFO: a writer that sends one input at a time gets each
decision before it sends the next (before, decisions came 256 inputs at a time, or at the end).
Real pipes and a real FIFO; the writer waits for each decision (a generous deadline, only so a
broken reader fails instead of hanging: nothing is asserted about time)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from m2g.policy import Evaluator, Stage, build, read_dir
from m2g.policy.jsonin import MAX_LINE_BYTES
from m2g_cli.policy_eval import PipeReader, evaluate_stream, open_input
from tests.unit.policy_helpers import policy, write

RULES = policy("dr", "Admission", """
    - name: defer
      when: "workload.flexTier >= 2"
      decision: Defer
""")
#: how long the writer waits for a decision before it goes on anyway (the test then fails)
DEADLINE = 120.0


def _line(tier: int) -> bytes:
    return json.dumps({"workload": {"flexTier": tier}}).encode() + b"\n"


class Writer(threading.Thread):
    """Writes one input, waits until its decision was printed, writes the next; records for
    each input whether its decision came while the writer was still waiting (the pipe open,
    nothing more sent)."""

    def __init__(self, open_fd: object, inputs: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.open_fd, self.inputs = open_fd, inputs
        self.printed = threading.Semaphore(0)
        self.in_time: list[bool] = []

    def run(self) -> None:
        fd = self.open_fd() if callable(self.open_fd) else self.open_fd
        assert isinstance(fd, int)
        try:
            for data in self.inputs:
                os.write(fd, data)
                self.in_time.append(self.printed.acquire(timeout=DEADLINE))
        finally:
            os.close(fd)


def _evaluator(tmp_path: Path) -> Evaluator:
    return Evaluator(build(read_dir(write(tmp_path / "p", {"dr.yaml": RULES}))))


def test_each_decision_is_printed_before_the_writer_sends_the_next(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    writer = Writer(write_end, [_line(2), _line(0), b"{not json}\n", _line(3)])
    out: list[str] = []

    def printed(line: str) -> None:
        out.append(line)
        writer.printed.release()

    writer.start()
    try:
        total, bad = evaluate_stream(_evaluator(tmp_path), Stage.ADMISSION,
                                     PipeReader(read_end), "<stdin>", printed, lambda _: None)
    finally:
        os.close(read_end)
    writer.join()
    assert writer.in_time == [True, True, True, True]
    assert (total, bad) == (4, 1)
    assert [json.loads(x).get("decision") for x in out] == ["Defer", "Admit", None, "Defer"]


def test_a_fifo_named_by_input_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    fifo = tmp_path / "inputs"
    os.mkfifo(fifo)
    writer = Writer(lambda: os.open(fifo, os.O_WRONLY), [_line(2), _line(0)])
    out: list[str] = []

    def printed(line: str) -> None:
        out.append(line)
        writer.printed.release()

    writer.start()
    with open_input(str(fifo)) as stream:
        assert isinstance(stream, PipeReader)
        evaluate_stream(_evaluator(tmp_path), Stage.ADMISSION, stream, str(fifo), printed,
                        lambda _: None)
    writer.join()
    assert writer.in_time == [True, True]
    assert [json.loads(x)["decision"] for x in out] == ["Defer", "Admit"]


def test_m2g_policy_eval_answers_a_pipe_line_by_line(tmp_path: Path) -> None:
    """The command itself, stdin a pipe: each decision is on stdout (written and flushed)
    while its writer waits with stdin still open."""
    folder = write(tmp_path / "p", {"dr.yaml": RULES})
    proc = subprocess.Popen([sys.executable, "-c", "from m2g_cli.app import main; main()",
                             "policy", "eval", "-p", str(folder), "-i", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(iter(proc.stdout.readline, b"")),
                              daemon=True)
    try:
        reader.start()
        for n, tier in enumerate((2, 0), start=1):
            proc.stdin.write(_line(tier))
            proc.stdin.flush()
            for _ in range(int(DEADLINE * 10)):
                if len(got) >= n or proc.poll() is not None:
                    break
                reader.join(0.1)
            assert len(got) == n, (n, got, proc.poll())
        proc.stdin.close()
        assert proc.wait(DEADLINE) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
    reader.join(DEADLINE)
    assert [json.loads(x)["decision"] for x in got] == ["Defer", "Admit"]


@pytest.mark.parametrize("data", [
    b"", b"a", b"a\n", b"a\nb", b"\n\n", b"x" * 70_000 + b"\ny\n",
    b"z" * (MAX_LINE_BYTES + 5) + b"\nafter\n"])
def test_pipe_reader_reads_lines_as_a_file_does(data: bytes) -> None:
    """The same lines as a buffered file's readline(MAX_LINE_BYTES + 1), over a real pipe
    (a writer thread, since the data is larger than the pipe's buffer)."""
    read_end, write_end = os.pipe()

    def send() -> None:
        with os.fdopen(write_end, "wb") as fh:
            fh.write(data)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    reader, expected = PipeReader(read_end), io.BytesIO(data)
    try:
        while True:
            line = reader.readline(MAX_LINE_BYTES + 1)
            assert line == expected.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
    finally:
        os.close(read_end)
    sender.join()


def test_ready_says_whether_the_next_line_has_arrived() -> None:
    read_end, write_end = os.pipe()
    reader = PipeReader(read_end)
    try:
        assert not reader.ready()  # nothing written: the next line has not arrived
        os.write(write_end, b'{"a": 1}')
        assert not reader.ready()  # part of a line
        os.write(write_end, b'\n{"b"')
        assert reader.ready() and reader.readline() == b'{"a": 1}\n'
        assert not reader.ready()
        os.close(write_end)
        write_end = -1
        assert reader.ready() and reader.readline() == b'{"b"' and reader.readline() == b""
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_line_without_an_end_is_buffered_no_further_than_the_line_bound() -> None:
    """A writer that sends 3 MiB with no newline: ready() reads up to MAX_LINE_BYTES (then
    the line is too long: readline returns it and the input stops there), never all of it."""
    read_end, write_end = os.pipe()

    def send() -> None:
        try:
            os.write(write_end, b"x" * (3 << 20))
        except OSError:  # the reader stopped reading and closed its end
            pass
        finally:
            os.close(write_end)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    reader = PipeReader(read_end)
    try:
        while not reader.ready():
            pass
        held = len(reader._buf) - reader._pos
        assert MAX_LINE_BYTES < held <= MAX_LINE_BYTES + 1 + PipeReader.READ
        assert len(reader.readline(MAX_LINE_BYTES + 1)) == MAX_LINE_BYTES + 1
    finally:
        os.close(read_end)
    sender.join(DEADLINE)


def test_a_fifo_nobody_writes_to_is_given_up_after_the_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11's leftover: ``-i FIFO`` with no writer waited forever (as cat does); now one
    line after $M2G_INPUT_WAIT seconds, and a writer that comes within it is read."""
    import time

    from m2g_cli.policy_eval import InputUnusable

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    monkeypatch.setenv("M2G_INPUT_WAIT", "0.5")
    started = time.monotonic()
    with pytest.raises(InputUnusable, match=r"no writer opened the FIFO within 0.5 s"), \
            open_input(str(fifo)):
        pass
    assert time.monotonic() - started < 3
    monkeypatch.setenv("M2G_INPUT_WAIT", "5")

    def late_writer() -> None:
        time.sleep(0.3)
        with open(fifo, "wb") as fh:
            fh.write(b"{}\n")

    threading.Thread(target=late_writer, daemon=True).start()
    with open_input(str(fifo)) as src:
        assert src.readline() == b"{}\n"
