"""Resource names given on the command line, checked before any API call (as kubectl does):
a namespace is a DNS-1123 label (at most 63 characters: a-z, 0-9, '-'), an object name a
DNS-1123 subdomain (at most 253: also '.'). A bad one is one line, exit code 2."""

from __future__ import annotations

import re

from m2g_cli import term

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def problem(value: str, namespace: bool = False) -> str | None:
    """Why ``value`` is not a namespace (``namespace``) or an object name, or None."""
    limit, pattern = (63, _LABEL) if namespace else (253, _SUBDOMAIN)
    if len(value) > limit:
        return f"longer than {limit} characters ({len(value)})"
    if not pattern.fullmatch(value):
        return ("not a DNS-1123 " + ("label" if namespace else "subdomain")
                + " (lower-case letters, digits, '-'" + ("" if namespace else ", '.'") + ")")
    return None


def check(value: str | None, what: str, namespace: bool = False) -> None:
    """Exit 2 with one line when ``value`` (if given) is not a valid name."""
    if value is None:
        return
    why = problem(value, namespace)
    if why:
        shown = value if len(value) <= 60 else value[:60] + "..."
        term.fail(f"{what} {shown!r} is {why}", term.USAGE)
