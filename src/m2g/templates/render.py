"""Template + ``--set`` values → Kubernetes manifests (plain dicts) for the chosen API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from m2g.templates import apis
from m2g.templates.errors import TemplateError
from m2g.templates.params import Values, resolve
from m2g.templates.podspec import Context, Obj
from m2g.templates.schema import WorkloadApi, WorkloadTemplate
from m2g.templates.sizing import Sizing, size

BUILDERS: dict[WorkloadApi, Callable[[Context], apis.Built]] = {
    WorkloadApi.JOB: apis.job,
    WorkloadApi.JOBSET: apis.jobset,
    WorkloadApi.PYTORCHJOB: apis.pytorchjob,
    WorkloadApi.TRAINJOB: apis.trainjob,
    WorkloadApi.LEADERWORKERSET: apis.leaderworkerset,
}


@dataclass(frozen=True, slots=True)
class Rendered:
    """What ``m2g submit`` creates, and what it tells the user about it."""

    template: WorkloadTemplate
    values: Values
    sizing: Sizing
    objects: tuple[Obj, ...]
    notes: tuple[str, ...]  # sizing warnings and API caveats

    @property
    def workload(self) -> Obj:
        """The object Kueue admits (the last one; a Service may precede a Job)."""
        return self.objects[-1]


def render(template: WorkloadTemplate, sets: Mapping[str, str] | None = None, *,
           namespace: str = "default", queue: str = "default") -> Rendered:
    """Resolve parameters, size, and build the manifests. Raises TemplateError."""
    values = resolve(template, sets or {})
    if not values.image:
        raise TemplateError(f"{template.name}: image is empty; --set image=REGISTRY/IMAGE:TAG")
    sizing = size(template, values)
    ctx = Context(template, values, sizing, namespace, queue)
    objects, notes = BUILDERS[WorkloadApi(values.api)](ctx)
    return Rendered(template, values, sizing, tuple(objects), sizing.warnings + tuple(notes))
