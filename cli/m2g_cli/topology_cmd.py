"""``m2g topology generate``: the Kueue Topology and ResourceFlavor and the KAI Topology that
match the site's topology label mapping (m2g.config.topology), for ``kubectl apply``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
import yaml

from m2g.config import SiteConfig, SiteConfigError, load_site_config
from m2g.config.topology import topology_objects

app = typer.Typer(help="The Kueue and KAI Topology objects of the site's node labels.",
                  no_args_is_help=True)


def _site(config: Path | None) -> SiteConfig:
    path = config or (Path(p) if (p := os.environ.get("M2G_CONFIG")) else None)
    if path is None:
        return SiteConfig()
    try:
        return load_site_config(path)
    except SiteConfigError as exc:
        for line in exc.problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None


@app.command()
def generate(
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Site configuration (the file m2g run --config reads; default "
        "$M2G_CONFIG, else the defaults: GFD's clique, Topograph's rack and block labels)")] = None,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="yaml (documents for kubectl apply -f -) | json (a List)")] = "yaml",
    kueue: Annotated[bool, typer.Option(
        "--kueue/--no-kueue", help="The Kueue Topology and ResourceFlavor")] = True,
    kai: Annotated[bool, typer.Option("--kai/--no-kai", help="The KAI Topology")] = True,
) -> None:
    """Print the Topology objects for the site's node labels (block → rack → clique →
    hostname, without the levels the site has no label for)."""
    if output not in ("yaml", "json"):
        typer.echo(f"error: --output {output!r}: use yaml or json", err=True)
        raise typer.Exit(2)
    objs = topology_objects(_site(config).topology, kueue=kueue, kai=kai)
    if output == "json":
        typer.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs,
                               "metadata": {"resourceVersion": ""}}, indent=2))
    else:
        typer.echo(yaml.safe_dump_all(objs, sort_keys=False), nl=False)
