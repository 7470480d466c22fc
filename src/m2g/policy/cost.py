"""A static bound on the memory one evaluation of a CEL expression can allocate.

Neither engine bounds what an evaluation allocates: both stop after 10,000 comprehension steps
(m2g.policy.celpy_budget), but a string concatenation copies its operands, so 14 policy
variables that each double the last (``variables.v1 + variables.v1``) build an 80 MB string from
a 10 KB literal, and a 10 KB literal concatenated inside a 99 × 99 nested ``map`` allocates
~90 MB. cel-expr-python keeps what an evaluation allocates on the snapshot's activation until
the snapshot is done, so a lint-clean Policy of 9.6 KB took 2.4 GB for 16 workloads in
``m2g policy eval`` (and the controller runs in 1 GiB): the controller would be OOM-killed
every reconcile (issue 11, "batch memory bounded").

``estimate`` parses the expression (CEL's grammar, without type checking) and bounds, per
evaluation, the bytes its string, bytes and list values can occupy (``size``) and the bytes all
of its sub-expressions allocate together (``alloc``):

* a literal is its length; an input value (``workload.name``, an iteration variable, ...) is
  at most ``INPUT_BYTES`` (Kubernetes names are at most 253 characters, label values 63);
* ``a + b`` allocates ``size(a) + size(b)``; a conversion or function call allocates the size
  of its arguments; a list or map literal the sum of its elements;
* inside a comprehension's body, everything counts ``ITERATIONS`` times (the budget is shared
  by nested comprehensions, so nesting does not multiply it again), and a ``map`` result
  holds ``ITERATIONS`` values of its body's size; over a list literal of n items, a ``map`` or
  ``filter`` also copies its result list at every step (cel-expr-python 0.1.3: n² slots;
  ``[0,0,...]`` of 5,000 items mapped took 400 MB). Over an input list the length is the
  site's (1,400 racks: 15 MB), not the policy's: the batch drops the activation instead
  (m2g.policy.batch.caches.RETAIN_BYTES);
* ``variables.NAME`` has its variable's size; each variable an expression needs allocates once
  per evaluation (m2g.policy.inline binds each once).

An expression whose bound exceeds ``MAX_ALLOC`` is refused by the compiler, with both numbers
(``may allocate 1.2 GiB in one evaluation (bound 16 MiB)``), as any other problem: lint fails,
the controller leaves that Policy out. The bound is an over-estimate by design; the shipped
policies stay far below it (tests/unit/test_policy_cost.py prints their largest).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Comprehension steps per evaluation (both engines; m2g.policy.celpy_budget.ITERATION_BUDGET).
ITERATIONS = 10_000
#: The bytes an input value stands for.
INPUT_BYTES = 256
#: A list slot or a scalar.
WORD = 16
#: Above this, an expression is refused.
MAX_ALLOC = 16 << 20

_MACROS = {"map", "filter", "all", "exists", "exists_one"}
_SMALL = {"size", "int", "uint", "double", "bool", "has", "matches", "startsWith", "endsWith",
          "contains", "timestamp", "duration", "type", "getSeconds", "getMinutes", "getHours",
          "getDate", "getDayOfWeek", "getDayOfMonth", "getDayOfYear", "getMonth",
          "getFullYear", "getMilliseconds", "min", "max", "math.least", "math.greatest"}

_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:'''|\"\"\"|'|"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*|`[^`\n]*`)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%<>!?:.,()\[\]{}])
""", re.VERBOSE)


class CostError(ValueError):
    """The text is not CEL this parser reads (the engine reports real syntax errors)."""


@dataclass(frozen=True)
class Cost:
    """Bytes a value can occupy, and bytes an evaluation can allocate."""

    size: int
    alloc: int
    #: A number or a bool (``+`` of a number adds, it copies nothing).
    scalar: bool = False
    #: The length of a list literal (a comprehension over it copies its result list at every
    #: step in cel-expr-python 0.1.3: length² / 2 slots).
    length: int = 0

    def describe(self) -> str:
        return human(self.alloc)


def human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _string_length(source: str, i: int, prefix: str) -> tuple[int, int]:
    """(index past the literal starting at ``i``, its length in characters, roughly)."""
    j = i + len(prefix)
    raw = "r" in prefix.lower()
    quote = prefix.lstrip("rRbB")
    while j < len(source):
        if not raw and source[j] == "\\":
            j += 2
            continue
        if source.startswith(quote, j):
            return j + len(quote), j - i - len(prefix)
        j += 1
    raise CostError("unterminated string")


