"""The hostile-input probe of issue 11, as a table: every entry point that takes user input
without a cluster, tried as a new user and as an attacker would.

Each :class:`Case` is a command line, the files it needs (odd encodings, BOMs, huge numbers,
deep nesting, duplicate keys, wrong types, unicode, symlinks, FIFOs, directories, unreadable
files, empty files), stdin and environment, and the exit codes it may end with. A case fails
when the command leaks a traceback, ends with a code outside its set, prints an error that is
not one ``error:`` line (or a ``FILE:LINE:`` problem line), or — for policy inputs that must not
be decided — prints an ``Admit`` decision.

Two runners:

* ``tests/unit/test_cli_probe.py`` runs every case in-process (typer's CliRunner): a
  regression test per case in ``make test-unit``.
* ``python -m tests.fuzz.cli_probe`` runs every case as a subprocess of the real ``m2g`` with a
  time limit (45 s: m2g bounds the first request at 30 s, an exec plugin at 20 s) and an address-space limit (2 GiB),
  so a hang or a memory blow-up is a failure too, and prints the counts by area and by kind
  of failure (docs/reliability.md).

The kubeconfig cases point at ``https://127.0.0.1:1`` (nothing listens there) and never at a
real host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Nothing listens on port 1: every request is refused at once.
DEAD = "https://127.0.0.1:1"

GOOD_POLICY = """apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {name: dr}
spec:
  stage: Admission
  priority: 100
  rules:
    - name: defer
      when: "grid.event.active && workload.flexTier >= 2"
      decision: Defer
      message: "grid event"
"""

#: An input this policy defers; with a hostile twist it must not be Admitted either.
GOOD_INPUT = {"grid": {"event": {"active": True, "level": 2}},
              "workload": {"name": "w", "flexTier": 3, "gpus": 8}}

GOOD_TEST = """apiVersion: m2g.io/v1alpha1
kind: PolicyTest
metadata: {name: t}
cases:
  - name: defers
    input: {grid: {event: {active: true}}, workload: {name: w, flexTier: 3, gpus: 8}}
    expect: {decision: Defer}
