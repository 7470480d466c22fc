"""Apply the right-sizing part of a ``Plan`` (docs/curtailment.md): each ``ResizeAction`` →

* on a shrink, m2g's record on the Workload first (``m2g.io/resized-from``: the full
  parallelism, ``m2g.io/resized-at``), so the snapshot knows the full size once Kueue has
  scaled the Workload down; then a merge patch of the Job's ``spec.parallelism`` with the same
  record in its annotations;
* on a grow back, the Job's ``spec.parallelism`` set to the full size and the record removed
  from the Job and the Workload (Kueue admits the larger size as a new Workload slice).

Level-triggered and idempotent: nothing is written when the Job and the record already say
so. A Job that is not (or no longer) elastic (``kueue.x-k8s.io/elastic-job: "true"``) is left
alone — a parallelism change of an admitted non-elastic Job would make Kueue evict it. One
Event on the Job per change (``Resized``). In dry-run (shadow) mode only the records say what
would have been written.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from m2g.k8s.annotations import RESIZED_AT, RESIZED_FROM
from m2g.k8s.apply import Applier, ApplyResult
from m2g.k8s.client import JOBS, WORKLOADS, KubeError, NotFound, Obj
from m2g.k8s.parse import format_time
from m2g.model import labels as L
from m2g.model.plan import Plan, ResizeAction

log = logging.getLogger(__name__)


def record_annotations(a: ResizeAction, annotations: dict[str, Any], now: str
                       ) -> dict[str, Any]:
    """The annotation changes for ``a`` on an object with ``annotations`` ({}: none)."""
    if a.parallelism >= a.full:
        return {k: None for k in (RESIZED_FROM, RESIZED_AT) if k in annotations}
    if annotations.get(RESIZED_FROM) == str(a.full) and RESIZED_AT in annotations:
        return {}
    return {RESIZED_FROM: str(a.full), RESIZED_AT: now}


def job_patch(a: ResizeAction, job: Obj, now: str) -> dict[str, Any]:
    """The merge patch of the Job for ``a`` ({}: nothing to write)."""
    meta = job.get("metadata") or {}
    notes = record_annotations(a, dict(meta.get("annotations") or {}), now)
    body: dict[str, Any] = {"metadata": {"annotations": notes}} if notes else {}
    if (job.get("spec") or {}).get("parallelism") != a.parallelism:
        body["spec"] = {"parallelism": a.parallelism}
        if "metadata" not in body:
            body["metadata"] = {}
        # the resourceVersion read: a concurrent change of the Job wins, the next reconcile
        # decides again
        body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
    return body


async def apply_resize(applier: Applier, a: ResizeAction, result: ApplyResult) -> bool:
    """Write ``a``; False when there is nothing to write, the Job is not elastic, or it is
    gone (it finished)."""
    try:
        return await _apply_resize(applier, a, result)
    except NotFound:
        return False


async def _apply_resize(applier: Applier, a: ResizeAction, result: ApplyResult) -> bool:
    job = await applier.kube.get(JOBS, a.job, a.namespace)
    meta = job.get("metadata") or {}
    target = f"{a.namespace}/{a.job}"
    verb = "grow" if a.parallelism >= a.full else "shrink"
    if (meta.get("annotations") or {}).get(L.ELASTIC_JOB) != "true":
        applier._record(result, verb, target, f"not an elastic Job ({L.ELASTIC_JOB}): left "
                        "alone", False)
        return False
    now = format_time(applier.clock())
    body = job_patch(a, job, now)
    if not applier._record(result, verb, target,
                           f"{a.parallelism} replicas, {a.kw:.1f} kW: {a.reason}", bool(body)):
        return False
    wl = await applier.kube.get_or_none(WORKLOADS, a.name, a.namespace)
    if wl is not None:
        notes = record_annotations(
            a, dict((wl.get("metadata") or {}).get("annotations") or {}), now)
        if notes:
            await applier.kube.patch(WORKLOADS, a.name, {"metadata": {"annotations": notes}},
                                     namespace=a.namespace,
                                     field_manager=applier.field_manager)
    await applier.kube.patch(JOBS, a.job, body, namespace=a.namespace,
                             field_manager=applier.field_manager)

    async def event() -> None:
        try:
            await applier.emit_event(job, "Resized", a.reason, "Normal")
        except KubeError as exc:  # best effort
            log.info("event for resize %s: %s", target, exc)

    if applier.background_events:
        applier.in_background(event)
    else:
        await event()
    return True


async def apply_resizes(applier: Applier, plan: Plan, result: ApplyResult) -> None:
    """Every resize, up to ``applier.parallel`` at once; one failure never stops the others."""
    await applier.bounded_recorded(result, [(f"resize {a.namespace}/{a.job}", partial(
        apply_resize, applier, a, result)) for a in plan.resizes])
