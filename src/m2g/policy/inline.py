"""Inline ``variables.<name>`` references into an expression's source.

Evaluating a policy's variables into a fresh activation per policy would convert the whole input
again for every policy; inlining each variable as a parenthesised sub-expression keeps one
activation per decision. The scanner skips string literals, so ``'variables.x'`` stays text.
"""

from __future__ import annotations

import re

_IDENT = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_]*)")
_QUOTES = ("'''", '"""', "'", '"')


def _string_end(source: str, i: int) -> int:
    """Index just past the string literal starting at ``i`` (which holds a quote)."""
    raw = i > 0 and source[i - 1] in "rR"
    quote = next(q for q in _QUOTES if source.startswith(q, i))
    j = i + len(quote)
    while j < len(source):
        if not raw and source[j] == "\\":
            j += 2
            continue
        if source.startswith(quote, j):
            return j + len(quote)
        j += 1
    return len(source)


def inline_variables(source: str, values: dict[str, str]) -> str:
    """Replace each ``variables.NAME`` outside string literals with ``(values[NAME])``."""
    out: list[str] = []
    i = 0
    while i < len(source):
        ch = source[i]
        if ch in "'\"":
            end = _string_end(source, i)
            out.append(source[i:end])
            i = end
            continue
        m = _IDENT.match(source, i)
        before_ok = i == 0 or not (source[i - 1].isalnum() or source[i - 1] in "_.")
        if m and before_ok and m.group(1) in values:
            out.append(f"({values[m.group(1)]})")
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)
