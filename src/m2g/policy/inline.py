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
from collections.abc import Callable

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


def _replace(source: str, pattern: re.Pattern[str], names: set[str] | dict[str, str],
             make: Callable[[str], str]) -> tuple[str, list[str]]:
    """Replace each match of ``pattern`` (group 1 in ``names``, outside string literals and
    not part of a longer name or selection) by ``make(name)``; return the text and the names
    replaced, in order of first use."""
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
        m = pattern.match(source, i)
        before_ok = i == 0 or not (source[i - 1].isalnum() or source[i - 1] in "_.")
        if m and before_ok and m.group(1) in names:
            out.append(make(m.group(1)))
            if m.group(1) not in used:
                used.append(m.group(1))
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out), used


def rewrite(source: str, known: set[str] | dict[str, str]) -> tuple[str, list[str]]:
    """Replace ``variables.NAME`` (NAME known, outside strings) by ``m2g__v_NAME``; return the
    new text and the names referenced, in order of first use."""
    return _replace(source, _REF, known, lambda name: PREFIX + name)


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


_USED = re.compile(PREFIX + r"([A-Za-z_][A-Za-z0-9_]*)")


def strip_strings(source: str) -> str:
    """``source`` with the contents of its string literals removed (to look for identifiers)."""
    out: list[str] = []
    i = 0
    while i < len(source):
        if source[i] in "'\"":
            end = _string_end(source, i)
            out.append("''")
            i = end
            continue
        out.append(source[i])
        i += 1
    return "".join(out)


def mentions(source: str, names: tuple[str, ...]) -> bool:
    """Whether ``source`` uses any of the identifiers ``names`` (outside string literals)."""
    code = strip_strings(source)
    return any(re.search(rf"(?<![\w.]){re.escape(n)}\b", code) for n in names)


def needed(bare: str, variables: Variables) -> set[str]:
    """The variables a bare (rewritten, unbound) text needs, with their dependencies."""
    out: set[str] = set()
    for name in _USED.findall(strip_strings(bare)):
        if name in variables.deps:
            out |= {name} | variables.deps[name]
    return out


def substitute(source: str, mapping: dict[str, str]) -> str:
    """Replace the identifiers ``m2g__v_NAME`` (outside string literals) by ``mapping[NAME]``."""
    if not mapping:
        return source
    return _replace(source, _USED, mapping, mapping.__getitem__)[0]


def bind_grouped(body: str, names: set[str], variables: Variables, tag: str,
                 fixed: dict[str, str] | None = None) -> str:
    """``body`` with ``names`` bound, variables that do not depend on each other bound together
    (``[[A, B]].map(m2g__TAG0, ...)[0]``, read as ``m2g__TAG0[1]``): one nesting level per
    level of dependency, not per variable, for cel-expr-python's parser (32 levels at most;
    each binding takes two). ``fixed`` maps variables computed elsewhere to the text that
    reads them (hoisted variables: m2g.policy.batch)."""
    fixed = fixed or {}
    names = names - fixed.keys()
    levels: dict[str, int] = {}
    for name in variables.order:
        if name in names:
            below = [levels[d] + 1 for d in variables.deps[name] if d in levels]
            levels[name] = max(below, default=0)
    groups = [[n for n in variables.order if levels.get(n) == lv]
              for lv in range(max(levels.values(), default=-1) + 1)]
    mapping = {**fixed, **{n: f"m2g__{tag}{lv}[{i}]" for lv, g in enumerate(groups)
                           if len(g) > 1 for i, n in enumerate(g)}}
    body = substitute(body, mapping)
    for lv in reversed(range(len(groups))):
        group = groups[lv]
        texts = [substitute(variables.bare[n], mapping) for n in group]
        if len(group) == 1:
            body = f"[{texts[0]}].map({PREFIX}{group[0]}, {body})[0]"
        else:
            body = f"[[{', '.join(texts)}]].map(m2g__{tag}{lv}, {body})[0]"
    return body
