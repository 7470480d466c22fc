"""Bounded policy and input loading: every hostile file is one line with the documented exit
code (lint/test 1, eval 2), never a traceback, a hang or unbounded memory (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g.policy import PolicySetError, load_dir
from m2g.policy.jsonin import MAX_LINE_BYTES, loads, non_finite, records
from m2g.policy.yamlsrc import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, parse_documents
from m2g_cli.app import app
from tests.unit.policy_helpers import policy, write

runner = CliRunner()

GOOD = policy("dr", "Admission", """
    - name: defer
      when: "grid.event.active && workload.flexTier >= 2"
      decision: Defer
      message: "grid event"
""")


def alias_bomb(levels: int = 9) -> str:
    """The billion-laughs document: ``levels`` anchors, each nine aliases of the one before,
    inside a Policy's spec (564 bytes expand to 9^9 strings)."""
    lines = ['  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghijklmnop"[: levels - 1]:
        lines.append(f"  {name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
        prev = name
    return ("apiVersion: m2g.io/v1alpha1\nkind: Policy\nmetadata: {name: bomb}\nspec:\n"
            + "\n".join(lines) + "\n")


def run(*args: str, stdin: str | bytes | None = None) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), input=stdin)
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), \
        f"traceback leaked: {res.exception!r}"
    return res.exit_code, res.stdout, res.stderr


def only_problem(folder: Path) -> str:
    with pytest.raises(PolicySetError) as info:
        load_dir(folder)
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0].render()


def test_alias_bomb_is_measured_not_expanded(tmp_path: Path) -> None:
    text = alias_bomb()
    assert len(text) < 600
    line = only_problem(write(tmp_path, {"bomb.yaml": text}))
    assert f"more than {MAX_NODES:,} values once aliases are expanded" in line


def test_small_aliases_still_load() -> None:
    docs, probs = parse_documents("a: &x [1, 2]\nb: *x\n", "f.yaml")
    assert probs == [] and docs[0].data == {"a": [1, 2], "b": [1, 2]}


def test_recursive_alias_is_refused() -> None:
    _, probs = parse_documents("a: &x [*x]\n", "f.yaml")
    assert len(probs) == 1 and "aliases" in probs[0].message


@pytest.mark.parametrize("text", ["[" * 1000 + "]" * 1000, "a:\n" + "".join(
    " " * i + "b:\n" for i in range(1, 1000))])
def test_deep_yaml(text: str) -> None:
    _, probs = parse_documents(text, "deep.yaml")
    assert len(probs) == 1 and f"nested deeper than {MAX_DEPTH} levels" in probs[0].message


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1b", "\x7f"])
def test_control_characters(char: str) -> None:
    _, probs = parse_documents(f"apiVersion: m2g.io/v1alpha1\nkind: Policy\nmetadata: "
                               f"{{name: a{char}b}}\n", "c.yaml")
    assert [(p.line, "control character" in p.message) for p in probs] == [(3, True)]


def test_self_symlink_and_devices(tmp_path: Path) -> None:
    write(tmp_path / "dir", {"dr.yaml": GOOD})
    os.symlink("loop.yaml", tmp_path / "dir" / "loop.yaml")
    line = only_problem(tmp_path / "dir")
    assert "loop.yaml:1" in line and "symbolic links" in line
    os.symlink("self", tmp_path / "self")
    assert "symbolic links" in only_problem(tmp_path / "self")
    assert "not a folder or a regular file" in only_problem(Path("/dev/zero"))


def test_device_behind_a_yaml_name(tmp_path: Path) -> None:
    write(tmp_path, {"dr.yaml": GOOD})
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    assert "zero.yaml:1: -: cannot read file: not a regular file" in only_problem(tmp_path)


def test_oversized_and_binary_files(tmp_path: Path) -> None:
    write(tmp_path / "big", {"big.yaml": "#" * (MAX_FILE_BYTES + 1)})
    assert f"larger than {MAX_FILE_BYTES:,} bytes" in only_problem(tmp_path / "big")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "b.yaml").write_bytes(b"a: \xff\xfe\n")
    assert "not UTF-8" in only_problem(tmp_path / "bin")


