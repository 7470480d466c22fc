"""Apply the right-sizing part of a ``Plan`` (docs/curtailment.md): each ``ResizeAction`` →

* on a shrink, m2g's record on the Workload first (``m2g.io/resized-from``: the full
  parallelism, ``m2g.io/resized-at``), so the snapshot knows the full size once Kueue has
  scaled the Workload down; then a merge patch of the Job's ``spec.parallelism`` with the same
  record in its annotations;
* on a grow back, the Job's ``spec.parallelism`` set to the full size (and its record removed)
  first, then the record removed from the Workload: a failure (or a crash) between the two
  leaves the record in place, so the next reconcile still knows the full size and finishes
  (removed first, a Job left small was read as full size and never grown back). Kueue admits
  the larger size as a new Workload slice.

The patches carry no ``resourceVersion``: they name only m2g's fields (the Job controller
rewrites the Job's status all the time, so a precondition read a moment earlier failed with
409 again and again); a 409 the server still answers is retried with the object read again
(``patch_retrying``, at most ``CONFLICT_RETRIES`` tries).

Level-triggered and idempotent: nothing is written when the Job and the records already say
so. A Job that is not (or no longer) elastic (``kueue.x-k8s.io/elastic-job: "true"``) is left
alone — a parallelism change of an admitted non-elastic Job would make Kueue evict it. A change
is recorded (``ApplyResult.records``) as written only once its writes succeeded. One Event on
the Job per change (``Resized``). In dry-run (shadow) mode only the records say what would
have been written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from m2g.k8s.annotations import RESIZED_AT, RESIZED_FROM
from m2g.k8s.apply import Applier, ApplyResult, retry_on_conflict
from m2g.k8s.client import JOBS, WORKLOADS, KubeError, NotFound, Obj, Resource
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


def _elastic(job: Obj) -> bool:
    return ((job.get("metadata") or {}).get("annotations") or {}).get(L.ELASTIC_JOB) == "true"


def job_patch(a: ResizeAction, job: Obj, now: str) -> dict[str, Any]:
    """The merge patch of the Job for ``a`` ({}: nothing to write). No ``resourceVersion``:
    the patch names only m2g's fields, and the Job controller's status writes would make a
    precondition fail (409) on most tries."""
    meta = job.get("metadata") or {}
    notes = record_annotations(a, dict(meta.get("annotations") or {}), now)
    body: dict[str, Any] = {"metadata": {"annotations": notes}} if notes else {}
    if (job.get("spec") or {}).get("parallelism") != a.parallelism:
        body["spec"] = {"parallelism": a.parallelism}
    return body


def workload_patch(a: ResizeAction, wl: Obj | None, now: str) -> dict[str, Any]:
    """The merge patch of the Workload for ``a`` ({}: nothing to write, or no Workload)."""
    if wl is None:
        return {}
    notes = record_annotations(a, dict((wl.get("metadata") or {}).get("annotations") or {}),
                               now)
    return {"metadata": {"annotations": notes}} if notes else {}


async def patch_retrying(applier: Applier, res: Resource, name: str, namespace: str,
                         body_of: Callable[[Obj], dict[str, Any]],
                         first: Obj | None = None) -> bool:
    """Merge-patch ``body_of(obj)`` onto the object (``first``: as just read); on a 409 read
    it again, compute the patch again and retry, at most ``CONFLICT_RETRIES`` tries, then let
    the Conflict out (a retryable error: the next reconcile decides again). False when there
    is nothing (left) to write."""
    known = first

    async def once() -> bool:
        nonlocal known
        obj = known if known is not None else await applier.kube.get(res, name, namespace)
        known = None  # a retry reads the server's copy
        body = body_of(obj)
        if not body:
            return False
        await applier.kube.patch(res, name, body, namespace=namespace,
                                 field_manager=applier.field_manager)
        return True

    return await retry_on_conflict(once)


async def apply_resize(applier: Applier, a: ResizeAction, result: ApplyResult) -> bool:
    """Write ``a``; False when there is nothing to write, the Job is not elastic, or it is
    gone (it finished)."""
    try:
        return await _apply_resize(applier, a, result)
    except NotFound:
        return False


async def _apply_resize(applier: Applier, a: ResizeAction, result: ApplyResult) -> bool:
    job = await applier.kube.get(JOBS, a.job, a.namespace)
    target = f"{a.namespace}/{a.job}"
    grow = a.parallelism >= a.full
    verb = "grow" if grow else "shrink"
    if not _elastic(job):
        applier._record(result, verb, target, f"not an elastic Job ({L.ELASTIC_JOB}): left "
                        "alone", False)
        return False
    now = format_time(applier.clock())
    wl = await applier.kube.get_or_none(WORKLOADS, a.name, a.namespace)
    detail = f"{a.parallelism} replicas, {a.kw:.1f} kW: {a.reason}"
    # the Workload's record too: a grow whose Workload write failed after the Job's is finished
    write = bool(job_patch(a, job, now) or workload_patch(a, wl, now))
    if not write or applier.dry_run:
        applier._record(result, verb, target, detail, False)
        return False

    def job_body(obj: Obj) -> dict[str, Any]:
        return job_patch(a, obj, now) if _elastic(obj) else {}

    async def write_job() -> bool:
        return await patch_retrying(applier, JOBS, a.job, a.namespace, job_body, job)

    async def write_workload() -> bool:
        return wl is not None and await patch_retrying(
            applier, WORKLOADS, a.name, a.namespace, lambda obj: workload_patch(a, obj, now),
            wl)

    if grow:  # the Job first: the Workload's record goes only once the Job is full size
        wrote = await write_job()
        wrote = await write_workload() or wrote
    else:  # the record first: the snapshot knows the full size once Kueue scales down
        wrote = await write_workload()
        wrote = await write_job() or wrote
    applier._record(result, verb, target, detail, wrote)  # only once written
    if not wrote:  # someone else wrote it meanwhile
        return False

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
