"""The CLI's terminal conventions: colour only on a terminal (NO_COLOR, --no-color), progress
only on an interactive stderr, shell completion, one-line errors with the documented codes."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from m2g_cli import term
from m2g_cli.app import app

runner = CliRunner()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NO_COLOR", raising=False)
    yield
    term.settings.no_color = False


def test_colour_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert term.color(Tty())
    assert not term.color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not term.color(Tty())


def test_no_color_option_turns_it_off() -> None:
    result = runner.invoke(app, ["--no-color", "version"])
    assert result.exit_code == 0
    assert term.settings.no_color and not term.color(Tty())


def test_progress_is_silent_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    async def answer() -> int:
        return 42

    assert term.run_async(answer(), "thinking") == 42
    assert capsys.readouterr() == ("", "")


def test_errors_are_one_plain_line_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exception) as info:
        term.fail("no workload named 'x'", term.USAGE)
    assert getattr(info.value, "exit_code", None) == 2
    assert capsys.readouterr().err == "error: no workload named 'x'\n"


def test_shell_completion_script() -> None:
    result = runner.invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0 and "_M2G_COMPLETE=complete_bash" in result.stdout


def test_a_missing_kubeconfig_is_exit_1_everywhere() -> None:
    missing = "/nonexistent/kubeconfig"
    for args in (["simulate", "--kubeconfig", missing], ["queues", "--kubeconfig", missing]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.stderr)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize(("argv", "line"), [
    (["workloads", "--bogus"], "error: No such option: --bogus (see 'm2g workloads -h')"),
    (["explain"], "error: Missing argument 'workload'. (see 'm2g explain -h')"),
    (["policy", "lint", "--zz"], "error: No such option: --zz (see 'm2g policy lint -h')"),
    (["workloads", "--x\x1b[31m"],  # a terminal escape in the option reaches no terminal
     "error: No such option: --x\\x1b[31m (see 'm2g workloads -h')"),
])
def test_a_usage_error_is_one_error_line_as_kubectl_says_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], line: str) -> None:
    """Through the console script's entry point (``main``, not typer's runner): an option
    typer refuses is exit 2 with one ``error:`` line naming the help, not typer's panel."""
    from typer import rich_utils

    from m2g_cli.app import main
    monkeypatch.setattr(rich_utils, "rich_format_error", rich_utils.rich_format_error)
    monkeypatch.setattr("sys.argv", ["m2g", *argv])
    with pytest.raises(SystemExit) as info:
        main(prog_name="m2g")
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", line + "\n")
