"""Read WorkloadTemplate files: the only module of m2g.templates that touches the disk.

The shipped recipes live in the repository's ``templates/`` folder (package data in an
installed wheel, m2g.shipped); ``M2G_TEMPLATES`` (a folder) or an explicit path overrides it.
Each template is checked on load: its schema, its parameter declarations against the
catalogue, and a trial render with its own defaults. Files are read with the policy loader's
bounds (m2g.policy.yamlsrc: size, regular files only, UTF-8, nesting, aliases, duplicate keys):
a FIFO in the folder hung ``m2g templates list``, ``/dev/zero`` ran out of memory and deep
nesting was a RecursionError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from m2g.policy.yamlsrc import parse_documents, read_bounded
from m2g.shipped import TEMPLATES, shipped_dir
from m2g.templates.errors import TemplateError
from m2g.templates.params import CATALOGUE
from m2g.templates.render import render
from m2g.templates.schema import WorkloadTemplate

ENV_DIR = "M2G_TEMPLATES"


def default_dir() -> Path:
    """``$M2G_TEMPLATES``, else the shipped templates (the checkout's or the wheel's)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    return shipped_dir(TEMPLATES)


def parse(text: str, source: str) -> WorkloadTemplate | None:
    """One YAML document → a checked template; None for documents of other API groups
    (e.g. the WorkloadPriorityClasses shipped next to the templates)."""
    docs = _documents(text, source)
    data = docs[0] if len(docs) == 1 else docs
    if not isinstance(data, dict):
        raise TemplateError(f"{source}: expected a WorkloadTemplate mapping")
    if not str(data.get("apiVersion", "")).startswith("m2g.io/"):
        return None
    try:
        doc = WorkloadTemplate.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "document"
        raise TemplateError(f"{source}: {where}: {err['msg']}") from None
    check(doc, source)
    return doc


def _documents(text: str, source: str) -> list[Any]:
    """The YAML documents of ``text`` but empty ones; TemplateError (one line) if it is not
    YAML m2g reads."""
    docs, problems = parse_documents(text, source)
    if problems:
        raise TemplateError(f"{source}: not YAML: "
                            f"{problems[0].message.removeprefix('invalid YAML: ')} "
                            f"(line {problems[0].line})")
    return [d.data for d in docs if d.data is not None]


def check(doc: WorkloadTemplate, source: str) -> None:
    """Declared parameters exist and fit the shape; the defaults render."""
    for key in doc.spec.parameters:
        knob = CATALOGUE.get(key)
        if knob is None:
            raise TemplateError(f"{source}: parameters.{key}: not a known parameter")
        if knob.shapes is not None and doc.spec.shape not in knob.shapes:
            raise TemplateError(f"{source}: parameters.{key}: does not apply to "
                                f"{doc.spec.shape.value} templates")
    try:
        render(doc)
    except TemplateError as exc:
        raise TemplateError(f"{source}: defaults do not render: {exc}") from None


def load_file(path: Path) -> WorkloadTemplate | None:
    """The template in ``path``; None if the file holds only documents of other API groups."""
    try:
        text = read_bounded(path)
    except ValueError as exc:
        raise TemplateError(f"cannot read {path}: {exc}") from None
    docs = _documents(text, str(path))
    if not any(isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("m2g.io/")
               for d in docs):
        return None
    if len(docs) != 1:
        raise TemplateError(f"{path}: put one WorkloadTemplate per file")
    return parse(text, str(path))


def load_all(folder: Path | None = None) -> dict[str, WorkloadTemplate]:
    """Every ``*.yaml`` template in ``folder``, by name; duplicate names are an error."""
    root = folder or default_dir()
    if not root.is_dir():
        raise TemplateError(f"template folder {root} does not exist (set {ENV_DIR})")
    out: dict[str, WorkloadTemplate] = {}
    for path in sorted(root.glob("*.y*ml")):
        doc = load_file(path)
        if doc is None:
            continue
        if doc.name in out:
            raise TemplateError(f"{path}: template {doc.name!r} is defined twice")
        out[doc.name] = doc
    return out


def find(name: str, folder: Path | None = None) -> WorkloadTemplate:
    """A template by name, or by path to a file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        doc = load_file(path)
        if doc is None:
            raise TemplateError(f"{path}: not a WorkloadTemplate")
        return doc
    found = load_all(folder)
    if name not in found:
        raise TemplateError(f"no template {name!r} (templates: {', '.join(sorted(found))})")
    return found[name]
