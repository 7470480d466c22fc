"""The Model-to-Grid twin (bench/twin.py): trace mapping, job progress, scenarios, metrics,
plots, and the harness that runs them on the local control plane (docs/twin.md)."""
