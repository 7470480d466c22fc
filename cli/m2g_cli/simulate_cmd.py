"""``m2g simulate`` — run the factory telemetry simulator against a cluster's KWOK nodes.

Serves ``/metrics`` (DCGM_FI_DEV_* per GPU, ``m2g_sim_*`` per rack and power domain) for a
Prometheus to scrape, and ``/faults`` for fault injection (docs/signals.md). The exporter lives
in ``m2g_controllers.simulator``; the CLI runs it as ``python -m`` (the CLI and the controllers
are independent layers). Exit codes: 0 on Ctrl-C / SIGTERM, 2 when the kubeconfig is missing,
the cluster cannot be reached or the port cannot be bound — one line each.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from m2g_cli import term


def simulate(
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")] = None,
    context: Annotated[str | None, typer.Option("--context", help="kubeconfig context")] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="HTTP port for /metrics and /faults")] = 9400,
    interval: Annotated[float, typer.Option("--interval", min=0.1, max=3600.0,
                                            help="seconds between model steps")] = 5.0,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    config: Annotated[Path | None, typer.Option(
        "--config", help="site configuration: its topology.labels name the rack, block and "
        "power-domain node labels (default: GFD's clique, Topograph's rack and block)")] = None,
) -> None:
    """Simulate GPU power/temperature and rack/power-domain kW for the cluster's KWOK nodes."""
    if kubeconfig is not None and not kubeconfig.is_file():
        term.fail(f"no cluster: kubeconfig {kubeconfig} not found", term.CLUSTER)
    argv = [sys.executable, "-m", "m2g_controllers.simulator", "--host", host,
            "--port", str(port), "--interval", str(interval)]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    if context:
        argv += ["--context", context]
    if config is not None:
        argv += ["--config", str(config)]
    # exec, not a child process: a SIGTERM to `m2g simulate` must reach the simulator itself
    os.execv(sys.executable, argv)