"""

#: Special file contents (instead of bytes) a case may ask for.
FIFO = "<fifo>"
DIR = "<dir>"
UNREADABLE = "<unreadable>"


def link(target: str) -> str:
    """A symlink to ``target`` (relative to the case's folder, or absolute)."""
    return f"<link:{target}>"


Files = dict[str, "bytes | str"]


@dataclass
class Case:
    """One command line and what it may end with."""

    area: str
    name: str
    argv: list[str]
    files: Files = field(default_factory=dict)
    codes: tuple[int, ...] = (1, 2)
    stdin: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: The output must not contain an Admit decision.
    no_admit: bool = False

    @property
    def id(self) -> str:
        return f"{self.area}:{self.name}"


def materialise(case: Case, root: Path) -> tuple[list[str], dict[str, str]]:
    """Write the case's files under ``root``; its argv and env with ``{d}`` replaced."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in case.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == FIFO:
            os.mkfifo(path)
        elif content == DIR:
            path.mkdir(exist_ok=True)
        elif isinstance(content, str) and content.startswith("<link:"):
            os.symlink(content[6:-1].replace("{d}", str(root)), path)
        elif content == UNREADABLE:
            path.write_text(GOOD_POLICY)
            path.chmod(0)
        elif isinstance(content, str):
            path.write_text(content.replace("{d}", str(root)), encoding="utf-8")
        else:
            path.write_bytes(content)
    return ([a.replace("{d}", str(root)) for a in case.argv],
            {k: v.replace("{d}", str(root)) for k, v in case.env.items()})


_PROBLEM = re.compile(r"^\S.*:\d+: ")  # FILE:LINE: policy/rule: message (lint's stdout)


def verdict(case: Case, code: int | None, stdout: str, stderr: str) -> str | None:
    """None when the case ended as documented, else the kind of failure."""
    if code is None:
        return "hang"
    if "Traceback" in stdout + stderr or "MemoryError" in stderr:
        return "traceback"
    if case.no_admit and re.search(r'"decision":\s*"Admit"', stdout):
        return "admit"
    if code < 0 or code > 2:
        return "crash"
    if code not in case.codes:
        return "exit-0" if code == 0 else "exit-code"
    if code:
        errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        problems = [ln for ln in stdout.splitlines() if _PROBLEM.match(ln)]
        usage = "Usage:" in stderr or "usage:" in stderr or "─ Error ─" in stderr  # typer's
        if not errors and not problems and not usage:
            return "no-error-line"
    if "\x1b" in stdout + stderr:
        return "escape"  # a terminal escape from the input reached the terminal
    return None


# ------------------------------------------------------------------------------ the cases


def _pol(body: str) -> str:
    return "apiVersion: m2g.io/v1alpha1\nkind: Policy\n" + body


#: Odd but valid policies: lint may pass them.
_MAY_PASS = {"when-bool", "when-deep-neg", "when-unicode", "variables-many", "yaml-tag-binary",
             "yaml-directive", "when-deep-parens", "when-huge", "when-deep-list", "when-bidi",
             "yaml-timestamp-name", "cel-deep-ternary", "cel-deep-calls", "cel-huge-literal",
             "cel-int-overflow", "rule-name-bidi", "variable-twice", "label-value-huge"}


def policy_files() -> Iterator[tuple[str, Files, bool | None]]:
    """(name, files of a policy folder, lint passes: True, fails: False, either: None) —
    hostile policy folders. Test files are not run by lint: a folder with a bad test file may
    lint clean, and ``policy test`` must fail it."""
    rule = ("spec:\n  stage: Admission\n  rules:\n    - name: r\n      when: 'true'\n"
            "      decision: Reject\n      message: m\n")
    yield "bom", {"p.yaml": b"\xef\xbb\xbf" + GOOD_POLICY.encode()}, True
    yield "utf16", {"p.yaml": GOOD_POLICY.encode("utf-16")}, False
    yield "utf32", {"p.yaml": GOOD_POLICY.encode("utf-32")}, False
    yield "latin1", {"p.yaml": GOOD_POLICY.replace("grid event", "gr\xefd").encode("latin-1")}, \
        False
    yield "crlf", {"p.yaml": GOOD_POLICY.replace("\n", "\r\n")}, True
    yield "cr-only", {"p.yaml": GOOD_POLICY.replace("\n", "\r")}, True
    yield "dup-decision", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Reject\n      decision: Admit")}, False
    yield "dup-stage", {"p.yaml": GOOD_POLICY.replace(
        "stage: Admission", "stage: Admission\n  stage: Capacity")}, False
    yield "dup-name", {"p.yaml": GOOD_POLICY.replace(
        "metadata: {name: dr}", "metadata: {name: dr, name: other}")}, False
    yield "dup-rules", {"p.yaml": GOOD_POLICY + "  rules: []\n"}, False
    yield "dup-when", {"p.yaml": GOOD_POLICY.replace(
        "      decision: Defer", "      when: 'false'\n      decision: Defer")}, False
    yield "priority-huge", {"p.yaml": GOOD_POLICY.replace("priority: 100",
                                                          "priority: " + "9" * 5000)}, False
    yield "priority-1e400", {"p.yaml": GOOD_POLICY.replace("priority: 100",
                                                           "priority: 1e400")}, False
    yield "priority-nan", {"p.yaml": GOOD_POLICY.replace("priority: 100", "priority: .nan")}, \
        False
    yield "priority-inf", {"p.yaml": GOOD_POLICY.replace("priority: 100", "priority: .inf")}, \
        False
    yield "priority-2^63", {"p.yaml": GOOD_POLICY.replace("priority: 100",
                                                          f"priority: {2**63}")}, None
    yield "priority-neg", {"p.yaml": GOOD_POLICY.replace("priority: 100",
                                                         f"priority: -{2**70}")}, None
    yield "priority-bool", {"p.yaml": GOOD_POLICY.replace("priority: 100", "priority: yes")}, \
        False
    yield "priority-str", {"p.yaml": GOOD_POLICY.replace("priority: 100",
                                                         "priority: '100'")}, None
    yield "priority-hex", {"p.yaml": GOOD_POLICY.replace("priority: 100", "priority: 0x64")}, \
        True
    yield "requeue-huge", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Defer\n      requeueAfter: " + "9" * 400 + "s")}, False
    yield "requeue-neg", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Defer\n      requeueAfter: -5m")}, False
    yield "requeue-nan", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Defer\n      requeueAfter: .nan")}, False
    yield "requeue-int", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Defer\n      requeueAfter: 99999999999999999999")}, False
    yield "requeue-P9999999W", {"p.yaml": GOOD_POLICY.replace(
        "decision: Defer", "decision: Defer\n      requeueAfter: P9999999999W")}, False
    for where, text in [
            ("doc-list", "- 1\n- 2\n"),
            ("doc-scalar", "42\n"),
            ("doc-string", "hello\n"),
            ("doc-null", "null\n"),
            ("doc-bool", "true\n"),
            ("apiversion-int", "apiVersion: 1\nkind: Policy\nmetadata: {name: a}\n" + rule),
            ("apiversion-list", "apiVersion: [m2g.io/v1alpha1]\nkind: Policy\n"
             "metadata: {name: a}\n" + rule),
            ("kind-int", "apiVersion: m2g.io/v1alpha1\nkind: 5\nmetadata: {name: a}\n" + rule),
            ("kind-null", "apiVersion: m2g.io/v1alpha1\nkind:\nmetadata: {name: a}\n" + rule),
            ("kind-unknown", "apiVersion: m2g.io/v1alpha1\nkind: Polcy\nmetadata: {name: a}\n"
             + rule),
            ("kind-lower", "apiVersion: m2g.io/v1alpha1\nkind: policy\nmetadata: {name: a}\n"
             + rule),
            ("version-other", "apiVersion: m2g.io/v9\nkind: Policy\nmetadata: {name: a}\n"
             + rule),
            ("metadata-str", _pol("metadata: x\n" + rule)),
            ("metadata-list", _pol("metadata: [a]\n" + rule)),
            ("metadata-missing", _pol(rule)),
            ("name-int", _pol("metadata: {name: 5}\n" + rule)),
            ("name-list", _pol("metadata: {name: [a]}\n" + rule)),
            ("name-empty", _pol("metadata: {name: ''}\n" + rule)),
            ("name-long", _pol("metadata: {name: " + "a" * 5000 + "}\n" + rule)),
            ("name-unicode", _pol("metadata: {name: \"\u202edr\u200b\U0001f600\"}\n" + rule)),
            ("name-slash", _pol("metadata: {name: ../../etc}\n" + rule)),
            ("name-newline", _pol("metadata: {name: \"a\\nerror: fake\"}\n" + rule)),
            ("spec-list", _pol("metadata: {name: a}\nspec: [1]\n")),
            ("spec-str", _pol("metadata: {name: a}\nspec: x\n")),
            ("spec-null", _pol("metadata: {name: a}\nspec:\n")),
            ("spec-missing", _pol("metadata: {name: a}\n")),
            ("stage-int", _pol("metadata: {name: a}\nspec: {stage: 1, rules: []}\n")),
            ("stage-unknown", _pol("metadata: {name: a}\nspec: {stage: Admision, rules: []}\n")),
            ("stage-lower", _pol("metadata: {name: a}\nspec: {stage: admission, rules: []}\n")),
            ("rules-map", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: {a: 1}}\n")),
            ("rules-empty", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: []}\n")),
            ("rules-null-item", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                     "rules: [null]}\n")),
            ("rules-int-item", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                    "rules: [1]}\n")),
            ("rules-str-item", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                    "rules: [x]}\n")),
            ("rule-name-int", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                   "[{name: 1, when: 'true', decision: Reject}]}\n")),
            ("when-int", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                              "[{name: r, when: 1, decision: Reject}]}\n")),
            ("when-list", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                               "[{name: r, when: [a], decision: Reject}]}\n")),
            ("when-bool", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                               "[{name: r, when: true, decision: Reject}]}\n")),
            ("when-empty", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                "[{name: r, when: '', decision: Reject}]}\n")),
            ("when-huge", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                               "[{name: r, when: '" + "1 + " * 20000 + "1 > 0', "
                               "decision: Reject}]}\n")),
            ("when-deep-parens", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                      "[{name: r, when: '" + "(" * 3000 + "true" + ")" * 3000
                                      + "', decision: Reject}]}\n")),
            ("when-deep-neg", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                   "[{name: r, when: '" + "!" * 5000 + "true', "
                                   "decision: Reject}]}\n")),
            ("when-deep-list", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                    "[{name: r, when: 'size(" + "[" * 2000 + "]" * 2000
                                    + ") > 0', decision: Reject}]}\n")),
            ("when-bigint", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                 "[{name: r, when: 'workload.gpus > " + "9" * 400
                                 + "', decision: Reject}]}\n")),
            ("when-nul", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                              "[{name: r, when: \"true\\0\", decision: Reject}]}\n")),
            ("when-unicode", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                  "[{name: r, when: \"workload.name == '\u00e9\U0001f600'\", "
                                  "decision: Reject}]}\n")),
            ("when-bidi", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                               "[{name: r, when: \"true \u202e|| false\", "
                               "decision: Reject}]}\n")),
            ("decision-int", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                  "[{name: r, when: 'true', decision: 1}]}\n")),
            ("decision-lower", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                    "[{name: r, when: 'true', decision: admit}]}\n")),
            ("decision-list", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                   "[{name: r, when: 'true', decision: [Admit]}]}\n")),
            ("message-int", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                 "[{name: r, when: 'true', decision: Reject, message: 5}]}\n")),
            ("message-huge", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                  "[{name: r, when: 'true', decision: Reject, message: '"
                                  + "x" * 300000 + "'}]}\n")),
            ("matchconditions-str", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                         "matchConditions: x, rules: [{name: r, when: 'true', "
                                         "decision: Reject}]}\n")),
            ("matchconditions-nulls", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                           "matchConditions: [null, 1], rules: [{name: r, "
                                           "when: 'true', decision: Reject}]}\n")),
            ("variables-map", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                   "variables: {a: 1}, rules: [{name: r, when: 'true', "
                                   "decision: Reject}]}\n")),
            ("variables-self", _pol("metadata: {name: a}\nspec: {stage: Admission, variables: "
                                    "[{name: v, expression: 'variables.v'}], rules: [{name: r, "
                                    "when: 'variables.v', decision: Reject}]}\n")),
            ("variables-many", _pol("metadata: {name: a}\nspec:\n  stage: Admission\n"
                                    "  variables:\n" + "".join(
                                        f"    - {{name: v{i}, expression: 'variables.v{i - 1}"
                                        f" + variables.v{i - 1}'}}\n" if i else
                                        "    - {name: v0, expression: '1'}\n"
                                        for i in range(64))
                                    + "  rules: [{name: r, when: 'variables.v63 > 0', "
                                    "decision: Reject}]\n")),
            ("failurepolicy-weird", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                         "failurePolicy: Allow, rules: [{name: r, when: 'true', "
                                         "decision: Reject}]}\n")),
            ("unknown-spec-key", _pol("metadata: {name: a}\nspec: {stage: Admission, bogus: 1, "
                                      "rules: [{name: r, when: 'true', decision: Reject}]}\n")),
            ("unknown-rule-key", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                      "[{name: r, when: 'true', decison: Reject}]}\n")),
            ("yaml-tag-python", _pol("metadata: {name: !!python/object/apply:os.system "
                                     "[echo pwned]}\n" + rule)),
            ("yaml-tag-binary", _pol("metadata: {name: !!binary aGVsbG8=}\n" + rule)),
            ("yaml-tag-custom", _pol("metadata: {name: !foo a}\n" + rule)),
            ("yaml-timestamp-name", _pol("metadata: {name: 2026-01-01}\n" + rule)),
            ("yaml-merge-bad", _pol("metadata: {<<: 5, name: a}\n" + rule)),
            ("yaml-merge-list", _pol("metadata: {<<: [1, 2], name: a}\n" + rule)),
            ("yaml-complex-key", _pol("metadata: {? [a, b] : 1, name: a}\n" + rule)),
            ("yaml-set", _pol("metadata: !!set {name: null}\n" + rule)),
            ("yaml-omap", _pol("metadata: !!omap [{name: a}]\n" + rule)),
            ("yaml-bad-indent", _pol("metadata:\n name: a\n  x: 1\n" + rule)),
            ("yaml-tab-indent", _pol("metadata:\n\tname: a\n" + rule)),
            ("yaml-unclosed", _pol("metadata: {name: a\n" + rule)),
            ("yaml-unterminated-str", _pol("metadata: {name: \"a}\n" + rule)),
            ("yaml-directive", "%YAML 1.1\n%TAG ! tag:x,2000:\n---\n" + _pol(
                "metadata: {name: a}\n" + rule)),
            ("yaml-many-docs", "---\n" * 200000),
            ("yaml-long-line", "a: " + "x" * 1_000_000 + "\n"),
            ("yaml-many-keys", "".join(f"k{i}: {i}\n" for i in range(90000))),
            ("yaml-wide-flow", "[" + ",".join(["1"] * 200000) + "]\n"),
            ("yaml-anchor-chain", "a: &a0 [x]\n" + "".join(
                f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 40))),
            ("yaml-surrogate-escape", _pol("metadata: {name: \"\\ud800\"}\n" + rule)),
            ("yaml-bigint-key", _pol("metadata: {name: a, " + "9" * 5000 + ": 1}\n" + rule)),
            ("yaml-float-key", _pol("metadata: {name: a, .nan: 1}\n" + rule)),
            ("yaml-null-key", _pol("metadata: {name: a, ~: 1}\n" + rule)),
            # the probe rerun (issue 11): memory bombs the CRD lets in, deep CEL, huge literals
            ("var-doubling-bomb", _pol("metadata: {name: a}\nspec:\n  stage: Admission\n"
                                       "  variables:\n    - {name: v0, expression: \"'"
                                       + "x" * 10000 + "'\"}\n" + "".join(
                                           f"    - {{name: v{i}, expression: 'variables.v{i - 1}"
                                           f" + variables.v{i - 1}'}}\n" for i in range(1, 14))
                                       + "  rules: [{name: r, when: 'size(variables.v13) < 0', "
                                       "decision: Reject}]\n")),
            ("nested-map-literal-bomb", _pol(
                "metadata: {name: a}\nspec: {stage: Admission, rules: [{name: r, when: \"size("
                + "[" + ",".join(map(str, range(99))) + "].map(a, ["
                + ",".join(map(str, range(99))) + "].map(b, workload.name + '" + "x" * 9000
                + "'))) < 0\", decision: Reject}]}\n")),
            ("literal-list-map-bomb", _pol(
                "metadata: {name: a}\nspec: {stage: Admission, rules: [{name: r, when: \"size(["
                + ",".join(["0"] * 4900) + "].map(a, a)) < 0\", decision: Reject}]}\n")),
            ("cel-deep-ternary", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                      "[{name: r, when: '" + "true ? (" * 300 + "true"
                                      + ") : false" * 300 + "', decision: Reject}]}\n")),
            ("cel-deep-calls", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                    "[{name: r, when: '" + "size(string(" * 400 + "1"
                                    + "))" * 400 + " > 0', decision: Reject}]}\n")),
            ("cel-huge-literal", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                      "[{name: r, when: \"'" + "x" * 9000 + "' == workload.name"
                                      "\", decision: Reject}]}\n")),
            ("cel-unterminated-string", _pol("metadata: {name: a}\nspec: {stage: Admission, "
                                             "rules: [{name: r, when: \"'abc\", "
                                             "decision: Reject}]}\n")),
            ("cel-int-overflow", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                      "[{name: r, when: 'workload.gpus * 9223372036854775807 > 0'"
                                      ", decision: Reject}]}\n")),
            ("rule-name-bidi", _pol("metadata: {name: a}\nspec: {stage: Admission, rules: "
                                    "[{name: \"r\u202e\", when: 'true', decision: Reject}]}\n")),
            ("variable-twice", _pol("metadata: {name: a}\nspec: {stage: Admission, variables: "
                                    "[{name: v, expression: '1'}, {name: v, expression: '2'}], "
                                    "rules: [{name: r, when: 'variables.v > 0', "
                                    "decision: Reject}]}\n")),
            ("label-value-huge", _pol("metadata: {name: a, labels: {x: '" + "y" * 300000
                                      + "'}}\n" + rule)),
            ("comments-only", "# nothing\n# here\n"),
            ("only-separator", "---\n...\n"),
            ("whitespace", "   \n\n\t\n"),
            ("empty", ""),
    ]:
        yield where, {"p.yaml": text}, None if where in _MAY_PASS else False
    many = "".join(f"---\n{_pol(f'metadata: {{name: p{i}}}' + chr(10) + rule)}"
                   for i in range(400))
    yield "many-policies", {"p.yaml": many}, True
    yield "same-name-twice", {"a.yaml": GOOD_POLICY, "b.yaml": GOOD_POLICY}, False
    yield "good-plus-empty", {"a.yaml": GOOD_POLICY, "b.yaml": ""}, True
    yield "good-plus-garbage", {"a.yaml": GOOD_POLICY, "b.yaml": "{{{{"}, False
    yield "good-plus-binary", {"a.yaml": GOOD_POLICY, "b.yaml": os.urandom(64) + b"\xff"}, False
    yield "yml-ext", {"p.yml": GOOD_POLICY}, True
    yield "upper-ext", {"p.YAML": GOOD_POLICY}, True
    yield "json-ext", {"p.json": json.dumps({"apiVersion": "m2g.io/v1alpha1", "kind": "Policy",
                                             "metadata": {"name": "j"}, "spec": {}})}, False
    yield "txt-only", {"p.txt": GOOD_POLICY}, False
    yield "hidden-file", {".p.yaml": GOOD_POLICY}, None
    yield "nested-deep-dirs", {"/".join(["d"] * 60) + "/p.yaml": GOOD_POLICY}, True
    yield "fifo", {"a.yaml": GOOD_POLICY, "f.yaml": FIFO}, False
    yield "dir-named-yaml", {"a.yaml": GOOD_POLICY, "x.yaml": DIR}, True
    yield "unreadable-file", {"a.yaml": GOOD_POLICY, "u.yaml": UNREADABLE}, False
    yield "self-symlink", {"a.yaml": GOOD_POLICY, "s.yaml": link("s.yaml")}, False
    yield "dangling-symlink", {"a.yaml": GOOD_POLICY, "s.yaml": link("nowhere.yaml")}, False
    yield "symlink-dev-zero", {"a.yaml": GOOD_POLICY, "z.yaml": link("/dev/zero")}, False
    yield "symlink-dev-null", {"a.yaml": GOOD_POLICY, "z.yaml": link("/dev/null")}, False
    yield "symlink-proc", {"a.yaml": GOOD_POLICY, "z.yaml": link("/proc/self/status")}, False
    yield "symlink-dir-loop", {"a.yaml": GOOD_POLICY, "sub/up": link("..")}, None
    yield "symlink-to-good", {"a.yaml": GOOD_POLICY, "sub/b.yaml": link("../a.yaml")}, None
    yield "unicode-filename", {"\u00e9\U0001f600.yaml": GOOD_POLICY}, True
    yield "newline-filename", {"a\nerror: x.yaml": GOOD_POLICY}, True
    yield "test-cases-int", {"a.yaml": GOOD_POLICY, "a_test.yaml":
                             "apiVersion: m2g.io/v1alpha1\nkind: PolicyTest\n"
                             "metadata: {name: t}\ncases: 5\n"}, False
    yield "test-cases-nulls", {"a.yaml": GOOD_POLICY, "a_test.yaml":
                               "apiVersion: m2g.io/v1alpha1\nkind: PolicyTest\n"
                               "metadata: {name: t}\ncases: [null, 1, x]\n"}, False
    yield "test-input-str", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "input: {grid: {event: {active: true}}, workload: {name: w, flexTier: 3, gpus: 8}}",
        "input: x")}, False
    yield "test-expect-int", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "expect: {decision: Defer}", "expect: 5")}, False
    yield "test-expect-unknown-decision", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST
                                           .replace("decision: Defer", "decision: Maybe")}, False
    yield "test-input-nan", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8", "gpus: 8, estimatedKw: .nan")}, False
    yield "test-input-inf", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8", "gpus: 8, estimatedKw: -.inf")}, False
    yield "test-input-bigint", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8", "gpus: " + "9" * 30)}, False
    yield "test-input-bool-gpus", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8", "gpus: true")}, False
    yield "test-input-unknown-key", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8", "gpus: 8, gpuz: 1")}, False
    yield "test-dup-expect", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "expect: {decision: Defer}", "expect: {decision: Defer, decision: Admit}")}, False
    yield "test-now-bad", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "input: {", "input: {now: 'year 9999', ")}, False
    yield "test-now-far", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "input: {", "input: {now: '9999-12-31T23:59:59Z', ")}, True
    yield "test-now-year1", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "input: {", "input: {now: '0001-01-01T00:00:00Z', ")}, True
    yield "test-policies-filter-str", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "cases:", "policies: dr\ncases:")}, False
    yield "test-deep-input", {"a.yaml": GOOD_POLICY, "a_test.yaml": GOOD_TEST.replace(
        "gpus: 8}", "gpus: 8, labels: " + "{a: " * 60 + "1" + "}" * 60 + "}")}, False
    yield "test-only", {"a_test.yaml": GOOD_TEST}, False


def eval_inputs() -> Iterator[tuple[str, bytes, bool]]:
    """(name, eval input bytes, may exit 0) — every input here must not be Admitted."""
    good = json.dumps(GOOD_INPUT).encode()

    def w(**fields: object) -> bytes:
        doc = json.loads(good)
        doc["workload"].update(fields)
        return json.dumps(doc).encode()

    yield "bom-jsonl", b"\xef\xbb\xbf" + good + b"\n" + good + b"\n", True
    yield "utf16", (good.decode() + "\n").encode("utf-16"), False
    yield "utf16-bom-le", b"\xff\xfe" + (good.decode() + "\n").encode("utf-16-le"), False
    yield "latin1", good.replace(b'"w"', b'"\xe9"'), False
    yield "crlf", good + b"\r\n" + good + b"\r\n", True
    yield "nul-line", good + b"\n\x00\n", False
    yield "empty", b"", False
    yield "only-newlines", b"\n\n\n", False
    yield "whitespace", b"   \t\n", False
    yield "array-of-inputs", b"[" + good + b"," + good + b"]", False
    yield "scalar", b"42\n", False
    yield "string", b'"x"\n', False
    yield "null", b"null\n", False
    yield "dup-keys-flex", good.replace(b'"flexTier": 3', b'"flexTier": 3, "flexTier": 0'), \
        True
    yield "dup-keys-workload", good[:-1] + b', "workload": {"name": "x", "gpus": 0}}', True
    yield "bigint-gpus", w(gpus=10 ** 30), False
    yield "bigint-4301", good.replace(b'"gpus": 8', b'"gpus": ' + b"9" * 5000), False
    yield "2^63-gpus", w(gpus=2 ** 63), False
    yield "2^64-gpus", w(gpus=2 ** 64), False
    yield "neg-gpus", w(gpus=-8), False
    yield "float-gpus", w(gpus=8.5), False
    yield "bool-gpus", w(gpus=True), False
    yield "str-gpus", w(gpus="8"), False
    yield "null-gpus", w(gpus=None), False
    yield "list-gpus", w(gpus=[8]), False
    yield "nan-kw", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": NaN'), False
    yield "inf-kw", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": -Infinity'), False
    yield "1e999-kw", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": 1e999'), False
    yield "neg-kw", w(estimatedKw=-1e308), False
    yield "huge-float-str", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": 1' +
                                         b"0" * 5000 + b".0"), False
    yield "flex-str", w(flexTier="3"), False
    yield "flex-neg", w(flexTier=-1), False
    yield "flex-huge", w(flexTier=2 ** 70), False
    yield "workload-list", json.dumps({**GOOD_INPUT, "workload": [1]}).encode(), False
    yield "workload-str", json.dumps({**GOOD_INPUT, "workload": "w"}).encode(), False
    yield "workload-null", json.dumps({**GOOD_INPUT, "workload": None}).encode(), False
    yield "grid-list", json.dumps({**GOOD_INPUT, "grid": []}).encode(), False
    yield "grid-event-str", json.dumps({**GOOD_INPUT, "grid": {"event": "x"}}).encode(), False
    yield "active-str", json.dumps({**GOOD_INPUT, "grid": {"event": {"active": "false"}}}) \
        .encode(), False
    yield "active-int", json.dumps({**GOOD_INPUT, "grid": {"event": {"active": 1}}}).encode(), \
        False
    yield "podsets-nulls", w(podSets=[None, 1]), False
    yield "podsets-count-huge", w(podSets=[{"name": "a", "count": 2 ** 80, "gpusPerPod": 8}]), \
        False
    yield "podsets-many", w(podSets=[{"name": f"p{i}", "count": 1, "gpusPerPod": 1}
                                     for i in range(20000)]), True
    yield "labels-int-values", w(labels={"a": 1}), False
    yield "labels-deep", good.replace(b'"gpus": 8', b'"gpus": 8, "labels": ' +
                                      b'{"a": ' * 5000 + b"1" + b"}" * 5000), False
    yield "deep-array", b"[" * 100000 + b"]" * 100000, False
    yield "deep-object", b'{"a":' * 100000 + b"1" + b"}" * 100000, False
    yield "unknown-top-key", json.dumps({**GOOD_INPUT, "bogus": 1}).encode(), False
    yield "unknown-workload-key", w(bogus=1), False
    yield "now-bad", json.dumps({**GOOD_INPUT, "now": "yesterday"}).encode(), False
    yield "now-far", json.dumps({**GOOD_INPUT, "now": "9999-12-31T23:59:59Z"}).encode(), True
    yield "now-int", json.dumps({**GOOD_INPUT, "now": 10 ** 20}).encode(), False
    yield "domains-list", json.dumps({**GOOD_INPUT, "domains": [1]}).encode(), False
    yield "domains-cycle", json.dumps({**GOOD_INPUT, "domains": {
        "a": {"kind": "rack", "parent": "b"}, "b": {"kind": "rack", "parent": "a"}}}).encode(), \
        True
    yield "domains-self-parent", json.dumps({**GOOD_INPUT, "domains": {
        "a": {"kind": "rack", "parent": "a"}}}).encode(), True
    yield "domains-many", json.dumps({**GOOD_INPUT, "domains": {
        f"r{i}": {"kind": "rack", "parent": f"r{i - 1}" if i else None}
        for i in range(3000)}}).encode(), True
    yield "long-line", b'{"a": "' + b"x" * (2 << 20) + b'"}\n', False
    yield "one-bad-then-good", b"{\n" + good + b"\n", False
    yield "unicode-escape-surrogate", good.replace(b'"w"', b'"\\ud800"'), True
    yield "control-in-string", good.replace(b'"w"', b'"a\\u0000b"'), True
    yield "trailing-garbage", good + b" xyz\n", False
    yield "two-on-one-line", good + b" " + good + b"\n", False
    yield "json5-comments", b"// c\n" + good, False
    # the probe rerun (issue 11): values nobody had tried
    yield "name-bidi-zero-width", w(name="\u202e\u200bw\U0001f600"), True
    yield "name-nul-escape", good.replace(b'"w"', b'"w\\u0000\\u001b[2J"'), True
    yield "name-1MB", w(name="n" * 1_000_000), True
    yield "label-value-500KB", w(labels={"a": "v" * 500_000}), True
    yield "label-keys-20000", w(labels={f"k{i}": "v" for i in range(20_000)}), True
    yield "gpus-minus-zero", good.replace(b'"gpus": 8', b'"gpus": -0'), True
    yield "gpus-1e2", good.replace(b'"gpus": 8', b'"gpus": 1e2'), False
    yield "gpus-8.0", good.replace(b'"gpus": 8', b'"gpus": 8.0'), False
    yield "flex-3.0", w(flexTier=3.0), False
    yield "kw-1e400", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": 1e400'), False
    yield "kw-neg-zero", good.replace(b'"gpus": 8', b'"gpus": 8, "estimatedKw": -0.0'), True
    yield "kw-denormal", w(estimatedKw=5e-324), True
    yield "level-neg", json.dumps({**GOOD_INPUT, "grid": {"event": {"active": True,
                                                                     "level": -2}}}).encode(), False
    yield "level-2^63", json.dumps({**GOOD_INPUT, "grid": {"event": {"active": True,
                                                                      "level": 2 ** 63}}}).encode(), False
    yield "now-leap-second", json.dumps({**GOOD_INPUT, "now": "2016-12-31T23:59:60Z"}).encode(), \
        False
    yield "now-tz-plus-14", json.dumps({**GOOD_INPUT, "now": "2026-01-01T00:00:00+14:00"}) \
        .encode(), True
    yield "now-tz-plus-25", json.dumps({**GOOD_INPUT, "now": "2026-01-01T00:00:00+25:00"}) \
        .encode(), False
    yield "now-naive", json.dumps({**GOOD_INPUT, "now": "2026-01-01T00:00:00"}).encode(), True
    yield "now-year-0", json.dumps({**GOOD_INPUT, "now": "0000-01-01T00:00:00Z"}).encode(), False
    yield "now-iso-week", json.dumps({**GOOD_INPUT, "now": "2026-W01-1"}).encode(), True
    yield "domains-10000", json.dumps({**GOOD_INPUT, "domains": {
        f"r{i}": {"kind": "rack"} for i in range(10_000)}}).encode(), True
    yield "domains-dup-key", good[:-1] + b', "domains": {"r": {"kind": "rack"}, "r": {}}}', \
        False
    yield "good-bad-good", good + b"\n{\n" + good + b"\n", False
    yield "line-of-spaces-1MB", b" " * (1 << 20) + b"\n" + good + b"\n", True  # a blank line
    yield "line-of-spaces-2MB", b" " * (2 << 20) + b"\n" + good + b"\n", False
    yield "single-quotes", good.replace(b'"', b"'"), False


def templates_cases() -> Iterator[Case]:
    """``m2g templates list|show`` and ``m2g submit --dry-run`` with hostile names, folders
    and ``--set`` values (the dry run prints manifests and needs no cluster: KUBECONFIG points
    at nothing)."""
    no_cluster = {"KUBECONFIG": "{d}/none", "HOME": "{d}"}
    for name in ["nope", "../../../etc/passwd", "/etc/passwd", "/dev/zero", "/dev/null",
                 "{d}", "", " ", "-", "\u00e9\U0001f600", "a" * 5000, "x\x1b[31m",
                 "{d}/t.yaml"]:
        yield Case("templates", f"show-name-{name[:20]!r}", ["templates", "show", name],
                   files={"t.yaml": "- not a template\n"}, codes=(2,), env=no_cluster)
    bad_dirs: dict[str, Files] = {
        "file": {"tdir": GOOD_POLICY}, "missing": {}, "empty": {"tdir": DIR},
        "garbage": {"tdir/a.yaml": "{{{"}, "list": {"tdir/a.yaml": "- 1\n"},
        "bomb": {"tdir/a.yaml": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
            f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True))},
        "deep": {"tdir/a.yaml": "[" * 5000 + "]" * 5000},
        "nul": {"tdir/a.yaml": "a: \x00\n"},
        "fifo": {"tdir/a.yaml": FIFO}, "unreadable": {"tdir/a.yaml": UNREADABLE},
        "selflink": {"tdir/a.yaml": link("a.yaml")}, "devzero": {"tdir/a.yaml": link("/dev/zero")},
        "policy-not-template": {"tdir/a.yaml": GOOD_POLICY},
        "template-wrong-types": {"tdir/a.yaml": "apiVersion: m2g.io/v1alpha1\n"
                                 "kind: WorkloadTemplate\nmetadata: {name: a}\nspec: [1]\n"},
        "template-params-wrong": {"tdir/a.yaml": "apiVersion: m2g.io/v1alpha1\n"
                                  "kind: WorkloadTemplate\nmetadata: {name: a}\n"
                                  "spec: {parameters: [1, 2]}\n"},
        "template-dup-name": {"tdir/a.yaml": "apiVersion: m2g.io/v1alpha1\n"
                              "kind: WorkloadTemplate\nmetadata: {name: a}\nspec: {}\n",
                              "tdir/b.yaml": "apiVersion: m2g.io/v1alpha1\n"
                              "kind: WorkloadTemplate\nmetadata: {name: a}\nspec: {}\n"},
    }
    for dname, files in bad_dirs.items():
        yield Case("templates", f"list-dir-{dname}",
                   ["templates", "list", "--templates-dir", "{d}/tdir"], files=files,
                   codes=(0, 1, 2), env=no_cluster)
        yield Case("templates", f"list-env-dir-{dname}", ["templates", "list"], files=files,
                   codes=(0, 1, 2), env={**no_cluster, "M2G_TEMPLATES": "{d}/tdir"})
        yield Case("templates", f"show-dir-{dname}",
                   ["templates", "show", "a", "--templates-dir", "{d}/tdir"], files=files,
                   codes=(1, 2), env=no_cluster)
    tpl = "llama31-8b-finetune"
    for val in ["gpus=-8", "gpus=0", "gpus=1e309", "gpus=nan", "gpus=inf", "gpus=-inf",
                "gpus=" + "9" * 5000, f"gpus={2**63}", "gpus=8.5", "gpus=0x10", "gpus=8,8",
                "gpus=", "=8", "gpus", "", "=", "gpus==8", "bogus=1", "gpus=true",
                "seq_len=-1", "seq_len=" + "9" * 30, "seq_len=nan", "precision=fp0",
                "precision=$(rm -rf /)", "image=evil\nkind: Secret", "image=" + "a" * 100000,
                "image=\x00", "name=UPPER_case", "name=../x", "name=a\nb", "name=" + "a" * 300,
                "name=\u00e9\U0001f600", "name=-leading", "name=a.b.c", "priority=x y",
                "priority=" + "p" * 500, "checkpoint_dir={{.Values}}", "tp=0", "tp=-1",
                "tp=3", "micro_batch=1e10", "replicas=-1", "image=\u202eevil",
                "dp=-1", "dp=0", "dp=nan", "dp=1e3", "dp=" + "9" * 5000, "dp=\uff11",
                "flex_tier=4", "flex_tier=-1", "flex_tier=1.5", "flex_tier=\u0663",
                "expected_runtime=-1", "expected_runtime=" + "9" * 40,
                "checkpoint_interval=-5", "api=Pod", "api=../JobSet", "kai_queue=A B",
                "data_pvc=../etc", "image=a b", "image='quoted'", "image=x\ty",
                "priority=$(id)", "name=a" + "\u0301"]:
        yield Case("submit", f"set-{val[:30]!r}",
                   ["submit", tpl, "--dry-run", "--set", val], codes=(2,), env=no_cluster)
        yield Case("templates", f"show-set-{val[:30]!r}",
                   ["templates", "show", tpl, "--set", val], codes=(2,), env=no_cluster)
    for opt in [["-o", "xml"], ["-q", ""], ["-q", "a b"], ["-q", "../x"], ["-n", "UPPER"],
                ["-n", "a" * 300], ["-n", ""], ["--dry-run=maybe"], ["--dry-run=server"],
                ["--policies", "{d}/nope"], ["--policies", "/dev/zero"],
                ["--policies", "{d}/empty"], ["--kubeconfig", "/dev/zero"],
                ["--prometheus", "not a url"], ["--prometheus", "http://127.0.0.1:1"],
                ["--context", "nope"]]:
        yield Case("submit", f"opt-{' '.join(opt)[:30]!r}", ["submit", tpl, "--dry-run", *opt],
                   files={"empty": DIR}, codes=(0, 1, 2), env=no_cluster)


def kubeconfigs() -> Iterator[tuple[str, str | bytes]]:
    """Kubeconfig files of odd shapes, each pointing (when it points anywhere) at DEAD."""
    def kc(cluster: str = f"server: {DEAD}", user: str = "token: abc",
           extra: str = "") -> str:
        return ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                f"clusters:\n- name: k\n  cluster:\n    {cluster}\n"
                f"users:\n- name: u\n  user:\n    {user}\n"
                "contexts:\n- name: c\n  context: {cluster: k, user: u}\n" + extra)

    yield "good-shape", kc()
    yield "empty", ""
    yield "null", "null\n"
    yield "list", "- 1\n"
    yield "scalar", "hello\n"
    yield "binary", b"\xff\xfe\x00garbage"
    yield "bom", b"\xef\xbb\xbf" + kc().encode()
    yield "utf16", kc().encode("utf-16")
    yield "json", json.dumps({"apiVersion": "v1", "clusters": [{"name": "k", "cluster": {
        "server": DEAD}}], "contexts": [{"name": "c", "context": {"cluster": "k"}}],
        "current-context": "c"})
    yield "no-clusters", "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
    yield "clusters-map", "apiVersion: v1\nclusters: {a: 1}\ncurrent-context: c\n"
    yield "clusters-nulls", "apiVersion: v1\nclusters: [null, 1]\ncontexts: [null]\n" \
        "users: [null]\ncurrent-context: c\n"
    yield "cluster-str", kc().replace(f"cluster:\n    server: {DEAD}", "cluster: x")
    yield "no-server", kc(cluster="insecure-skip-tls-verify: true")
    yield "server-int", kc(cluster="server: 5")
    yield "server-list", kc(cluster="server: [a]")
    yield "server-no-scheme", kc(cluster="server: 127.0.0.1:1")
    yield "server-bad-scheme", kc(cluster="server: ftp://127.0.0.1:1")
    yield "server-garbage", kc(cluster="server: 'http://[::1'")
    yield "server-port-huge", kc(cluster="server: https://127.0.0.1:99999")
    yield "server-userinfo", kc(cluster="server: https://user:secret@127.0.0.1:1")
    yield "server-unicode", kc(cluster="server: https://\u00e9\U0001f600:1")
    yield "server-empty", kc(cluster="server: ''")
    yield "server-newline", kc(cluster="server: \"https://127.0.0.1:1\\nerror: fake\"")
    yield "no-current-context", kc().replace("current-context: c\n", "")
    yield "current-context-missing", kc().replace("current-context: c", "current-context: zz")
    yield "current-context-int", kc().replace("current-context: c", "current-context: 5")
    yield "context-missing-cluster", kc().replace("{cluster: k, user: u}", "{user: u}")
    yield "context-null", kc().replace("context: {cluster: k, user: u}", "context: null")
    yield "context-cluster-unknown", kc().replace("{cluster: k, user: u}", "{cluster: zz}")
    yield "context-user-unknown", kc().replace("{cluster: k, user: u}", "{cluster: k, user: zz}")
    yield "context-namespace-int", kc().replace("{cluster: k, user: u}",
                                                "{cluster: k, user: u, namespace: 5}")
    yield "user-str", kc().replace("user:\n    token: abc", "user: x")
    yield "token-int", kc(user="token: 12345")
    yield "token-newline", kc(user="token: \"a\\nb\"")
    yield "token-huge", kc(user="token: " + "a" * 200000)
    yield "token-file-missing", kc(user="tokenFile: /nonexistent/token")
    yield "token-file-dir", kc(user="tokenFile: /")
    yield "token-file-devzero", kc(user="tokenFile: /dev/zero")
    yield "token-file-int", kc(user="tokenFile: 5")
    yield "ca-file-missing", kc(cluster=f"server: {DEAD}\n    certificate-authority: /nope/ca")
    yield "ca-file-garbage", kc(cluster=f"server: {DEAD}\n    certificate-authority: /etc/hostname")
    yield "ca-file-devzero", kc(cluster=f"server: {DEAD}\n    certificate-authority: /dev/zero")
    yield "ca-data-garbage", kc(cluster=f"server: {DEAD}\n    certificate-authority-data: !!!")
    yield "ca-data-not-pem", kc(cluster=f"server: {DEAD}\n    certificate-authority-data: "
                                "aGVsbG8=")
    yield "ca-data-int", kc(cluster=f"server: {DEAD}\n    certificate-authority-data: 5")
    yield "client-cert-missing", kc(user="client-certificate: /nope/c\n    client-key: /nope/k")
    yield "client-cert-data-garbage", kc(user="client-certificate-data: eA==\n"
                                         "    client-key-data: eA==")
    yield "client-cert-no-key", kc(user="client-certificate-data: eA==")
    yield "insecure-str", kc(cluster=f"server: {DEAD}\n    insecure-skip-tls-verify: 'yes'")
    yield "proxy-url", kc(cluster=f"server: {DEAD}\n    proxy-url: http://127.0.0.1:1")
    yield "proxy-url-garbage", kc(cluster=f"server: {DEAD}\n    proxy-url: '::'")
    yield "basic-auth", kc(user="username: a\n    password: b")
    yield "exec-missing", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                             "      command: /nonexistent/plugin")
    yield "exec-false", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                           "      command: /bin/false")
    yield "exec-garbage-out", kc(user="exec:\n      apiVersion: "
                                 "client.authentication.k8s.io/v1\n      command: /bin/echo\n"
                                 "      args: ['{{not json']")
    yield "exec-json-list", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                               "      command: /bin/echo\n      args: ['[1,2]']")
    yield "exec-no-token", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                              "      command: /bin/echo\n      args: ['{\"status\": {}}']")
    yield "exec-sleeps", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                            "      command: /bin/sleep\n      args: ['600']")
    yield "exec-sleeps-in-child", kc(user="exec:\n      apiVersion: "
                                     "client.authentication.k8s.io/v1\n      command: /bin/sh\n"
                                     "      args: ['-c', 'sleep 600; echo x']")
    yield "exec-floods", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                            "      command: /usr/bin/yes")
    yield "exec-no-command", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1")
    yield "exec-str", kc(user="exec: x")
    yield "exec-args-str", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                              "      command: /bin/echo\n      args: x")
    yield "exec-env-bad", kc(user="exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
                             "      command: /bin/echo\n      env: [1]")
    yield "auth-provider", kc(user="auth-provider:\n      name: gcp\n      config: {}")
    yield "deep", "a: " + "[" * 5000 + "]" * 5000
    yield "bomb", "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def kube_cases() -> Iterator[Case]:
    """Cluster commands with odd kubeconfigs and an unreachable server: exit 1 (or 2), one
    line, within the time limit."""
    for name, text in kubeconfigs():
        for cmd in (["queues"], ["submit", "llama31-8b-finetune"]):
            yield Case("kubeconfig", f"{cmd[0]}-{name}", [*cmd, "--kubeconfig", "{d}/kc"],
                       files={"kc": text}, codes=(1, 2), env={"HOME": "{d}"})
    for label, files, arg in [("missing", {}, "{d}/nope"), ("dir", {"kc": DIR}, "{d}/kc"),
                              ("fifo", {"kc": FIFO}, "{d}/kc"), ("devzero", {}, "/dev/zero"),
                              ("unreadable", {"kc": UNREADABLE}, "{d}/kc"),
                              ("selflink", {"kc": link("kc")}, "{d}/kc"), ("empty-arg", {}, "")]:
        yield Case("kubeconfig", f"queues-file-{label}", ["queues", "--kubeconfig", arg],
                   files=files, codes=(1, 2), env={"HOME": "{d}"})
    yield Case("kubeconfig", "token-file-unreadable",
               ["queues", "--kubeconfig", "{d}/kc"],
               files={"tok": UNREADABLE, "kc": next(t for n, t in kubeconfigs()
                                                     if n == "good-shape").__str__().replace(
                   "token: abc", "tokenFile: {d}/tok")}, codes=(1,), env={"HOME": "{d}"})


def env_cases() -> Iterator[Case]:
    """Environment variables the CLI reads."""
    home = {"HOME": "{d}"}
    for label, env in [
            ("kubeconfig-missing", {"KUBECONFIG": "{d}/nope"}),
            ("kubeconfig-multi", {"KUBECONFIG": "{d}/nope:{d}/nope2"}),
            ("kubeconfig-dir", {"KUBECONFIG": "{d}"}),
            ("kubeconfig-devzero", {"KUBECONFIG": "/dev/zero"}),
            ("kubeconfig-empty", {"KUBECONFIG": ""}),
            ("kubeconfig-colons", {"KUBECONFIG": ":::"}),
            ("incluster-no-files", {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                    "KUBERNETES_SERVICE_PORT": "1"}),
            ("incluster-port-garbage", {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                        "KUBERNETES_SERVICE_PORT": "x"}),
            ("incluster-host-garbage", {"KUBERNETES_SERVICE_HOST": "[::",
                                        "KUBERNETES_SERVICE_PORT": "1"}),
            ("home-missing", {"HOME": "/nonexistent"}),
    ]:
        yield Case("env", label, ["queues"], env={**home, **env}, codes=(1, 2))
    for label, url in [("prom-garbage", "not a url"), ("prom-dead", "http://127.0.0.1:1"),
                       ("prom-ftp", "ftp://127.0.0.1:1"), ("prom-userinfo",
                                                           "http://u:secret@127.0.0.1:1"),
                       ("prom-empty", "")]:
        yield Case("env", label, ["signals"], env={**home, "KUBECONFIG": "{d}/nope",
                                                    "M2G_PROMETHEUS_URL": url}, codes=(1, 2))
    for label, val in [("templates-file", "/etc/hostname"), ("templates-missing", "{d}/nope"),
                       ("templates-devnull", "/dev/null"), ("templates-empty", "")]:
        yield Case("env", label, ["templates", "list"], env={**home, "M2G_TEMPLATES": val},
                   codes=(0, 1, 2))
    for label, val in [("config-missing", "{d}/nope"), ("config-dir", "{d}"),
                       ("config-devzero", "/dev/zero"), ("config-empty", "")]:
        yield Case("env", label, ["run", "--kubeconfig", "{d}/nope"],
                   env={**home, "M2G_CONFIG": val}, codes=(1, 2))


def run_config_cases() -> Iterator[Case]:
    """``m2g run --config FILE`` and its options: a value m2g cannot use must be refused before
    it starts (one line, exit 2), never run with a value it misreads. The kubeconfig points
    nowhere, so a config that is accepted ends at the kubeconfig (exit 1)."""
    bad = {
        "empty": "", "list": "- 1\n", "scalar": "x\n", "null": "null\n",
        "unknown-top": "bogus: 1\n", "unknown-nested": "prometheus: {urll: x}\n",
        "prom-list": "prometheus: [1]\n", "prom-url-int": "prometheus: {url: 5}\n",
        "prom-url-garbage": "prometheus: {url: 'not a url'}\n",
        "planner-str": "planner: x\n", "planner-neg": "planner: {defaultKwPerGpu: -1}\n",
        "planner-nan": "planner: {defaultKwPerGpu: .nan}\n",
        "planner-inf": "planner: {defaultKwPerGpu: .inf}\n",
        "planner-huge": "planner: {defaultKwPerGpu: 1e308}\n",
        "planner-bigint": "planner: {defaultKwPerGpu: " + "9" * 5000 + "}\n",
        "lease-neg": "leaderElection: {leaseDurationSeconds: -1}\n",
        "lease-zero": "leaderElection: {leaseDurationSeconds: 0}\n",
        "lease-huge": "leaderElection: {leaseDurationSeconds: " + "9" * 30 + "}\n",
        "lease-str": "leaderElection: {leaseDurationSeconds: soon}\n",
        "lease-ns-bad": "leaderElection: {leaseNamespace: 'A B'}\n",
        "bomb": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
            f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
        "deep": "a: " + "[" * 5000 + "]" * 5000,
        "nul": "prometheus: {url: \"\\0\"}\n",
        "binary": "\xff\xfe",
        "dup-keys": "prometheus: {url: 'http://a'}\nprometheus: {url: 'http://b'}\n",
        "seconds-huge": "planner: {minShedSeconds: 1e300}\n",
        "seconds-neg": "planner: {minShedSeconds: -5}\n",
        "seconds-str": "planner: {minShedSeconds: 5m}\n",
        "ramp-inf": "planner: {rampKwPerSecond: .inf}\n",
        "kw-per-gpu-huge": "planner: {defaultKwPerGpu: 5000}\n",
        "prom-timeout-huge": "prometheus: {url: 'http://127.0.0.1:1', timeoutSeconds: 1e300}\n",
        "signal-max-age-inf": "signals: {rack_power_kw: {maxAgeSeconds: .inf}}\n",
        "signal-scale-nan": "signals: {rack_power_kw: {scale: .nan}}\n",
        "lease-name-bad": "leaderElection: {leaseName: 'A B'}\n",
        "two-docs": "planner: {}\n---\nplanner: {}\n",
        "api-version-wrong": "apiVersion: v1\nkind: SiteConfig\n",
        "cap-levels-wrong": "planner: {capLevels: [0.5, 0.9]}\n",
    }
    for name, text in bad.items():
        empty = name in ("empty", "null")  # the defaults: accepted, ends at the kubeconfig
        yield Case("run-config", name, ["run", "--config", "{d}/c.yaml", "--kubeconfig",
                                        "{d}/nope"], files={"c.yaml": text},
                   codes=(1,) if empty else (2,),
                   env={"HOME": "{d}"})
    for name, args in [("resync-neg", ["--resync-seconds", "-1"]),
                       ("resync-zero", ["--resync-seconds", "0"]),
                       ("resync-nan", ["--resync-seconds", "nan"]),
                       ("resync-inf", ["--resync-seconds", "inf"]),
                       ("resync-huge", ["--resync-seconds", "1e300"]),
                       ("port-neg", ["--metrics-port", "-1"]),
                       ("port-huge", ["--metrics-port", "99999"]),
                       ("clock-garbage", ["--clock-start", "yesterday"]),
                       ("clock-naive", ["--clock-start", "2026-01-01T00:00:00"]),
                       ("clock-year-9999", ["--clock-start", "9999-12-31T23:59:59Z"]),
                       ("log-level-bad", ["--log-level", "loud"]),
                       ("check-name-bad", ["--check-name", "A B/../"]),
                       ("lease-name-bad", ["--lease-name", "UPPER case"]),
                       ("policies-missing", ["--policies", "{d}/nope"]),
                       ("policies-devzero", ["--policies", "/dev/zero"]),
                       ("decision-log-file", ["--decision-log", "/etc/hostname"]),
                       ("config-dir", ["--config", "{d}"]),
                       ("config-fifo", ["--config", "{d}/fifo"]),
                       ("config-unreadable", ["--config", "{d}/unr"])]:
        yield Case("run-options", name, ["run", "--kubeconfig", "{d}/nope", *args],
                   files={"fifo": FIFO, "unr": UNREADABLE}, codes=(2,), env={"HOME": "{d}"})


def policy_cases() -> Iterator[Case]:
    """``m2g policy lint|test|eval|examples`` over hostile folders and inputs."""
    for name, files, ok in policy_files():
        tests_only = name.startswith("test-")
        passes = ok is not False or tests_only
        yield Case("policy-lint", name, ["policy", "lint", "{d}/p"],
                   files={f"p/{k}": v for k, v in files.items()},
                   codes=(0, 1) if passes else (1,))
        yield Case("policy-test", name, ["policy", "test", "{d}/p"],
                   files={f"p/{k}": v for k, v in files.items()},
                   codes=(0, 1) if ok is not False else (1,))
        yield Case("policy-eval-dir", name, ["policy", "eval", "-p", "{d}/p", "-i", "{d}/in"],
                   files={**{f"p/{k}": v for k, v in files.items()},
                          "in": json.dumps(GOOD_INPUT)},
                   codes=(0, 2) if passes else (2,), no_admit=ok is False and not tests_only)
    for name, data, ok in eval_inputs():
        yield Case("policy-eval-input", name, ["policy", "eval", "-p", "{d}/p", "-i", "{d}/in"],
                   files={"p/a.yaml": GOOD_POLICY, "in": data}, codes=(0, 2) if ok else (2,),
                   no_admit=True)
        yield Case("policy-eval-stdin", name, ["policy", "eval", "-p", "{d}/p", "-i", "-"],
                   files={"p/a.yaml": GOOD_POLICY}, stdin=data, codes=(0, 2) if ok else (2,),
                   no_admit=True)
    for label, files, arg in [("missing", {}, "{d}/nope"), ("dir", {"x": DIR}, "{d}/x"),
                              ("fifo-dir", {}, "/dev/zero"), ("devnull", {}, "/dev/null"),
                              ("unreadable", {"u": UNREADABLE}, "{d}/u"),
                              ("selflink", {"s": link("s")}, "{d}/s"), ("empty-arg", {}, "")]:
        yield Case("policy-eval-input", f"file-{label}",
                   ["policy", "eval", "-p", "{d}/p", "-i", arg],
                   files={"p/a.yaml": GOOD_POLICY, **files}, codes=(2,), no_admit=True)
    yield Case("policy-eval-input", "file-fifo-no-writer",  # waited forever, as cat does
               ["policy", "eval", "-p", "{d}/p", "-i", "{d}/f"],
               files={"p/a.yaml": GOOD_POLICY, "f": FIFO}, codes=(2,), no_admit=True,
               env={"M2G_INPUT_WAIT": "1"})
    for label, arg in [("missing", "{d}/nope"), ("devzero", "/dev/zero"),
                       ("devnull", "/dev/null"), ("root-proc", "/proc/self/fd"),
                       ("empty-arg", ""), ("dash", "-")]:
        yield Case("policy-lint", f"path-{label}", ["policy", "lint", arg], codes=(1, 2))
        yield Case("policy-eval-dir", f"path-{label}",
                   ["policy", "eval", "-p", arg, "-i", "{d}/in"],
                   files={"in": json.dumps(GOOD_INPUT)}, codes=(2,), no_admit=True)
    for stage in ["admission", "Bogus", "", "Placement", "Fairness", "Capacity", "Preemption"]:
        yield Case("policy-eval-input", f"stage-{stage!r}",
                   ["policy", "eval", "-p", "{d}/p", "-i", "{d}/in", "--stage", stage],
                   files={"p/a.yaml": GOOD_POLICY, "in": b"[1]\n"}, codes=(2,), no_admit=True)
    for engine in ["bogus", "", "cel-python"]:
        yield Case("policy-lint", f"engine-{engine!r}", ["policy", "lint", "{d}/p", "--engine",
                                                         engine],
                   files={"p/a.yaml": "x: [\n"}, codes=(1, 2))
    for label, files, arg in [("exists", {"x/a": "1"}, "{d}/x"), ("file", {"x": "1"}, "{d}/x"),
                              ("devnull", {}, "/dev/null"), ("empty-arg", {}, ""),
                              ("dangling", {"l": link("{d}/nowhere/x")}, "{d}/l"),
                              ("under-file", {"f": "1"}, "{d}/f/sub")]:
        yield Case("policy-examples", label, ["policy", "examples", arg], files=files,
                   codes=(2,))


def _parquet(columns: dict[str, object]) -> bytes:
    """A Parquet file of ``columns`` (pyarrow arrays or lists), as bytes."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def session30_cases() -> Iterator[Case]:
    """The thirtieth session probe (docs/reliability.md): options of the cluster commands with
    odd values, files a kubeconfig names that are FIFOs, devices or folders (a FIFO named as
    the CA or a client certificate blocked kr8s's open for ever: a hang), server URLs, PolicyTest
    files of odd shapes, decision logs whose Parquet columns have the wrong types, forecast and
    topology options."""
    import datetime as dt

    import pyarrow as pa

    home = {"HOME": "{d}"}
    kcfile = next(t for n, t in kubeconfigs() if n == "good-shape")
    assert isinstance(kcfile, str)
    kc_files: dict[str, tuple[str, str]] = {
        "ca-fifo": ("cluster", "certificate-authority: {d}/fifo"),
        "ca-dir": ("cluster", "certificate-authority: {d}"),
        "ca-devzero": ("cluster", "certificate-authority: /dev/zero"),
        "client-cert-fifo": ("user", "client-certificate: {d}/fifo\n    client-key: {d}/k"),
        "client-key-fifo": ("user", "client-certificate: {d}/k\n    client-key: {d}/fifo"),
        "client-key-devzero": ("user", "client-certificate: {d}/k\n    client-key: /dev/zero"),
        "token-file-fifo": ("user", "tokenFile: {d}/fifo"),
        "token-file-selflink": ("user", "tokenFile: {d}/loop"),
    }
    for label, (where, line) in kc_files.items():
        text = (kcfile.replace("server: https://127.0.0.1:1",
                               "server: https://127.0.0.1:1\n    " + line)
                if where == "cluster" else kcfile.replace("token: abc", line))
        for cmd in (["queues"], ["workloads", "-A"], ["status"], ["forecast"]):
            yield Case("kubeconfig-files", f"{cmd[0]}-{label}", [*cmd, "--kubeconfig", "{d}/kc"],
                       files={"kc": text, "fifo": FIFO, "k": "x", "loop": link("loop")},
                       codes=(1,), env=home)
    for label, server in [("host-label-64", "https://" + "a" * 64 + ":1"),
                          ("host-300", "https://" + "a." * 150 + "x:1"),
                          ("punycode-empty", "https://xn--:1"), ("space", "https://a b:1"),
                          ("percent-nul", "https://%00:1"), ("port-0", "https://127.0.0.1:0"),
                          ("path-query", "https://127.0.0.1:1/a/b?x=1#f"),
                          ("trailing-space", "'https://127.0.0.1:1 '"),
                          ("ipv6-zone", "'https://[fe80::1%eth9]:1'")]:
        yield Case("kubeconfig-files", f"server-{label}", ["queues", "--kubeconfig", "{d}/kc"],
                   files={"kc": kcfile.replace("server: https://127.0.0.1:1", "server: " + server)},
                   codes=(1,), env=home)
    for label, user in [("token-non-latin1", 'token: "\u00e9\u4e2d"'),
                        ("token-nul", 'token: "a\\0b"'),
                        ("key-data-not-base64", "client-certificate-data: '!!!'\n"
                         "    client-key-data: '!!!'"),
                        ("exec-empty-command", "exec:\n      apiVersion: "
                         "client.authentication.k8s.io/v1\n      command: ''"),
                        ("exec-command-dir", "exec:\n      apiVersion: "
                         "client.authentication.k8s.io/v1\n      command: /"),
                        ("exec-stderr-flood", "exec:\n      apiVersion: "
                         "client.authentication.k8s.io/v1\n      command: /bin/sh\n"
                         "      args: ['-c', 'head -c 20000000 /dev/zero >&2; echo {}']")]:
        yield Case("kubeconfig-files", f"user-{label}", ["queues", "--kubeconfig", "{d}/kc"],
                   files={"kc": kcfile.replace("token: abc", user)}, codes=(1,), env=home)
    yield Case("kubeconfig-files", "context-missing", ["queues", "--kubeconfig", "{d}/kc",
                                                       "--context", "nope"],
               files={"kc": kcfile}, codes=(1,), env=home)
    # options of the cluster commands: read before any request (exit 2), or the dead server
    kc = {"kc": kcfile}
    for label, args in [
            ("selector-unbalanced", ["workloads", "-l", "a in (b"]),
            ("selector-two-equals", ["workloads", "-l", "a=b=c"]),
            ("selector-100k", ["workloads", "-l", "a" * 100_000]),
            ("selector-unicode-key", ["workloads", "-l", "\u00e9=1"]),
            ("selector-only-commas", ["workloads", "-l", ",,,"]),
            ("selector-notin-empty", ["workloads", "-l", "a notin ()"]),
            ("selector-deep-parens", ["workloads", "-l", "a in " + "(" * 5000]),
            ("selector-bang-only", ["workloads", "-l", "!"]),
            ("field-selector-eqeq", ["workloads", "--field-selector", "=="]),
            ("field-selector-newline", ["workloads", "--field-selector", "a=b\nerror: x"]),
            ("sort-by-brace", ["workloads", "--sort-by", "{"]),
            ("sort-by-empty", ["queues", "--sort-by", ""]),
            ("sort-by-100k-dots", ["status", "--sort-by", "." * 100_000]),
            ("sort-by-huge-index", ["workloads", "--sort-by", ".a[99999999999999999999]"]),
            ("sort-by-range", ["queues", "--sort-by", "{range .items[*]}{.a}{end}"]),
            ("sort-by-filter", ["signals", "--sort-by", ".racks[?(@.x==1)]"]),
            ("output-unknown", ["queues", "-o", "jsonpath={.items}"]),
            ("output-empty", ["workloads", "-o", ""]),
            ("namespace-empty", ["workloads", "-n", ""]),
            ("namespace-upper", ["workloads", "-n", "A"]),
            ("namespace-64", ["workloads", "-n", "a" * 64]),
            ("namespace-bidi", ["explain", "x", "-n", "\u202ea"]),
            ("explain-empty", ["explain", ""]),
            ("explain-slash", ["explain", "/"]),
            ("explain-trailing-slash", ["explain", "a/"]),
            ("explain-three-parts", ["explain", "a/b/c"]),
            ("explain-300", ["explain", "a" * 300]),
            ("queue-bad", ["workloads", "-q", "A B"]),
            ("lease-namespace-bad", ["status", "--lease-namespace", "A B"]),
            ("lease-namespace-empty", ["status", "--lease-namespace", ""]),
            ("lease-name-bad", ["status", "--lease-name", "x/../y"]),
            ("forecast-hours-nan", ["forecast", "--hours", "nan"]),
            ("forecast-hours-inf", ["forecast", "--hours", "inf"]),
            ("forecast-hours-neg", ["forecast", "--hours", "-1"]),
            ("forecast-interval-float", ["forecast", "--interval", "1.5"]),
            ("forecast-interval-huge", ["forecast", "--interval", "9" * 30]),
            ("forecast-png-empty", ["forecast", "--png", ""]),
            ("forecast-png-dir", ["forecast", "--png", "{d}"]),
            ("forecast-window-devzero", ["forecast", "--with-window", "/dev/zero"]),
            ("forecast-window-dir", ["forecast", "--with-window", "{d}"]),
            ("forecast-new-work-bad", ["forecast", "--new-work", "all"]),
            ("forecast-output-yaml", ["forecast", "-o", "yaml"]),
            ("submit-output-bad", ["submit", "llama31-8b-finetune", "--dry-run", "-o", "table"]),
            ("submit-queue-bad", ["submit", "llama31-8b-finetune", "--dry-run", "-q", "A B"]),
            ("dry-run-strategy-bad", ["submit", "llama31-8b-finetune", "--dry-run=maybe"]),
    ]:
        needs_kc = args[0] not in ("forecast",) or "--hours" not in args
        yield Case("cli-options", label, [*args, "--kubeconfig", "{d}/kc"] if needs_kc else args,
                   files=kc, codes=(2,) if label.startswith("lease-") else (1, 2), env=home)
    for label, args in [("output-bogus", ["-o", "bogus"]), ("output-empty", ["-o", ""]),
                        ("config-devzero", ["-c", "/dev/zero"]), ("config-dir", ["-c", "{d}"]),
                        ("config-fifo", ["-c", "{d}/fifo"]),
                        ("config-bomb", ["-c", "{d}/bomb.yaml"])]:
        yield Case("topology", label, ["topology", "generate", *args],
                   files={"fifo": FIFO, "bomb.yaml": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
                       f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
                       for p, c in zip("abcdefgh", "bcdefghi", strict=True))},
                   codes=(2,), env=home)
    # decision logs whose Parquet columns have types m2g never writes
    t0 = pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC"))
    logs: dict[str, tuple[bytes, tuple[int, ...]]] = {
        "time-seconds-far": (_parquet({"time": pa.array([10 ** 12], pa.timestamp("s")),
                                       "kind": ["shed"]}), (1,)),
        "time-ns-negative": (_parquet({"time": pa.array([-(2 ** 62)], pa.timestamp("ns")),
                                       "kind": ["x"]}), (1,)),
        "time-int": (_parquet({"time": pa.array([1, 2]), "kind": ["a", "b"]}), (0,)),
        "time-list": (_parquet({"time": pa.array([[1], [2]]), "kind": ["a", "b"]}), (1,)),
        "time-date32-max": (_parquet({"time": pa.array([2 ** 31 - 1], pa.date32()),
                                      "kind": ["a"]}), (1,)),
        "time-dictionary": (_parquet({"time": pa.array(["2026-01-01T00:00:00Z"])
                                      .dictionary_encode(), "kind": ["a"]}), (0,)),
        "time-duration": (_parquet({"time": pa.array([10 ** 18], pa.duration("s")),
                                    "kind": ["a"]}), (1,)),
        "time-double": (_parquet({"time": [1.5e300], "kind": ["a"]}), (1,)),
        "time-text-years": (_parquet({"time": ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"],
                                      "grid_event": ["e", "e"], "site_draw_kw": [1.0, 2.0]}),
                            (0, 1)),
        "value-struct": (_parquet({"time": t0, "value": pa.array([{"a": 1}])}), (1,)),
        "value-decimal-1e30": (_parquet({"time": t0, "value": pa.array(
            [10 ** 30], pa.decimal128(38, 0))}), (0,)),
        "grid-level-2^62": (_parquet({"time": t0, "grid_level": [2 ** 62], "grid_event": ["e"],
                                      "grid_target_kw": [1.0], "site_draw_kw": [2.0]}), (0, 1)),
        "no-columns": (_parquet({"x": pa.array([], pa.int8())}), (1,)),
    }
    for label, (data, codes) in logs.items():
        for out in ("table", "json"):
            yield Case("report", f"parquet-{label}-{out}", ["report", "{d}/log", "-o", out],
                       files={"log/decisions.parquet": data}, codes=codes, env=home)
    for label, args in [("event-escape", ["--event", "a\x1b[2J"]), ("event-empty", ["--event", ""]),
                        ("interval-nan", ["--interval", "nan"]),
                        ("output-bogus", ["-o", "bogus"])]:
        yield Case("report", label, ["report", "{d}/log", *args],
                   files={"log/decisions.parquet": logs["time-int"][0]}, codes=(0, 2), env=home)
    # PolicyTest files of odd shapes: a load problem or a failing case is exit 1, never a pass
    # the file did not mean; a valid odd one may pass
    head = "apiVersion: m2g.io/v1alpha1\nkind: PolicyTest\nmetadata: {name: t}\n"
    inp = "{grid: {event: {active: true}}, workload: {name: w, flexTier: 3, gpus: 8}}"
    tests: dict[str, tuple[str, tuple[int, ...]]] = {
        "case-name-date": (f"cases:\n  - name: 2026-01-01\n    input: {inp}\n"
                           "    expect: {decision: Defer}\n", (1,)),
        "workload-name-date": ("cases:\n  - name: c\n    input: {grid: {event: {active: true}},"
                               " workload: {name: 2026-01-01, flexTier: 3, gpus: 8}}\n"
                               "    expect: {decision: Defer}\n", (0, 1)),
        "name-binary": ("cases:\n  - name: !!binary aGVsbG8=\n    input: {grid: {event: "
                        "{active: true}}, workload: {name: !!binary aGVsbG8=, flexTier: 3, "
                        "gpus: 8}}\n    expect: {decision: Defer}\n", (0, 1)),
        "merge-key-input": (f"cases:\n  - name: c\n    input: {{<<: {inp}}}\n"
                            "    expect: {decision: Defer}\n", (0, 1)),
        "anchor-outside-cases": (f"base: &b {inp}\ncases:\n  - name: c\n    input: *b\n"
                                 "    expect: {decision: Defer}\n", (1,)),
        "python-tag-input": ("cases:\n  - name: c\n    input: !!python/object/apply:os.system "
                             "[echo pwned]\n    expect: {decision: Defer}\n", (1,)),
        "cases-map": ("cases: {a: 1}\n", (1,)),
        "expect-extra-keys": (f"cases:\n  - name: c\n    input: {inp}\n    expect: "
                              "{decision: Defer, rules: 5, bogus: 1}\n", (1,)),
        "expect-reasons-wrong": (f"cases:\n  - name: c\n    input: {inp}\n    expect: "
                                 "{decision: Defer, reasons: [{policy: 1}]}\n", (1,)),
        "expect-null": (f"cases:\n  - name: c\n    input: {inp}\n    expect:\n", (1,)),
        "no-expect": (f"cases:\n  - name: c\n    input: {inp}\n", (1,)),
        "expect-lower": (f"cases:\n  - name: c\n    input: {inp}\n    expect: "
                         "{decision: defer}\n", (1,)),
        "stage-bogus": (f"stage: Bogus\ncases:\n  - name: c\n    input: {inp}\n"
                        "    expect: {decision: Defer}\n", (1,)),
        "duplicate-case-names": (f"cases:\n  - name: c\n    input: {inp}\n    expect: "
                                 "{decision: Defer}\n  - name: c\n    input: {grid: {event: "
                                 "{active: false}}, workload: {name: w, flexTier: 3, gpus: 8}}\n"
                                 "    expect: {decision: Defer}\n", (1,)),
        "now-yaml-date": ("cases:\n  - name: c\n    input: {now: 2026-01-01, grid: {event: "
                          "{active: true}}, workload: {name: w, flexTier: 3, gpus: 8}}\n"
                          "    expect: {decision: Defer}\n", (0, 1)),
        "name-90-digits": (f"cases:\n  - name: {'9' * 90}\n    input: {inp}\n"
                           "    expect: {decision: Defer}\n", (1,)),
        "kind-typo": ("", (1,)),
    }
    for label, (body, codes) in tests.items():
        text = (head.replace("PolicyTest", "PolicyTests") + "cases: []\n" if label == "kind-typo"
                else head + body)
        yield Case("policy-test-shapes", label, ["policy", "test", "{d}/p"],
                   files={"p/a.yaml": GOOD_POLICY, "p/a_test.yaml": text}, codes=codes)


