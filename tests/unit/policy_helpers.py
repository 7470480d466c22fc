"""Helpers to write small policy folders for engine tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from m2g.policy import Evaluator, PolicySet, load_dir

HEADER = "apiVersion: m2g.io/v1alpha1\nkind: Policy\n"


def policy(name: str, stage: str, rules: str, extra: str = "", priority: int = 100) -> str:
    """A policy document with the given rules block (YAML, indented by the caller's dedent)."""
    body = textwrap.indent(textwrap.dedent(rules).strip(), "    ")
    extra_block = textwrap.indent(textwrap.dedent(extra).strip(), "  ") + "\n" if extra else ""
    return (f"{HEADER}metadata: {{name: {name}}}\nspec:\n  stage: {stage}\n"
            f"  priority: {priority}\n{extra_block}  rules:\n{body}\n")


def write(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp


def evaluator(tmp: Path, engine: str, files: dict[str, str]) -> Evaluator:
    pset: PolicySet = load_dir(write(tmp, files), engine)
    return Evaluator(pset)
