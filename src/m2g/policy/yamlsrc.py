"""Reading YAML with line numbers, so every problem can point at FILE:LINE.

Bounded (docs/reliability.md): a file larger than ``MAX_FILE_BYTES``, a document nested deeper
than ``MAX_DEPTH`` or expanding (through aliases) to more than ``MAX_NODES`` nodes is one Problem,
found before anything is built from it; so is a file that is not a regular file (``/dev/zero``,
a FIFO), a symlink loop, or text that is not UTF-8 or holds control characters.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from m2g.policy.errors import Problem

PathKey = tuple[str | int, ...]

#: A policy folder's file, at most (the largest example policy is ~6 KB).
MAX_FILE_BYTES = 1 << 20
#: Nesting of mappings and lists, at most (a Policy or PolicyTest needs about 12).
MAX_DEPTH = 64
#: Nodes of one document once aliases are expanded, at most (a 564-byte alias bomb expands to
#: 10^9; the largest example document has ~400).
MAX_NODES = 100_000


class BoundsError(yaml.YAMLError):
    """A document over one of the bounds above; ``line`` is 1-based."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


class _Loader(yaml.SafeLoader):
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


_Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


@dataclass(frozen=True)
class SourceDoc:
    """One YAML document of a file, its data, and the line of every key and list item."""

    file: str
    data: Any
    start_line: int
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line_of(self, path: PathKey) -> int:
        """The line of the deepest known prefix of ``path`` (1-based)."""
        for n in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return self.start_line


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


def _walk(node: yaml.Node, path: PathKey, out: dict[PathKey, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, str(key.value))
            out[sub] = key.start_mark.line + 1
            _walk(value, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            sub = (*path, i)
            out[sub] = item.start_mark.line + 1
            _walk(item, sub, out)


def _check_text(text: str) -> tuple[int, str] | None:
    """(line, problem) for the first character YAML and Kubernetes refuse, else None."""
    match = _BAD_CHARS.search(text)
    if match is None:
        return None
    line = text.count("\n", 0, match.start()) + 1
    return line, f"control character {ord(match.group()):#04x} (only tab and newline may appear)"


_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff"
                        r"\ufffe\uffff]")


def parse_documents(text: str, file: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Parse every document of a YAML stream; a syntax error is one Problem for the file."""
    docs: list[SourceDoc] = []
    bad = _check_text(text)
    if bad is not None:
        return [], [Problem(file, bad[0], "", "", f"invalid YAML: {bad[1]}")]
    loader = None
    try:
        loader = _Loader(text)  # its reader refuses unprintable characters here already
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if expanded_size(node) > MAX_NODES:
                raise BoundsError(node.start_mark.line + 1,
                                  f"more than {MAX_NODES:,} values once aliases are expanded")
            lines: dict[PathKey, int] = {}
            _walk(node, (), lines)
            data = loader.construct_document(node)
            docs.append(SourceDoc(file, data, node.start_mark.line + 1, lines))
    except BoundsError as exc:
        return [], [Problem(file, exc.line, "", "", f"invalid YAML: {exc.problem}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return [], [Problem(file, line, "", "", f"invalid YAML: {problem}")]
    finally:
        if loader is not None:
            loader.dispose()
    return docs, []


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


def read_documents(path: Path, display: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Read and parse a file; an unreadable file is a Problem, not an exception."""
    try:
        text = read_bounded(path)
    except ValueError as exc:
        return [], [Problem(display, 1, "", "", f"cannot read file: {exc}")]
    return parse_documents(text, display)