def test_empty_folder_is_not_an_empty_policy_set(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "no Policy (m2g.io/v1alpha1)" in only_problem(tmp_path / "empty")
    code, out, err = run("policy", "eval", "-p", str(tmp_path / "empty"), "-i", "-",
                         stdin='{"workload": {}}')
    assert code == 2 and out == "" and "do not load" in err


def test_wrong_group_is_named(tmp_path: Path) -> None:
    text = GOOD.replace("m2g.io/v1alpha1", "m2g.example.com/v1alpha1")
    line = only_problem(write(tmp_path, {"dr.yaml": text}))
    assert "1 document(s) skipped for their group" in line
    assert "'m2g.example.com/v1alpha1' is not m2g.io/v1alpha1" in line
    code, _, _ = run("policy", "lint", str(tmp_path))
    assert code == 1


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": [-Infinity]}'])
def test_non_finite_constants_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        loads(text.encode())


def test_non_finite_literals_are_found() -> None:
    assert non_finite(loads(b'{"a": [1, {"b": 1e999}]}')) == "a[1].b: inf is not a finite number"
    assert non_finite(loads(b'{"a": -1e400}')) == "a: -inf is not a finite number"
    assert non_finite(loads(b'{"a": 1e300, "b": 1e-999, "c": 12345}')) is None


def test_deep_json() -> None:
    # beyond any recursion limit in force (cel-python raises it to 2,500 once it is used)
    for depth in (10_000, 100_000):
        with pytest.raises(ValueError, match="nested too deeply"):
            loads(b"[" * depth + b"]" * depth)
    assert loads(b"[" * 64 + b"]" * 64) is not None


@pytest.mark.parametrize("depth", [20, 500, 5000])
def test_eval_deep_input_is_one_error(tmp_path: Path, depth: int) -> None:
    folder = write(tmp_path, {"dr.yaml": GOOD})
    stdin = '{"workload": {"labels": ' + '{"a": ' * depth + "1" + "}" * depth + "}}\n"
    code, out, err = run("policy", "eval", "-p", str(folder), "-i", "-", stdin=stdin)
    assert code == 2 and "error" in json.loads(out) and err.count("\n") == 2


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e309", "-1" + "0" * 400 + ".0"])
@pytest.mark.parametrize("where", ["workload.estimatedKw", "site.power.headroomKw",
                                   "queue.nominalGpus"])
def test_eval_rejects_non_finite_inputs(tmp_path: Path, value: str, where: str) -> None:
    folder = write(tmp_path, {"dr.yaml": GOOD})
    top, *mid, leaf = where.split(".")
    inner = f'{{"{leaf}": {value}}}'
    for key in reversed(mid):
        inner = f'{{"{key}": {inner}}}'
    stdin = f'{{"{top}": {inner}}}\n'
    code, out, err = run("policy", "eval", "-p", str(folder), "-i", "-", stdin=stdin)
    assert code == 2 and ("finite" in err or "greater than or equal to 0" in err
                          or "valid integer" in err)  # nominalGpus is an integer
    assert "error" in json.loads(out) and "Admit" not in out


def test_one_bad_line_costs_only_itself(tmp_path: Path) -> None:
    folder = write(tmp_path, {"dr.yaml": GOOD})
    good = json.dumps({"workload": {"flexTier": 2}, "grid": {"event": {"active": True}}})
    stdin = "\n".join([good, "{oops", '{"workload": {"flexTier": 9}}', "[1]", good, ""]) + "\n"
    code, out, err = run("policy", "eval", "-p", str(folder), "-i", "-", stdin=stdin)
    assert code == 2
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r.get("decision") or f"error@{r['line']}" for r in rows] == [
        "Defer", "error@2", "error@3", "error@4", "Defer"]
    assert "<stdin>:2: not JSON" in err and "3 of 5 input(s)" in err


def test_over_long_line_ends_the_stream(tmp_path: Path) -> None:
    folder = write(tmp_path, {"dr.yaml": GOOD})
    stdin = '{"workload": {}}\n' + " " * (MAX_LINE_BYTES + 10)
    code, out, err = run("policy", "eval", "-p", str(folder), "-i", "-", stdin=stdin)
    assert code == 2 and "longer than" in err
    assert [("decision" in json.loads(x)) for x in out.splitlines()] == [True, False]


def test_eval_refuses_devices_and_folders(tmp_path: Path) -> None:
    folder = write(tmp_path, {"dr.yaml": GOOD})
    for source in ("/dev/zero", str(tmp_path)):
        code, out, err = run("policy", "eval", "-p", str(folder), "-i", source)
        assert (code, out) == (2, "") and "not a regular file or a pipe" in err


def test_records_pretty_document_and_fallback() -> None:
    import io

    pretty = json.dumps({"workload": {"gpus": 8}}, indent=2).encode()
    assert [r.value for r in records(io.BytesIO(pretty))] == [{"workload": {"gpus": 8}}]
    broken = b'{"a":\n1\n{"b": 2}\n'
    got = [(r.line, r.error is None) for r in records(io.BytesIO(broken))]
    assert got == [(1, False), (2, True), (3, True)]
