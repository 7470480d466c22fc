"""Policy variables: rewrite ``variables.NAME`` references and bind each variable once.

CEL has no let; ``[X].map(v, BODY)[0]`` binds ``v`` to ``X`` in ``BODY`` in any CEL runtime.
(cel.bind would do the same, but cel-expr-python 0.1.3 computes wrong results for a cel.bind
whose value is a comprehension following another comprehension; see docs/benchmarks.md.)
A reference ``variables.fit`` becomes the identifier ``m2g__v_fit``; an expression is wrapped in
bindings of exactly the variables it needs, in declaration order, so each is computed once per
evaluation and never textually repeated (inlining would repeat nested variables exponentially).
The scanner skips string literals, so ``'variables.x'`` stays text.
"""

from __future__ import annotations

import re

_REF = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_]*)")
_QUOTES = ("'''", '"""', "'", '"')
PREFIX = "m2g__v_"


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


def rewrite(source: str, known: set[str] | dict[str, str]) -> tuple[str, list[str]]:
    """Replace ``variables.NAME`` (NAME known, outside strings) by ``m2g__v_NAME``; return the
    new text and the names referenced, in order of first use."""
    out: list[str] = []
    used: list[str] = []
    i = 0
    while i < len(source):
        ch = source[i]
        if ch in "'\"":
            end = _string_end(source, i)
            out.append(source[i:end])
            i = end
            continue
        m = _REF.match(source, i)
        before_ok = i == 0 or not (source[i - 1].isalnum() or source[i - 1] in "_.")
        if m and before_ok and m.group(1) in known:
            out.append(PREFIX + m.group(1))
            if m.group(1) not in used:
                used.append(m.group(1))
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out), used


def bind(body: str, names: list[str], values: dict[str, str]) -> str:
    """Wrap ``body`` so that each of ``names`` (in order, outermost first) is bound."""
    for name in reversed(names):
        body = f"[{values[name]}].map({PREFIX}{name}, {body})[0]"
    return body


class Variables:
    """A policy's variables, in declaration order: their rewritten text and dependencies."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.bare: dict[str, str] = {}
        self.deps: dict[str, set[str]] = {}

    def add(self, name: str, source: str) -> None:
        bare, used = rewrite(source, self.bare)
        closure = set(used)
        for u in used:
            closure |= self.deps[u]
        self.order.append(name)
        self.bare[name] = bare
        self.deps[name] = closure

    def prepare(self, source: str) -> tuple[str, str]:
        """(the text to compile alone, with its variables bound; the bare rewritten text)."""
        bare, used = rewrite(source, self.bare)
        needed = set(used)
        for u in used:
            needed |= self.deps[u]
        return bind(bare, [n for n in self.order if n in needed], self.bare), bare

    def bind_all(self, body: str) -> str:
        """``body`` with every variable bound (the batch form)."""
        return bind(body, self.order, self.bare)