def tokens(source: str) -> list[tuple[str, str, int]]:
    """(kind, text, literal length) of every token."""
    out: list[tuple[str, str, int]] = []
    i = 0
    while i < len(source):
        m = _TOKEN.match(source, i)
        if not m:
            raise CostError(f"unexpected character {source[i]!r}")
        kind = m.lastgroup or ""
        if kind == "string":
            end, length = _string_length(source, i, m.group("string"))
            out.append(("string", source[i:end], length))
            i = end
            continue
        if kind != "space":
            out.append((kind, m.group(kind), 0))
        i = m.end()
    return out


class _Parser:
    """Recursive descent over CEL's grammar, computing Costs as it goes (no tree is built)."""

    def __init__(self, source: str, variable: Callable[[str], Cost | None]) -> None:
        self.toks = tokens(source)
        self.i = 0
        self.variable = variable
        self.mult = 1
        self.depth = 0

    # ---- token helpers
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.toks[j][1] if j < len(self.toks) else ""

    def kind(self) -> str:
        return self.toks[self.i][0] if self.i < len(self.toks) else ""

    def take(self, text: str | None = None) -> tuple[str, str, int]:
        if self.i >= len(self.toks) or (text is not None and self.toks[self.i][1] != text):
            raise CostError(f"expected {text!r}")
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def alloc(self, n: int) -> int:
        return n * self.mult

    # ---- grammar
    def parse(self) -> Cost:
        cost = self.expr()
        if self.i != len(self.toks):
            raise CostError("trailing tokens")
        return cost

    def expr(self) -> Cost:
        self.depth += 1
        if self.depth > 400:
            raise CostError("nested too deeply")
        c = self.or_()
        if self.peek() == "?":
            self.take("?")
            a = self.or_() if self.peek() != "?" else self.expr()
            self.take(":")
            b = self.expr()
            c = Cost(max(a.size, b.size), c.alloc + a.alloc + b.alloc)
        self.depth -= 1
        return c

    def _binary(self, ops: tuple[str, ...], sub: Callable[[], Cost], concat: bool = False
                ) -> Cost:
        c = sub()
        while (self.peek() in ops and self.kind() == "op") or (
                "in" in ops and self.peek() == "in" and self.kind() == "ident"):
            op = self.take()[1]
            d = sub()
            if concat and op == "+" and not (c.scalar or d.scalar):
                size = c.size + d.size
                c = Cost(size, c.alloc + d.alloc + self.alloc(size))
            else:
                c = Cost(WORD, c.alloc + d.alloc, scalar=True)
        return c

    def or_(self) -> Cost:
        return self._binary(("||",), self.and_)

    def and_(self) -> Cost:
        return self._binary(("&&",), self.rel)

    def rel(self) -> Cost:
        return self._binary(("<", "<=", ">", ">=", "==", "!=", "in"), self.add)

    def add(self) -> Cost:
        return self._binary(("+", "-"), self.mul, concat=True)

    def mul(self) -> Cost:
        return self._binary(("*", "/", "%"), self.unary)

    def unary(self) -> Cost:
        if self.peek() in ("!", "-") and self.kind() == "op":
            self.take()
            self.depth += 1
            if self.depth > 400:
                raise CostError("nested too deeply")
            c = self.unary()
            self.depth -= 1
            return Cost(WORD, c.alloc, scalar=True)
        return self.member()

    def member(self) -> Cost:
        c, name = self.primary()
        while self.peek() in (".", ".?", "[", "[?") and self.kind() == "op":
            op = self.take()[1]
            if op in (".", ".?"):
                field = self.take()[1]
                if self.peek() == "(":
                    c = self.call(field, c)
                    name = ""
                    continue
                if self.peek() == "{":  # a message literal: pkg.Name{field: value, ...}
                    c, _ = self.primary()
                    name = ""
                    continue
                if name == "variables":
                    var = self.variable(field)
                    c = Cost(var.size, 0, var.scalar) if var is not None else \
                        Cost(INPUT_BYTES, 0)
                else:
                    c = Cost(max(INPUT_BYTES, c.size), c.alloc)
                name = ""
            else:
                idx = self.expr()
                self.take("]")
                c = Cost(max(INPUT_BYTES, c.size), c.alloc + idx.alloc)
                name = ""
        return c

    def primary(self) -> tuple[Cost, str]:
        kind, text, length = self.take()
        if kind == "string":
            return Cost(length, 0), ""
        if kind == "number":
            return Cost(WORD, 0, scalar=True), ""
        if kind == "ident":
            if self.peek() == "(":
                return self.call(text, None), ""
            if text in ("true", "false", "null"):
                return Cost(WORD, 0, scalar=True), text
            if self.peek() == "{":  # a message literal: Name{field: value, ...}
                return self.primary()[0], ""
            return Cost(INPUT_BYTES, 0), text
        if text == ".":  # a leading-dot identifier
            return self.primary()
        if text == "(":
            c = self.expr()
            self.take(")")
            return c, ""
        if text in ("[", "{"):
            close = "]" if text == "[" else "}"
            size = alloc = 0
            n = 0
            while self.peek() != close:
                if self.peek() == "?":
                    self.take("?")
                e = self.expr()
                size, alloc = size + e.size, alloc + e.alloc
                if close == "}":
                    self.take(":")
                    v = self.expr()
                    size, alloc = size + v.size, alloc + v.alloc
                n += 1
                if self.peek() == ",":
                    self.take(",")
                else:
                    break
            self.take(close)
            size += WORD * n
            return Cost(size, alloc + self.alloc(WORD * n), length=n if close == "]" else 0), ""
        raise CostError(f"unexpected {text!r}")

    def args(self) -> list[Cost]:
        self.take("(")
        out: list[Cost] = []
        while self.peek() != ")":
            out.append(self.expr())
            if self.peek() == ",":
                self.take(",")
            else:
                break
        self.take(")")
        return out

    def call(self, name: str, receiver: Cost | None) -> Cost:
        if receiver is not None and name in _MACROS:
            return self.macro(name, receiver)
        args = self.args()
        if self.peek() == "{":  # a message literal Name{...}: read as a map
            inner, _ = self.primary()
            args.append(inner)
        parts = ([receiver] if receiver is not None else []) + args
        alloc = sum(p.alloc for p in parts)
        if name in _SMALL:
            return Cost(WORD, alloc, scalar=name not in ("timestamp", "duration", "type"))
        size = sum(p.size for p in parts) + WORD
        return Cost(size, alloc + self.alloc(size))

    def macro(self, name: str, receiver: Cost) -> Cost:
        self.take("(")
        self.take()  # the iteration variable
        if self.peek() == "," and self.peek(2) == ",":  # a two-variable comprehension
            self.take(",")
            self.take()
        outer, self.mult = self.mult, ITERATIONS
        parts: list[Cost] = []
        while self.peek() == ",":
            self.take(",")
            parts.append(self.expr())
        self.take(")")
        self.mult = outer
        body_alloc = sum(p.alloc for p in parts)
        steps = min(ITERATIONS, receiver.length) if receiver.length else ITERATIONS
        # the result list copied at every step (map, filter) of a list of known length
        slots = ITERATIONS * WORD + (steps * steps * WORD if receiver.length else 0)
        if name == "map":
            body = parts[-1].size if parts else WORD
            size = min(ITERATIONS * body, MAX_ALLOC * 64)
            return Cost(size, receiver.alloc + body_alloc + slots)
        if name == "filter":
            return Cost(receiver.size, receiver.alloc + body_alloc + slots)
        return Cost(WORD, receiver.alloc + body_alloc, scalar=True)


