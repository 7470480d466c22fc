"""Reading YAML with line numbers, so every problem can point at FILE:LINE.

The bounds (size, regular files, UTF-8, nesting, aliases, duplicate keys, huge integers,
escaped control characters) are m2g.yamlbounds'; this module adds the source position of every
key and list item and turns each refusal into one Problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from m2g.policy.errors import Problem
from m2g.yamlbounds import (
    BAD_CHARS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_INT_DIGITS,
    MAX_NODES,
    BoundsError,
    Loader,
    bounded_nodes,
    expanded_size,
    read_bounded,
)

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_INT_DIGITS", "MAX_NODES", "BoundsError",
           "PathKey", "SourceDoc", "expanded_size", "parse_documents", "read_bounded",
           "read_documents"]

PathKey = tuple[str | int, ...]


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


def _check_text(text: str) -> tuple[int, str] | None:
    """(line, problem) for the first character YAML and Kubernetes refuse, else None."""
    match = BAD_CHARS.search(text)
    if match is None:
        return None
    line = text.count("\n", 0, match.start()) + 1
    return line, f"control character {ord(match.group()):#04x} (only tab and newline may appear)"


def parse_documents(text: str, file: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Parse every document of a YAML stream; a syntax error is one Problem for the file."""
    docs: list[SourceDoc] = []
    bad = _check_text(text)
    if bad is not None:
        return [], [Problem(file, bad[0], "", "", f"invalid YAML: {bad[1]}")]
    loader = None
    try:
        loader = Loader(text)  # its reader refuses unprintable characters here already
        for node in bounded_nodes(loader):
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


def read_documents(path: Path, display: str) -> tuple[list[SourceDoc], list[Problem]]:
    """Read and parse a file; an unreadable file is a Problem, not an exception."""
    try:
        text = read_bounded(path)
    except ValueError as exc:
        return [], [Problem(display, 1, "", "", f"cannot read file: {exc}")]
    return parse_documents(text, display)
