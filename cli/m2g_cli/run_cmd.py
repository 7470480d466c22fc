"""``m2g run`` — start the m2g controllers (the product's main job).

The controllers live in ``m2g_controllers.run``; the CLI hands over to it with ``exec`` (the
CLI and the controllers are independent layers), so signals and the exit code are the
controller's own. Every option is passed through; ``m2g run --help`` shows them all.
"""

from __future__ import annotations

import os
import sys

import typer


def run(ctx: typer.Context) -> None:
    """Run the controllers: AdmissionCheck, capacity, shedding and fairness (see --help)."""
    argv = [sys.executable, "-m", "m2g_controllers.run", *ctx.args]
    os.execv(sys.executable, argv)


SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