CATALOGUE: list[Callable[[], Iterator[Case]]] = [
    policy_cases, templates_cases, kube_cases, env_cases, run_config_cases, session30_cases]


def all_cases() -> list[Case]:
    return [case for make in CATALOGUE for case in make()]


# ---------------------------------------------------------------------- subprocess runner

#: Above m2g's own bounds: an exec plugin that sleeps is killed at 20 s ($M2G_EXEC_TIMEOUT),
#: the first request gives up at 30 s.
TIME_LIMIT = 45.0
MEMORY_LIMIT = 2 << 30


def _limit() -> None:  # pragma: no cover - runs in the child
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.setsid()


def run_subprocess(case: Case, root: Path, m2g: str) -> tuple[str | None, str]:
    argv, env = materialise(case, root)
    full_env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
    full_env.update({"HOME": str(root), "KUBECONFIG": str(root / "no-kubeconfig"),
                     "NO_COLOR": "1"})
    full_env.update(env)
    if any("\x00" in a for a in argv):  # exec cannot pass it; the in-process runner does
        return None, "skipped: NUL in argv"
    try:
        proc = subprocess.run([m2g, *argv], input=case.stdin or b"", capture_output=True,
                              timeout=TIME_LIMIT, env=full_env, preexec_fn=_limit,
                              cwd=root, check=False)
    except subprocess.TimeoutExpired as exc:
        return "hang", (exc.stderr or b"").decode(errors="replace")[-300:]
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    return verdict(case, proc.returncode, out, err), (err.strip().splitlines() or [""])[-1][:300]


