"""Reading YAML with line numbers, so every problem can point at FILE:LINE."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from m2g.policy.errors import Problem

PathKey = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans: only true/false, so a rule named `no` stays a string."""


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


def parse_documents(text: str, file: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Parse every document of a YAML stream; a syntax error is one Problem for the file."""
    docs: list[SourceDoc] = []
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[PathKey, int] = {}
            _walk(node, (), lines)
            data = loader.construct_document(node)
            docs.append(SourceDoc(file, data, node.start_mark.line + 1, lines))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return [], [Problem(file, line, "", "", f"invalid YAML: {problem}")]
    finally:
        loader.dispose()
    return docs, []


def read_documents(path: Path, display: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Read and parse a file; an unreadable file is a Problem, not an exception."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [Problem(display, 1, "", "", f"cannot read file: {exc}")]
    return parse_documents(text, display)
