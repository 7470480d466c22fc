"""Fuzzing the policy loader: any text, any structure in a Policy's place, any expression —
a PolicySet or a PolicySetError of one-line problems, never another exception."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from m2g.policy import PolicySetError, build, make_runtime, read_texts
from m2g.policy.yamlsrc import MAX_NODES, parse_documents
from tests.fuzz.helpers import count, json_values

RUNTIME = make_runtime("cel-expr-python")

BASE: dict[str, Any] = {
    "apiVersion": "m2g.io/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
    "spec": {"stage": "Admission", "priority": 10, "failurePolicy": "Fail",
             "match": {"workloadKinds": ["training"]},
             "variables": [{"name": "big", "expression": "workload.gpus > 64"}],
             "rules": [{"name": "r", "when": "variables.big && grid.event.active",
                        "decision": "Defer", "requeueAfter": "600",
                        "message": "grid event"}]}}

KEYS = st.sampled_from(["apiVersion", "kind", "metadata", "name", "spec", "stage", "rules",
                        "when", "decision", "match", "variables", "expression", "priority",
                        "failurePolicy", "message", "messageExpression", "requeueAfter",
                        "podSetUpdates", "quota", "score", "eligible", "weight"])
#: The paths of BASE a mutation may replace.
PATHS = [("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"), ("spec",),
         ("spec", "stage"), ("spec", "priority"), ("spec", "failurePolicy"), ("spec", "match"),
         ("spec", "variables"), ("spec", "rules"), ("spec", "rules", 0),
         ("spec", "rules", 0, "when"), ("spec", "rules", 0, "decision"),
         ("spec", "rules", 0, "requeueAfter"), ("spec", "rules", 0, "message"),
         ("spec", "variables", 0, "expression")]


def one_line_problems(texts: dict[str, str]) -> None:
    try:
        pset = build(read_texts(texts), RUNTIME)
    except PolicySetError as exc:
        assert exc.problems
        for p in exc.problems:
            assert "\n" not in p.render(), p.render()
    else:
        assert pset.policies


@given(st.text(max_size=400))
def test_any_text(text: str) -> None:
    count()
    _, problems = parse_documents(text, "f.yaml")
    assert all("\n" not in p.render() for p in problems)
    one_line_problems({"f.yaml": text})


@given(st.lists(st.tuples(st.sampled_from(PATHS), json_values(KEYS)), min_size=1, max_size=3))
def test_mutated_policy(mutations: list[tuple[tuple[Any, ...], Any]]) -> None:
    count()
    doc = copy.deepcopy(BASE)
    for path, value in mutations:
        target: Any = doc
        for key in path[:-1]:
            if (isinstance(target, dict) and key in target) or (isinstance(target, list) and isinstance(key, int) and key < len(target)):
                target = target[key]
            else:
                break
        else:
            if isinstance(target, dict) or (isinstance(target, list)
                                            and isinstance(path[-1], int)
                                            and path[-1] < len(target)):
                target[path[-1]] = value
    one_line_problems({"Policy/p": yaml.safe_dump(doc)})


CEL_TOKENS = st.sampled_from([
    "workload.gpus", "workload.flexTier", "site.power.headroomKw", "grid.event.active", "1",
    "2.5", "'x'", "true", "&&", "||", "!", ">", "<", "==", "+", "*", "/", "%", "(", ")", "[",
    "]", ".", ",", "?", ":", "topology.racks", ".exists(r, ", ".map(x, ", ".all(d, ", "r.freeGpus",
    "x", "size(", "int(", "double(", "string(", "duration('1h')", "now", "timestamp('x')",
    "\x00", "\u202e", "\"", "\\", "in", "{", "}", "null", "-9223372036854775808"])


@given(st.lists(CEL_TOKENS, min_size=1, max_size=14))
def test_random_expressions(tokens: list[str]) -> None:
    count()
    doc = copy.deepcopy(BASE)
    doc["spec"]["rules"][0]["when"] = " ".join(tokens)
    one_line_problems({"Policy/p": yaml.safe_dump(doc)})


@given(st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=12),
       st.booleans())
def test_aliases_of_any_shape(levels: int, fanout: int, inline: bool) -> None:
    count()
    lines = ["a0: &a0 [x, y]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * fanout)
        lines.append(f"a{i}: &a{i} [{refs}]" if inline else f"a{i}: &a{i}\n" +
                     "\n".join(f"  - *a{i - 1}" for _ in range(fanout)))
    text = ("apiVersion: m2g.io/v1alpha1\nkind: PolicyTest\nmetadata: {name: t}\n"
            + "\n".join(lines) + "\n")
    docs, problems = parse_documents(text, "a.yaml")
    assert bool(docs) != bool(problems)
    size = 3  # a0: the list and its two strings
    expanded = size
    for _ in range(1, levels):
        size = 1 + fanout * size
        expanded += size
    if expanded > 2 * MAX_NODES:
        assert problems and "aliases" in problems[0].message
    if problems:
        assert "aliases" in problems[0].message and expanded > MAX_NODES // 2


CEL_TOKENS = st.sampled_from(["workload.name", "variables.v", "'abc'", "\"x\"", "r'\\d'", "b'y'",
                              "+", "-", "*", "!", "?", ":", "(", ")", "[", "]", "{", "}", ",",
                              ".", "map", "filter", "all", "exists", "(a,", "1", "2.5", "3u",
                              "0x1F", "true", "null", "in", "&&", "||", "==", "size(", "'''t'''",
                              "[?", ".?", "a", "// c\n", "\\", "'"])


@given(st.one_of(st.text(max_size=200), st.lists(CEL_TOKENS, max_size=40).map(" ".join)))
def test_cost_estimate_of_any_text(text: str) -> None:
    """m2g.policy.cost reads any text: a Cost, or CostError (then the crude bound applies)."""
    from m2g.policy.cost import Cost, CostError, crude, estimate

    count()
    try:
        cost = estimate(text, lambda _: Cost(10, 0))
    except CostError:
        cost = crude(text)
    assert cost.size >= 0 and cost.alloc >= 0
