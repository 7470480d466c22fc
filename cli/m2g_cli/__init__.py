"""The m2g command line: a typer app over the m2g library, with pure renderers."""
