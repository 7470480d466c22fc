"""Shared helpers for the template tests: the shipped templates and a pod-template walker."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from m2g.templates import WorkloadTemplate
from m2g.templates.loader import load_all

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
Obj = dict[str, Any]


@cache
def shipped() -> dict[str, WorkloadTemplate]:
    return load_all(TEMPLATES)


def pod_templates(obj: Any, path: str = "") -> Iterator[tuple[str, Obj]]:
    """Every PodTemplateSpec-like dict in a manifest (metadata + spec.containers), with path;
    a TrainJob runtime patch's pod template counts too (it carries only the pod metadata)."""
    if isinstance(obj, dict):
        spec = obj.get("spec")
        if "metadata" in obj and isinstance(spec, dict) and "containers" in spec:
            yield path, obj
        if path.endswith(".spec.template") and "metadata" in obj and "spec" not in obj:
            yield path, obj
        for key, value in obj.items():
            if key != "metadata":
                yield from pod_templates(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from pod_templates(item, f"{path}[{i}]")
