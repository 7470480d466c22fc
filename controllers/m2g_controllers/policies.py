"""The policy set in force: built atomically from Policy objects (or a folder); a broken update
keeps the last good set and says why."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2g.policy import Evaluator, PolicySet, PolicySetError, Problem, build, read_dir, read_texts
from m2g.policy.loader import yaml_files
from m2g.policy.objects import policy_texts
from m2g.policy.runtime import Runtime


@dataclass(frozen=True)
class LoadResult:
    """What happened on the last load: accepted, unchanged, or rejected with problems."""

    accepted: bool
    changed: bool
    problems: tuple[Problem, ...] = ()

    def summary(self) -> str:
        if self.accepted:
            return "policy set accepted" if self.changed else "policy set unchanged"
        first = self.problems[0].render() if self.problems else "unknown problem"
        return (f"policy set rejected ({len(self.problems)} problem(s); the last good set stays "
                f"in force): {first}")


class PolicyStore:
    """Holds the Evaluator of the last good policy set."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._digest = ""
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
        digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()
        if digest == self._digest and self.evaluator is not None:
            self.last = LoadResult(True, False)
            return self.last
        try:
            pset = build(read_texts(texts), self._runtime)
        except PolicySetError as exc:
            self.last = LoadResult(False, False, tuple(exc.problems))
            return self.last
        self.evaluator, self._digest = Evaluator(pset), digest
        self.last = LoadResult(True, True)
        return self.last

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


def _dir_digest(path: Path) -> str:
    """A digest of every policy file under ``path`` (names and bytes); "" when unreadable."""
    h = hashlib.sha256(b"dir\0")
    try:
        for f in yaml_files(path):
            h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes() + b"\0")
    except OSError:
        return ""
    return h.hexdigest()