def main() -> int:  # pragma: no cover - a script
    import argparse
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m2g", default=str(Path(sys.executable).parent / "m2g"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("-k", default="", help="only cases whose id contains this")
    parser.add_argument("--areas", default="", help="only these areas (comma-separated)")
    parser.add_argument("-v", action="store_true", help="print every case")
    args = parser.parse_args()
    areas = set(filter(None, args.areas.split(",")))
    cases = [c for c in all_cases() if args.k in c.id and (not areas or c.area in areas)]
    tmp = Path(tempfile.mkdtemp(prefix="m2g-probe-"))
    started = time.monotonic()

    def one(item: tuple[int, Case]) -> tuple[Case, str | None, str]:
        i, case = item
        kind, last = run_subprocess(case, tmp / str(i), args.m2g)
        return case, kind, last

    by_area: Counter[str] = Counter()
    failed: Counter[tuple[str, str]] = Counter()
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for case, kind, last in pool.map(one, enumerate(cases)):
                by_area[case.area] += 1
                if kind:
                    failed[(case.area, kind)] += 1
                if kind or args.v:
                    print(f"{kind or 'ok':14} {case.id}  | {last}", flush=True)
    finally:
        for path in tmp.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o700) if path.is_dir() else path.chmod(0o600)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(cases)} cases in {time.monotonic() - started:.0f} s; "
          f"{sum(failed.values())} failed")
    for area, n in sorted(by_area.items()):
        kinds = {k: v for (a, k), v in failed.items() if a == area}
        print(f"  {area:18} {n:4}  failed: {kinds or 0}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
