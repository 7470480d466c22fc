"""``m2g node-agent`` — apply m2g's per-GPU power limits (GPUPowerLimit) on a node through NVML.

The agent lives in ``m2g_controllers.nodeagent``; the CLI runs it as ``python -m`` (exec, so
SIGTERM reaches it and it restores the default limits). docs/node-agent.md.
Exit codes: 0 on SIGTERM / Ctrl-C, 2 for a bad setup (no kubeconfig, no NVML, no node name).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from m2g.model.powerlimit import MAX_AGENT_SECONDS
from m2g_cli import term


def node_agent(
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config or the "
                             "pod's service account)")] = None,
    context: Annotated[str | None, typer.Option("--context", help="kubeconfig context")] = None,
    node: Annotated[str, typer.Option(
        "--node", envvar="NODE_NAME", help="this node's name (DaemonSet: the downward API)")] = "",
    all_nodes: Annotated[bool, typer.Option(
        "--all-nodes", help="one fake agent per GPU node (KWOK, tests, the twin)")] = False,
    nvml: Annotated[str, typer.Option("--nvml", help="real (nvidia-ml-py) or fake")] = "real",
    fake_gpus: Annotated[int, typer.Option("--fake-gpus", min=1, max=64,
                                           help="GPUs of the fake device")] = 4,
    read_only: Annotated[bool, typer.Option(
        "--read-only", help="read and report the limits, never set one")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, max=MAX_AGENT_SECONDS,
                                            help="seconds")] = 5.0,
    grace: Annotated[float, typer.Option(
        "--grace", min=0.0, max=MAX_AGENT_SECONDS,
        help="seconds a cap outlives its lease (spec.expiresAt)")] = 60.0,
    min_interval: Annotated[float, typer.Option(
        "--min-interval", min=0.0, max=MAX_AGENT_SECONDS,
        help="least seconds between two changes of a node")] = 5.0,
) -> None:
    """Apply the GPU power limits m2g decides on this node; restore defaults when released."""
    if kubeconfig is not None and not kubeconfig.is_file():
        term.fail(f"no cluster: kubeconfig {kubeconfig} not found", term.CLUSTER)
    if nvml not in ("real", "fake"):
        term.fail(f"--nvml {nvml!r}: real or fake", term.USAGE)
    argv = [sys.executable, "-m", "m2g_controllers.nodeagent", "--nvml", nvml,
            "--fake-gpus", str(fake_gpus), "--interval", str(interval), "--grace", str(grace),
            "--min-interval", str(min_interval)]
    argv += ["--all-nodes"] if all_nodes else ["--node", node]
    argv += ["--read-only"] if read_only else []
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else []
    argv += ["--context", context] if context else []
    os.execv(sys.executable, argv)
