"""The policy set in force: built from Policy objects (or a folder); a broken update keeps the
last good set and says why.

Policy objects are isolated one by one: when the new set does not build and every problem lies
in named Policy objects, those objects keep their last good version (or stay out, if they never
had one) and the others' updates take effect — one tenant's broken Policy no longer freezes
every other policy update. A problem of the set as a whole (an empty set, a name used twice)
rejects the update whole. A folder (``--policies DIR``) is loaded atomically."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from m2g.policy import Evaluator, PolicySet, PolicySetError, Problem, build, read_dir, read_texts
from m2g.policy.loader import yaml_files
from m2g.policy.objects import narrow_tenants, policy_texts
from m2g.policy.runtime import Runtime


@dataclass(frozen=True)
class LoadResult:
    """What happened on the last load: accepted, unchanged, or rejected with problems."""

    accepted: bool
    changed: bool
    problems: tuple[Problem, ...] = ()

    @property
    def invalid(self) -> frozenset[str]:
        """The sources with a problem ("Policy/NAME" for Policy objects)."""
        return frozenset(p.file for p in self.problems)

    def summary(self) -> str:
        if self.accepted and self.problems:
            first = self.problems[0].render()
            return (f"policy set accepted without {len(self.invalid)} invalid Policy object(s) "
                    f"(each keeps its last good version, or stays out): {first}")
        if self.accepted:
            return "policy set accepted" if self.changed else "policy set unchanged"
        first = self.problems[0].render() if self.problems else "unknown problem"
        return (f"policy set rejected ({len(self.problems)} problem(s); the last good set stays "
                f"in force): {first}")


class PolicyStore:
    """Holds the Evaluator of the last good policy set."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._digest = ""  # of the sources in force
        self._seen = ""  # of the Policy objects as last read (unchanged: nothing to build)
        self._good: dict[str, str] = {}  # each Policy object's text in force
        self.evaluator: Evaluator | None = None
        self.last = LoadResult(False, False)
        self._selections: dict[tuple[str, tuple[str, ...]], Evaluator] = {}

    @property
    def version(self) -> str:
        """The policy set in force: the first 12 hex digits of its sources' digest."""
        return self._digest[:12]

    @property
    def policy_set(self) -> PolicySet | None:
        return self.evaluator.policy_set if self.evaluator else None

    def selection(self, names: tuple[str, ...] | None) -> Evaluator | None:
        """An Evaluator of only these policies of the current set (None: the whole set), kept
        until the set changes so its compiled batches are reused."""
        if self.evaluator is None or names is None:
            return self.evaluator
        key = (self._digest, names)
        if key not in self._selections:
            self._selections = {k: v for k, v in self._selections.items()
                                if k[0] == self._digest}
            self._selections[key] = Evaluator(self.evaluator.policy_set.select(names))
        return self._selections[key]

    def load_objects(self, objects: list[dict[str, Any]]) -> LoadResult:
        texts = policy_texts(objects)
        seen = _texts_digest(texts)
        if seen == self._seen and self.evaluator is not None and self.last.accepted:
            self.last = replace(self.last, changed=False)
            return self.last
        try:
            pset, in_force, problems = self._build_isolated(texts)
        except PolicySetError as exc:
            self.last = LoadResult(False, False, tuple(exc.problems))
            return self.last
        digest = _texts_digest(in_force)
        changed = digest != self._digest or self.evaluator is None
        if changed:
            self.evaluator, self._digest = Evaluator(pset), digest
        self._good, self._seen = in_force, seen
        self.last = LoadResult(True, changed or bool(problems), problems)
        return self.last

    def _build_isolated(self, texts: dict[str, str]) -> tuple[PolicySet, dict[str, str],
                                                               tuple[Problem, ...]]:
        """The set of ``texts``; failing that, the set with each object that has a problem at
        its last good version (or left out). Raises the first build's error when a problem
        is not an object's own or the fallback does not build either."""
        try:
            return build(narrow_tenants(read_texts(texts)), self._runtime), texts, ()
        except PolicySetError as exc:
            bad = {p.file for p in exc.problems}
            if not bad <= texts.keys():
                raise
            kept = {n: self._good[n] if n in bad else t for n, t in texts.items()
                    if n not in bad or n in self._good}
            try:
                return (build(narrow_tenants(read_texts(kept)), self._runtime), kept,
                        tuple(exc.problems))
            except PolicySetError:
                raise exc from None

    def load_dir(self, path: Path) -> LoadResult:
        """Build the folder's set, unless its files are byte-for-byte the last good set's
        (every reconcile calls this: compiling the CEL each time cost 0.1–0.3 s)."""
        digest = _dir_digest(path)
        if digest and digest == self._digest and self.evaluator is not None:
            self.last = LoadResult(True, False)
            return self.last
        try:
            pset = build(read_dir(path), self._runtime)
        except PolicySetError as exc:
            self.last = LoadResult(False, False, tuple(exc.problems))
            return self.last
        changed = self.evaluator is None or pset.names() != self.evaluator.policy_set.names()
        self.evaluator, self._digest = Evaluator(pset), digest
        self.last = LoadResult(True, changed)
        return self.last


def _texts_digest(texts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()


def _dir_digest(path: Path) -> str:
    """A digest of every policy file under ``path`` (names and bytes); "" when unreadable."""
    h = hashlib.sha256(b"dir\0")
    try:
        for f in yaml_files(path):
            h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes() + b"\0")
    except OSError:
        return ""
    return h.hexdigest()
