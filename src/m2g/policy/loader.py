"""Find policy and test documents under a folder (or in given texts) and build a PolicySet.

Documents whose apiVersion is not in the ``m2g.io`` group (a kustomization.yaml, say) are
skipped, so a GitOps folder can hold both. Within the group, the kind decides: ``Policy`` or
``PolicyTest``; anything else is a problem.

A set of no policies at all is a problem too (an empty folder, a typo in the apiVersion group):
evaluating nothing would admit everything. The problem names the documents that were skipped
for their group although their kind is Policy or PolicyTest.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from m2g.policy.compiler import PolicySet, compile_documents, parse_policy
from m2g.policy.errors import PolicySetError, Problem
from m2g.policy.runtime import Runtime, make_runtime
from m2g.policy.schema import TypeChecker, make_checker
from m2g.policy.spec import API_GROUP_PREFIX, API_VERSION, PolicyDoc, PolicyTestDoc
from m2g.policy.yamlsrc import SourceDoc, parse_documents, read_documents

_SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules"}


@dataclass
class Sources:
    """The m2g documents found, sorted into policies and tests, plus problems so far."""

    policies: list[tuple[SourceDoc, PolicyDoc]] = field(default_factory=list)
    tests: list[tuple[SourceDoc, PolicyTestDoc]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    #: Where the documents came from (for the "no policies" problem).
    origin: str = ""
    #: Policy/PolicyTest documents skipped because their apiVersion is not in m2g.io.
    skipped: list[Problem] = field(default_factory=list)


def yaml_files(root: Path) -> list[Path]:
    """Every .yaml/.yml file under ``root`` (or ``root`` itself), in a stable order."""
    if root.is_file():
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found += [Path(dirpath) / f for f in sorted(filenames) if f.endswith((".yaml", ".yml"))]
    return found


def _display(path: Path) -> str:
    absolute = Path(os.path.abspath(path))  # not resolve(): a symlink loop must not raise here
    try:
        return str(absolute.relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


def classify(docs: Iterable[SourceDoc], into: Sources) -> None:
    """Sort parsed documents into policies and tests, validating their structure."""
    for doc in docs:
        data = doc.data
        if data is None:
            continue
        if not isinstance(data, dict):
            into.problems.append(Problem(doc.file, doc.start_line, "", "",
                                         "a document must be a mapping (a Kubernetes object)"))
            continue
        api = str(data.get("apiVersion", ""))
        if not api.startswith(API_GROUP_PREFIX):
            if data.get("kind") in ("Policy", "PolicyTest"):
                into.skipped.append(Problem(doc.file, doc.line_of(("apiVersion",)), "", "",
                                            f"apiVersion {api[:80]!r} is not {API_VERSION}"))
            continue
        kind = data.get("kind")
        if kind == "Policy":
            pol, probs = parse_policy(doc)
            into.problems.extend(probs)
            if pol is not None:
                into.policies.append((doc, pol))
        elif kind == "PolicyTest":
            _add_test(doc, into)
        else:
            into.problems.append(Problem(doc.file, doc.line_of(("kind",)), "", "",
                                         f"unknown kind {kind!r} in {api}: "
                                         "expected Policy or PolicyTest"))


#: A Kubernetes object name (a DNS-1123 subdomain, at most 253 characters): what the API server
#: accepts as a Policy object's ``metadata.name``.
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def object_name_problems(sources: Sources) -> list[Problem]:
    """One problem per Policy whose name the API server refuses as an object's name (upper
    case, '_', more than 253 characters): the file loads here, and ``kubectl apply`` of it
    fails (``m2g policy lint`` reports these; the other commands read files as they are)."""
    out = []
    for doc, pol in sources.policies:
        name = pol.metadata.name
        if len(name) > 253 or not OBJECT_NAME.fullmatch(name):
            out.append(Problem(doc.file, doc.line_of(("metadata", "name")), name[:80], "",
                               "metadata.name is not a Kubernetes object name (lower-case "
                               "letters, digits, '-' and '.', at most 253): the API server "
                               "refuses this Policy"))
    return out


def _add_test(doc: SourceDoc, into: Sources) -> None:
    try:
        into.tests.append((doc, PolicyTestDoc.model_validate(doc.data)))
    except ValidationError as exc:
        name = str(((doc.data or {}).get("metadata") or {}).get("name", ""))
        for err in exc.errors():
            loc = tuple(err["loc"])
            where = ".".join(str(p) for p in loc)
            into.problems.append(Problem(doc.file, doc.line_of(loc), name, "",
                                         f"{where}: {err['msg']}"))


def _root_problem(root: Path) -> str | None:
    """Why ``root`` cannot be a policy folder or file, or None."""
    try:
        mode = root.stat().st_mode
    except OSError as exc:
        return exc.strerror or "cannot be read"
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return None
    return "not a folder or a regular file"


def read_dir(root: Path) -> Sources:
    """Read every document under ``root``."""
    out = Sources(origin=str(root))
    why = _root_problem(root)
    if why is not None:
        out.problems.append(Problem(str(root), 0, "", "", why))
        return out
    for path in yaml_files(root):
        out.files += 1
        docs, probs = read_documents(path, _display(path))
        out.problems.extend(probs)
        classify(docs, out)
    return out


def read_texts(texts: Mapping[str, str]) -> Sources:
    """Read documents from named texts (e.g. the ``Policy`` objects of a cluster)."""
    out = Sources(origin="the Policy objects")
    for name, text in texts.items():
        out.files += 1
        docs, probs = parse_documents(text, name)
        out.problems.extend(probs)
        classify(docs, out)
    return out


_CHECKER: list[TypeChecker | None] = []


def shared_checker() -> TypeChecker | None:
    """One type checker per process (its descriptor pool is costly to build)."""
    if not _CHECKER:
        _CHECKER.append(make_checker())
    return _CHECKER[0]


def build(sources: Sources, runtime: Runtime | None = None) -> PolicySet:
    """The PolicySet of ``sources``, or PolicySetError listing every problem (atomic)."""
    runtime = runtime or make_runtime()
    problems = list(sources.problems)
    pset, probs = compile_documents(sources.policies, runtime, shared_checker())
    problems += probs
    if not problems and not sources.policies:
        problems.append(_none_found(sources))
    if problems or pset is None:
        raise PolicySetError(problems)
    return pset


def _none_found(sources: Sources) -> Problem:
    where = sources.origin or "the sources"
    text = (f"no Policy ({API_VERSION}) in {where} ({sources.files} file(s)): an empty policy "
            "set would admit everything")
    if sources.skipped:
        first = sources.skipped[0]
        text += (f"; {len(sources.skipped)} document(s) skipped for their group, first "
                 f"{first.file}:{first.line}: {first.message}")
    return Problem(where, 0, "", "", text)


def load_dir(root: Path | str, engine: str | None = None) -> PolicySet:
    """Load, check and compile every policy under ``root``; raise PolicySetError on any problem."""
    return build(read_dir(Path(root)), make_runtime(engine))
