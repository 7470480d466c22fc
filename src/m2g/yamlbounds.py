"""YAML read with bounds, for every file m2g reads from a user: policies, templates, site
configuration, kubeconfigs, forecasts (docs/reliability.md).

A file larger than ``MAX_FILE_BYTES`` or not a regular file (``/dev/zero``, a FIFO: stat before
open, as a FIFO's open blocks), text that is not UTF-8, a document nested deeper than
``MAX_DEPTH`` or expanding (through aliases) to more than ``MAX_NODES`` nodes, a key given twice
in one mapping (YAML says keys are unique; PyYAML kept the last, so ``decision: Reject``
followed by ``decision: Admit`` admitted), an integer of more than ``MAX_INT_DIGITS`` digits and
a string whose escapes (``"\\0"``, ``"\\e"``, ``"\\ud800"``) make a control character or a
surrogate are refused, each with one line, before anything is built from them. YAML 1.2
booleans: only true/false (a rule named ``no`` stays a string).

This module depends on PyYAML only, so the adapters (m2g.k8s) and the policy engine share it.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

#: A policy folder's file, at most (the largest example policy is ~6 KB).
MAX_FILE_BYTES = 1 << 20
#: Nesting of mappings and lists, at most (a Policy or PolicyTest needs about 12).
MAX_DEPTH = 64
#: Nodes of one document once aliases are expanded, at most (a 564-byte alias bomb expands to
#: 10^9; the largest example document has ~400).
MAX_NODES = 100_000
#: Digits of one integer, at most (int64 has 19; Python refuses to read more than 4,300).
MAX_INT_DIGITS = 100


class BoundsError(yaml.YAMLError):
    """A document over one of the bounds above; ``line`` is 1-based."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false, so a rule named `no` stays a string)
    that refuses documents nested deeper than MAX_DEPTH while composing them (PyYAML's composer
    recurses: 300 levels are a RecursionError)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise BoundsError(mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """A mapping whose explicit keys are unique (merged ``<<`` keys may be overridden)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = (key_node.tag, key_node.value)
        if key in seen:
            raise BoundsError(key_node.start_mark.line + 1,
                              f"key {key_node.value[:80]!r} appears twice in one mapping")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _construct_int(loader: Loader, node: yaml.ScalarNode) -> Any:
    if sum(c.isdigit() for c in str(node.value)) > MAX_INT_DIGITS:
        raise BoundsError(node.start_mark.line + 1,
                          f"an integer of more than {MAX_INT_DIGITS} digits")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _construct_str(loader: Loader, node: yaml.ScalarNode) -> Any:
    value = yaml.SafeLoader.construct_yaml_str(loader, node)
    match = BAD_CHARS.search(value) if isinstance(value, str) else None
    if match is not None:
        raise BoundsError(node.start_mark.line + 1, f"an escape makes character "
                          f"U+{ord(match.group()):04X}, a control character or a surrogate "
                          "(only tab and newline may appear)")
    return value


Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
Loader.add_constructor("tag:yaml.org,2002:str", _construct_str)
Loader.construct_mapping = _construct_mapping  # type: ignore[method-assign,assignment]

Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff"
                        r"\ufffe\uffff]")



def expanded_size(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """Nodes of ``node`` with every alias expanded, computed once per distinct node (an alias
    is the same node object again), so a bomb is measured without being expanded."""
    sizes = {} if sizes is None else sizes
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_NODES + 1  # a node inside itself (a recursive alias) is too big
    total = 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            total += expanded_size(key, sizes) + expanded_size(value, sizes)
            if total > MAX_NODES:
                break
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += expanded_size(item, sizes)
            if total > MAX_NODES:
                break
    sizes[id(node)] = total
    return total


def load_all(text: str) -> list[Any]:
    """Every document of ``text`` (empty ones as None), within the bounds above. Raises
    BoundsError or yaml.YAMLError; ``problem_line`` makes either one line."""
    bad = BAD_CHARS.search(text)
    if bad is not None:
        raise BoundsError(text.count("\n", 0, bad.start()) + 1,
                          f"control character {ord(bad.group()):#04x} (only tab and newline "
                          "may appear)")
    loader = Loader(text)
    try:
        return [loader.construct_document(node) for node in bounded_nodes(loader)]
    finally:
        loader.dispose()


def bounded_nodes(loader: Loader) -> Iterator[yaml.Node]:
    """The node of each document of ``loader``'s stream; BoundsError for one that aliases
    expand past ``MAX_NODES`` (before it is constructed)."""
    while loader.check_node():
        node = loader.get_node()
        if node is None:
            continue
        if expanded_size(node) > MAX_NODES:
            raise BoundsError(node.start_mark.line + 1,
                              f"more than {MAX_NODES:,} values once aliases are expanded")
        yield node


def problem_line(exc: yaml.YAMLError) -> tuple[int, str]:
    """(1-based line, one-line problem) of a YAML error."""
    if isinstance(exc, BoundsError):
        return exc.line, exc.problem
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 1
    return line, getattr(exc, "problem", None) or str(exc).splitlines()[0]


def load_file(path: Path, limit: int = MAX_FILE_BYTES) -> list[Any]:
    """The documents of a YAML file within the bounds; ValueError (one line, without the
    path) if it cannot be read or is not YAML m2g reads."""
    text = read_bounded(path, limit)
    try:
        return load_all(text)
    except yaml.YAMLError as exc:
        line, problem = problem_line(exc)
        raise ValueError(f"invalid YAML at line {line}: {problem}") from None


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; ValueError (one line) if
    it cannot be read, is not a regular file, is larger, or is not UTF-8."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # before opening: a FIFO's open blocks
            raise ValueError("not a regular file")
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ValueError(exc.strerror or type(exc).__name__) from None
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