def estimate(source: str, variable: Callable[[str], Cost | None] | None = None) -> Cost:
    """The Cost of ``source``; ``variable(name)`` is the Cost of ``variables.name`` (its size;
    its alloc is counted by the caller, once per evaluation). Raises CostError when the text
    is not CEL this parser reads."""
    try:
        return _Parser(source, variable or (lambda _: None)).parse()
    except RecursionError:  # 5,000 "!" in a row: the engines refuse it too
        raise CostError("nested too deeply") from None


_VARIABLE = re.compile(r"variables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


def crude(source: str, variable: Callable[[str], Cost | None] | None = None) -> Cost:
    """A bound for text ``estimate`` cannot read: every byte of it plus the size of each
    variable reference, ``ITERATIONS`` times over when it has a comprehension (so syntax this
    parser does not know cannot hide a doubling variable)."""
    loops = any(f".{m}(" in "".join(source.split()) for m in _MACROS)
    refs = 0
    for m in _VARIABLE.finditer(source):
        var = variable(m.group(1)) if variable is not None else None
        refs += var.size if var is not None else INPUT_BYTES
    n = (len(source) + INPUT_BYTES + refs) * (ITERATIONS if loops else 1)
    return Cost(n, n)


def total(own: Cost, needed: Mapping[str, Cost]) -> int:
    """An expression's allocation: its own and that of each variable it needs, once."""
    return own.alloc + sum(c.alloc for c in needed.values())
