"""Where the answer cannot be written (thirtieth session probe, docs/reliability.md): stdout on
a full disk (``> /dev/full``), closed (``>&-``), or a pipe whose reader is gone (``| head -1``).
Before: a traceback (OSError, AttributeError) for the first two, and ``m2g policy eval`` said
``error: cannot read input FILE: Broken pipe`` (exit 2: the user's input) for a reader that
stopped reading, or ``... No space left on device`` for a full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD_INPUT = {"grid": {"event": {"active": True, "level": 2}},
              "workload": {"name": "w", "flexTier": 3, "gpus": 8}}
MAIN = "import sys; from m2g_cli.app import main; sys.argv[0] = 'm2g'; main()"


def _m2g(args: list[str], stdout: int, close_stdout: bool = False) -> tuple[int, str]:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "controllers"), str(ROOT / "cli")])}
    proc = subprocess.run([sys.executable, "-c", MAIN, *args], stdout=stdout,
                          stderr=subprocess.PIPE, env=env, check=False, timeout=120,
                          preexec_fn=(lambda: os.close(1)) if close_stdout else None)
    return proc.returncode, proc.stderr.decode()


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text((json.dumps(GOOD_INPUT) + "\n") * 3000)  # ~1.5 MB of answers: past a pipe
    return path


def _eval(inputs: Path) -> list[str]:
    return ["policy", "eval", "-p", str(ROOT / "policies"), "-i", str(inputs)]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("which", ["templates", "eval"])
def test_a_full_disk_is_one_error_line_exit_1(which: str, inputs: Path) -> None:
    args = ["templates", "list"] if which == "templates" else _eval(inputs)
    with open("/dev/full", "wb") as full:
        code, err = _m2g(args, full.fileno())
    assert code == 1, err
    assert err.splitlines() == ["error: cannot write the output: No space left on device"]


def test_stdout_closed_is_one_error_line_exit_1() -> None:
    code, err = _m2g(["templates", "show", "llama31-8b-finetune"], subprocess.DEVNULL,
                     close_stdout=True)
    assert (code, err.splitlines()) == (1, ["error: cannot write the output: stdout is closed"])


def test_eval_into_a_pipe_nobody_reads_is_not_an_input_error(inputs: Path) -> None:
    """``m2g policy eval ... | head -1``: the reader goes away; the command stops quietly, as
    every command does on a closed pipe (click's rule: exit 1, nothing printed)."""
    read, write = os.pipe()
    os.close(read)
    try:
        code, err = _m2g(_eval(inputs), write)
    finally:
        os.close(write)
    assert "cannot read input" not in err and "Traceback" not in err, err
    assert code == 1 and err == ""
