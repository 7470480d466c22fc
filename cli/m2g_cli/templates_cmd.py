"""``m2g templates list | show`` and ``m2g submit`` — workload templates on the command line.

Exit codes: 0 done; 2 a usage or validation error (unknown template, bad --set, a layout that
cannot be placed); 1 a cluster error (no cluster, CRD missing, forbidden, rejected). Every
error is one line on stderr.
"""

from __future__ import annotations

import shutil
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from m2g.templates import Rendered, TemplateError, loader, parse_sets, render
from m2g_cli import templates_view as view
from m2g_cli import term
from m2g_cli.ops_cmd import NoHeaders, SortBy, listing, rendered
from m2g_cli.views import Output as Structured

app = typer.Typer(help="List and inspect workload templates (recipes).", no_args_is_help=True)


class Output(StrEnum):
    """Manifest formats."""

    YAML = "yaml"
    JSON = "json"


DirOpt = Annotated[Path | None, typer.Option(
    "--templates-dir", envvar=loader.ENV_DIR,
    help="Folder of templates (default: the shipped ones)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="Parameter override key=value (repeatable)")]


def _fail(message: str, code: int) -> NoReturn:
    term.fail(message, code)


def _width() -> int:
    return shutil.get_terminal_size((view.WIDTH, 24)).columns if sys.stdout.isatty() \
        else view.WIDTH


def _rendered(name: str, sets: list[str] | None, folder: Path | None, namespace: str = "default",
              queue: str = "default") -> Rendered:
    try:
        template = loader.find(name, folder)
        return render(template, parse_sets(sets or []), namespace=namespace, queue=queue)
    except TemplateError as exc:
        _fail(str(exc), 2)


class ListOutput(StrEnum):
    """``templates list`` formats."""

    TABLE = "table"
    YAML = "yaml"
    JSON = "json"


@app.command("list")
def list_(templates_dir: DirOpt = None,
          output: Annotated[ListOutput, typer.Option("--output", "-o",
                                                     help="table | yaml | json")
                            ] = ListOutput.TABLE,
          no_headers: NoHeaders = False, sort_by: SortBy = None) -> None:
    """Table of templates: name, kind, default API, default GPUs, flex tier, description."""
    how = listing(no_headers, sort_by)
    try:
        found = loader.load_all(templates_dir).values()
    except TemplateError as exc:
        _fail(str(exc), 2)
    if output is ListOutput.TABLE:
        rendered(lambda: view.list_table(found, listing=how))
    else:
        rendered(lambda: view.list_structured(found, Structured(output.value), how))


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Template name (or a path to a template file)")],
    set_: SetOpt = None,
    templates_dir: DirOpt = None,
) -> None:
    """Parameters with defaults and bounds, and what they derive (GPUs, placement, memory)."""
    rendered = _rendered(name, set_, templates_dir)
    typer.echo(view.show_text(rendered, width=_width(), color=term.color()), nl=False)


def submit(
    template: Annotated[str, typer.Argument(help="Template name (or a path to a template file)")],
    set_: SetOpt = None,
    queue: Annotated[str, typer.Option("--queue", "-q", help="Kueue LocalQueue")] = "default",
    namespace: Annotated[str | None, typer.Option(
        "--namespace", "-n", help="Namespace (default: the kubeconfig context's, as kubectl)")
    ] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the manifests; create nothing")] = False,
    server_dry_run: Annotated[bool, typer.Option(
        "--server-dry-run", help="Let the API server validate (dryRun=All); create nothing")
    ] = False,
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.YAML,
    kubeconfig: Annotated[str | None, typer.Option(
        "--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")] = None,
    context: Annotated[str | None, typer.Option("--context")] = None,
    templates_dir: DirOpt = None,
    policies: Annotated[Path | None, typer.Option(
        "--policies", help="With --dry-run: evaluate these policy files instead of the "
        "cluster's Policy objects")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", envvar="M2G_PROMETHEUS_URL",
        help="With --dry-run: Prometheus URL for power and thermal")] = None,
) -> None:
    """Render TEMPLATE into a workload and create it in a Kueue LocalQueue.

    --dry-run prints the manifests (stdout) and the admission decision m2g would make now
    (stderr), read from the cluster like `m2g explain`.
    """
    from m2g_cli import names

    names.check(namespace, "namespace", namespace=True)
    names.check(queue, "queue")
    if namespace is None:
        from m2g.k8s.kubeconfig import context_namespace

        namespace = context_namespace(kubeconfig, context)
    rendered = _rendered(template, set_, templates_dir, namespace, queue)
    for note in rendered.notes:
        typer.echo(f"note: {note}", err=True)
    if dry_run:
        typer.echo(view.manifests_text(rendered.objects, output.value), nl=False)
        _decision(rendered, kubeconfig, context, policies, prometheus)
        return
    # imported here: the cluster client is slow to import, which every other m2g command
    # would pay
    from m2g_cli.templates_apply import ClusterError, connect, create

    try:
        api = connect(kubeconfig, context)
        try:
            for obj in rendered.objects:
                create(api, obj, dry_run=server_dry_run)
        finally:
            api.close()
    except ClusterError as exc:
        _fail(str(exc), 1)
    typer.echo(summary(rendered, namespace, queue, server_dry_run))


def _decision(rendered: Rendered, kubeconfig: str | None, context: str | None,
              policies: Path | None, prometheus: str | None) -> None:
    # imported here: the cluster client and the policy engine are slow to import
    from m2g_cli.cluster import CliError
    from m2g_cli.preview import preview
    from m2g_cli.views import render_preview

    try:
        found = term.run_async(preview(rendered, kubeconfig, context, policies, prometheus),
                               "reading the cluster")
    except CliError as exc:
        _fail(str(exc), exc.code)
    typer.echo(render_preview(found.explanation, found.notes), err=True, nl=False)


def summary(rendered: Rendered, namespace: str, queue: str, validated_only: bool) -> str:
    """One line about what was created (or validated)."""
    w, s = rendered.workload, rendered.sizing
    verb = "validated (server dry-run)" if validated_only else "created"
    return (f"{verb} {w['kind']}/{w['metadata']['name']} in namespace {namespace}, queue "
            f"{queue}: {s.gpus} GPUs in {s.pods * s.groups} pods, ~{s.kw:g} kW")
