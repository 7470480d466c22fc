"""The terminal: when to colour, when to show progress, and one-line errors with exit codes.

Colour only on a terminal, never with ``NO_COLOR`` set (https://no-color.org) or ``--no-color``.
A spinner for slow calls goes to stderr, and only when stderr is a terminal, so pipes, scripts
and golden files see exactly the same output with or without it.

Exit codes, the same for every command (docs/cli.md): 0 ok; 1 the cluster or the policies
failed (no cluster, Kueue CRDs missing, forbidden, a rejected create, policies that do not
load); 2 the user's input is wrong (unknown workload or template, bad --set or option).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TextIO, TypeVar

import typer

T = TypeVar("T")

OK, CLUSTER, USAGE = 0, 1, 2


class _Settings:
    no_color = False


settings = _Settings()


def color(stream: TextIO | None = None) -> bool:
    """Colour for ``stream`` (stdout by default)?"""
    if settings.no_color or os.environ.get("NO_COLOR"):
        return False
    return _isatty(stream or sys.stdout)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def fail(message: str, code: int) -> NoReturn:
    """``error: message`` on stderr (red on a terminal) and exit ``code``."""
    prefix = typer.style("error:", fg="red", bold=True) if color(sys.stderr) else "error:"
    typer.echo(f"{prefix} {message}", err=True, color=color(sys.stderr))
    raise typer.Exit(code)


def run_async(coro: Coroutine[Any, Any, T], what: str) -> T:
    """``asyncio.run(coro)`` with a spinner saying ``what`` on an interactive stderr."""
    if not _isatty(sys.stderr):
        return asyncio.run(coro)
    from rich.console import Console

    console = Console(stderr=True, no_color=not color(sys.stderr))
    with console.status(f"{what}…", spinner="dots"):
        return asyncio.run(coro)
