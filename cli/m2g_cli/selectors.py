"""Label selectors as kubectl reads them (``-l/--selector``): pure parsing and matching.

Equality-based (``key=value``, ``key==value``, ``key!=value``), set-based (``key in (a,b)``,
``key notin (a,b)``), existence (``key``, ``!key``); requirements separated by commas are ANDed.
A selector that cannot be read raises ``SelectorError`` with one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Matcher = Callable[[Mapping[str, str]], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


class SelectorError(ValueError):
    """A selector that cannot be read."""


def _split(selector: str) -> list[str]:
    """Requirements split at the commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            raise SelectorError(f"selector {selector!r}: unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise SelectorError(f"selector {selector!r}: unbalanced '('")
    return [*parts, cur]


def _requirement(text: str) -> Matcher:
    if m := _SET.match(text):
        key, op = m.group(1), m.group(2)
        values = {v.strip() for v in m.group(3).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ.match(text):
        key, op, value = m.group(1), m.group(2), m.group(3)
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS.match(text):
        neg, key = m.group(1) == "!", m.group(2)
        return (lambda labels: key not in labels) if neg else (lambda labels: key in labels)
    raise SelectorError(f"cannot read selector requirement {text.strip()!r}")


def parse_selector(selector: str | None) -> Matcher:
    """A matcher for ``selector`` (None or "": everything matches)."""
    if not selector or not selector.strip():
        return lambda labels: True
    reqs = [_requirement(part) for part in _split(selector)]
    return lambda labels: all(r(labels) for r in reqs)
