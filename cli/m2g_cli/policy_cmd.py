"""``m2g policy lint | test | eval | examples`` — the command-line contract of
docs/policy-format.md.

Exit codes: lint 0 clean / 1 problems; test 0 all passed / 1 failures or broken policies;
eval 0 on any decision / 2 on bad policies or any bad input (each bad input is one line, the
others are still evaluated); examples 0 / 2 when it cannot copy. Every problem is one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from m2g.policy import Evaluator, PolicySet, PolicySetError, Stage, build, read_dir
from m2g.policy.errors import EngineUnavailable
from m2g.policy.loader import Sources, object_name_problems
from m2g.policy.runtime import ENGINES, Runtime, make_runtime
from m2g.policy.scanlint import scan_warnings
from m2g.policy.testing import run_tests
from m2g.shipped import POLICIES, shipped_dir
from m2g_cli.policy_eval import InputUnusable, evaluate_stream, open_input

app = typer.Typer(help="Lint, test and evaluate m2g policy files.", no_args_is_help=True)

EngineOpt = Annotated[
    str | None,
    typer.Option("--engine",
                 help=f"CEL runtime: {' | '.join(ENGINES)} (default: the first that imports)"),
]


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _runtime(engine: str | None, code: int) -> Runtime:
    try:
        return make_runtime(engine)
    except EngineUnavailable as exc:
        _err(f"error: {exc}")
        raise typer.Exit(code) from None


def _build_or_exit(sources: Sources, runtime: Runtime, summary: str) -> PolicySet:
    """The policy set, or every problem on stdout (one line each) and exit 1."""
    try:
        return build(sources, runtime)
    except PolicySetError as exc:
        for problem in exc.problems:
            typer.echo(problem.render())
        _err(f"{len(exc.problems)} {summary}")
        raise typer.Exit(1) from None


@app.command()
def lint(
    directory: Annotated[Path, typer.Argument(help="Folder (or file) of policies and tests")],
    engine: EngineOpt = None,
) -> None:
    """Parse, type-check and compile every policy; one line per problem (FILE:LINE: policy/rule),
    a Policy name the API server refuses included. Warnings (exit code 0): expressions that
    scan the factory once per workload."""
    runtime = _runtime(engine, 1)
    sources = read_dir(directory)
    pset = _build_or_exit(sources, runtime, f"problem(s) in {directory}")
    names = object_name_problems(sources)
    for problem in names:
        typer.echo(problem.render())
    if names:
        _err(f"{len(names)} problem(s) in {directory}")
        raise typer.Exit(1)
    warnings = scan_warnings(pset)
    for warning in warnings:
        typer.echo(warning.render())
    _err(f"ok: {len(pset.policies)} policies and {len(sources.tests)} test files in "
         f"{sources.files} files ({runtime.name})"
         + (f"; {len(warnings)} warning(s)" if warnings else ""))


@app.command()
def test(
    directory: Annotated[Path, typer.Argument(help="Folder with policies and *_test.yaml files")],
    engine: EngineOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List passing cases")] = False,
) -> None:
    """Run every PolicyTest under DIRECTORY against the policies under it."""
    runtime = _runtime(engine, 1)
    sources = read_dir(directory)
    pset = _build_or_exit(sources, runtime, f"problem(s): policies under {directory} do not "
                                            "load; no test ran")
    results = run_tests(pset, sources.tests)
    for res in results:
        if not res.passed:
            typer.echo(res.render())
        elif verbose:
            typer.echo(f"ok   {res.file}:{res.line}: {res.test}/{res.case}")
    failed = sum(not r.passed for r in results)
    typer.echo(f"{len(results) - failed} passed, {failed} failed ({runtime.name})")
    if failed or not results:
        if not results:
            _err(f"error: no PolicyTest cases found under {directory}")
        raise typer.Exit(1)


class _OutputFailed(Exception):
    """Writing a decision failed (a closed pipe, a full disk): carried past ``open_input``,
    which would read any OSError as the input's ("cannot read input ...", exit 2)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _out(line: str) -> None:
    try:
        typer.echo(line)
    except OSError as exc:
        raise _OutputFailed(exc) from exc


@app.command(name="eval")
def eval_(
    policies: Annotated[Path, typer.Option("--policies", "-p", help="Folder of policies")],
    input_: Annotated[str, typer.Option("--input", "-i", help="JSON file, JSON Lines file, or -")],
    engine: EngineOpt = None,
    stage: Annotated[Stage, typer.Option("--stage", help="Stage to evaluate")] = Stage.ADMISSION,
) -> None:
    """Evaluate inputs: one JSON line per input, in order: its decision or its error."""
    runtime = _runtime(engine, 2)
    try:
        pset = build(read_dir(policies), runtime)
    except PolicySetError as exc:
        for problem in exc.problems:
            _err(problem.render())
        _err(f"error: the policies under {policies} do not load ({len(exc.problems)} problem(s))")
        raise typer.Exit(2) from None
    name = "<stdin>" if input_ == "-" else input_
    try:
        with open_input(input_) as stream:
            total, bad = evaluate_stream(Evaluator(pset), stage, stream, name, _out, _err)
    except InputUnusable as exc:
        _err(f"error: {exc}")
        raise typer.Exit(2) from None
    except _OutputFailed as exc:  # the output's, not the input's: as every command's (app.main)
        raise exc.error from None
    if not total:
        _err(f"error: input {name} is empty")
    if bad or not total:
        if bad:
            _err(f"error: {bad} of {total} input(s) in {name} were not evaluated")
        raise typer.Exit(2)


@app.command()
def examples(
    dest: Annotated[Path | None, typer.Argument(
        help="Copy the example policies (and their tests) into this new folder")] = None,
) -> None:
    """Print the folder of the shipped example policies, or copy them to DEST.

    ``m2g policy test "$(m2g policy examples)"`` runs their tests where m2g is installed.
    """
    src = shipped_dir(POLICIES)
    if not src.is_dir():
        _err(f"error: the example policies are not installed (no {src})")
        raise typer.Exit(2)
    if dest is None:
        typer.echo(str(src))
        return
    if dest.exists():
        _err(f"error: {dest} exists; name a new folder")
        raise typer.Exit(2)
    try:
        shutil.copytree(src, dest)
    except OSError as exc:
        _err(f"error: cannot copy to {dest}: {exc.strerror or exc}")
        raise typer.Exit(2) from None
    _err(f"copied {sum(1 for _ in dest.rglob('*.yaml'))} files to {dest}")
