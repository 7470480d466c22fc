"""Workload templates: validated recipes rendered to Kubernetes workload manifests.

Pure library (no cluster I/O; ``loader`` is the one module that reads files). Start with
``loader.find`` / ``loader.load_all`` and ``render.render``; docs/templates.md is the guide.
"""

from __future__ import annotations

from m2g.templates.errors import TemplateError
from m2g.templates.params import CATALOGUE, Values, parse_sets, resolve, settable
from m2g.templates.render import Rendered, render
from m2g.templates.schema import WorkloadApi, WorkloadTemplate
from m2g.templates.sizing import Sizing, size

__all__ = [
    "CATALOGUE",
    "Rendered",
    "Sizing",
    "TemplateError",
    "Values",
    "WorkloadApi",
    "WorkloadTemplate",
    "parse_sets",
    "render",
    "resolve",
    "settable",
    "size",
]
