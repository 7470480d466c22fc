"""The command-line contract: m2g policy lint / test / eval, exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g_cli.app import app
from tests.unit.policy_helpers import policy, write

runner = CliRunner()

GOOD = policy("dr", "Admission", """
    - name: defer
      when: "grid.event.active && workload.flexTier >= 2"
      decision: Defer
      requeueAfter: "grid.event.endsInSeconds"
      messageExpression: "'grid event ' + grid.event.id + ' is active'"
""")
DR_INPUT = {"workload": {"flexTier": 2},
            "grid": {"event": {"active": True, "id": "e1", "endsInSeconds": 900}}}


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), input=stdin)
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), \
        f"traceback leaked: {res.exception!r}"
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def good_dir(tmp_path: Path) -> Path:
    return write(tmp_path / "good", {"dr.yaml": GOOD})


BROKEN = {
    "yaml": ("x.yaml", "apiVersion: m2g.io/v1alpha1\nkind: Policy\nmetadata: {name: x\n",
             "invalid YAML"),
    "syntax": ("x.yaml", policy("x", "Admission", '- {name: r, when: "workload.gpus >", '
                                                   'decision: Defer}'), "x/r: when:"),
    "types": ("x.yaml", policy("x", "Admission", '- {name: r, when: "workload.gpus * 1.5 > 2.0",'
                                                  ' decision: Defer}'),
              "no matching overload"),
    "field": ("x.yaml", policy("x", "Admission", '- {name: r, when: "workload.gpuz > 2",'
                                                  ' decision: Defer}'), "undefined field 'gpuz'"),
    "decision": ("x.yaml", policy("x", "Admission", '- {name: r, when: "true", decision: Maybe}'),
                 "decision"),
    "not-bool": ("x.yaml", policy("x", "Admission", '- {name: r, when: "workload.gpus",'
                                                     ' decision: Defer}'),
                 "must return bool, but returns int"),
    "stage-field": ("x.yaml", policy("x", "Capacity", '- {name: r, when: "true", quota: "1",'
                                                       ' decision: Defer}'),
                    "not allowed in stage Capacity"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_lint_and_eval_reject_broken_files(tmp_path: Path, case: str) -> None:
    name, text, needle = BROKEN[case]
    folder = write(tmp_path / case, {"ok.yaml": GOOD, name: text})
    code, out, _ = run("policy", "lint", str(folder))
    assert code == 1
    lines = out.strip().splitlines()
    assert lines and all(line.count(":") >= 3 for line in lines)
    assert any(needle in line for line in lines), out
    assert lines[0].split(":")[0].endswith("x.yaml")
    (tmp_path / "in.json").write_text(json.dumps(DR_INPUT))
    code, out, err = run("policy", "eval", "--policies", str(folder), "--input",
                         str(tmp_path / "in.json"))
    assert code == 2 and out == "" and "error:" in err


def test_lint_line_points_at_the_rule(tmp_path: Path) -> None:
    text = policy("x", "Admission", """
        - {name: fine, when: "true", decision: Admit}
        - name: bad
          when: "workload.gpus * 1.5 > 2.0"
          decision: Defer
    """)
    folder = write(tmp_path, {"p.yaml": text})
    code, out, _ = run("policy", "lint", str(folder))
    expected_line = text.splitlines().index('      when: "workload.gpus * 1.5 > 2.0"') + 1
    assert code == 1
    assert out.startswith(f"{folder / 'p.yaml'}:{expected_line}: x/bad: when: column 15:")


def test_lint_reports_every_problem(tmp_path: Path) -> None:
    folder = write(tmp_path, {
        "a.yaml": policy("a", "Admission", '- {name: r, when: "nope", decision: Defer}'),
        "b.yaml": policy("b", "Admission", '- {name: r, when: "1 +", decision: Defer}'),
    })
    code, out, _ = run("policy", "lint", str(folder))
    assert code == 1 and len(out.strip().splitlines()) == 2


def test_lint_refuses_a_policy_name_the_api_server_refuses(tmp_path: Path) -> None:
    """Upper case, '_', a leading '-', an empty label: lint said ok, and ``kubectl apply`` of the
    GitOps folder it had checked failed (the probe's gap)."""
    rule = '- {name: r, when: "true", decision: Defer}'
    bad = ("DR-Flex", "dr_flex", "-dr", "dr.", "dr..flex")
    folder = write(tmp_path / "bad", {f"p{i}.yaml": policy(name, "Admission", rule)
                                      for i, name in enumerate(bad)})
    code, out, err = run("policy", "lint", str(folder))
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == len(bad), out
    assert all("metadata.name is not a Kubernetes object name" in x for x in lines)
    assert lines[0].startswith(f"{folder / 'p0.yaml'}:3: DR-Flex")
    assert f"{len(bad)} problem(s)" in err
    ok = write(tmp_path / "ok", {"p.yaml": policy("m2g.dr-flex-2", "Admission", rule)})
    assert run("policy", "lint", str(ok))[0] == 0
    # the other commands read the files as they are
    assert run("policy", "test", str(folder))[2].count("metadata.name") == 0


def test_lint_ok(good_dir: Path) -> None:
    code, out, err = run("policy", "lint", str(good_dir))
    assert (code, out) == (0, "")
    assert "ok: 1 policies" in err


def test_eval_single_object(good_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text(json.dumps(DR_INPUT, indent=2))
    code, out, _ = run("policy", "eval", "--policies", str(good_dir), "--input",
                       str(tmp_path / "in.json"))
    assert code == 0
    assert json.loads(out) == {
        "decision": "Defer", "requeueAfterSeconds": 900, "podSetUpdates": [],
        "reasons": [{"policy": "dr", "rule": "defer", "decision": "Defer",
                     "message": "grid event e1 is active"}],
    }


@pytest.mark.parametrize("engine", ["cel-expr-python", "cel-python"])
def test_eval_json_lines_from_stdin(good_dir: Path, engine: str) -> None:
    lines = [DR_INPUT, {"workload": {"flexTier": 0}}, DR_INPUT]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\n"
    code, out, _ = run("policy", "eval", "-p", str(good_dir), "-i", "-", "--engine", engine,
                       stdin=stdin)
    assert code == 0
    decisions = [json.loads(line)["decision"] for line in out.strip().splitlines()]
    assert decisions == ["Defer", "Admit", "Defer"]


@pytest.mark.parametrize(("stdin", "needle"), [
    ('{"workload": {"gpuz": 3}}', "workload.gpuz: Extra inputs are not permitted"),
    ('{"workload": {"flexTier": 7}}', "workload.flexTier"),
    ('{"workload": {"kind": "simulation"}}', "workload.kind"),
    ("[1, 2]", "must be a JSON object"),
    ('{"workload": {}}\n{not json}\n', "<stdin>:2: not JSON"),
    ("", "empty"),
])
def test_eval_bad_input_exit_2(good_dir: Path, stdin: str, needle: str) -> None:
    code, out, err = run("policy", "eval", "-p", str(good_dir), "-i", "-", stdin=stdin)
    assert code == 2
    assert needle in err and "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len([x for x in stdin.splitlines() if x.strip()]) or \
        (len(lines) == 1 and stdin.count("\n") <= 1)
    assert any("error" in x for x in lines) == bool(stdin)


def test_eval_missing_input_file(good_dir: Path, tmp_path: Path) -> None:
    code, _, err = run("policy", "eval", "-p", str(good_dir), "-i", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read input" in err


def test_unknown_engine(good_dir: Path) -> None:
    code, _, err = run("policy", "lint", str(good_dir), "--engine", "v8")
    assert code == 1 and "unknown CEL engine 'v8'" in err


def test_policy_test_reports_expected_vs_got(tmp_path: Path) -> None:
    test_doc = """apiVersion: m2g.io/v1alpha1
kind: PolicyTest
metadata: {name: t}
cases:
  - name: passes
    input: {workload: {flexTier: 2}, grid: {event: {active: true, id: e, endsInSeconds: 60}}}
    expect: {decision: Defer, requeueAfterSeconds: 60, reasons: [dr/defer]}
  - name: fails
    input: {workload: {flexTier: 2}, grid: {event: {active: true, id: e, endsInSeconds: 60}}}
    expect: {decision: Admit}
"""
    folder = write(tmp_path, {"dr.yaml": GOOD, "dr_test.yaml": test_doc})
    code, out, _ = run("policy", "test", str(folder))
    assert code == 1
    assert "decision: expected 'Admit', got 'Defer'" in out
    assert out.strip().splitlines()[-1].startswith("1 passed, 1 failed")


def test_missing_directory(tmp_path: Path) -> None:
    code, out, _ = run("policy", "lint", str(tmp_path / "nope"))
    assert code == 1 and "no such file or directory" in out.lower()


def test_other_api_groups_are_skipped(tmp_path: Path) -> None:
    kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    folder = write(tmp_path, {"dr.yaml": GOOD, "kustomization.yaml": kustomization})
    assert run("policy", "lint", str(folder))[0] == 0
    folder2 = write(tmp_path / "t", {"x.yaml": "apiVersion: m2g.io/v1alpha1\nkind: Polcy\n"})
    code, out, _ = run("policy", "lint", str(folder2))
    assert code == 1 and "unknown kind 'Polcy'" in out
