"""The twin's CPU by process (``twinkit.harness.process_cpu``, ``twinkit.report.cpu_lines``):
which process of a run took the machine's cores, read from /proc while they live."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from twinkit.harness import Proc, Procs, RunData, process_cpu
from twinkit.report import cpu_lines


def test_each_live_process_and_pid_file_is_counted_by_name(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "kube-apiserver.pid").write_text(f"{os.getpid()} python\n")
    (tmp_path / "pids" / "etcd.pid").write_text("not a pid\n")  # unreadable: left out
    spin = Proc("m2g run", [sys.executable, "-c", "while True: pass"],
                tmp_path / "spin.log").start()
    done = Proc("job driver", [sys.executable, "-c", "pass"], tmp_path / "done.log").start()
    try:
        deadline = time.monotonic() + 10
        while done.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        while time.monotonic() < deadline:  # the spinner has used some CPU
            parts = process_cpu(tmp_path, Procs(list=[spin, done]))
            if parts.get("m2g run", 0.0) >= 0.2:
                break
            time.sleep(0.1)
    finally:
        spin.stop()
    assert set(parts) == {"kube-apiserver", "m2g run"}  # the exited driver: not live
    assert parts["m2g run"] >= 0.2
    assert parts["kube-apiserver"] > 0.0  # this test's own process


def test_the_report_lists_the_largest_first_and_skips_runs_without_figures() -> None:
    m2g = RunData("m2g", cpu_parts={"kueue": 120.0, "m2g run": 310.4, "kube-apiserver": 250.0})
    lines = cpu_lines({"kueue": RunData("kueue"), "m2g": m2g}, ["kueue", "m2g"])
    assert lines == ["CPU by process at the end of m2g's replay (s): m2g run 310, "
                     "kube-apiserver 250, kueue 120.", ""]
    assert cpu_lines({"kueue": RunData("kueue")}, ["kueue"]) == []
