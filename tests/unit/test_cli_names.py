"""Resource names on the command line are checked before any API call: one line, exit 2
(without a cluster, a valid name gets as far as "no cluster", exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from m2g_cli.app import app
from m2g_cli.names import problem


@pytest.mark.parametrize(("argv", "error"), [
    (["explain", "a/b/c"], "error: workload 'a/b/c': NAME or NAMESPACE/NAME\n"),
    (["explain", "x" * 300], f"error: workload name '{'x' * 60}...' is longer than 253 "
     "characters (300)\n"),
    (["explain", "Bad_Name"], "error: workload name 'Bad_Name' is not a DNS-1123 subdomain "
     "(lower-case letters, digits, '-', '.')\n"),
    (["explain", "NS/w"], "error: namespace 'NS' is not a DNS-1123 label (lower-case letters, "
     "digits, '-')\n"),
    (["explain", ""], "error: workload name '' is not a DNS-1123 subdomain (lower-case "
     "letters, digits, '-', '.')\n"),
    (["workloads", "-n", "a" * 64], f"error: namespace '{'a' * 60}...' is longer than 63 "
     "characters (64)\n"),
    (["workloads", "-q", "q\n"], "error: queue 'q\\n' is not a DNS-1123 subdomain (lower-case "
     "letters, digits, '-', '.')\n"),
    (["submit", "rack-benchmark", "-n", "a.b"], "error: namespace 'a.b' is not a DNS-1123 "
     "label (lower-case letters, digits, '-')\n"),
])
def test_a_bad_name_is_one_line_exit_2_before_the_cluster(argv: list[str], error: str,
                                                          tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none"), "NO_COLOR": "1"}
    result = CliRunner().invoke(app, argv, env=env)
    assert (result.exit_code, result.stderr) == (2, error)


def test_a_good_name_goes_on_to_the_cluster(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none"), "NO_COLOR": "1"}
    result = CliRunner().invoke(app, ["explain", "research/job-a.b-1"], env=env)
    assert result.exit_code == 1 and result.stderr.startswith("error: no cluster")
    assert problem("a" * 253) is None and problem("a" * 63, namespace=True) is None
