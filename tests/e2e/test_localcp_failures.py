"""The control plane tooling's failure paths: a component that does not start is named, with
the tail of its log, in one message; user errors never show a traceback. No cluster needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import REPO
from localcp import UserError, procs
from localcp.paths import RunPaths

pytestmark = pytest.mark.e2e


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-component"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_component_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    run = RunPaths(tmp_path / "run")
    comp = procs.Component("fake", [_script(tmp_path, "echo 'listen tcp: bind: in use'; exit 1")],
                           ready=lambda: False, timeout=10)
    procs.start(run, comp)
    with pytest.raises(UserError) as err:
        procs.wait_ready(run, comp)
    message = str(err.value)
    assert message.startswith(f"fake exited during start-up; last lines of {run.log('fake')}")
    assert "listen tcp: bind: in use" in message


def test_component_that_hangs_times_out_and_is_stopped(tmp_path: Path) -> None:
    run = RunPaths(tmp_path / "run")
    comp = procs.Component("slow", [_script(tmp_path, "echo starting; while true; do sleep 1; done")],
                           ready=lambda: False, timeout=1)
    pid = procs.start(run, comp)
    with pytest.raises(UserError, match=r"slow did not become ready in 1s; last lines of .*"):
        procs.wait_ready(run, comp)
    assert procs.read_pid(run, "slow") == pid
    assert procs.stop(run, "slow", grace=5)
    assert procs.read_pid(run, "slow") is None
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_bad_factory_spec_is_one_line_without_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: Bad_Name\nracks: 0\nextra: 1\n")
    out = subprocess.run([sys.executable, str(REPO / "kind-e2e" / "localcp"), "factory",
                          "check", str(spec)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: factory spec {spec} is invalid: ")
    assert "racks" in lines[0] and "extra" in lines[0]
