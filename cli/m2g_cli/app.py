"""The ``m2g`` command: the root typer app; each command group lives in its own module."""

from __future__ import annotations

import warnings
from typing import Annotated

import typer

from m2g import __version__
from m2g_cli import ops_cmd, policy_cmd, run_cmd, simulate_cmd, templates_cmd, term

app = typer.Typer(
    name="m2g",
    help="Model-to-Grid: power-, thermal-, health- and grid-aware policy for Kueue and KAI.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
app.add_typer(policy_cmd.app, name="policy")
app.add_typer(templates_cmd.app, name="templates")
app.command("submit")(templates_cmd.submit)
app.command("simulate")(simulate_cmd.simulate)
ops_cmd.register(app)
app.command("run", context_settings=run_cmd.SETTINGS)(run_cmd.run)


@app.callback()
def _common(no_color: Annotated[bool, typer.Option(
        "--no-color", help="No colour even on a terminal (NO_COLOR=1 does the same)")] = False
            ) -> None:
    """Model-to-Grid: power-, thermal-, health- and grid-aware policy for Kueue and KAI."""
    term.settings.no_color = no_color


@app.command()
def version() -> None:
    """Print the m2g version."""
    typer.echo(__version__)


def main() -> None:
    """Console-script entry point."""
    # kr8s warns about API servers newer than it knows (1.36 here); that is noise for users.
    warnings.filterwarnings("ignore", message="Kubernetes version .* is not supported")
    app()
