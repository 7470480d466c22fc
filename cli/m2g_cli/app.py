"""The ``m2g`` command: the root typer app; each command group lives in its own module."""

from __future__ import annotations

import errno
import os
import sys
import warnings
from typing import Annotated

import typer
from typer import rich_utils

from m2g import __version__
from m2g_cli import (
    forecast_cmd,
    nodeagent_cmd,
    ops_cmd,
    policy_cmd,
    report_cmd,
    run_cmd,
    simulate_cmd,
    templates_cmd,
    term,
    topology_cmd,
)

app = typer.Typer(
    name="m2g",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Model-to-Grid: power-, thermal-, health- and grid-aware policy for Kueue and KAI.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
app.add_typer(policy_cmd.app, name="policy")
app.add_typer(templates_cmd.app, name="templates")
app.add_typer(topology_cmd.app, name="topology")
app.command("submit")(templates_cmd.submit)
app.command("simulate")(simulate_cmd.simulate)
app.command("node-agent")(nodeagent_cmd.node_agent)
ops_cmd.register(app)
app.command("run", context_settings=run_cmd.SETTINGS)(run_cmd.run)
app.command("report")(report_cmd.report)
app.command("forecast")(forecast_cmd.forecast_cmd)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"m2g {__version__}")
        raise typer.Exit()


@app.callback()
def _common(
    no_color: Annotated[bool, typer.Option(
        "--no-color", help="No colour even on a terminal (NO_COLOR=1 does the same)")] = False,
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the m2g version and exit")] = False,
) -> None:
    """Model-to-Grid: power-, thermal-, health- and grid-aware policy for Kueue and KAI."""
    term.settings.no_color = no_color


@app.command()
def version() -> None:
    """Print the m2g version."""
    typer.echo(__version__)


#: kubectl's ``--dry-run=STRATEGY`` as m2g's flags (typer has no option with an optional
#: value, so ``--dry-run`` alone stays a flag: kubectl's ``client``).
DRY_RUN = {"client": ["--dry-run"], "server": ["--server-dry-run"], "none": []}


def kubectl_forms(args: list[str]) -> list[str]:
    """``args`` with ``--dry-run=client|server|none`` spelt as m2g's flags (up to ``--``);
    ValueError with a one-line message for another strategy."""
    out: list[str] = []
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        if a.startswith("--dry-run="):
            strategy = a.split("=", 1)[1].lower()
            if strategy not in DRY_RUN:
                raise ValueError(f"--dry-run must be none, client or server, not {strategy!r}")
            out += DRY_RUN[strategy]
        else:
            out.append(a)
    return out


def usage_error(exc: Exception) -> None:
    """A usage error (an unknown option, a value typer refuses, a missing argument) as kubectl
    says one: one ``error:`` line naming the help to read, instead of typer's panel of six
    lines. Characters that are not printable (a terminal escape in an option's name) are
    shown escaped."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # the help was printed: typer's own rule
        return
    fmt = getattr(exc, "format_message", None)
    text = " ".join(str(fmt() if callable(fmt) else exc).split())
    path = getattr(getattr(exc, "ctx", None), "command_path", None)
    if path:
        text += f" (see '{path} -h')"
    print("error: " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text),
          file=sys.stderr)


def main(prog_name: str | None = None) -> None:
    """Console-script entry point."""
    # typer calls it for every usage error (its parameter is named self: a keyword mismatch)
    rich_utils.rich_format_error = usage_error  # type: ignore[assignment]
    # kr8s warns about API servers newer than it knows (1.36 here); that is noise for users.
    warnings.filterwarnings("ignore", message="Kubernetes version .* is not supported")
    try:
        args = kubectl_forms(sys.argv[1:])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if sys.stdout is None:  # started with stdout closed (`m2g ... >&-`): say so, not a traceback
        print("error: cannot write the output: stdout is closed", file=sys.stderr)
        raise SystemExit(1)
    try:
        app(args=args, prog_name=prog_name)
    except OSError as exc:
        if exc.errno not in OUTPUT_ERRNOS:
            raise
        _discard_stdout()
        where = f" {exc.filename}" if exc.filename else ""
        print(f"error: cannot write the output{where}: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(1) from None


#: What a write to a full disk, a quota, a size limit or a broken device says. A reader that
#: closes the pipe (``| head -1``, EPIPE) is click's: the command stops quietly, exit 1.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what could not be
    written does not print "Exception ignored ..." after the one error line."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def kubectl_main() -> None:
    """``kubectl-m2g``: the same commands as a kubectl plugin (``kubectl m2g ...``)."""
    main(prog_name="kubectl m2g")
